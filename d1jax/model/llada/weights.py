"""LLaDA checkpoints in the Hugging Face layout (``LLaDAModelLM``): the key map, load, save.

The streaming and writing are ``d1jax.model.hf_checkpoint``'s; this module names the keys
(torch Linear weights are [out, in]; our kernels are [in, out]):

  model.transformer.wte.weight            [V, D]  -> wte/embedding          (as is)
  model.transformer.ln_f.weight           [D]     -> ln_f/weight            (as is)
  model.transformer.ff_out.weight         [V, D]  -> ff_out/kernel          (transposed)
  model.transformer.blocks.{i}.{p}.weight [o, i]  -> blocks/{p}/kernel[i]   (transposed)
      for p in q_proj k_proj v_proj attn_out ff_proj up_proj ff_out
  model.transformer.blocks.{i}.{n}.weight [D]     -> blocks/{n}/weight[i]   (as is)
      for n in attn_norm ff_norm
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax.numpy as jnp
from jax.sharding import Mesh

from d1jax import sharding as shd
from d1jax.model import hf_checkpoint as hf
from d1jax.model.hf_checkpoint import (  # noqa: F401 (what loading raises, saving writes)
    INDEX_FILE, SINGLE_FILE, CheckpointError)
from d1jax.model import hf_files
from d1jax.model.llada.config import LLaDAConfig
from d1jax.model.llada.model import LLaDA
from d1jax.model.lora import LoraConfig

PREFIX = "model.transformer."
TRANSPOSED_PROJS = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")
NORMS = ("attn_norm", "ff_norm")
EMBEDDING = PREFIX + "wte.weight"  # its rows: the vocabulary

# d1jax's own Hugging Face code for LLaDA (hf_remote/), shipped with every export: LLaDA's
# official modeling_llada.py fails under transformers 5.
REMOTE_CODE = hf_files.RemoteCode(
    "LLaDA", ("configuration_llada.py", "modeling_llada.py"),
    {"AutoConfig": "configuration_llada.LLaDAConfig",
     "AutoModel": "modeling_llada.LLaDAModelLM",
     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
    "GSAI-ML/LLaDA-8B-Instruct", "d1jax.model.llada.load_hf_checkpoint", keep_source=False,
    forward="`model(input_ids, attention_mask=...).logits` is one bidirectional pass.")


def key_map(config: LLaDAConfig) -> hf.KeyMap:
    """HF key -> (param path, layer index or None, transposed?), in checkpoint order."""
    out: hf.KeyMap = {
        EMBEDDING: (("wte", "embedding"), None, False),
        PREFIX + "ln_f.weight": (("ln_f", "weight"), None, False),
    }
    if not config.weight_tying:
        out[PREFIX + "ff_out.weight"] = (("ff_out", "kernel"), None, True)
    for i in range(config.n_layers):
        for p in TRANSPOSED_PROJS:
            out[f"{PREFIX}blocks.{i}.{p}.weight"] = (("blocks", p, "kernel"), i, True)
        for n in NORMS:
            out[f"{PREFIX}blocks.{i}.{n}.weight"] = (("blocks", n, "weight"), i, False)
    return out


def param_shapes(config: LLaDAConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Shapes of our (stacked) params, by path."""
    return hf.param_shapes(LLaDA(config))


def read_config(path: str | os.PathLike) -> LLaDAConfig:
    """The ``LLaDAConfig`` of a checkpoint directory's config.json."""
    return hf.read_config(path, LLaDAConfig.from_hf_dict)


def load_hf_checkpoint(path: str | os.PathLike, mesh: Mesh | None = None,
                       dtype: Any = jnp.float32, rules=shd.DEFAULT_RULES,
                       ) -> tuple[LLaDAConfig, dict[str, Any]]:
    """Loads a Hugging Face LLaDA checkpoint directory.

    Args:
      path: directory with config.json and model.safetensors (or sharded files + index).
      mesh: if given, each param is placed with the sharding the rules give it;
        otherwise on the first local device.
      dtype: parameter dtype (e.g. jnp.bfloat16).
    Returns:
      (config, params) with params the plain pytree ``LLaDA(config).apply`` takes under
      ``{"params": params}``.
    """
    config = read_config(path)
    return config, hf.load_hf_checkpoint(path, key_map(config), LLaDA(config), mesh, dtype,
                                         rules)


def save_hf_checkpoint(path: str | os.PathLike, config: LLaDAConfig, params: Mapping[str, Any],
                       max_shard_size: int | str = "5GB", dtype: Any = None, *,
                       source_dir: str | os.PathLike | None = None,
                       tokenizer: Any = None, lora: LoraConfig | None = None) -> None:
    """Writes params in the Hugging Face LLaDA layout (loadable by the PyTorch code), as
    ``hf_checkpoint.save_hf_checkpoint``: atomically, process 0 writing, LoRA adapters merged
    (``lora``; refused without it). Every export carries d1jax's own
    ``configuration_llada.py`` / ``modeling_llada.py`` (``REMOTE_CODE``), which transformers
    4.x and 5.x open with ``trust_remote_code=True``; a ``source_dir``'s generation config,
    tokenizer files (unless ``tokenizer`` is given) and other ``auto_map`` modules are
    copied (``hf_files.copy_companions``)."""
    hf.save_hf_checkpoint(path, config, params, key_map(config), REMOTE_CODE, max_shard_size,
                          dtype, source_dir=source_dir, tokenizer=tokenizer, lora=lora)
