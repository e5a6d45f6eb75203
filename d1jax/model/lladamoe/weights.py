"""LLaDA-MoE checkpoints as the Hub publishes them (inclusionAI/LLaDA-MoE-7B-A1B-*): the key
map, load, save. Torch Linear weights are [out, in], our kernels [in, out]; ``j`` a global
layer, ``i`` its index in its stack, ``e`` an expert:

  model.embed_tokens.weight                          [V, D]  -> embed_tokens/embedding
  model.layers.{j}.self_attn.{q,k,v,o}_proj.weight           -> {stack}/{p}/kernel[i]
      (.bias of each when attention_bias)
  model.layers.{j}.self_attn.{q,k}_norm.weight       [H]     -> {stack}/{q,k}_norm/weight[i]
      (when qk_layernorm)
  model.layers.{j}.{input,post_attention}_layernorm.weight   -> {stack}/{..}/weight[i]
  dense layers (moe_layer_freq 0), stack dense_layers:
  model.layers.{j}.mlp.{gate,up,down}_proj.weight            -> dense_layers/{p}/kernel[i]
  MoE layers (moe_layer_freq 1), stack moe_layers:
  model.layers.{j}.mlp.gate.weight                   [E, D]  -> moe_layers/gate/kernel[i]
  model.layers.{j}.mlp.expert_bias                   [E]     -> moe_layers/gate/expert_bias[i]
      (the buffer, when moe_router_enable_expert_bias)
  model.layers.{j}.mlp.experts.{e}.{gate,up}_proj.weight [I, D] -> moe_layers/experts/{p}[i, e]
  model.layers.{j}.mlp.experts.{e}.down_proj.weight  [D, I]  -> moe_layers/experts/down_proj[i, e]
  model.layers.{j}.shared_expert.{p}.weight  (on the layer, not under mlp; when
      shared_expert_intermediate_size)                       -> moe_layers/shared_expert/{p}/kernel[i]
  model.norm.weight [D] -> norm/weight;  lm_head.weight [V, D] -> lm_head/kernel

The key set must match the config's exactly and every shape is checked before anything is
read; each device reads only its shard (LLaDA2's streaming readers,
``d1jax.model.llada2.weights``). dInfer's fused layout (``tools/transfer.py``: ``mlp.w1``
[E, 2I, D], ``mlp.w2`` [E, D, I]) is not read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, SingleDeviceSharding

from d1jax import sharding as shd
from d1jax.model import hf_checkpoint as hf
from d1jax.model import hf_files
from d1jax.model.llada2.weights import KeyMap, _entry, _reader, check_keys
from d1jax.model.lladamoe.config import MODEL_TYPES, LLaDAMoEConfig
from d1jax.model.lladamoe.model import LLaDAMoE
from d1jax.model.lora import LoraConfig

EMBEDDING = "model.embed_tokens.weight"
PROJ = ("gate_proj", "up_proj", "down_proj")

# No code of theirs is vendored: an export from a Hub download ships that directory's own
# configuration_lladamoe.py / modeling_lladamoe.py (keep_source); a random init's ships none.
REMOTE_CODE = hf_files.RemoteCode(
    "LLaDA-MoE", (), {}, "inclusionAI/LLaDA-MoE-7B-A1B-Base and -Instruct",
    "d1jax.model.lladamoe.load_hf_checkpoint", keep_source=True,
    forward="`model(input_ids).logits`: full attention, row i predicts token i (their forward "
            "ignores attention_mask).")


def _layer_keys(config: LLaDAMoEConfig, j: int) -> KeyMap:
    """The keys of global layer ``j``."""
    moe = j >= config.n_dense
    stack, i = ("moe_layers", j - config.n_dense) if moe else ("dense_layers", j)
    pre = f"model.layers.{j}."
    out: KeyMap = {}

    def put(key, *path, swap=False, grid=None):
        out[pre + key] = ((stack,) + path, (i,) if grid is None else grid, swap)
    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
        put(f"self_attn.{p}.weight", p, "kernel", swap=True)
        if config.attention_bias:
            put(f"self_attn.{p}.bias", p, "bias")
    if config.qk_layernorm:
        put("self_attn.q_norm.weight", "q_norm", "weight")
        put("self_attn.k_norm.weight", "k_norm", "weight")
    if not moe:
        for p in PROJ:
            put(f"mlp.{p}.weight", p, "kernel", swap=True)
    else:
        put("mlp.gate.weight", "gate", "kernel", swap=True)
        if config.moe_router_enable_expert_bias:
            put("mlp.expert_bias", "gate", "expert_bias")
        for p in PROJ:
            for e in range(config.num_experts):
                put(f"mlp.experts.{e}.{p}.weight", "experts", p, swap=True, grid=(i, e))
        if config.shared_expert_intermediate_size:
            for p in PROJ:
                put(f"shared_expert.{p}.weight", "shared_expert", p, "kernel", swap=True)
    put("input_layernorm.weight", "input_layernorm", "weight")
    put("post_attention_layernorm.weight", "post_attention_layernorm", "weight")
    return out


def key_map(config: LLaDAMoEConfig) -> KeyMap:
    """HF key -> (param path, grid index, swapped?), in checkpoint order."""
    out: KeyMap = {EMBEDDING: (("embed_tokens", "embedding"), (), False)}
    for j in range(config.num_hidden_layers):
        out.update(_layer_keys(config, j))
    out["model.norm.weight"] = (("norm", "weight"), (), False)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head", "kernel"), (), True)
    return out


def read_config(path: str | os.PathLike) -> LLaDAMoEConfig:
    """The ``LLaDAMoEConfig`` of a checkpoint directory's config.json."""
    return hf.read_config(path, LLaDAMoEConfig.from_hf_dict, wrap_unsupported=True)


def load_hf_checkpoint(path: str | os.PathLike, mesh: Mesh | None = None,
                       dtype: Any = jnp.float32, rules=shd.DEFAULT_RULES,
                       ) -> tuple[LLaDAMoEConfig, dict[str, Any]]:
    """Loads a LLaDA-MoE checkpoint directory, each param placed with the sharding the rules
    give it over ``mesh``; (config, params for ``LLaDAMoE(config).apply``). The router's
    ``expert_bias`` stays float32 whatever ``dtype``."""
    config = read_config(path)
    where = hf.open_checkpoint(path)
    expected = key_map(config)
    model = LLaDAMoE(config)
    shapes = hf.param_shapes(model)
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    check_keys(expected, shapes, where, ignorable,
               "LLaDA-MoE checkpoint keys do not match its config.json")
    shardings = shd.param_shardings(model, mesh, rules) if mesh is not None else None
    by_param: dict[tuple, dict[tuple, str]] = {}
    swaps = {}
    for key, (ppath, grid, swap) in expected.items():
        by_param.setdefault(ppath, {})[grid] = key
        swaps[ppath] = swap
    params: dict[str, Any] = {}
    for ppath, keys in by_param.items():
        sharding = (hf.get_path(shardings, ppath) if shardings is not None
                    else SingleDeviceSharding(jax.local_devices()[0]))
        dt = jnp.float32 if ppath[-1] == "expert_bias" else dtype
        read = _reader(where, keys, len(next(iter(keys))), swaps[ppath], shapes[ppath], dt)
        hf.set_path(params, ppath, jax.make_array_from_callback(shapes[ppath], sharding, read))
    return config, params


def source_model_type(source_dir: str | os.PathLike | None) -> str:
    """The model_type an export writes: its source's (the published "llada" or dllm's
    "lladamoe"), "lladamoe" without one (what d1jax's family detection reads)."""
    cfg = None if source_dir is None else Path(source_dir) / "config.json"
    if cfg is not None and cfg.is_file():
        found = json.loads(cfg.read_text()).get("model_type")
        if found in MODEL_TYPES:
            return found
    return "lladamoe"


def save_hf_checkpoint(path: str | os.PathLike, config: LLaDAMoEConfig,
                       params: Mapping[str, Any], max_shard_size: int | str = "5GB",
                       dtype: Any = None, *, source_dir: str | os.PathLike | None = None,
                       tokenizer: Any = None, lora: LoraConfig | None = None) -> None:
    """Writes params in the Hub's layout, atomically, LoRA adapters merged with ``lora``;
    ``source_dir``'s generation config, tokenizer and code copied, its model_type kept."""
    params = hf._merged(params, lora)
    entries = [(k, _entry(params, p, g, s)) for k, (p, g, s) in key_map(config).items()]

    def finish(tmp: Path) -> None:
        d = config.to_hf_dict(source_model_type(source_dir))
        d["auto_map"] = hf_files.copy_companions(source_dir, tmp, tokenizer, REMOTE_CODE)
        if not d["auto_map"]:
            del d["auto_map"]
        (tmp / "config.json").write_text(json.dumps(d, indent=2))

    hf.write_checkpoint(Path(path), entries, max_shard_size, dtype, finish)
