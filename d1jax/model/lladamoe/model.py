"""LLaDA-MoE (inclusionAI LLaDA-MoE-7B-A1B) as a pure Flax linen module.

The decoder of their ``modeling_lladamoe.py`` (``LLaDAMoEModelLM``, OLMoE's code with the causal
mask removed): ``embed_tokens``; per layer x + Attn(RMSNorm(x)), then + FFN(RMSNorm(.));
final RMSNorm; an untied ``lm_head``. Attention: ``q_proj``/``k_proj``/``v_proj`` (GQA,
head_dim = D / N; biases when ``attention_bias``), an RMSNorm over each head's H features
of q and of k (``q_norm``/``k_norm``, weight [H], when ``qk_layernorm``: their attention
reshapes to [-1, head_dim] before the norm, unlike OLMoE's norm over the whole projection),
a clamp of q, k, v to ``clip_qkv``, RoPE (rotate-half, theta ``rope_theta``) on the first
``rotary_dim = head_dim * partial_rotary_factor`` features, softmax in float32, ``o_proj``.
The attention is full (bidirectional): their forward sets the mask to None whatever the
caller passes; here a given ``attention_mask`` hides padding keys (as d1jax's LLaDA does), so
unpadded rows are theirs exactly. Positions are 0..L-1, theirs by default.

FFN by ``moe_layer_freq``: a SwiGLU of width ``dense_intermediate_size`` (0), or their
``LLaDAMoESparseMoeBlock`` (1): router logits, softmax in float32 over the experts, plus the
``expert_bias`` buffer when ``moe_router_enable_expert_bias``; the top ``num_experts_per_tok``
of those values choose the experts AND weigh them (the bias included, no renormalisation:
their block hard-codes ``norm_topk_prob = False``); the routed experts run dropless through
``d1jax.model.llada2.moe`` (``jax.lax.ragged_dot``, the expert-axis shard_map, summed in
float32, the shards' sum too: ``moe.experts_forward``); plus the layer's ``shared_expert``
SwiGLU when ``shared_expert_intermediate_size``.
The router logits are float32 (dInfer's vLLM model runs its gate in float32; their HF file in
the model dtype: the same in a float32 run).

Parameter names are the checkpoint's with ``model.``/``self_attn.``/``mlp.`` dropped; kernels
[in, out]; the dense layers stacked under ``dense_layers``, the MoE layers under
``moe_layers`` (two ``nn.scan``s): the body is LLaDA2's (``d1jax.model.llada2.stack``), with
this family's layer, embedding name, mask and positions. Router metrics are sown as LLaDA2's
(``router_load``, ``router_entropy`` of the softmax probabilities, ``router_ids``;
``MoEPredictor.step_metrics`` summarises them); ``hidden(..., routing=)`` replays recorded
experts as LLaDA2's does.

Shape letters: B batch, L sequence, D hidden, N query heads, K kv heads, H head dim, V vocab.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model.attention import attention
from d1jax.model.kv_cache import KVCache, attend_cached
from d1jax.model.layers import Proj, RMSNorm, swiglu
from d1jax.model.llada2 import moe
from d1jax.model.llada2.model import SwiGLU, partial_rope
from d1jax.model.llada2.stack import MoEPredictor
from d1jax.model.lladamoe.config import LLaDAMoEConfig
from d1jax.model.lora import LoraConfig
from d1jax.model.qwen import BiasedProj

Array = jax.Array
DType = Any
F32 = jnp.float32


def route(x_td: Array, kernel_de: Array, bias_e: Array | None, top_k: int
          ) -> tuple[Array, Array, Array]:
    """(expert ids [T, K] int32, weights [T, K] float32, probabilities [T, E] float32) of
    their softmax router: softmax(x W) (+ bias), top-k of that; the bias is a buffer."""
    probs = jax.nn.softmax(jnp.matmul(x_td.astype(F32), kernel_de.astype(F32)), axis=-1)
    scores = probs if bias_e is None else probs + jax.lax.stop_gradient(bias_e.astype(F32))
    w, ids = jax.lax.top_k(scores, top_k)
    return ids.astype(jnp.int32), w, probs


def replay(ids_tk: Array, probs_te: Array, bias_e: Array | None, recorded_tk: Array
           ) -> tuple[Array, Array, Array]:
    """Routing replay: (the recorded experts where a token has a record (>= 0), else its
    current ones; their weights (probability + bias) under the current router; changed [T])."""
    used = jnp.where(recorded_tk[:, :1] >= 0, recorded_tk.astype(jnp.int32), ids_tk)
    scores = probs_te if bias_e is None else probs_te + jax.lax.stop_gradient(bias_e.astype(F32))
    missing = ~jnp.any(used[:, :, None] == ids_tk[:, None, :], axis=-1)
    return used, jnp.take_along_axis(scores, used, axis=1), jnp.any(missing, axis=-1)


class Router(nn.Module):
    """``kernel`` [D, E] (their ``gate.weight`` transposed) and, when enabled, ``expert_bias``
    [E] (their buffer, float32; no gradient reaches it)."""

    n_experts: int
    init_std: float
    param_dtype: Any
    with_bias: bool

    @nn.compact
    def __call__(self, width: int) -> tuple[Array, Array | None]:
        kernel = self.param("kernel", nn.with_logical_partitioning(
            nn.initializers.normal(self.init_std), (shd.EMBED, None)),
            (width, self.n_experts), self.param_dtype)
        bias = self.param("expert_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, (None,)), (self.n_experts,), F32) if self.with_bias else None
        return kernel, bias


class LLaDAMoEBlock(nn.Module):
    """One LLaDA-MoE decoder layer (dense FFN, or MoE when ``is_moe``); returns (x, kv)."""

    config: LLaDAMoEConfig
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None = None
    is_moe: bool = False

    def _proj(self, name: str, features: int, axes: tuple[str, str], bias: bool = False):
        lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
        return (BiasedProj if bias else Proj)(
            features, axes, self.dtype, self.param_dtype, init_std=self.config.initializer_range,
            lora=lora, name=name, quant=self.lora.base_quant if self.lora is not None else "none")

    def _attention(self, xn: Array, rope: tuple[Array, Array], mask: Any, kw: dict,
                   cached: dict | None) -> tuple[Array, KVCache]:
        c = self.config
        n, k, h, bias = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.attention_bias
        b, l = xn.shape[:2]
        f = l if cached is None or cached["n_fresh"] is None else cached["n_fresh"]
        q = self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS), bias)(xn, **kw)
        kk = self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias)(xn[:, :f], **kw)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias)(xn[:, :f], **kw)
        q, kk, v = q.reshape(b, l, n, h), kk.reshape(b, f, k, h), v.reshape(b, f, k, h)
        if c.qk_layernorm:  # per head: their norm runs on reshape(-1, head_dim)
            norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
            q, kk = norm(name="q_norm")(q), norm(name="k_norm")(kk)
        if c.clip_qkv is not None:
            q, kk, v = (jnp.clip(t, -c.clip_qkv, c.clip_qkv) for t in (q, kk, v))
        q = partial_rope(q, *rope)
        fresh = KVCache(partial_rope(kk, *(r[:, :f] for r in rope)), v)
        if cached is None:
            att, own = attention(q, fresh.k, fresh.v, mask, h ** -0.5), fresh
        else:
            att, own = attend_cached(q, fresh, cached["cache"], cached["q_start"], mask,
                                     cached["window"], cached["idx_bq"])
        out = self._proj("o_proj", c.hidden_size, (shd.Q_HEADS, shd.EMBED), bias)(
            att.reshape(b, l, n * h), **kw)
        return out, own

    def _moe(self, xn: Array, kw: dict, routing: Array | None) -> Array:
        c = self.config
        b, l, d = xn.shape
        kernel, bias = Router(c.num_experts, c.initializer_range, self.param_dtype,
                              bool(c.moe_router_enable_expert_bias), name="gate")(d)
        x_td = xn.reshape(b * l, d)
        ids, w, probs = route(x_td, kernel, bias, c.num_experts_per_tok)
        metrics = moe.router_metrics(ids, probs)
        self.sow("intermediates", "router_load", metrics["load"])
        self.sow("intermediates", "router_entropy", metrics["entropy"])
        self.sow("intermediates", "router_ids", ids.reshape(b, l, -1))
        if routing is not None:
            ids, w, changed = replay(ids, probs, bias, routing.reshape(b * l, -1))
            self.sow("intermediates", "router_changed", jnp.mean(changed.astype(F32)))
        weights = moe.Experts(c.num_experts, d, c.expert_intermediate_size, c.initializer_range,
                              self.param_dtype, name="experts")()
        y = moe.experts_forward(x_td, ids, w, *weights).reshape(b, l, d)
        if c.shared_expert_intermediate_size:
            y = y + SwiGLU(c, self.dtype, self.param_dtype, self.lora,
                           c.shared_expert_intermediate_size, name="shared_expert")(xn, kw)
        return y

    @nn.compact
    def __call__(self, x_bld: Array, rope: tuple[Array, Array], mask: Any, use_lora: bool,
                 deterministic: bool, routing: Array | None = None,
                 cache: KVCache | None = None, window: KVCache | None = None,
                 q_start: Array | int = 0, idx_bq: Array | None = None,
                 n_fresh: int | None = None, return_kv: bool = False
                 ) -> tuple[Array, KVCache | None]:
        """Full (``cache`` None, as ``nn.scan`` calls it) or cached (``kv_cache.attend_cached``:
        ``mask`` then a key mask [B, L]); the rows' keys/values returned when ``return_kv``."""
        c = self.config
        kw = dict(use_lora=use_lora, deterministic=deterministic)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bld = nn.with_logical_constraint(x_bld, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))
        cached = None if cache is None else dict(cache=cache, window=window, q_start=q_start,
                                                 idx_bq=idx_bq, n_fresh=n_fresh)
        att, own = self._attention(norm(name="input_layernorm")(x_bld), rope, mask, kw, cached)
        x_bld = x_bld + att
        xn = norm(name="post_attention_layernorm")(x_bld)
        if self.is_moe:
            y = self._moe(xn, kw, routing)
        else:
            y = swiglu(self._proj, xn, c.dense_intermediate_size, c.hidden_size,
                       ("gate_proj", "up_proj", "down_proj"), **kw)
        return x_bld + y, (own if return_kv else None)


class LLaDAMoE(MoEPredictor):
    """The LLaDA-MoE mask predictor (row i predicts token i): ``MoEPredictor``'s body
    (``d1jax.model.llada2.stack``, its attributes) with ``LLaDAMoEBlock`` layers, full
    attention over the real keys and positions 0..L-1 by default (theirs), and Fast-dLLM's
    approximate cache."""

    config: LLaDAMoEConfig
    block = LLaDAMoEBlock
    embed_name = "embed_tokens"

    def default_positions(self, attention_mask: Array | None, length: int) -> Array:
        return jnp.arange(length)

    def default_mask(self, attention_mask: Array | None, length: int) -> Array | None:
        return None if attention_mask is None else jnp.asarray(attention_mask).astype(bool)

    # The cache entry points: Fast-dLLM's approximate cache, as LLaDA's (full attention: the
    # recomputed rows see their fresh keys/values and the cache's everywhere else). The MoE
    # is per token, so a slice routes as the full forward does.

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        """One full forward: logits [B, S, V] of positions slice_start:+slice_len (all when
        slice_len is None) and every layer's keys/values [n_layers, B, L, K, H]."""
        b, l = input_ids.shape
        key_mask = None if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
        h, cache = self.cached_stack(input_ids, jnp.arange(l)[None], key_mask, use_lora,
                                     return_kv=True)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, slice_start, slice_len, axis=1)
        return self.logits(h), cache

    def decode_hidden(self, input_ids: Array, cache: KVCache, slice_start: Array | int,
                      attention_mask: Array | None = None, *, slice_len: int,
                      use_lora: bool = True) -> Array:
        """Hidden states [B, slice_len, D] of positions slice_start:+slice_len of
        ``input_ids`` [B, L]: fresh keys/values for the slice, the cache's elsewhere."""
        b, l = input_ids.shape
        key_mask = None if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
        pos = slice_start + jnp.arange(slice_len)[None]
        h, _ = self.cached_stack(
            jax.lax.dynamic_slice_in_dim(input_ids, slice_start, slice_len, 1), pos, key_mask,
            use_lora, cache=cache, q_start=slice_start)
        return h

    def decode_at(self, input_ids: Array, idx: Array, cache: KVCache, window: KVCache,
                  window_start: Array | int, attention_mask: Array | None = None, *,
                  use_lora: bool = True) -> tuple[Array, KVCache]:
        """Positions ``window_start + idx`` (idx [B, Q]; >= W: padding) of a window of
        [n_layers, B, W, K, H] keys/values, recomputed and written into the window; they see
        the updated window and the cache elsewhere. Returns (hidden [B, Q, D], the window)."""
        b, l = input_ids.shape
        at = jnp.clip(window_start + idx, 0, l - 1)
        key_mask = None if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
        return self.cached_stack(
            jnp.take_along_axis(input_ids, at, axis=1), window_start + idx, key_mask, use_lora,
            cache=cache, window=window, q_start=window_start, idx_bq=idx,
            n_fresh=idx.shape[1], return_kv=True)
