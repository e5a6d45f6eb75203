"""The layers of every family's blocks: RMSNorm, the (LoRA-capable) projection, the SwiGLU
MLP, RoPE.

Kernels are [in, out] (the transpose of torch's Linear weight); names follow the Hugging
Face ``modeling_llada.py``. Shape letters: B batch, L sequence, N heads, H head dim.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model import quant
from d1jax.model.lora import ADAPTER_NAMES, LoraConfig

Array = jax.Array
DType = Any

def _normal(std: float):
    return nn.initializers.normal(stddev=std)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back, then scaled (as modeling_llada.RMSLayerNorm)."""

    eps: float
    dtype: DType
    param_dtype: DType

    @nn.compact
    def __call__(self, x: Array) -> Array:
        w = self.param("weight", nn.with_logical_partitioning(nn.initializers.ones, (shd.NORM,)),
                       (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return w.astype(self.dtype) * y.astype(self.dtype)


def token_matmul(x: Array, w_io: Array) -> Array:
    """``x @ w_io`` for x [..., I]: [..., O], with x's leading axes merged into one.

    With one token axis the weight gradient ``x^T g`` is a plain matmul; with two (batch,
    length) XLA's CPU dot canonicalisation first copies g [tokens, O] into a transposed
    layout, a strided copy that costs more than the matmul itself at the vocabulary head.
    The merge is a free reshape on every backend (a batch-sharded leading axis stays
    sharded).
    """
    x_ti = x.reshape(-1, x.shape[-1])
    return (x_ti @ w_io).reshape(*x.shape[:-1], w_io.shape[-1])


class Proj(nn.Module):
    """A bias-free linear map ``x @ kernel`` with an optional LoRA branch.

    kernel is [in, out] (torch weight transposed). LoRA params ``lora_a`` [in, r] (he-uniform)
    and ``lora_b`` [r, out] (zeros) exist only when ``lora`` targets this projection.
    ``quant`` ("int8", "nf4"; d1jax.model.quant) stores the frozen kernel quantised instead,
    as ``quant.LEAVES[quant]``, dequantised to ``dtype`` for the matmul.
    """

    features: int
    axes: tuple[str, str]
    dtype: DType
    param_dtype: DType
    init_std: float = 0.02
    lora: LoraConfig | None = None
    quant: str = "none"

    def _quantized(self, d_in: int) -> dict[str, Array]:
        """The kernel's quantised leaves; at init, drawn as ``kernel`` would be, then quantised."""
        axes = quant.leaf_axes(self.quant, self.axes)
        drawn = None
        if not self.has_variable("params", next(iter(axes))):  # init (nn.scan hides the flag)
            w = _normal(self.init_std)(self.make_rng("params"), (d_in, self.features))
            drawn = quant.quantize(w, self.quant)
        specs = quant.leaf_specs(self.quant, d_in, self.features)

        def init(name):  # flax also calls it to check an existing leaf's shape
            s = specs[name]
            return lambda *_: drawn[name] if drawn is not None else jnp.zeros(s.shape, s.dtype)
        return {name: self.param(name, nn.with_logical_partitioning(init(name), names))
                for name, names in axes.items()}

    @nn.compact
    def __call__(self, x: Array, use_lora: bool = True, deterministic: bool = True) -> Array:
        if self.quant == "none":
            kernel = self.param("kernel", nn.with_logical_partitioning(
                _normal(self.init_std), self.axes), (x.shape[-1], self.features), self.param_dtype)
            y = token_matmul(x.astype(self.dtype), kernel.astype(self.dtype))
        else:  # dequantised here, inside the caller's program, where XLA can fuse it in
            kernel, scale = quant.matmul_operands(self._quantized(x.shape[-1]), self.dtype)
            y = token_matmul(x.astype(self.dtype), kernel)
            y = y if scale is None else y * scale
        if self.lora is None:
            return y
        r, adapter_dtype = self.lora.rank, jnp.dtype(self.lora.param_dtype)
        a = self.param("lora_a", nn.with_logical_partitioning(
            nn.initializers.he_uniform(), (self.axes[0], shd.LORA)), (x.shape[-1], r), adapter_dtype)
        b = self.param("lora_b", nn.with_logical_partitioning(
            nn.initializers.zeros, (shd.LORA, self.axes[1])), (r, self.features), adapter_dtype)
        if not use_lora:
            return y
        h = nn.Dropout(self.lora.dropout)(x, deterministic=deterministic)
        h = token_matmul(h.astype(self.dtype), a.astype(self.dtype))
        return y + self.lora.scale * token_matmul(h, b.astype(self.dtype))


def swiglu(proj, x_bld: Array, hidden: int, width: int, names: tuple[str, str, str],
           **kw: Any) -> Array:
    """The SwiGLU MLP ``down(silu(gate(x)) * up(x))`` [B, L, width] of a block, whose
    ``proj(name, features, axes)`` makes its named projections (gate, up, down in
    ``names``: LLaDA's ff_proj/up_proj/ff_out, Qwen's gate_proj/up_proj/down_proj); ``kw``
    (use_lora, deterministic) goes to each. Called inside the block's compact method, so
    the projections are the block's own submodules."""
    gate = proj(names[0], hidden, (shd.EMBED, shd.MLP))(x_bld, **kw)
    up = proj(names[1], hidden, (shd.EMBED, shd.MLP))(x_bld, **kw)
    hid = nn.with_logical_constraint(nn.silu(gate) * up, (shd.BATCH, shd.LENGTH, shd.ACT_MLP))
    return proj(names[2], width, (shd.MLP, shd.EMBED))(hid, **kw)


def rope_tables(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """sin, cos [..., H] in float32 for integer positions [...] (half-split layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    freqs = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.sin(freqs), jnp.cos(freqs)


def apply_rope(x_blnh: Array, sin_blh: Array, cos_blh: Array) -> Array:
    """Rotary embedding in float32 (LLaDA's rope_full_precision), rotate-half layout."""
    x = x_blnh.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    rot = jnp.concatenate([-x2, x1], axis=-1)
    out = x * cos_blh[:, :, None, :] + rot * sin_blh[:, :, None, :]
    return out.astype(x_blnh.dtype)
