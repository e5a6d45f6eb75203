"""The mask-predictor interface every diffusion LM of d1jax satisfies (LLaDA, Dream).

Contract: ``predict_logits(model, params, ids [B, L], attention_mask [B, L] | None)``
returns logits [B, L, V] whose row i is the model's prediction of token i (the
distribution a masked position i is filled from, and whose log-probability an estimator
reads). Anything that asks a model for the prediction at position i goes through here, so
the per-family quirks live in one place:

- LLaDA (``d1jax.model.LLaDA``) is trained as a mask predictor: row i already predicts
  token i; the call is the model's forward (RoPE positions 0..L-1, padding keys masked).
- Dream (``d1jax.model.dream.Dream``, Dream-v0-7B, DiffuCoder-7B) keeps its autoregressive
  initialisation: raw row i-1 predicts token i, so ``Dream.predict_logits`` shifts the
  outputs by one (row 0 repeats raw row 0, never read: position 0 is a prompt token) and
  counts RoPE positions from each row's first real token, as Dream's ``_sample``.

A model class says which it is by its ``shifted_prediction`` class attribute (absent:
False). Code that slices logits (``slice_start``/``slice_len``) or runs the output head on
chosen hidden rows must read row i-1's hidden state for a shifted model; until it does, it
must call ``predict_logits`` (full rows) for such a model (``require_unshifted`` says so).
"""

from __future__ import annotations

from typing import Any

import jax

Array = jax.Array


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
    if is_shifted(model):
        return model.apply({"params": params}, ids_bl, attention_mask_bl,
                           method=model.predict_logits, **kwargs, **extra)
    return model.apply({"params": params}, ids_bl, attention_mask_bl, **kwargs, **extra)


def require_unshifted(model: Any, what: str) -> None:
    """Refuses a shifted model in code that still reads raw rows (names ``what``)."""
    if is_shifted(model):
        raise NotImplementedError(
            f"{what} reads the model's raw output rows as the prediction of their own "
            f"position, which is wrong for {type(model).__name__} (row i-1 predicts token i); "
            f"use d1jax.model.predictor.predict_logits")
