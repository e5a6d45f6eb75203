"""A quantised frozen base for LoRA runs: int8 or NF4 storage of the block projections.

d1 trains LLaDA-8B with LoRA on a 4-bit NF4 base (bitsandbytes ``load_in_4bit``,
``bnb_4bit_quant_type="nf4"``, compute dtype bfloat16; diffu-grpo/diffu_grpo_train.py). Here
the block projections (every ``kernel`` below the layer stack) can be stored as

- ``"int8"``: weight-only int8 with one absmax scale per output channel:
  ``kernel_int8`` [..., in, out] int8 = round(W / s), ``kernel_scale`` [..., out] float32,
  s = max_in |W| / 127 (LLM.int8()'s row-wise absmax of the torch [out, in] weight).
- ``"nf4"``: bitsandbytes' NF4: blocks of 64 consecutive inputs of one output (the torch
  weight's rows, flattened, as bitsandbytes blocks them), each scaled by its absmax and
  rounded to the nearest of the 16 NormalFloat values (``NF4``): ``kernel_nf4``
  [..., in/2, out] uint8, two codes a byte (even input in the high nibble, as bitsandbytes
  packs), ``kernel_absmax`` [..., in/64 * out] float32 (the [in/64, out] scales flattened:
  a mesh axis that divides ``out`` divides it, where in/64 may be odd, e.g. Dream's
  3584 / 64 = 56 over fsdp 16). No double quantisation: the absmax
  costs 0.5 bit a weight instead of bitsandbytes' 0.127 (about 0.33 GB at 8B).

The output head, embeddings, norms, biases and LoRA adapters stay as they are:
bitsandbytes converts the ``nn.Linear`` modules except the output embedding
(transformers' ``get_keys_to_not_convert``: LLaDA's ``ff_out`` head, Dream's ``lm_head``).
The model (``layers.Proj`` with ``LoraConfig.base_quant``) reads these leaves and
dequantises them to its compute dtype inside the jitted program that reads them, where XLA
can fuse the conversion into the matmul's operand (int8: the scale multiplies the matmul's
output); no bfloat16 copy of the base is kept between steps.

Functions (params are plain pytrees, as everywhere in d1jax):

  quantize(kernel_io, scheme) -> {leaf name: array}       one kernel [..., in, out]
  dequantize(leaves, dtype=jnp.float32) -> kernel_io      its inverse, up to rounding
  quantize_base(params, scheme, shardings=None, donate=False) -> params  block kernels
  dequantize_base(params, dtype=None) -> params           back to ``kernel`` leaves (export)
  nbytes(tree) -> int                                     bytes of arrays or abstract arrays
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

SCHEMES = ("none", "int8", "nf4")
NF4_BLOCK = 64  # inputs per absmax (bitsandbytes' blocksize for 4-bit weights)
# bitsandbytes' NF4 code values (functional.get_4bit_type("nf4"), the CUDA kernels'
# dDequantizeNF4 table): quantiles of N(0, 1) scaled to [-1, 1], with an exact 0.
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
# The leaves that replace ``kernel`` under each scheme, and how their axes follow the
# kernel's logical axes (in, out): index 0 / 1 of those, in order.
LEAVES = {"int8": {"kernel_int8": (0, 1), "kernel_scale": (1,)},
          "nf4": {"kernel_nf4": (0, 1), "kernel_absmax": (0,)}}
_QUANT_NAMES = {n for leaves in LEAVES.values() for n in leaves}


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"base_quant={scheme!r}: choose one of {', '.join(SCHEMES)}")
    return scheme


def leaf_axes(scheme: str, axes: tuple[str, str]) -> dict[str, tuple[str, ...]]:
    """{leaf name: its logical axes} for a kernel of logical axes ``axes`` (in, out)."""
    return {name: tuple(axes[i] for i in idx) for name, idx in LEAVES[scheme].items()}


def leaf_specs(scheme: str, d_in: int, d_out: int) -> dict[str, jax.ShapeDtypeStruct]:
    """{leaf name: shape and dtype} of one [d_in, d_out] kernel's quantised leaves."""
    sds = jax.ShapeDtypeStruct
    if scheme == "int8":
        return {"kernel_int8": sds((d_in, d_out), jnp.int8),
                "kernel_scale": sds((d_out,), jnp.float32)}
    _check_nf4_rows(d_in)
    return {"kernel_nf4": sds((d_in // 2, d_out), jnp.uint8),
            "kernel_absmax": sds((d_in // NF4_BLOCK * d_out,), jnp.float32)}


def _check_nf4_rows(d_in: int) -> None:
    if d_in % NF4_BLOCK:
        raise ValueError(f"base_quant='nf4' needs every quantised projection's input size to "
                         f"be a multiple of {NF4_BLOCK} (its block), got {d_in}: use int8 or "
                         "a wider model")


def quantize(kernel_io: jax.Array, scheme: str) -> dict[str, jax.Array]:
    """The ``scheme``'s leaves (``LEAVES``) of a kernel [..., in, out]; leading axes (the
    layer stack) are kept. Computed in float32."""
    w = jnp.asarray(kernel_io).astype(jnp.float32)
    if scheme == "int8":
        absmax = jnp.max(jnp.abs(w), axis=-2)
        scale = jnp.where(absmax > 0, absmax / 127.0, 1.0)
        q = jnp.clip(jnp.round(w / scale[..., None, :]), -127, 127).astype(jnp.int8)
        return {"kernel_int8": q, "kernel_scale": scale}
    if scheme != "nf4":
        raise ValueError(f"quantize: scheme {scheme!r} is not one of {SCHEMES[1:]}")
    *lead, d_in, d_out = w.shape
    _check_nf4_rows(d_in)
    blocks = w.reshape(*lead, d_in // NF4_BLOCK, NF4_BLOCK, d_out)
    absmax = jnp.max(jnp.abs(blocks), axis=-2)
    x = blocks / jnp.where(absmax > 0, absmax, 1.0)[..., None, :]
    # Nearest code: the count of midpoints below x (a tie goes to the lower code, as
    # bitsandbytes' dQuantizeNF4 decision tree); 15 fused compares, no [..., 16] tensor.
    mids = (np.asarray(NF4[1:]) + np.asarray(NF4[:-1])) / 2
    code = sum((x > float(m)).astype(jnp.uint8) for m in mids)
    code = code.reshape(*lead, d_in // 2, 2, d_out)
    packed = (code[..., 0, :] << 4) | code[..., 1, :]
    return {"kernel_nf4": packed.astype(jnp.uint8),
            "kernel_absmax": absmax.reshape(*lead, d_in // NF4_BLOCK * d_out)}


def scheme_of(leaves) -> str | None:
    """The scheme whose leaves ``leaves`` (a dict) holds, or None."""
    for scheme, names in LEAVES.items():
        if all(n in leaves for n in names):
            return scheme
    return None


def nf4_codes(packed: jax.Array) -> jax.Array:
    """The 4-bit codes [..., in, out] (uint8 0..15) of packed NF4 storage [..., in/2, out]."""
    codes = jnp.stack([packed >> 4, packed & 15], axis=-2)
    return codes.reshape(*packed.shape[:-2], 2 * packed.shape[-2], packed.shape[-1])


def matmul_operands(leaves, dtype: Any) -> tuple[jax.Array, jax.Array | None]:
    """(kernel [..., in, out] in ``dtype``, output scale [..., out] or None): ``x @ kernel``
    times the scale is ``x @ W``. int8 applies its per-output scale after the matmul (the
    int8 values are exact in bfloat16); NF4 dequantises per block before it."""
    if scheme_of(leaves) == "int8":
        return leaves["kernel_int8"].astype(dtype), leaves["kernel_scale"].astype(dtype)
    return dequantize(leaves, dtype), None


def dequantize(leaves, dtype: Any = jnp.float32) -> jax.Array:
    """The kernel [..., in, out] in ``dtype`` from its quantised leaves (either scheme);
    the products are taken in float32, then cast."""
    scheme = scheme_of(leaves)
    if scheme == "int8":
        w = leaves["kernel_int8"].astype(jnp.float32) * leaves["kernel_scale"][..., None, :]
        return w.astype(dtype)
    if scheme != "nf4":
        raise ValueError(f"dequantize: leaves {sorted(leaves)} are no quantised kernel")
    codes = nf4_codes(leaves["kernel_nf4"])
    *lead, d_in, d_out = codes.shape
    absmax = leaves["kernel_absmax"].astype(jnp.float32).reshape(*lead, d_in // NF4_BLOCK, d_out)
    values = jnp.asarray(NF4, jnp.float32)[codes.astype(jnp.int32)]
    blocks = values.reshape(*lead, d_in // NF4_BLOCK, NF4_BLOCK, d_out) * absmax[..., None, :]
    return blocks.reshape(*lead, d_in, d_out).astype(dtype)


def is_base_kernel(path: tuple[str, ...]) -> bool:
    """A block projection's kernel: a ``kernel`` below the layer stack (``blocks/q_proj/
    kernel``, ``layers/down_proj/kernel``); a top-level one (the output head) is not."""
    return len(path) >= 3 and path[-1] == "kernel"


def quantize_base(params, scheme: str, shardings=None, donate: bool = False):
    """``params`` with every block projection's kernel replaced by its ``scheme`` leaves
    (``"none"``: unchanged). Other leaves (embeddings, head, norms, adapters) are kept.

    One kernel at a time; with ``donate`` each is deleted once quantised (the caller must
    hold no other use for it), so the full-precision copy does not stay resident (the
    loader's path: load, quantise, join the adapters). ``shardings``: an optional
    tree of the quantised model's param shardings (``sharding.param_shardings``) that the
    new leaves are placed by; without it XLA chooses.
    """
    check_scheme(scheme)
    if scheme == "none":
        return params
    flat = traverse_util.flatten_dict(dict(params))
    target = traverse_util.flatten_dict(dict(shardings)) if shardings is not None else {}
    out = {}
    for path, leaf in flat.items():
        if not is_base_kernel(path):
            out[path] = leaf
            continue
        names = tuple(LEAVES[scheme])
        outs = tuple(target.get(path[:-1] + (n,)) for n in names)
        fn = jax.jit(lambda w: tuple(quantize(w, scheme)[n] for n in names),
                     out_shardings=outs if all(s is not None for s in outs) else None)
        for name, value in zip(names, fn(leaf)):
            out[path[:-1] + (name,)] = value
        if donate and isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()
    return traverse_util.unflatten_dict(out)


def is_quantized(params) -> bool:
    """Whether ``params`` holds quantised kernels."""
    return any(p[-1] in _QUANT_NAMES for p in traverse_util.flatten_dict(dict(params)))


def dequantize_base(params, dtype: Any = None):
    """``params`` with quantised kernels back as ``kernel`` leaves (e.g. to merge adapters
    and export), in ``dtype``; None: the dtype of the base's float leaves (the embedding's,
    i.e. the model's ``param_dtype``). Unquantised params are returned as they are."""
    flat = traverse_util.flatten_dict(dict(params))
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    out = {}
    for path, leaf in flat.items():
        if path[-1] in _QUANT_NAMES:
            groups.setdefault(path[:-1], {})[path[-1]] = leaf
        else:
            out[path] = leaf
    if not groups:
        return params
    if dtype is None:
        floats = [v.dtype for p, v in out.items() if jnp.issubdtype(v.dtype, jnp.floating)
                  and p[-1] not in ("lora_a", "lora_b")]
        dtype = floats[0] if floats else jnp.float32
    for parent, leaves in groups.items():
        out[parent + ("kernel",)] = jax.jit(dequantize, static_argnums=1)(leaves, dtype)
    return traverse_util.unflatten_dict(out)


def nbytes(tree) -> int:
    """Bytes of the arrays (or ``jax.ShapeDtypeStruct``s) in ``tree``; packed NF4 counts
    its true half byte a weight."""
    return int(sum(np.prod(x.shape, dtype=np.int64) * jnp.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))
