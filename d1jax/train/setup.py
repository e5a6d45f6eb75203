"""Builds what every stage needs from a config: mesh, tokenizer, model, initial params."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding
from d1jax.model import weights
from d1jax.model import LLaDA, LLaDAConfig, LoraConfig, preset
from d1jax.model.tokenizer import load_tokenizer, special_ids, train_tiny_tokenizer


@dataclasses.dataclass
class Setup:
    mesh: jax.sharding.Mesh
    rules: tuple
    tokenizer: Any
    model: LLaDA  # with LoRA when config.lora.enabled
    model_config: LLaDAConfig
    params: dict  # base params, plus adapters when LoRA is on
    ids: dict  # mask / eos / eot / pad token ids


def _dtype(name: str):
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[name]


def make_mesh(config) -> tuple[jax.sharding.Mesh, tuple]:
    rules = dict(sharding.DEFAULT_RULES)
    rules.update(dict(config.mesh.rules))
    return sharding.make_mesh(tuple(config.mesh.shape)), tuple(rules.items())


def data_parallel_size(mesh: jax.sharding.Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def _tokenizer(config, workdir: Path, texts):
    if config.model.tokenizer_path:
        return load_tokenizer(config.model.tokenizer_path)
    if _random(config):
        tok_dir = workdir / "tokenizer"
        if (tok_dir / "tokenizer.json").exists():  # a resumed run keeps its tokenizer
            return load_tokenizer(tok_dir)
        if texts is None:
            raise ValueError("a random_init model needs task texts to train its tokenizer")
        return train_tiny_tokenizer(texts(), tok_dir, config.model.tokenizer_vocab)
    return load_tokenizer(config.model.path)


def _random_model_config(config, tok) -> LLaDAConfig:
    ids = special_ids(tok)
    vocab = -(-len(tok) // 64) * 64  # room for the mesh's tensor axis to divide it
    if config.model.vocab_size:
        if config.model.vocab_size < len(tok):
            raise ValueError(f"model.vocab_size={config.model.vocab_size} is smaller than the "
                             f"tokenizer's {len(tok)} tokens")
        vocab = config.model.vocab_size
    over = dict(vocab_size=vocab, embedding_size=vocab, mask_token_id=ids["mask"],
                eos_token_id=ids["eos"], pad_token_id=ids["pad"], max_sequence_length=1024)
    if config.model.width:
        w = config.model.width
        over.update(d_model=w, mlp_hidden_size=3 * w)
    if config.model.n_layers:
        over["n_layers"] = config.model.n_layers
    return preset(config.model.random_init, **over)


def _random(config) -> bool:
    """Random weights: random_init names a preset and no model.path was given (a path wins,
    so ``--config.model.path=DIR`` on a :tiny config evaluates or trains that model)."""
    return bool(config.model.random_init) and not config.model.path


def lora_config(config) -> LoraConfig | None:
    if not config.lora.enabled:
        return None
    return LoraConfig(rank=config.lora.rank, alpha=config.lora.alpha, dropout=config.lora.dropout)


def build(config, workdir: str | Path, texts=None) -> Setup:
    """Mesh, tokenizer, model and params (loaded from model.path or random).

    ``texts``: a callable returning training texts, used only to train the tiny tokenizer
    of a ``random_init`` model.
    """
    workdir = Path(workdir)
    mesh, rules = make_mesh(config)
    tok = _tokenizer(config, workdir, texts)
    dtype, pdtype = _dtype(config.model.dtype), _dtype(config.model.param_dtype)
    lora = lora_config(config)
    if _random(config):
        mcfg = _random_model_config(config, tok)
        model = LLaDA(mcfg, dtype=dtype, param_dtype=pdtype, remat=config.model.remat, lora=lora)
        params = _init(model, jax.random.key(config.seed), mesh, rules, only_lora=False)
    else:
        mcfg, params = weights.load_hf_checkpoint(config.model.path, mesh=mesh, dtype=pdtype,
                                                  rules=rules)
        model = LLaDA(mcfg, dtype=dtype, param_dtype=pdtype, remat=config.model.remat, lora=lora)
        if lora is not None:
            adapters = _init(model, jax.random.key(config.seed), mesh, rules, only_lora=True)
            params = merge_trees(params, adapters)
    ids = special_ids(tok)
    if ids["mask"] != mcfg.mask_token_id:
        raise ValueError(f"tokenizer mask id {ids['mask']} != model mask_token_id "
                         f"{mcfg.mask_token_id}: tokenizer and model do not belong together")
    return Setup(mesh, rules, tok, model, mcfg, params, ids)


def _is_lora(path) -> bool:
    return any(getattr(k, "key", None) in ("lora_a", "lora_b") for k in path)


def _init(model: LLaDA, rng, mesh, rules, only_lora: bool) -> dict:
    """Params born sharded; with only_lora, just the adapters (XLA drops the rest)."""
    def init(k):
        p = model.init(k, jnp.zeros((1, 8), jnp.int32))["params"]
        if only_lora:
            p = jax.tree_util.tree_map_with_path(lambda pth, x: x if _is_lora(pth) else None, p)
        return p
    abstract = jax.eval_shape(init, rng)
    shardings = sharding.logical_to_sharding(abstract, mesh, rules)
    with sharding.activate(mesh, rules):
        boxed = jax.jit(init, out_shardings=shardings)(rng)
    return nn.meta.unbox(boxed)


def merge_trees(a: dict, b: dict) -> dict:
    """Union of two nested dicts of arrays; ``b``'s non-None leaves win."""
    out = dict(a)
    for k, v in b.items():
        if v is None:
            continue
        out[k] = merge_trees(out.get(k, {}), v) if isinstance(v, dict) else v
    return out
