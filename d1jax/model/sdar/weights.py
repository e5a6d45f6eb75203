"""SDAR / TraDo checkpoints in the Hugging Face layout (``SDARForCausalLM``): the key map,
load, save.

The streaming and writing are ``d1jax.model.hf_checkpoint``'s; this module names the keys
(JetAstra/SDAR ``training/model/SDAR-4B-Chat/model.safetensors.index.json``; torch Linear
weights are [out, in], our kernels [in, out]):

  model.embed_tokens.weight                       [V, D] -> embed_tokens/embedding (as is)
  model.layers.{i}.self_attn.{p}.weight           [o, i] -> layers/{p}/kernel[i]   (transposed)
      for p in q_proj k_proj v_proj o_proj
  model.layers.{i}.self_attn.{n}.weight           [H]    -> layers/{n}/weight[i]   (as is)
      for n in q_norm k_norm
  model.layers.{i}.mlp.{p}.weight                 [o, i] -> layers/{p}/kernel[i]   (transposed)
      for p in gate_proj up_proj down_proj
  model.layers.{i}.{n}.weight                     [D]    -> layers/{n}/weight[i]   (as is)
      for n in input_layernorm post_attention_layernorm
  model.norm.weight                               [D]    -> norm/weight            (as is)
  lm_head.weight (absent if tie_word_embeddings)  [V, D] -> lm_head/kernel         (transposed)

d1jax ships no modeling code of its own for SDAR (``REMOTE_CODE``): an export from a loaded
checkpoint keeps the source's ``modeling_sdar.py`` and ``auto_map``; one from a random init
carries none (d1jax reads it back).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax.numpy as jnp
from jax.sharding import Mesh

from d1jax import sharding as shd
from d1jax.model import hf_checkpoint as hf
from d1jax.model import hf_files, qwen
from d1jax.model.lora import LoraConfig
from d1jax.model.sdar.config import SDARConfig
from d1jax.model.sdar.model import SDAR

EMBEDDING = "model.embed_tokens.weight"  # its rows: the vocabulary

REMOTE_CODE = hf_files.RemoteCode(
    "SDAR", (), {}, "JetAstra/SDAR-8B-Chat", "d1jax.model.sdar.load_hf_checkpoint",
    keep_source=True,
    forward="`model(input_ids, attention_mask=<4-D block-causal mask>, position_ids=...)"
            ".logits` is one pass whose row i predicts token i; the authors' modeling_sdar.py "
            "takes the block mask from its caller. A random init's export carries no "
            "modeling code (d1jax reads it back).")


def key_map(config: SDARConfig) -> hf.KeyMap:
    """HF key -> (param path, layer index or None, transposed?), in checkpoint order."""
    return qwen.key_map(config, head_norms=("q_norm", "k_norm"))


def read_config(path: str | os.PathLike) -> SDARConfig:
    """The ``SDARConfig`` of a checkpoint directory's config.json (an unsupported variant:
    CheckpointError naming the file)."""
    return hf.read_config(path, SDARConfig.from_hf_dict, wrap_unsupported=True)


def load_hf_checkpoint(path: str | os.PathLike, mesh: Mesh | None = None,
                       dtype: Any = jnp.float32, rules=shd.DEFAULT_RULES,
                       ) -> tuple[SDARConfig, dict[str, Any]]:
    """Loads an SDAR / TraDo checkpoint directory (single file or sharded + index), each
    param placed with the sharding the rules give it over ``mesh``. Returns (config, params)
    with params the plain pytree ``SDAR(config).apply`` takes."""
    config = read_config(path)
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    return config, hf.load_hf_checkpoint(path, key_map(config), SDAR(config), mesh, dtype,
                                         rules, ignorable, "SDAR checkpoint")


def save_hf_checkpoint(path: str | os.PathLike, config: SDARConfig, params: Mapping[str, Any],
                       max_shard_size: int | str = "5GB", dtype: Any = None, *,
                       source_dir: str | os.PathLike | None = None, tokenizer: Any = None,
                       lora: LoraConfig | None = None) -> None:
    """Writes params in the SDAR layout, as ``hf_checkpoint.save_hf_checkpoint`` (atomically,
    LoRA adapters merged with ``lora``); ``source_dir``'s generation config, tokenizer files
    and remote code are copied byte for byte."""
    hf.save_hf_checkpoint(path, config, params, key_map(config), REMOTE_CODE, max_shard_size,
                          dtype, source_dir=source_dir, tokenizer=tokenizer, lora=lora)
