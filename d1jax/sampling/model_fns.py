"""The model as the sampler sees it: plain functions, so any model (or a test's stand-in)
can be sampled from."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from d1jax.model.predictor import MaskPredictor

Array = jax.Array
# (params, ids [B, L], attention mask [B, L] | None, slice_start, slice_len) -> [B, S, V].
ApplyFn = Callable[[Any, Array, Array | None, Array, int], Array]


class ModelFns(NamedTuple):
    """The model's entry points. ``prefill``/``decode`` serve ``kv_cache`` only.

    The cached ones take the whole sequence ids [B, L] and the rows to recompute, so a model
    reads the tokens it needs (a shifted predictor like Dream also the one before them).

    forward: ``ApplyFn``.
    prefill: ``(params, ids [B, L], mask, slice_start, slice_len) -> (logits [B, S, V],
      cache)``, cache holding every layer's keys/values of the whole sequence.
    decode: ``(params, ids [B, L], cache, q_start, q_len, mask [B, L], head_len) -> logits
      [B, head_len, V]``: positions q_start:+q_len (static q_len) recomputed, attending to
      the cache elsewhere; the logits of the first head_len of them.
    max_length: the model's max_sequence_length (longer requests are refused).
    decode_hidden, head: optional split of ``decode`` into ``(params, ids, cache, q_start,
      q_len, mask) -> hidden [B, q_len, D]`` and ``(params, hidden [B, S, D]) -> logits
      [B, S, V]``; with them cached steps run the output head on the masked positions only.
    decode_at: ``(params, ids [B, L], idx [B, Q], cache, window, window_start, mask) ->
      (hidden [B, Q, D], window)``, for ``recompute="masked"``: window positions
      window_start + idx recomputed, their keys/values written into ``window`` (the
      block's keys/values, kept apart from the cache; idx >= W: a padding row, not
      written), attending to it and to the cache; row q predicts position window_start +
      idx[q].
    forward_hidden: optional ``forward`` before the output head: ``(params, ids, mask,
      slice_start, slice_len) -> hidden [B, S, D]``; with it and ``head`` the exact sampler
      runs the head on the block's masked positions only.
    block_size: a block-diffusion model's block (``config.block_size``; None for the
      others): ``loop="sdar"`` checks its ``block_length`` against it.
    """

    forward: ApplyFn
    prefill: Callable[..., tuple[Array, Any]] | None = None
    decode: Callable[..., Array] | None = None
    max_length: int | None = None
    decode_hidden: Callable[..., Array] | None = None
    head: Callable[[Any, Array], Array] | None = None
    decode_at: Callable[..., tuple[Array, Any]] | None = None
    forward_hidden: Callable[..., Array] | None = None
    block_size: int | None = None


def model_apply_fn(model: MaskPredictor) -> ApplyFn:
    """Adapts a d1jax model (``d1jax.model.predictor.MaskPredictor``, row i predicting
    token i) to ``apply_fn(params, ids, mask, slice_start, slice_len)``."""
    def apply_fn(params, ids, mask, slice_start, slice_len):
        return model.apply({"params": params}, ids, mask, slice_start=slice_start,
                           slice_len=slice_len)
    return apply_fn


def model_fns(model: MaskPredictor) -> ModelFns:
    """``ModelFns`` of a d1jax model: the forward and the KV-cache entry points, each the
    interface's one signature (the cached ones read the whole sequence; a shifted predictor
    such as Dream reads the token before a row itself)."""
    def apply(params, *args, **kw):
        return model.apply({"params": params}, *args, **kw)

    def prefill(params, ids, mask, slice_start, slice_len):
        return apply(params, ids, mask, slice_start=slice_start, slice_len=slice_len,
                     method=model.prefill)

    def decode_hidden(params, ids, cache, q_start, q_len, mask):
        return apply(params, ids, cache, q_start, mask, slice_len=q_len,
                     method=model.decode_hidden)

    def head(params, hidden):
        return apply(params, hidden, method=model.logits)

    def decode(params, ids, cache, q_start, q_len, mask, head_len):
        return head(params, decode_hidden(params, ids, cache, q_start, q_len, mask)[:, :head_len])

    def decode_at(params, ids, idx, cache, window, window_start, mask):
        return apply(params, ids, idx, cache, window, window_start, mask,
                     method=model.decode_at)

    def forward_hidden(params, ids, mask, slice_start, slice_len):
        return apply(params, ids, mask, slice_start=slice_start, slice_len=slice_len,
                     method=model.sliced_hidden)
    return ModelFns(model_apply_fn(model), prefill, decode, model.config.max_sequence_length,
                    decode_hidden, head, decode_at, forward_hidden,
                    getattr(model.config, "block_size", None))
