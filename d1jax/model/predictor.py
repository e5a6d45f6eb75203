"""The mask-predictor interface every diffusion LM of d1jax satisfies (``MaskPredictor``).

A family's model module (``d1jax.model.llada.LLaDA``, ``d1jax.model.dream.Dream``) offers the
entry points below, each with one signature for every family, through ``model.apply``; the
sampler (``d1jax.sampling.model_fns``), the estimator, SFT, the objectives and the planner
call them and never ask which family they hold. Every output is prediction-aligned: row i
is the model's prediction of token i (the distribution a masked position i is filled from,
whose log-probability an estimator reads).

The per-family quirks live inside each model:

- LLaDA is trained as a mask predictor: raw row i already predicts token i (RoPE positions
  0..L-1, padding keys masked).
- Dream (Dream-v0-7B, DiffuCoder-7B) keeps its autoregressive initialisation: raw row i-1
  predicts token i, so ``Dream.hidden`` shifts its rows by one and counts RoPE positions from
  each row's first real token, as Dream's ``_sample``. ``Dream.raw_logits`` is the unshifted
  Hugging Face forward.

A model says which it is by its ``shifted_prediction`` class attribute, a property the
planner's FLOP count reads (``is_shifted``); the cached entry points take the whole sequence,
so a shifted model reads the token before a row itself.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Protocol

import jax
from flax import traverse_util

from d1jax import sharding as shd
from d1jax.model.kv_cache import KVCache
from d1jax.model.lora import ADAPTER_NAMES

Array = jax.Array


class MaskPredictor(Protocol):
    """What a family's flax module offers (shape letters: B batch, L sequence, S slice, D
    width, V vocabulary, Q recomputed rows, W window). Keyword-only arguments are marked *."""

    config: Any  # .mask_token_id, .max_sequence_length, .width, .depth, .projections, ...
    shifted_prediction: bool  # raw row i predicts token i+1 (Dream) rather than token i
    lora: Any  # LoraConfig or None
    remat: bool

    def __call__(self, input_ids: Array, attention_mask: Array | None = None, *,
                 positions: Array | None = None, slice_start: Array | int | None = None,
                 slice_len: int | None = None, use_lora: bool = True,
                 deterministic: bool = True) -> Array:
        """Logits [B, L, V], or [B, slice_len, V] of positions slice_start:+slice_len."""

    def sliced_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                      positions: Array | None = None, slice_start: Array | int | None = None,
                      slice_len: int | None = None, use_lora: bool = True,
                      deterministic: bool = True) -> Array:
        """``__call__`` before the output head: final-norm hidden [B, L or slice_len, D]."""

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True, keep_last: int | None = None,
               read_upto: Array | int | None = None) -> Array:
        """Final-norm hidden [B, L, D], or [B, keep_last, D] of the last positions
        (``read_upto``: only that many of them are read; a model may ignore it)."""

    def logits(self, hidden_bsd: Array) -> Array:
        """The output head, row-wise: [B, S, D] -> [B, S, V]."""

    @staticmethod
    def output_head(params: Mapping[str, Any], config: Any) -> tuple[Array, float | None]:
        """(head [D, V], logit scale or None), for the chunked log-softmax."""

    def unrolled(self) -> bool:
        """Whether the layers run as straight-line code (the planner's layout column)."""

    # Fast-dLLM's block KV cache. The cache holds every layer's keys/values of the sequence.

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        """One full forward: (logits [B, S, V] of slice_start:+slice_len, or all, cache)."""

    def decode_hidden(self, input_ids: Array, cache: KVCache, slice_start: Array | int,
                      attention_mask: Array | None = None, *, slice_len: int,
                      use_lora: bool = True) -> Array:
        """Hidden [B, slice_len, D] of positions slice_start:+slice_len of the sequence
        ``input_ids`` [B, L], recomputed against ``cache`` elsewhere."""

    def decode_at(self, input_ids: Array, idx: Array, cache: KVCache, window: KVCache,
                  window_start: Array | int, attention_mask: Array | None = None, *,
                  use_lora: bool = True) -> tuple[Array, KVCache]:
        """(hidden [B, Q, D] predicting positions window_start + idx [B, Q] of the sequence
        ``input_ids`` [B, L], the window's keys/values [n_layers, B, W, ...] with theirs
        written; idx >= W: padding rows, never written)."""


ENTRY_POINTS = ("__call__", "sliced_hidden", "hidden", "logits", "output_head", "unrolled",
                "prefill", "decode_hidden", "decode_at")


def check_module(module: type) -> None:
    """TypeError unless ``module`` (a family's flax module class) has every entry point of
    ``MaskPredictor`` with its parameters (names, order, keyword-only ones) and declares
    ``shifted_prediction``; a family is checked once, when it registers."""
    problems = []
    if not isinstance(getattr(module, "shifted_prediction", None), bool):
        problems.append("no bool class attribute shifted_prediction")
    for name in ENTRY_POINTS:
        want = _params(getattr(MaskPredictor, name))
        got = getattr(module, name, None)
        if got is None:
            problems.append(f"no {name}")
        elif _params(got)[:len(want)] != want:
            problems.append(f"{name}{_params(got)} is not {name}{want}")
    if problems:
        raise TypeError(f"{module.__name__} is not a MaskPredictor (d1jax.model.predictor): "
                        + "; ".join(problems))


def _params(fn) -> list[tuple[str, str]]:
    """(name, kind) of ``fn``'s parameters past self."""
    sig = inspect.signature(fn)
    return [(p.name, p.kind.name) for p in sig.parameters.values() if p.name != "self"]


def is_shifted(model: MaskPredictor) -> bool:
    """Whether ``model``'s raw row i predicts token i+1 (Dream) rather than token i (LLaDA)."""
    return bool(model.shifted_prediction)


def predict_logits(model: MaskPredictor, params: Any, ids_bl: Array,
                   attention_mask_bl: Array | None = None, **kwargs: Any) -> Array:
    """Logits [B, L, V] with row i predicting token i, for any family.

    kwargs (``use_lora``, ``deterministic``, ``rngs``) pass through to ``model.apply``.
    """
    if ids_bl.ndim != 2:
        raise ValueError(f"ids must be [B, L], got shape {ids_bl.shape}")
    rngs = kwargs.pop("rngs", None)
    extra = {} if rngs is None else {"rngs": rngs}
    return model.apply({"params": params}, ids_bl, attention_mask_bl, **kwargs, **extra)


def output_head(model: MaskPredictor, params: Any) -> tuple[Array, float | None]:
    """(output head [D, V], logit scale or None) of ``model`` (its static ``output_head``)."""
    return type(model).output_head(params, model.config)


def init_params(model: MaskPredictor, rng: Array, mesh=None, rules=shd.DEFAULT_RULES, *,
                adapters_only: bool = False) -> dict[str, Any]:
    """Random params (plain pytree) of any family's module, born sharded over ``mesh`` by
    the logical rules.

    adapters_only: just the LoRA leaves (``lora_a``/``lora_b`` under their paths), e.g. to
    add fresh adapters to loaded base weights (``lora.join``); the base is never computed.
    """
    def init(key):
        params = shd.boxed_init(model, key)
        if not adapters_only:
            return params
        flat = traverse_util.flatten_dict(params)
        return traverse_util.unflatten_dict(
            {k: v for k, v in flat.items() if k[-1] in ADAPTER_NAMES})
    params, _ = shd.init_sharded(init, mesh, rng, rules=rules)
    return params
