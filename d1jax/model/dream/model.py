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

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.model.dream.config import DreamConfig
from d1jax.model.kv_cache import KVCache
from d1jax.model.qwen import QwenStack, head_weight, token_positions

Array = jax.Array


class Dream(QwenStack):
    """The Dream mask predictor: ``QwenStack`` (its attributes) with Qwen2's q/k/v biases,
    bidirectional, its raw rows shifted by one (module docstring).

    ``lora`` targets Dream's names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    down_proj.
    """

    config: DreamConfig

    # Raw row i predicts token i+1 (``d1jax.model.predictor.MaskPredictor``).
    shifted_prediction = True
    qkv_bias = True

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
        x, _ = self.layers(self.embed_tokens(input_ids), self.rope(positions), attention_mask,
                           use_lora, deterministic)
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

    # Fast-dLLM's block KV cache (``d1jax.model.predictor.MaskPredictor``'s entry points). Outputs are
    # prediction-aligned like ``hidden``'s; the cache holds every layer's keys (after RoPE at
    # ``tok_idx`` positions) and values.

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        """One full forward: logits [B, S, V] of positions slice_start:+slice_len (all when
        slice_len is None) and every layer's keys/values of the whole sequence."""
        return self.full_with_cache(input_ids, attention_mask, attention_mask, slice_start,
                                    slice_len, use_lora, rows=shift_rows)

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
        h, _ = self.cached_stack(rows(input_ids), rows(token_positions(attention_mask, l)),
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
        pos = jnp.broadcast_to(token_positions(attention_mask, l), (b, l))
        h, window = self.cached_stack(
            jnp.take_along_axis(input_ids, src, axis=1), jnp.take_along_axis(pos, src, axis=1),
            attention_mask, use_lora, cache=cache, window=window, q_start=window_start,
            idx_bq=idx, n_fresh=q, return_kv=True)
        return jnp.where((at > 0)[..., None], h[:, q:], h[:, :q]), window


def shift_rows(raw_bl_: Array) -> Array:
    """Row i of the result is raw row i-1 (row 0 keeps raw row 0): [B, L, ...]."""
    return jnp.concatenate([raw_bl_[:, :1], raw_bl_[:, :-1]], axis=1)


shift_logits = shift_rows  # raw logits [B, L, V] -> prediction-aligned


def dream_positions(attention_mask_bl: Array) -> Array:
    """Dream's ``tok_idx`` [B, L]: cumsum(mask) - 1, padding positions set to 1."""
    return token_positions(attention_mask_bl, attention_mask_bl.shape[-1])
