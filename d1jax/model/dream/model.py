"""Dream (Dream-v0-7B, DiffuCoder-7B) as a pure Flax linen module.

A Qwen2 transformer run bidirectionally, as HKUNLP's ``modeling_dream.py``: RMSNorm,
RoPE (rotate-half), grouped-query attention with biases on q, k and v (not o), SwiGLU MLP,
no causal mask, an untied ``lm_head`` unless ``tie_word_embeddings``. Parameter names follow
the checkpoint with the ``model.``/``self_attn.``/``mlp.`` scopes dropped (``embed_tokens``,
``layers.{q,k,v,o}_proj``, ``layers.{gate,up,down}_proj``, ``layers.input_layernorm``,
``layers.post_attention_layernorm``, ``norm``, ``lm_head``); kernels are ``[in, out]``
(torch's weight transposed) and the blocks are stacked on a leading ``layers`` axis
(``nn.scan``), each parameter carrying logical axis names.

Shifted prediction: Dream keeps its autoregressive initialisation, so the raw output at
position i-1 predicts token i. The mask-predictor interface every d1jax model shares
(``hidden``, ``logits``, ``__call__`` with ``slice_start``/``slice_len``, as ``LLaDA``'s) is
prediction-aligned: ``hidden`` is the one place that shifts (row i is raw row i-1, row 0
repeats raw row 0, as ``cat([l[:, :1], l[:, :-1]])`` in Dream's ``generation_utils._sample``;
the head is row-wise, so shifting hidden states equals shifting logits), and it takes RoPE
positions from the padding mask (Dream's ``tok_idx``: counted from each row's first real
token). The sampler, the estimator, SFT and every objective therefore read row i as the
prediction of token i for either family. ``raw_logits`` is the Hugging Face forward
(unshifted, positions 0..L-1 unless given), for parity with the checkpoint's own code.

Fast-dLLM's KV cache (``prefill``, ``decode_hidden``, ``decode_at``): the prediction of a
block's first position is raw row block_start-1, outside the recomputed block. Fast-dLLM's
Dream loop (``generation_utils_block._sample``) decodes that position from the block's full
forward and shifts its cached logits within the recomputed rows (row 0 then unread); here a
cached forward also recomputes the row before the slice, query-only (it attends as the slice
does, its keys/values stay the cache's), so the slice's rows are Fast-dLLM's and every
position, the first included, has a prediction that equals the full forward's on a fresh
cache. The sampler's ``first_position`` option is Fast-dLLM's loop itself.

Shape letters: B batch, L sequence, D hidden, N query heads, K kv heads, H head dim,
F intermediate, V vocab.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model.attention import attention
from d1jax.model.dream.config import DreamConfig
from d1jax.model.kv_cache import KVCache, attend_cached
from d1jax.model.layers import Proj, RMSNorm, apply_rope, rope_tables
from d1jax.model.lora import LoraConfig

Array = jax.Array
DType = Any

class BiasedProj(Proj):
    """``Proj`` plus a bias [out] (Qwen2's q/k/v projections); the bias is never adapted."""

    @nn.compact
    def __call__(self, x: Array, use_lora: bool = True, deterministic: bool = True) -> Array:
        y = super().__call__(x, use_lora, deterministic)
        b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axes[1],)),
                       (self.features,), self.param_dtype)
        return y + b.astype(y.dtype)


class DreamBlock(nn.Module):
    """One DreamDecoderLayer: x + Attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(.)).

    Full (``cache`` None; as ``nn.scan`` calls it): the rows [B, L, D] are the sequence and
    attend to each other. Cached (Fast-dLLM): the first ``n_fresh`` rows are recomputed
    positions whose keys/values are fresh (a slice q_start:+n_fresh, or with ``window``
    the window rows ``idx_bq``, as ``kv_cache.attend_cached``); the rows after them are
    query-only (the rows a shifted prediction reads, ``Dream.decode_hidden``): they attend
    like the others and their keys/values are the cache's. Returns (x, the fresh rows' keys/
    values, the slice or the updated window, when ``return_kv``, else None).
    """

    config: DreamConfig
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None = None

    def _proj(self, name: str, features: int, axes: tuple[str, str], bias: bool = False):
        lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
        cls = BiasedProj if bias else Proj
        return cls(features, axes, self.dtype, self.param_dtype,
                   init_std=self.config.initializer_range, lora=lora, name=name,
                   quant=self.lora.base_quant if self.lora is not None else "none")

    @nn.compact
    def __call__(self, x_bld: Array, rope: tuple[Array, Array], key_mask_bl: Array | None,
                 use_lora: bool, deterministic: bool, cache: KVCache | None = None,
                 window: KVCache | None = None, q_start: Array | int = 0,
                 idx_bq: Array | None = None, n_fresh: int | None = None,
                 return_kv: bool = False) -> tuple[Array, KVCache | None]:
        c = self.config
        n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        kw = dict(use_lora=use_lora, deterministic=deterministic)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bld = nn.with_logical_constraint(x_bld, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))
        b, l = x_bld.shape[:2]
        xn = norm(name="input_layernorm")(x_bld)
        xf, rope_f = xn, rope  # the rows with fresh keys/values
        if n_fresh is not None:
            xf, rope_f = xn[:, :n_fresh], tuple(r[:, :n_fresh] for r in rope)
        f = xf.shape[1]
        q = self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS), bias=True)(xn, **kw)
        kk = self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias=True)(xf, **kw)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias=True)(xf, **kw)
        q = apply_rope(q.reshape(b, l, n, h), *rope)
        fresh = KVCache(apply_rope(kk.reshape(b, f, k, h), *rope_f), v.reshape(b, f, k, h))
        if cache is None:
            att, own = attention(q, fresh.k, fresh.v, key_mask_bl, h ** -0.5), fresh
        else:
            att, own = attend_cached(q, fresh, cache, q_start, key_mask_bl, window, idx_bq)
        x_bld = x_bld + self._proj("o_proj", c.hidden_size, (shd.Q_HEADS, shd.EMBED))(
            att.reshape(b, l, n * h), **kw)

        xn = norm(name="post_attention_layernorm")(x_bld)
        gate = self._proj("gate_proj", c.intermediate_size, (shd.EMBED, shd.MLP))(xn, **kw)
        up = self._proj("up_proj", c.intermediate_size, (shd.EMBED, shd.MLP))(xn, **kw)
        hid = nn.with_logical_constraint(nn.silu(gate) * up, (shd.BATCH, shd.LENGTH, shd.ACT_MLP))
        x_bld = x_bld + self._proj("down_proj", c.hidden_size, (shd.MLP, shd.EMBED))(hid, **kw)
        return x_bld, (own if return_kv else None)


class Dream(nn.Module):
    """The Dream mask predictor.

    Attributes:
      config: architecture.
      dtype: compute dtype of matmuls; norms, RoPE and softmax statistics run in float32.
      param_dtype: storage dtype of the parameters.
      remat: rematerialise each block in the backward pass.
      lora: optional LoRA adapters on the projections named in ``lora.targets`` (Dream's
        names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
      unroll_layers: unroll the layer scan (straight-line code) instead of a loop (None:
        a loop, as False).
      layers_per_loop: layers per iteration of that loop (``nn.scan``'s unroll).
    """

    config: DreamConfig
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    remat: bool = False
    lora: LoraConfig | None = None
    unroll_layers: bool | None = None
    layers_per_loop: int = 1

    # Raw row i predicts token i+1 (``d1jax.model.predictor.MaskPredictor``).
    shifted_prediction = True

    def setup(self):
        c = self.config
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, param_dtype=self.param_dtype, dtype=self.dtype,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(stddev=c.initializer_range), (shd.VOCAB, shd.EMBED)))
        block = DreamBlock
        if self.remat:
            block = nn.remat(DreamBlock, prevent_cse=False, static_argnums=(4, 5),
                             policy=jax.checkpoint_policies.nothing_saveable)
        bc = nn.broadcast
        self.layers = nn.scan(
            block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
            in_axes=(bc, bc, bc, bc), length=c.num_hidden_layers,
            metadata_params={nn.PARTITION_NAME: shd.LAYERS},
            unroll=c.num_hidden_layers if self.unroll_layers else self.layers_per_loop,
        )(c, self.dtype, self.param_dtype, self.lora)
        self.norm = RMSNorm(c.rms_norm_eps, self.dtype, self.param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Proj(c.vocab_size, (shd.EMBED, shd.VOCAB), self.dtype,
                                self.param_dtype, init_std=c.initializer_range)

    def unrolled(self) -> bool:
        """Whether the layer scan runs as straight-line code (``unroll_layers``)."""
        return bool(self.unroll_layers)

    def raw_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                   positions: Array | None = None, use_lora: bool = True,
                   deterministic: bool = True) -> Array:
        """Final-norm hidden states [B, L, D] of the HF forward (unshifted: row i feeds the
        prediction of token i+1).

        Args:
          input_ids: [B, L] int token ids.
          attention_mask: [B, L] (1 = real token, 0 = padding key); None attends to all.
          positions: [B, L] or [L] RoPE positions; default 0..L-1 (the HF forward's).
        """
        b, l = input_ids.shape
        positions = jnp.arange(l) if positions is None else jnp.asarray(positions)
        positions = positions[None] if positions.ndim == 1 else jnp.broadcast_to(positions, (b, l))
        rope = rope_tables(positions.astype(jnp.float32) / self.config.rope_factor,
                           self.config.head_dim, self.config.rope_theta)
        x, _ = self.layers(self.embed_tokens(input_ids), rope, attention_mask, use_lora,
                           deterministic)
        return self.norm(x)

    def raw_logits(self, input_ids: Array, attention_mask: Array | None = None, *,
                   positions: Array | None = None, use_lora: bool = True,
                   deterministic: bool = True) -> Array:
        """The HF model's logits [B, L, V] (unshifted: row i predicts token i+1)."""
        return self.logits(self.raw_hidden(input_ids, attention_mask, positions=positions,
                                           use_lora=use_lora, deterministic=deterministic))

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True, keep_last: int | None = None,
               read_upto: Array | int | None = None) -> Array:
        """Prediction-aligned final-norm hidden states [B, L, D] (row i predicts token i), or
        [B, keep_last, D] of the last ``keep_last`` positions. ``read_upto`` is accepted for
        the interface and changes nothing: every layer runs every row (no peeled last layer).

        positions: RoPE positions; default Dream's ``tok_idx`` of ``attention_mask``
        (``dream_positions``), or 0..L-1 without a mask.
        """
        if positions is None and attention_mask is not None:
            positions = dream_positions(attention_mask)
        h = shift_rows(self.raw_hidden(input_ids, attention_mask, positions=positions,
                                       use_lora=use_lora, deterministic=deterministic))
        return h if keep_last is None else h[:, h.shape[1] - keep_last:]

    def logits(self, hidden_bsd: Array) -> Array:
        """Logits [B, S, V] from hidden states [B, S, D] (the output head, row-wise)."""
        if self.config.tie_word_embeddings:
            out = self.embed_tokens.attend(hidden_bsd)
        else:
            out = self.lm_head(hidden_bsd)
        return nn.with_logical_constraint(out, (shd.BATCH, shd.LENGTH, shd.ACT_VOCAB))

    def __call__(self, input_ids: Array, attention_mask: Array | None = None, *,
                 positions: Array | None = None, slice_start: Array | int | None = None,
                 slice_len: int | None = None, use_lora: bool = True,
                 deterministic: bool = True) -> Array:
        """Prediction-aligned logits [B, L, V] (row i predicts token i), or [B, slice_len, V]
        of positions slice_start:+slice_len (slice_start may be traced; only those rows go
        through the output head)."""
        return self.logits(self.sliced_hidden(
            input_ids, attention_mask, positions=positions, slice_start=slice_start,
            slice_len=slice_len, use_lora=use_lora, deterministic=deterministic))

    def sliced_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                      positions: Array | None = None, slice_start: Array | int | None = None,
                      slice_len: int | None = None, use_lora: bool = True,
                      deterministic: bool = True) -> Array:
        """``__call__`` before the output head: prediction-aligned hidden states [B, L or
        slice_len, D]."""
        h = self.hidden(input_ids, attention_mask, positions=positions, use_lora=use_lora,
                        deterministic=deterministic)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, 0 if slice_start is None else slice_start,
                                             slice_len, axis=1)
        return h

    @staticmethod
    def output_head(params: dict[str, Any], config: DreamConfig) -> tuple[Array, float | None]:
        """(the output head as [D, V], logit scale or None) for chunked log-softmax."""
        return head_weight(params, config), None

    # Fast-dLLM's block KV cache (``d1jax.model.predictor.MaskPredictor``'s entry points). Outputs are
    # prediction-aligned like ``hidden``'s; the cache holds every layer's keys (after RoPE at
    # ``tok_idx`` positions) and values.

    def _cached_stack(self, ids_br: Array, positions_br: Array, key_mask_bl: Array | None,
                      use_lora: bool, cache: KVCache | None = None,
                      window: KVCache | None = None, q_start: Array | int = 0,
                      idx_bq: Array | None = None, n_fresh: int | None = None,
                      return_kv: bool = False) -> tuple[Array, KVCache | None]:
        """Rows [B, R] at RoPE positions [B or 1, R] through every layer, one ``lax.scan``
        over the stacked params (the full forward's ``nn.scan`` is left as it is): (final-norm
        raw hidden [B, R, D], the fresh keys/values stacked [n_layers, ...] or None)."""
        c = self.config
        rope = rope_tables(positions_br.astype(jnp.float32) / c.rope_factor, c.head_dim,
                           c.rope_theta)
        block = DreamBlock(c, self.dtype, self.param_dtype, self.lora, parent=None)

        def layer(x, per_layer):
            p, kv, win = per_layer
            return block.apply({"params": p}, x, rope, key_mask_bl, use_lora, True, kv, win,
                               q_start, idx_bq, n_fresh, return_kv)
        x, kv = jax.lax.scan(layer, self.embed_tokens(ids_br),
                             (self.layers.variables["params"], cache, window),
                             unroll=c.num_hidden_layers if self.unroll_layers
                             else self.layers_per_loop)
        return self.norm(x), kv

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        """One full forward: logits [B, S, V] of positions slice_start:+slice_len (all when
        slice_len is None) and every layer's keys/values of the whole sequence."""
        b, l = input_ids.shape
        h, cache = self._cached_stack(input_ids, _token_positions(attention_mask, l),
                                      attention_mask, use_lora, return_kv=True)
        h = shift_rows(h)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, slice_start, slice_len, axis=1)
        return self.logits(h), cache

    def decode_hidden(self, input_ids: Array, cache: KVCache, slice_start: Array | int,
                      attention_mask: Array | None = None, *, slice_len: int,
                      use_lora: bool = True) -> Array:
        """Hidden states [B, slice_len, D] of positions slice_start:+slice_len of the sequence
        ``input_ids`` [B, L], against ``cache`` (from ``prefill``) everywhere else.

        The slice is recomputed (fresh keys/values); position p's prediction is raw row
        p-1, so the row before the slice is recomputed too, query-only: it attends like the
        slice and its own keys/values stay the cache's, as every key outside the slice
        (the slice's outputs are those of Fast-dLLM's cached forward). With a cache of the
        same sequence this equals ``hidden``'s rows.
        """
        b, l = input_ids.shape
        before = jnp.maximum(slice_start - 1, 0)

        def rows(a):  # the slice, then the row before it
            return jnp.concatenate([jax.lax.dynamic_slice_in_dim(a, slice_start, slice_len, 1),
                                    jax.lax.dynamic_slice_in_dim(a, before, 1, 1)], axis=1)
        h, _ = self._cached_stack(rows(input_ids), rows(_token_positions(attention_mask, l)),
                                  attention_mask, use_lora, cache=cache, q_start=slice_start,
                                  n_fresh=slice_len)
        first = jnp.where(slice_start > 0, h[:, slice_len:], h[:, :1])  # as shift_rows
        return jnp.concatenate([first, h[:, :slice_len - 1]], axis=1)

    def decode_slice(self, input_ids: Array, cache: KVCache, slice_start: Array | int,
                     attention_mask: Array | None = None, *, slice_len: int,
                     head_len: int | None = None, use_lora: bool = True) -> Array:
        """Logits [B, head_len or slice_len, V] of ``decode_hidden``'s rows."""
        h = self.decode_hidden(input_ids, cache, slice_start, attention_mask,
                               slice_len=slice_len, use_lora=use_lora)
        return self.logits(h if head_len is None else h[:, :head_len])

    def decode_at(self, input_ids: Array, idx: Array, cache: KVCache, window: KVCache,
                  window_start: Array | int, attention_mask: Array | None = None, *,
                  use_lora: bool = True) -> tuple[Array, KVCache]:
        """``LLaDA.decode_at`` for the shifted prediction, reading the sequence [B, L].

        Positions ``window_start + idx`` (idx [B, Q], distinct within a row; idx >= W:
        padding, never written) are recomputed and their fresh keys/values written into
        ``window`` (the keys/values [n_layers, B, W, K, H] of positions window_start:+W);
        their predictions are raw rows ``window_start + idx - 1``, recomputed as Q
        query-only rows. All 2Q rows attend to the updated window and to ``cache`` outside
        it. Returns (hidden [B, Q, D] predicting positions window_start + idx, the window).
        """
        b, l = input_ids.shape
        q, at = idx.shape[1], window_start + idx
        src = jnp.clip(jnp.concatenate([at, at - 1], axis=1), 0, l - 1)
        pos = jnp.broadcast_to(_token_positions(attention_mask, l), (b, l))
        h, window = self._cached_stack(
            jnp.take_along_axis(input_ids, src, axis=1), jnp.take_along_axis(pos, src, axis=1),
            attention_mask, use_lora, cache=cache, window=window, q_start=window_start,
            idx_bq=idx, n_fresh=q, return_kv=True)
        return jnp.where((at > 0)[..., None], h[:, q:], h[:, :q]), window


def shift_rows(raw_bl_: Array) -> Array:
    """Row i of the result is raw row i-1 (row 0 keeps raw row 0): [B, L, ...]."""
    return jnp.concatenate([raw_bl_[:, :1], raw_bl_[:, :-1]], axis=1)


shift_logits = shift_rows  # raw logits [B, L, V] -> prediction-aligned


def _token_positions(attention_mask_bl: Array | None, length: int) -> Array:
    """RoPE positions [B or 1, L] as ``hidden`` takes them: ``tok_idx``, or 0..L-1."""
    if attention_mask_bl is None:
        return jnp.arange(length)[None]
    return dream_positions(attention_mask_bl)


def dream_positions(attention_mask_bl: Array) -> Array:
    """Dream's ``tok_idx`` [B, L]: cumsum(mask) - 1, padding positions set to 1."""
    m = jnp.asarray(attention_mask_bl).astype(jnp.int32)
    return jnp.where(m == 0, 1, jnp.cumsum(m, axis=-1) - 1)


def head_weight(params: dict[str, Any], config: DreamConfig) -> Array:
    """The output head as [D, V] (for chunked log-softmax over the vocabulary)."""
    if config.tie_word_embeddings:
        return params["embed_tokens"]["embedding"].T
    return params["lm_head"]["kernel"]
