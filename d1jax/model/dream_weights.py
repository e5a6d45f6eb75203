"""Dream checkpoints in the Hugging Face layout: config.json + safetensors, in and out.

Same machinery as LLaDA's ``weights`` (memory-mapped safetensors, each device shard read by
``jax.make_array_from_callback``, so an 8B checkpoint is never held whole; atomic sharded
writes), with Dream's names (HKUNLP ``modeling_dream.py``; torch Linear weights are
[out, in], our kernels [in, out]):

  model.embed_tokens.weight                       [V, D] -> embed_tokens/embedding (as is)
  model.norm.weight                               [D]    -> norm/weight            (as is)
  lm_head.weight (absent if tie_word_embeddings)  [V, D] -> lm_head/kernel         (transposed)
  model.layers.{i}.self_attn.{p}.weight           [o, i] -> layers/{p}/kernel[i]   (transposed)
      for p in q_proj k_proj v_proj o_proj
  model.layers.{i}.self_attn.{p}.bias             [o]    -> layers/{p}/bias[i]     (as is)
      for p in q_proj k_proj v_proj
  model.layers.{i}.mlp.{p}.weight                 [o, i] -> layers/{p}/kernel[i]   (transposed)
      for p in gate_proj up_proj down_proj
  model.layers.{i}.{n}.weight                     [D]    -> layers/{n}/weight[i]   (as is)
      for n in input_layernorm post_attention_layernorm

A tied checkpoint that still carries ``lm_head.weight`` loads (the tensor is ignored).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from d1jax import sharding as shd
from d1jax.model import hf_files
from d1jax.model import lora as lora_lib
from d1jax.model.config import LoraConfig, UnsupportedConfigError
from d1jax.model.dream import Dream
from d1jax.model.dream_config import DreamConfig
from d1jax.model.weights import (CheckpointError, _get, _open_checkpoint, stream_params,
                                write_checkpoint)

ATTN_PROJS = ("q_proj", "k_proj", "v_proj", "o_proj")
BIASED_PROJS = ("q_proj", "k_proj", "v_proj")
MLP_PROJS = ("gate_proj", "up_proj", "down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
# Files of a source Dream directory shipped with an export (its remote code comes from its
# auto_map).
COMPANIONS = (hf_files.GENERATION_CONFIG, *hf_files.TOKENIZER_FILES)

KeyMap = dict[str, tuple[tuple[str, ...], int | None, bool]]


def dream_key_map(config: DreamConfig) -> KeyMap:
    """HF key -> (param path, layer index or None, transposed?), in checkpoint order."""
    out: KeyMap = {"model.embed_tokens.weight": (("embed_tokens", "embedding"), None, False)}
    for i in range(config.num_hidden_layers):
        pre = f"model.layers.{i}."
        for p in ATTN_PROJS:
            out[f"{pre}self_attn.{p}.weight"] = (("layers", p, "kernel"), i, True)
            if p in BIASED_PROJS:
                out[f"{pre}self_attn.{p}.bias"] = (("layers", p, "bias"), i, False)
        for p in MLP_PROJS:
            out[f"{pre}mlp.{p}.weight"] = (("layers", p, "kernel"), i, True)
        for n in NORMS:
            out[f"{pre}{n}.weight"] = (("layers", n, "weight"), i, False)
    out["model.norm.weight"] = (("norm", "weight"), None, False)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head", "kernel"), None, True)
    return out


def dream_param_shapes(config: DreamConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Shapes of our (stacked) params, by path."""
    flat = jax.tree_util.tree_flatten_with_path(shd.abstract_params(Dream(config)))[0]
    return {tuple(k.key for k in path): tuple(leaf.shape) for path, leaf in flat}


def read_dream_config(path: str | os.PathLike) -> DreamConfig:
    """The ``DreamConfig`` of a checkpoint directory's config.json."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{cfg_file} is missing" if Path(path).is_dir()
                              else f"checkpoint directory {path} does not exist")
    try:
        return DreamConfig.from_hf_dict(json.loads(cfg_file.read_text()))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file}: invalid JSON ({e})") from None
    except UnsupportedConfigError as e:
        raise CheckpointError(f"{cfg_file}: {e}") from None


def load_dream_checkpoint(path: str | os.PathLike, mesh: Mesh | None = None,
                          dtype: Any = jnp.float32, rules=shd.DEFAULT_RULES,
                          ) -> tuple[DreamConfig, dict[str, Any]]:
    """Loads a Hugging Face Dream checkpoint directory (single file or sharded + index).

    Each param is placed with the sharding the rules give it over ``mesh`` (else on the
    first local device), each device reading only its own shard from the memory maps.
    Returns (config, params) with params the plain pytree ``Dream(config).apply`` takes.
    """
    path = Path(path)
    config = read_dream_config(path)
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    return config, stream_params(_open_checkpoint(path), dream_key_map(config),
                                 dream_param_shapes(config), Dream(config), mesh, dtype, rules,
                                 ignorable, "Dream checkpoint")


def save_dream_checkpoint(path: str | os.PathLike, config: DreamConfig, params: Mapping[str, Any],
                          max_shard_size: int | str = "5GB", dtype: Any = None, *,
                          source_dir: str | os.PathLike | None = None, tokenizer: Any = None,
                          lora: LoraConfig | None = None) -> None:
    """Writes params in the Hugging Face Dream layout, tensor by tensor (process 0 writes).

    Files go to a temporary directory next to ``path`` and replace the old weights only when
    complete. ``source_dir``: the directory the model was loaded from; its generation config,
    tokenizer files (unless ``tokenizer`` is given) and ``auto_map`` modules (Dream's
    ``modeling_dream.py`` ...) are copied, and its ``auto_map`` kept. ``tokenizer``: the
    ``transformers`` tokenizer to ship (``hf_files.ship_tokenizer``). ``lora``: adapters in
    ``params`` are merged into the kernels (refused without it).
    """
    path = Path(path)
    params = lora_lib.merge(params, lora)
    entries = [(k, (_get(params, p), layer, t))
               for k, (p, layer, t) in dream_key_map(config).items()]

    def finish(tmp: Path) -> None:
        hf_config = config.to_hf_dict()
        # auto_map names the source's remote code (modeling_dream.py ...), copied beside the
        # weights; a model without a source (random init) ships none, so its config names none.
        auto_map = {}
        if source_dir is not None:
            skip = () if tokenizer is None else hf_files.TOKENIZER_FILES
            auto_map = _copy_companions(Path(source_dir), tmp, skip)
        modules = hf_files.auto_map_modules(auto_map)
        if auto_map and all((tmp / m).is_file() for m in modules):
            hf_config["auto_map"] = auto_map
        else:
            hf_config.pop("auto_map", None)
        if tokenizer is not None:
            hf_files.ship_tokenizer(tokenizer, tmp)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))

    write_checkpoint(path, entries, max_shard_size, dtype, finish)


def _copy_companions(source: Path, dest: Path, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Copies the source's generation config, tokenizer and auto_map modules; its auto_map."""
    if not source.is_dir():
        raise FileNotFoundError(f"source_dir {source} is not a directory; pass the Hugging "
                                f"Face Dream directory the model was loaded from, or None")
    cfg = source / "config.json"
    auto_map = dict(json.loads(cfg.read_text()).get("auto_map") or {}) if cfg.exists() else {}
    names = sorted((set(COMPANIONS) - set(skip)) | hf_files.auto_map_modules(auto_map))
    for name in names:
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)
    return auto_map
