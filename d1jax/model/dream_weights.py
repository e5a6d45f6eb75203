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
    tokenizer files (unless ``tokenizer`` is given) and remote code are copied byte for byte,
    and its ``auto_map`` kept. Without remote code of its own (a random init, ``source_dir``
    None) the export carries d1jax's ``configuration_dream.py`` and ``modeling_dream.py``,
    which transformers 4.x and 5.x open (``hf_files``); its README.md says which code it holds.
    ``tokenizer``: the ``transformers`` tokenizer to ship (``hf_files.ship_tokenizer``).
    ``lora``: adapters in ``params`` are merged into the kernels (refused without it).
    """
    path = Path(path)
    params = lora_lib.merge(params, lora)
    entries = [(k, (_get(params, p), layer, t))
               for k, (p, layer, t) in dream_key_map(config).items()]

    def finish(tmp: Path) -> None:
        hf_config = config.to_hf_dict()
        hf_config["auto_map"] = hf_files.copy_companions(source_dir, tmp, tokenizer,
                                                         hf_files.DREAM)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))

    write_checkpoint(path, entries, max_shard_size, dtype, finish)
