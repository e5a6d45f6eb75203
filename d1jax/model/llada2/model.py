"""LLaDA2.x (mixture-of-experts block diffusion) as a pure Flax linen module.

The decoder of inclusionAI's ``modeling_llada2_moe.py`` (``LLaDA2MoeModelLM``): word
embeddings; per layer x + Attn(RMSNorm(x)), then + FFN(RMSNorm(.)); final RMSNorm; an untied
``lm_head``. Attention: one fused ``query_key_value`` projection split into N query and K kv
heads (GQA), a per-head RMSNorm on queries and keys (``query_layernorm``/``key_layernorm``;
their modeling file applies them whatever ``use_qk_norm`` says, and every release carries
them), RoPE (rotate-half, theta ``rope_theta``) on the first ``rotary_dim = head_dim *
partial_rotary_factor`` features of each head only, softmax in float32, the output projection
``dense``. FFN: a SwiGLU of width ``intermediate_size`` in the first ``first_k_dense_replace``
layers, the MoE of ``d1jax.model.llada2.moe`` (router, routed experts, shared experts) after.

Block-causal attention: their ``generate`` gives the model a [L, L] mask on which a query sees
every key of its own block of ``block_size`` (their block_length, 32) tokens and of the blocks
before it, blocks counted from position 0, positions 0..L-1 (``block_align`` "start"; the SDAR
mask, ``d1jax.model.sdar.model.block_causal_mask``). Their block-diffusion training (dFactory
``tasks/train_llada2_bd.py``) runs the noised and clean copies side by side under a
three-part mask; ``hidden(..., mask=, positions=)`` takes such a mask from the objective. Row i
predicts token i (``shifted_prediction`` False).

Parameter names are the checkpoint's with the ``model.``/``attention.``/``mlp.`` scopes dropped;
kernels are [in, out]; the dense layers are stacked on a leading axis under ``dense_layers``,
the MoE layers under ``moe_layers`` (two ``nn.scan``s). Router metrics are sown into the
``intermediates`` collection (``moe_layers/router_load`` [n_moe, E], ``router_entropy``
[n_moe], the chosen experts ``router_ids`` [n_moe, B, L, K]) when the caller asks for it
(``mutable=["intermediates"]``). Routing replay: ``hidden(..., routing=)`` routes every MoE
layer by recorded ids (an old-policy pass's ``router_ids``) and sows ``router_changed``.

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
from d1jax.model.layers import Proj, RMSNorm, apply_rope, swiglu
from d1jax.model.llada2 import moe
from d1jax.model.llada2.config import LLaDA2Config
from d1jax.model.llada2.stack import MoEPredictor
from d1jax.model.lora import LoraConfig
from d1jax.model.qwen import BiasedProj, token_positions
from d1jax.model.sdar.model import (block_causal_mask, decode_at, decode_hidden,
                                    upto_block_of)

Array = jax.Array
DType = Any


def partial_rope(x_blnh: Array, sin_blr: Array, cos_blr: Array) -> Array:
    """RoPE on the first R features of each head (R = the tables' width), the rest as is."""
    r = sin_blr.shape[-1]
    return jnp.concatenate([apply_rope(x_blnh[..., :r], sin_blr, cos_blr), x_blnh[..., r:]],
                           axis=-1)


class LLaDA2Block(nn.Module):
    """One LLaDA2 decoder layer (dense FFN, or MoE when ``is_moe``); returns (x, None)."""

    config: LLaDA2Config
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
                   cached: dict | None = None) -> tuple[Array, KVCache]:
        """(attention output [B, L, D], the fresh keys/values); ``cached``: QwenBlock's cached
        mode (cache, window, q_start, idx_bq, n_fresh; ``mask`` a key mask [B, L])."""
        c = self.config
        n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        b, l = xn.shape[:2]
        qkv = self._proj("query_key_value", (n + 2 * k) * h, (shd.EMBED, shd.Q_HEADS),
                         c.use_qkv_bias)(xn, **kw).reshape(b, l, n + 2 * k, h)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        q = partial_rope(norm(name="query_layernorm")(qkv[:, :, :n]), *rope)
        f = l if cached is None or cached["n_fresh"] is None else cached["n_fresh"]
        kk = norm(name="key_layernorm")(qkv[:, :f, n:n + k])
        fresh = KVCache(partial_rope(kk, *(r[:, :f] for r in rope)), qkv[:, :f, n + k:])
        if cached is None:
            att, own = attention(q, fresh.k, fresh.v, mask, h ** -0.5), fresh
        else:
            att, own = attend_cached(q, fresh, cached["cache"], cached["q_start"], mask,
                                     cached["window"], cached["idx_bq"])
        out = self._proj("dense", c.hidden_size, (shd.Q_HEADS, shd.EMBED), c.use_bias)(
            att.reshape(b, l, n * h), **kw)
        return out, own

    def _moe(self, xn: Array, kw: dict, routing: Array | None = None) -> Array:
        """The MoE FFN; ``routing`` [B, L, K]: recorded expert ids to route by (replay)."""
        c = self.config
        b, l, d = xn.shape
        kernel, bias = moe.Router(c.num_experts, c.initializer_range, self.param_dtype,
                                  name="gate")(d)
        x_td = xn.reshape(b * l, d)
        ids, w, scores = moe.route(x_td, kernel, bias, top_k=c.num_experts_per_tok,
                                   n_group=c.n_group, topk_group=c.topk_group,
                                   scaling=c.routed_scaling_factor)
        metrics = moe.router_metrics(ids, scores)
        self.sow("intermediates", "router_load", metrics["load"])
        self.sow("intermediates", "router_entropy", metrics["entropy"])
        self.sow("intermediates", "router_ids", ids.reshape(b, l, -1))
        if routing is not None:
            ids, w, changed = moe.replay(ids, scores, routing.reshape(b * l, -1),
                                         c.routed_scaling_factor)
            self.sow("intermediates", "router_changed", jnp.mean(changed.astype(jnp.float32)))
        weights = moe.Experts(c.num_experts, d, c.moe_intermediate_size, c.initializer_range,
                              self.param_dtype, name="experts")()
        y = moe.experts_forward(x_td, ids, w, *weights).reshape(b, l, d)
        if c.num_shared_experts:
            y = y + SwiGLU(c, self.dtype, self.param_dtype, self.lora,
                           c.shared_intermediate_size, name="shared_experts")(xn, kw)
        return y

    @nn.compact
    def __call__(self, x_bld: Array, rope: tuple[Array, Array], mask: Any, use_lora: bool,
                 deterministic: bool, routing: Array | None = None,
                 cache: KVCache | None = None,
                 window: KVCache | None = None, q_start: Array | int = 0,
                 idx_bq: Array | None = None, n_fresh: int | None = None,
                 return_kv: bool = False) -> tuple[Array, KVCache | None]:
        """Full (``cache`` None, as ``nn.scan`` calls it) or cached, as ``QwenBlock``: the
        rows' fresh keys/values are returned when ``return_kv``. ``routing`` [B, L, K]: the
        MoE routes by these recorded expert ids (routing replay; ``LLaDA2.hidden``)."""
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
            y = swiglu(self._proj, xn, c.intermediate_size, c.hidden_size,
                       ("gate_proj", "up_proj", "down_proj"), **kw)
        return x_bld + y, (own if return_kv else None)


class SwiGLU(nn.Module):
    """A SwiGLU of width ``hidden`` with its own scope (the MoE layers' ``shared_experts``)."""

    config: LLaDA2Config
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None
    hidden: int

    @nn.compact
    def __call__(self, x_bld: Array, kw: dict) -> Array:
        def proj(name, features, axes):
            lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
            return Proj(features, axes, self.dtype, self.param_dtype,
                        init_std=self.config.initializer_range, lora=lora, name=name,
                        quant=self.lora.base_quant if self.lora is not None else "none")
        return swiglu(proj, x_bld, self.hidden, self.config.hidden_size,
                      ("gate_proj", "up_proj", "down_proj"), **kw)


class LLaDA2(MoEPredictor):
    """The LLaDA2 MoE mask predictor (row i predicts token i): ``MoEPredictor``'s body
    (``d1jax.model.llada2.stack``, its attributes) with ``LLaDA2Block`` layers, the
    block-causal mask and ``token_positions`` by default, and block diffusion's cache."""

    config: LLaDA2Config
    block = LLaDA2Block
    embed_name = "word_embeddings"

    def default_positions(self, attention_mask: Array | None, length: int) -> Array:
        return token_positions(attention_mask, length)

    def default_mask(self, attention_mask: Array | None, length: int) -> Array:
        c = self.config
        return block_causal_mask(attention_mask, length, c.block_size, c.block_align)

    # The cache entry points: block diffusion's exact cache, SDAR's (d1jax.model.sdar.model).
    # The MoE is per token, so a slice routes as the full forward does.
    _upto_block_of = upto_block_of
    decode_hidden = decode_hidden
    decode_at = decode_at

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        """One block-causal forward: logits [B, S, V] of positions slice_start:+slice_len (all
        when slice_len is None) and every layer's keys/values [n_layers, B, L, K, H]."""
        c = self.config
        l = input_ids.shape[1]
        mask = block_causal_mask(attention_mask, l, c.block_size, c.block_align)
        h, cache = self.cached_stack(input_ids, token_positions(attention_mask, l), mask,
                                     use_lora, return_kv=True)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, slice_start, slice_len, axis=1)
        return self.logits(h), cache
