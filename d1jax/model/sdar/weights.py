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

An export ships the family's published Hugging Face code (``REMOTE_CODE``): Gen-Verse/dLLM-RL's
``models/sdar/configuration_sdar.py`` and ``modeling_sdar.py``, vendored unchanged in
``d1jax/model/hf_remote/sdar/`` (``SOURCE.md`` there: repository, commit, license). An export
from a loaded checkpoint keeps the source's own files and ``auto_map`` instead. The published
modeling code does not import under transformers 5.x (``LossKwargs``), needs flash_attn for its
RMSNorm and RoPE type "default" (which 5.x's ``ROPE_INIT_FUNCTIONS`` dropped), and 5.x leaves
its non-persistent ``inv_freq`` uninitialised; tests/test_export_sdar.py opens an export with it
under stand-ins for exactly those four and matches d1jax's logits.
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

# Where the vendored files come from (hf_remote/sdar/SOURCE.md says the same).
SOURCE = ("Gen-Verse/dLLM-RL", "10b4fd1cba83e4496c20585dc2fd01dc02f20255", "models/sdar/")

REMOTE_CODE = hf_files.RemoteCode(
    "SDAR", ("configuration_sdar.py", "modeling_sdar.py"),
    {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "JetAstra/SDAR-8B-Chat and Gen-Verse/TraDo-8B-Instruct", "d1jax.model.sdar.load_hf_checkpoint",
    keep_source=True,
    forward="`model(input_ids, attention_mask=<[B, 1, L, L] block-causal 0/1 mask>, "
            "position_ids=...).logits` is one pass whose row i predicts token i; the published "
            "modeling_sdar.py takes the block mask from its caller (JetAstra/SDAR generate.py "
            "builds it as tril(ones(blocks, blocks)) repeated block_size times along both axes).",
    directory="sdar",
    published=(f"the published `configuration_sdar.py` and `modeling_sdar.py` of {SOURCE[0]} "
               f"(`{SOURCE[2]}` at commit {SOURCE[1][:12]}, Apache-2.0), unchanged; they need "
               f"transformers 4.x (written from 4.52.4; 5.x has neither "
               f"`transformers.utils.LossKwargs` nor RoPE type \"default\", and it leaves their "
               f"non-persistent `inv_freq` uninitialised) and flash_attn (their RMSNorm)"))


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
