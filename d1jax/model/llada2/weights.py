"""LLaDA2 checkpoints in both published layouts: the key maps, load, save.

Users meet two layouts of the same weights (torch Linear weights [out, in]; our kernels
[in, out]; ``j`` a global layer, ``i`` its index in its stack, ``e`` an expert):

  model.word_embeddings.weight                    [V, D]      -> word_embeddings/embedding
  model.layers.{j}.attention.query_key_value.weight [(N+2K)H, D] -> {stack}/query_key_value/kernel[i]
  model.layers.{j}.attention.{query,key}_layernorm.weight [H] -> {stack}/{..}_layernorm/weight[i]
  model.layers.{j}.attention.dense.weight         [D, NH]     -> {stack}/dense/kernel[i]
      (.bias of query_key_value if use_qkv_bias, of dense if use_bias)
  model.layers.{j}.{input,post_attention}_layernorm.weight [D] -> {stack}/{..}/weight[i]
  dense layers (j < first_k_dense_replace), stack dense_layers:
  model.layers.{j}.mlp.{gate,up,down}_proj.weight             -> dense_layers/{p}/kernel[i]
  MoE layers, stack moe_layers:
  model.layers.{j}.mlp.gate.weight                [E, D]      -> moe_layers/gate/kernel[i]
  model.layers.{j}.mlp.gate.expert_bias           [E]         -> moe_layers/gate/expert_bias[i]
  model.layers.{j}.mlp.shared_experts.{p}.weight              -> moe_layers/shared_experts/{p}/kernel[i]
  "hub" (inclusionAI/LLaDA2.0-*, model_type "llada2_moe"), one tensor per expert:
  model.layers.{j}.mlp.experts.{e}.{gate,up}_proj.weight [I, D] -> moe_layers/experts/{p}[i, e]
  model.layers.{j}.mlp.experts.{e}.down_proj.weight      [D, I] -> moe_layers/experts/down_proj[i, e]
  "merged" (dFactory ``scripts/moe_convertor.py`` merge, model_type "llada2_moe_veomni"):
  model.layers.{j}.mlp.experts.{gate,up}_proj     [E, I, D]   -> moe_layers/experts/{p}[i]
  model.layers.{j}.mlp.experts.down_proj          [E, D, I]   -> moe_layers/experts/down_proj[i]
  model.norm.weight [D] -> norm/weight;  lm_head.weight [V, D] -> lm_head/kernel

Every "transposed" entry swaps the last two axes (a merged expert tensor keeps its expert
axis first). Loading finds the layout from the keys; the key set must match the config's
exactly and every shape is checked before anything is read. Each device reads only its shard.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from d1jax import sharding as shd
from d1jax.model import hf_checkpoint as hf
from d1jax.model import hf_files
from d1jax.model.llada2.config import LLaDA2Config
from d1jax.model.llada2.model import LLaDA2
from d1jax.model.lora import LoraConfig

LAYOUTS = ("hub", "merged")
MODEL_TYPE = {"hub": "llada2_moe", "merged": "llada2_moe_veomni"}
EMBEDDING = "model.word_embeddings.weight"
EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")

# Where the vendored files come from (hf_remote/llada2/SOURCE.md says the same).
SOURCE = ("inclusionAI/dFactory", "92b6890808088b112fcf5fc73a341b78b6ab76bf", "models/llada2_moe/")

# The published code, vendored unchanged: an export without a source directory ships it; one
# from a Hub download ships that directory's own files instead (keep_source).
REMOTE_CODE = hf_files.RemoteCode(
    "LLaDA2", ("configuration_llada2_moe.py", "modeling_llada2_moe.py", "parallel_plan.py"),
    {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
     "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
    "inclusionAI/LLaDA2.0-mini and -flash", "d1jax.model.llada2.load_hf_checkpoint",
    keep_source=True,
    forward="`model(input_ids, attention_mask=<[B, 1, L, L] block-causal 0/1 mask>, "
            "position_ids=...).logits`: row i predicts token i (their generate builds the mask "
            "as tril(ones(blocks, blocks)) repeated block_length times along both axes).",
    directory="llada2",
    published=(f"the published `configuration_llada2_moe.py`, `modeling_llada2_moe.py` and "
               f"`parallel_plan.py` (which the modeling file imports for expert parallelism) of "
               f"{SOURCE[0]} (`{SOURCE[2]}` at commit {SOURCE[1][:12]}, Apache-2.0), "
               f"unchanged; the modeling file imports VeOmni (`veomni`, whose fused MoE kernel "
               f"only the merged layout's model_type \"llada2_moe_veomni\" runs) and was "
               f"written against transformers 4.x"))

# HF key -> (param path, grid index: () / (layer,) / (layer, expert), swap the last two axes?)
KeyMap = dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]]


def _layer_keys(config: LLaDA2Config, j: int, layout: str) -> KeyMap:
    """The keys of global layer ``j``."""
    moe = j >= config.n_dense
    stack, i = ("moe_layers", j - config.n_dense) if moe else ("dense_layers", j)
    pre = f"model.layers.{j}."
    out: KeyMap = {}

    def put(key, *path, swap=False, grid=None):
        out[pre + key] = ((stack,) + path, (i,) if grid is None else grid, swap)
    put("attention.query_key_value.weight", "query_key_value", "kernel", swap=True)
    if config.use_qkv_bias:
        put("attention.query_key_value.bias", "query_key_value", "bias")
    put("attention.query_layernorm.weight", "query_layernorm", "weight")
    put("attention.key_layernorm.weight", "key_layernorm", "weight")
    put("attention.dense.weight", "dense", "kernel", swap=True)
    if config.use_bias:
        put("attention.dense.bias", "dense", "bias")
    if not moe:
        for p in EXPERT_PROJ:
            put(f"mlp.{p}.weight", p, "kernel", swap=True)
    else:
        put("mlp.gate.weight", "gate", "kernel", swap=True)
        put("mlp.gate.expert_bias", "gate", "expert_bias")
        for p in EXPERT_PROJ:
            if layout == "merged":
                put(f"mlp.experts.{p}", "experts", p, swap=True)
            else:
                for e in range(config.num_experts):
                    put(f"mlp.experts.{e}.{p}.weight", "experts", p, swap=True, grid=(i, e))
        if config.num_shared_experts:
            for p in EXPERT_PROJ:
                put(f"mlp.shared_experts.{p}.weight", "shared_experts", p, "kernel", swap=True)
    put("input_layernorm.weight", "input_layernorm", "weight")
    put("post_attention_layernorm.weight", "post_attention_layernorm", "weight")
    return out


def key_map(config: LLaDA2Config, layout: str = "hub") -> KeyMap:
    """HF key -> (param path, grid index, swapped?), in checkpoint order, of ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: one of {LAYOUTS}")
    out: KeyMap = {EMBEDDING: (("word_embeddings", "embedding"), (), False)}
    for j in range(config.num_hidden_layers):
        out.update(_layer_keys(config, j, layout))
    out["model.norm.weight"] = (("norm", "weight"), (), False)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head", "kernel"), (), True)
    return out


def detect_layout(keys) -> str:
    """"merged" when the checkpoint holds stacked expert tensors, else "hub"."""
    return "merged" if any(k.endswith(".mlp.experts.gate_proj") for k in keys) else "hub"


def _swap(shape_or_array, swap: bool):
    if not swap:
        return shape_or_array
    if isinstance(shape_or_array, tuple):
        return shape_or_array[:-2] + shape_or_array[-2:][::-1]
    return np.swapaxes(shape_or_array, -1, -2)


def check_keys(expected: KeyMap, shapes: Mapping[tuple, tuple], where: Mapping[str, Any],
               ignorable=frozenset(), what: str = "LLaDA2 checkpoint keys do not match the config"
               ) -> None:
    """CheckpointError unless the checkpoint holds exactly ``expected``'s keys (``ignorable``
    may be there too), each with the shape the config gives it; ``what`` opens the message
    (LLaDA-MoE's key map shares this check)."""
    missing = sorted(set(expected) - set(where))
    unexpected = sorted(set(where) - set(expected) - set(ignorable))
    if missing or unexpected:
        raise hf.CheckpointError(
            f"{what}: missing {missing[:6]} "
            f"({len(missing)}), unexpected {unexpected[:6]} ({len(unexpected)})")
    for key, (ppath, grid, swap) in expected.items():
        want = _swap(tuple(shapes[ppath][len(grid):]), swap)
        got = where[key].shape(key)
        if got != want:
            raise hf.CheckpointError(f"{key}: shape {got} in the checkpoint, config needs {want}")


def _reader(where, keys: Mapping[tuple, str], ndim_grid: int, swap: bool, shape, dtype):
    """A callback reading one device shard (index: slices over the param's axes)."""
    def read(index):
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        ranges = [range(shape[a])[index[a]] for a in range(ndim_grid)]
        tiles = [np.asarray(_swap(where[keys[g]].array(keys[g]), swap)[index[ndim_grid:]])
                 for g in itertools.product(*ranges)]
        out = np.stack(tiles) if ndim_grid else tiles[0]
        return out.reshape([len(r) for r in ranges] + list(out.shape[1 if ndim_grid else 0:]))\
            .astype(dtype)
    return read


def source_layout(source_dir: str | os.PathLike | None) -> str:
    """The layout of the checkpoint at ``source_dir`` by its config.json's model_type ("hub"
    without one): an export keeps the layout its run loaded."""
    cfg = None if source_dir is None else Path(source_dir) / "config.json"
    if cfg is None or not cfg.is_file():
        return "hub"
    model_type = json.loads(cfg.read_text()).get("model_type")
    return next((k for k, v in MODEL_TYPE.items() if v == model_type), "hub")


def read_config(path: str | os.PathLike) -> LLaDA2Config:
    """The ``LLaDA2Config`` of a checkpoint directory's config.json."""
    return hf.read_config(path, LLaDA2Config.from_hf_dict, wrap_unsupported=True)


def load_hf_checkpoint(path: str | os.PathLike, mesh: Mesh | None = None,
                       dtype: Any = jnp.float32, rules=shd.DEFAULT_RULES,
                       ) -> tuple[LLaDA2Config, dict[str, Any]]:
    """Loads a LLaDA2 checkpoint directory of either layout, each param placed with the
    sharding the rules give it over ``mesh``; (config, params for ``LLaDA2(config).apply``).
    The router's ``expert_bias`` stays float32 whatever ``dtype``."""
    config = read_config(path)
    where = hf.open_checkpoint(path)
    expected = key_map(config, detect_layout(where))
    model = LLaDA2(config)
    shapes = hf.param_shapes(model)
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    check_keys(expected, shapes, where, ignorable)
    shardings = shd.param_shardings(model, mesh, rules) if mesh is not None else None
    by_param: dict[tuple, dict[tuple, str]] = {}
    swaps = {}
    for key, (ppath, grid, swap) in expected.items():
        by_param.setdefault(ppath, {})[grid] = key
        swaps[ppath] = swap
    params: dict[str, Any] = {}
    for ppath, keys in by_param.items():
        ndim_grid = len(next(iter(keys)))
        sharding = (hf.get_path(shardings, ppath) if shardings is not None
                    else SingleDeviceSharding(jax.local_devices()[0]))
        dt = jnp.float32 if ppath[-1] == "expert_bias" else dtype
        read = _reader(where, keys, ndim_grid, swaps[ppath], shapes[ppath], dt)
        hf.set_path(params, ppath, jax.make_array_from_callback(shapes[ppath], sharding, read))
    return config, params


class _Slices:
    """A lazily sliced stack for ``hf.write_checkpoint``: item i is ``fn(stack[i])``."""

    def __init__(self, stack, fn, shape):
        self.stack, self.fn, self.shape, self.dtype = stack, fn, shape, stack.dtype

    def __getitem__(self, i):
        return self.fn(self.stack[i])


def _entry(params, ppath, grid, swap):
    """``write_checkpoint``'s (array, layer, transposed) of one key."""
    arr = hf.get_path(params, ppath)
    if not grid:
        return arr, None, swap
    fix = (lambda a: jnp.swapaxes(a, -1, -2)) if swap else (lambda a: a)
    if len(grid) == 1:
        shape = (arr.shape[0],) + _swap(tuple(arr.shape[1:]), swap)
        return _Slices(arr, fix, shape), grid[0], False
    e = grid[1]
    shape = (arr.shape[0],) + _swap(tuple(arr.shape[2:]), swap)
    return _Slices(arr, lambda a: fix(a[e]), shape), grid[0], False


def save_hf_checkpoint(path: str | os.PathLike, config: LLaDA2Config,
                       params: Mapping[str, Any], max_shard_size: int | str = "5GB",
                       dtype: Any = None, *, source_dir: str | os.PathLike | None = None,
                       tokenizer: Any = None, lora: LoraConfig | None = None,
                       layout: str | None = None) -> None:
    """Writes params in ``layout`` ("hub": per-expert tensors, model_type "llada2_moe";
    "merged": dFactory's stacked experts, "llada2_moe_veomni"; None: ``source_dir``'s layout,
    "hub" without one), atomically, LoRA adapters merged with ``lora``; ``source_dir``'s
    generation config, tokenizer and code copied."""
    if layout is None:
        layout = source_layout(source_dir)
    params = hf._merged(params, lora)
    entries = [(k, _entry(params, p, g, s)) for k, (p, g, s) in key_map(config, layout).items()]

    def finish(tmp: Path) -> None:
        d = config.to_hf_dict(MODEL_TYPE[layout])
        d["auto_map"] = hf_files.copy_companions(source_dir, tmp, tokenizer, REMOTE_CODE)
        (tmp / "config.json").write_text(json.dumps(d, indent=2))

    hf.write_checkpoint(Path(path), entries, max_shard_size, dtype, finish)
