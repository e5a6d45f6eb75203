"""Builds what every stage needs from a run spec: tokenizer, model and initial params."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import jax

from d1jax import sharding as shd
from d1jax.model import init_params
from d1jax.model import quant
from d1jax.model import family as family_lib
from d1jax.model import lora as lora_lib
from d1jax.model.tokenizer import load_tokenizer, special_ids, train_tiny_tokenizer
from d1jax.run.spec import ModelSpec, RunSpec


@dataclasses.dataclass
class Setup:
    mesh: jax.sharding.Mesh
    rules: tuple
    tokenizer: Any
    model: Any  # the family's module (LLaDA, Dream), with LoRA when the spec enables it
    model_config: Any  # its architecture (LLaDAConfig, DreamConfig)
    params: dict  # base params, plus adapters when LoRA is on
    ids: dict  # mask / eos / eot / pad token ids


def data_parallel_size(mesh: jax.sharding.Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def _tokenizer(m: ModelSpec, workdir: Path, texts: Callable[[], list[str]] | None):
    if m.tokenizer_path:
        return load_tokenizer(m.tokenizer_path)
    if m.random:
        tok_dir = workdir / "tokenizer"
        if (tok_dir / "tokenizer.json").exists():  # a resumed run keeps its tokenizer
            return load_tokenizer(tok_dir)
        if texts is None:
            raise ValueError("a random_init model needs task texts to train its tokenizer")
        return train_tiny_tokenizer(texts(), tok_dir, m.tokenizer_vocab)
    return load_tokenizer(m.path)


def random_model_config(m: ModelSpec, tok) -> Any:
    """The preset ``m.random_init`` of the spec's family sized to the tokenizer, with the
    spec's overrides."""
    ids = special_ids(tok)
    vocab = -(-len(tok) // 64) * 64  # room for the mesh's tensor axis to divide it
    if m.vocab_size:
        if m.vocab_size < len(tok):
            raise ValueError(f"model.vocab_size={m.vocab_size} is smaller than the "
                             f"tokenizer's {len(tok)} tokens")
        vocab = m.vocab_size
    return family_lib.get(m.family).sized_config(
        m.random_init, vocab=vocab, mask=ids["mask"], eos=ids["eos"], pad=ids["pad"],
        width=m.width, n_layers=m.n_layers)


def make_model(m: ModelSpec, mcfg: Any):
    """The flax module (the spec's family) of architecture ``mcfg`` with the spec's dtypes,
    remat, layer unrolling and LoRA."""
    return family_lib.get(m.family).model(
        mcfg, dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, lora=m.lora,
        unroll_layers=m.unroll_layers, layers_per_loop=m.layers_per_loop)


def build(spec: RunSpec, workdir: str | Path, mesh: jax.sharding.Mesh,
          texts: Callable[[], list[str]] | None = None) -> Setup:
    """Tokenizer, model and params (loaded from model.path, or random), placed on ``mesh``;
    under LoRA with ``base_quant`` the base's block projections are quantised (a random one
    as it is drawn, a loaded one kernel by kernel as it loads: d1jax.model.quant).

    ``texts``: training texts, used only to train the tiny tokenizer of a random model.
    """
    m, rules = spec.model, spec.mesh.rules
    tok = _tokenizer(m, Path(workdir), texts)
    rng = jax.random.key(spec.seed)
    if m.random:
        mcfg = random_model_config(m, tok)
        model = make_model(m, mcfg)
        params = init_params(model, rng, mesh, rules)
    else:
        mcfg, params = family_lib.get(m.family).load(m.path, mesh=mesh, dtype=m.param_dtype,
                                                     rules=rules)
        model = make_model(m, mcfg)
        if m.lora is not None:  # load -> quantise the base (if asked) -> join the adapters
            target = shd.param_shardings(model, mesh, rules) if mesh is not None else None
            params = quant.quantize_base(params, m.lora.base_quant, target, donate=True)
            params = lora_lib.join(params, init_params(model, rng, mesh, rules,
                                                      adapters_only=True))
    ids = special_ids(tok, mcfg)  # the checkpoint's ids, checked against its config.json
    if ids["mask"] != mcfg.mask_token_id:
        raise ValueError(f"tokenizer mask id {ids['mask']} != model mask_token_id "
                         f"{mcfg.mask_token_id}: tokenizer and model do not belong together")
    return Setup(mesh, rules, tok, model, mcfg, params, ids)
