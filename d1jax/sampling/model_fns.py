"""The model as the sampler sees it: plain functions, so any model (or a test's stand-in)
can be sampled from."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from d1jax.model import predictor

Array = jax.Array
# (params, ids [B, L], attention mask [B, L] | None, slice_start, slice_len) -> [B, S, V].
ApplyFn = Callable[[Any, Array, Array | None, Array, int], Array]


class ModelFns(NamedTuple):
    """The model's entry points. ``prefill``/``decode`` serve ``kv_cache`` only.

    forward: ``ApplyFn``.
    prefill: ``(params, ids [B, L], mask, slice_start, slice_len) -> (logits [B, S, V],
      cache)``, cache holding every layer's keys/values of the whole sequence.
    decode: ``(params, ids [B, Q], cache, q_start, mask [B, L], head_len) -> logits
      [B, head_len, V]``: positions q_start:+Q recomputed, attending to the cache elsewhere.
    max_length: the model's max_sequence_length (longer requests are refused).
    decode_hidden, head: optional split of ``decode`` into ``(params, ids, cache, q_start,
      mask) -> hidden [B, Q, D]`` and ``(params, hidden [B, S, D]) -> logits [B, S, V]``;
      with them cached steps run the output head on the still-masked positions only.
    decode_at: ``(params, ids [B, Q], idx [B, Q], cache, window, window_start, mask) ->
      (hidden [B, Q, D], window)``, for ``recompute="masked"``: window positions
      window_start + idx recomputed, their keys/values written into ``window`` (the
      block's keys/values, kept apart from the cache; idx >= W: a padding row, not
      written), attending to it and to the cache.
    """

    forward: ApplyFn
    prefill: Callable[..., tuple[Array, Any]] | None = None
    decode: Callable[..., Array] | None = None
    max_length: int | None = None
    decode_hidden: Callable[..., Array] | None = None
    head: Callable[[Any, Array], Array] | None = None
    decode_at: Callable[..., tuple[Array, Any]] | None = None
    cache_absent: str | None = None  # the model's name when it has no KV-cache entry points


def model_apply_fn(model) -> ApplyFn:
    """Adapts a d1jax model (LLaDA, Dream: ``d1jax.model.predictor``'s interface, row i
    predicting token i) to ``apply_fn(params, ids, mask, slice_start, slice_len)``."""
    def apply_fn(params, ids, mask, slice_start, slice_len):
        return model.apply({"params": params}, ids, mask, slice_start=slice_start,
                           slice_len=slice_len)
    return apply_fn


def model_fns(model) -> ModelFns:
    """``ModelFns`` of a d1jax model: the forward, and for LLaDA the KV-cache entry points
    (Dream has none yet: its ``ModelFns`` serve ``kv_cache="none"``, and asking for a cache
    names the model)."""
    if predictor.is_shifted(model):
        return ModelFns(model_apply_fn(model), max_length=model.config.max_sequence_length,
                        cache_absent=type(model).__name__)

    def prefill(params, ids, mask, slice_start, slice_len):
        return model.apply({"params": params}, ids, mask, slice_start=slice_start,
                           slice_len=slice_len, method=model.prefill)

    def decode(params, ids, cache, q_start, mask, head_len):
        return model.apply({"params": params}, ids, cache, q_start, mask, head_len=head_len,
                           method=model.decode_slice)

    def decode_hidden(params, ids, cache, q_start, mask):
        return model.apply({"params": params}, ids, cache, q_start, mask,
                           method=model.decode_hidden)

    def head(params, hidden):
        return model.apply({"params": params}, hidden, method=model.logits)

    def decode_at(params, ids, idx, cache, window, window_start, mask):
        return model.apply({"params": params}, ids, idx, cache, window, window_start, mask,
                           method=model.decode_at)
    return ModelFns(model_apply_fn(model), prefill, decode, model.config.max_sequence_length,
                    decode_hidden, head, decode_at)
