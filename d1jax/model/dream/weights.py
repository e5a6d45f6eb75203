"""Dream checkpoints in the Hugging Face layout (``DreamModel``): the key map, load, save.

The streaming and writing are ``d1jax.model.hf_checkpoint``'s; this module names the keys
(HKUNLP ``modeling_dream.py``; torch Linear weights are [out, in], our kernels [in, out]):

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

import os
from typing import Any, Mapping

import jax.numpy as jnp
from jax.sharding import Mesh

from d1jax import sharding as shd
from d1jax.model import hf_checkpoint as hf
from d1jax.model.hf_checkpoint import (  # noqa: F401 (what loading raises, saving writes)
    INDEX_FILE, SINGLE_FILE, CheckpointError)
from d1jax.model import hf_files, qwen
from d1jax.model.dream.config import DreamConfig
from d1jax.model.dream.model import Dream
from d1jax.model.lora import LoraConfig

EMBEDDING = "model.embed_tokens.weight"  # its rows: the vocabulary

# d1jax's own Hugging Face code for Dream (hf_remote/), shipped when the source directory has
# none of its own (Dream's and DiffuCoder's modeling_dream.py are kept: their
# diffusion_generate).
REMOTE_CODE = hf_files.RemoteCode(
    "Dream", ("configuration_dream.py", "modeling_dream.py"),
    {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "Dream-org/Dream-v0-Instruct-7B", "d1jax.model.dream.load_hf_checkpoint",
    keep_source=True,
    forward="`model(input_ids, attention_mask=...).logits` is one bidirectional pass giving "
            "Dream's raw logits (row i predicts token i+1; Dream's sampler shifts them by one), "
            "with RoPE positions counted from each row's first real token, as Dream's sampler "
            "passes them. d1jax's code has no `diffusion_generate` (`d1jax.sampling.dream` "
            "samples).")


def key_map(config: DreamConfig) -> hf.KeyMap:
    """HF key -> (param path, layer index or None, transposed?), in checkpoint order."""
    return qwen.key_map(config, biased=("q_proj", "k_proj", "v_proj"))


def param_shapes(config: DreamConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Shapes of our (stacked) params, by path."""
    return hf.param_shapes(Dream(config))


def read_config(path: str | os.PathLike) -> DreamConfig:
    """The ``DreamConfig`` of a checkpoint directory's config.json (an unsupported variant:
    CheckpointError naming the file)."""
    return hf.read_config(path, DreamConfig.from_hf_dict, wrap_unsupported=True)


def load_hf_checkpoint(path: str | os.PathLike, mesh: Mesh | None = None,
                       dtype: Any = jnp.float32, rules=shd.DEFAULT_RULES,
                       ) -> tuple[DreamConfig, dict[str, Any]]:
    """Loads a Hugging Face Dream checkpoint directory (single file or sharded + index).

    Each param is placed with the sharding the rules give it over ``mesh`` (else on the
    first local device), each device reading only its own shard from the memory maps.
    Returns (config, params) with params the plain pytree ``Dream(config).apply`` takes.
    """
    config = read_config(path)
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    return config, hf.load_hf_checkpoint(path, key_map(config), Dream(config), mesh, dtype,
                                         rules, ignorable, "Dream checkpoint")


def save_hf_checkpoint(path: str | os.PathLike, config: DreamConfig, params: Mapping[str, Any],
                       max_shard_size: int | str = "5GB", dtype: Any = None, *,
                       source_dir: str | os.PathLike | None = None, tokenizer: Any = None,
                       lora: LoraConfig | None = None) -> None:
    """Writes params in the Hugging Face Dream layout, as ``hf_checkpoint.save_hf_checkpoint``
    (atomically, process 0 writing, LoRA adapters merged with ``lora``, refused without it).

    ``source_dir``: the directory the model was loaded from; its generation config,
    tokenizer files (unless ``tokenizer`` is given) and remote code are copied byte for byte,
    and its ``auto_map`` kept. Without remote code of its own (a random init, ``source_dir``
    None) the export carries d1jax's ``configuration_dream.py`` and ``modeling_dream.py``
    (``REMOTE_CODE``), which transformers 4.x and 5.x open; its README.md says which code it
    holds. ``tokenizer``: the ``transformers`` tokenizer to ship (``hf_files.ship_tokenizer``).
    """
    hf.save_hf_checkpoint(path, config, params, key_map(config), REMOTE_CODE, max_shard_size,
                          dtype, source_dir=source_dir, tokenizer=tokenizer, lora=lora)
