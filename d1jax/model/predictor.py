"""The mask-predictor interface every diffusion LM of d1jax satisfies (LLaDA, Dream).

A model module (``d1jax.model.LLaDA``, ``d1jax.model.dream.Dream``) offers, through
``model.apply``:

- ``__call__(ids [B, L], attention_mask [B, L] | None, *, slice_start, slice_len, use_lora,
  deterministic)``: logits whose row i is the model's prediction of token i (the
  distribution a masked position i is filled from, whose log-probability an estimator
  reads), all rows or a slice; ``sliced_hidden`` (same arguments) is it before the head;
- ``hidden(ids, attention_mask, *, use_lora, deterministic, keep_last)``: the final-norm
  hidden states those logits come from (row-aligned the same way), and ``logits(hidden)``;
- the static ``output_head(params, config)``: (head [D, V], logit scale or None), for the
  chunked log-softmax of the estimator and the SFT loss;
- ``config.mask_token_id`` and ``config.max_sequence_length``.

The per-family quirks live inside each model, so the sampler, the estimator, SFT and the
objectives hold no family switch:

- LLaDA is trained as a mask predictor: raw row i already predicts token i (RoPE positions
  0..L-1, padding keys masked).
- Dream (Dream-v0-7B, DiffuCoder-7B) keeps its autoregressive initialisation: raw row i-1
  predicts token i, so ``Dream.hidden`` shifts its rows by one and counts RoPE positions from
  each row's first real token, as Dream's ``_sample``. ``Dream.raw_logits`` is the unshifted
  Hugging Face forward.

A model says which it is by its ``shifted_prediction`` class attribute (absent: False).
Both offer the Fast-dLLM KV-cache entry points (``prefill``, ``decode_hidden``,
``decode_at``); ``d1jax.sampling.model_fns`` adapts their signatures (Dream's read the whole
sequence: a row's prediction needs the token before it).
"""

from __future__ import annotations

from typing import Any, Union

import jax

from d1jax.model.dream import Dream
from d1jax.model.llada import LLaDA

Array = jax.Array

# A module with this interface: one of the families' models.
MaskPredictor = Union[LLaDA, Dream]


def is_shifted(model: Any) -> bool:
    """Whether ``model``'s raw row i predicts token i+1 (Dream) rather than token i (LLaDA)."""
    return bool(getattr(model, "shifted_prediction", False))


def predict_logits(model: Any, params: Any, ids_bl: Array, attention_mask_bl: Array | None = None,
                   **kwargs: Any) -> Array:
    """Logits [B, L, V] with row i predicting token i, for LLaDA or Dream.

    kwargs (``use_lora``, ``deterministic``, ``rngs``) pass through to ``model.apply``.
    """
    if ids_bl.ndim != 2:
        raise ValueError(f"ids must be [B, L], got shape {ids_bl.shape}")
    rngs = kwargs.pop("rngs", None)
    extra = {} if rngs is None else {"rngs": rngs}
    return model.apply({"params": params}, ids_bl, attention_mask_bl, **kwargs, **extra)


def output_head(model: Any, params: Any) -> tuple[Array, float | None]:
    """(output head [D, V], logit scale or None) of ``model`` (its static ``output_head``)."""
    return type(model).output_head(params, model.config)
