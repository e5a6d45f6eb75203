"""Dream's ``diffusion_generate`` (``generation_utils._sample``) as one jitted program.

Semantics of HKUNLP's ``DreamGenerationMixin._sample``: the prompt is followed by
``max_new_tokens`` masks and ``steps`` denoising steps run over the whole sequence (no
blocks), step i going from time t = ts[i] to s = ts[i+1], ``ts = linspace(1, eps, steps+1)``:

- ``alg="origin"``: each masked position is decoded with probability 1 - s/t (1 at the last
  step), its token drawn by ``sample_tokens``.
- ``"maskgit_plus"`` / ``"topk_margin"`` / ``"entropy"``: every masked position proposes a
  token with a confidence (its probability, top1 - top2 probability, or minus the
  entropy); the ``int(n_mask * (1 - s/t))`` most confident (all left at the last step) are
  decoded, n_mask being the batch's masks per row (``mask_index.sum() / B``). With
  ``alg_temp`` > 0 they are drawn without replacement from softmax(confidence / alg_temp)
  (Gumbel top-k: the law of ``torch.multinomial``) instead.
- ``sample_tokens``: logits / temperature (T > 0), then top-p and top-k filtering (applied
  at T = 0 too, as the reference: they change margin and entropy confidences), softmax; the
  token is the argmax (T = 0) or a draw.

The model is asked through ``d1jax.model.predictor``'s contract (row i predicts token i:
Dream's logit shift and ``tok_idx`` positions live in ``Dream.predict_logits``), so the
sampler runs any d1jax mask predictor. Shapes are fixed: every step runs the model on the
full [B, Lp + N] sequence (as the reference) inside one ``lax.fori_loop``.

Matching the reference bit for bit where it is arithmetic: the times are float32 as
``torch.linspace`` computes them (``timesteps``), 1 - s/t and the transfer counts are float32
as in torch. Departures: confidences are float32 whatever the model's dtype (the reference
keeps the logits' dtype, bfloat16 for a bfloat16 model); a row never decodes more positions
than it has masks (the reference's top-k would then overwrite decoded tokens with the mask
id when rows hold different mask counts; with a mask-free prompt they never do); random
draws are JAX's (``dream_step_keys``), not torch's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.model import predictor

Array = jax.Array
# (params, ids [B, L], attention mask [B, L] | None) -> logits [B, L, V], row i -> token i.
PredictFn = Callable[[Any, Array, Array | None], Array]

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


@dataclasses.dataclass(frozen=True)
class DreamGenerationConfig:
    """Static knobs of ``diffusion_generate`` (frozen, hashable), with Dream's names.

    Defaults are what ``model.diffusion_generate(ids, **kwargs)`` uses for a field the call
    leaves out under the transformers Dream pins (4.46): with no ``generation_config``
    argument it builds one ``from_model_config``, which carries PretrainedConfig's
    generation defaults (temperature 1.0, top_p 1.0, top_k 50) over DreamGenerationConfig's
    own (0.0, None, None). Dream's and DiffuCoder's READMEs pass temperature and top_p but
    not top_k, so their runs filter to the top 50 logits (which changes the margin and
    entropy confidences, not the argmax).
    """

    max_new_tokens: int = 128  # N masks appended to the prompt.
    steps: int = 512  # Denoising steps (model evaluations).
    eps: float = 1e-3  # Final time of linspace(1, eps, steps + 1).
    alg: str = "origin"  # One of ALGS: how positions to decode are chosen.
    alg_temp: float | None = None  # > 0: draw positions from softmax(conf / alg_temp).
    temperature: float = 1.0  # Token sampling temperature; 0 = argmax.
    top_p: float | None = 1.0  # Nucleus filter (applied if < 1).
    top_k: int | None = 50  # Keep the k largest logits; None: no filter.
    mask_token_id: int = 151666  # Dream's <|mask|> (the checkpoint config's mask_token_id).

    def __post_init__(self):
        for name in ("max_new_tokens", "steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.alg not in ALGS:
            hint = (" (Fast-dLLM's batch-1 variant with a data-dependent step count is not "
                    "ported)" if self.alg == "confidence_threshold" else "")
            raise ValueError(f"alg={self.alg!r}: use one of {ALGS}{hint}")
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"eps={self.eps} must be in (0, 1)")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k is not None and self.top_k <= 0:
            raise ValueError(f"top_k={self.top_k} must be positive")
        if self.alg_temp is not None and self.alg_temp < 0:
            raise ValueError(f"alg_temp={self.alg_temp} must be >= 0")


def timesteps(steps: int, eps: float) -> np.ndarray:
    """``torch.linspace(1, eps, steps + 1)`` in float32, bit for bit: [steps + 1].

    torch computes the first half as start + step * i and the second as end - step *
    (n - 1 - i), each one fused multiply-add (a single rounding), step = (end - start) /
    (n - 1) in float32.
    """
    n = steps + 1
    start, end = np.float32(1.0), np.float32(eps)
    step = np.float64(np.float32((end - start) / np.float32(max(n - 1, 1))))
    i = np.arange(n, dtype=np.float64)
    # float32 * float32 is exact in float64: one rounding to float32, as an FMA
    head = (np.float64(start) + step * i).astype(np.float32)
    tail = (np.float64(end) - step * (n - 1 - i)).astype(np.float32)
    return np.where(np.arange(n) < n // 2, head, tail)


def transfer_fractions(steps: int, eps: float) -> np.ndarray:
    """1 - s/t of every step in float32 (the reference's ``1 - s / t``): [steps]."""
    ts = timesteps(steps, eps)
    return (np.float32(1.0) - ts[1:] / ts[:-1]).astype(np.float32)


def dream_step_keys(rng: Array, step: Array | int) -> tuple[Array, Array, Array]:
    """(position key, token key, alg_temp key) of one step; public for reference tests.

    ``alg="origin"`` compares ``uniform(position key, [B, L])`` at the masked positions
    with 1 - s/t (the reference's ``torch.rand`` over the masked positions in row-major
    order).
    """
    return tuple(jax.random.split(jax.random.fold_in(rng, step), 3))


def _filter(logits: Array, cfg: DreamGenerationConfig) -> Array:
    """top_p_logits then top_k_logits (filtered entries set to the dtype's min)."""
    low = jnp.finfo(logits.dtype).min
    if cfg.top_p is not None and cfg.top_p < 1:
        srt = -jnp.sort(-logits, axis=-1)
        cum = jnp.cumsum(jax.nn.softmax(srt, axis=-1), axis=-1)
        # sorted entry j is kept iff the mass before it is <= top_p (entry 0 always)
        kept = 1 + jnp.sum(cum[..., :-1] <= cfg.top_p, axis=-1, keepdims=True)
        cutoff = jnp.take_along_axis(srt, kept - 1, axis=-1)
        logits = jnp.where(logits < cutoff, low, logits)
    if cfg.top_k is not None:
        kth = jax.lax.top_k(logits, min(cfg.top_k, logits.shape[-1]))[0][..., -1:]
        logits = jnp.where(logits < kth, low, logits)
    return logits


def sample_tokens(logits: Array, key: Array, cfg: DreamGenerationConfig) -> tuple[Array, Array]:
    """(confidence [...], token [...]) per position from logits [..., V], as the reference's
    ``sample_tokens`` with the confidence ``cfg.alg`` reads."""
    logits = logits.astype(jnp.float32)
    if cfg.temperature > 0:
        logits = logits / cfg.temperature
    logits = _filter(logits, cfg)
    probs = jax.nn.softmax(logits, axis=-1)
    if cfg.temperature > 0:
        x0 = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
        conf = jnp.take_along_axis(probs, x0[..., None], axis=-1)[..., 0]
    else:
        x0 = jnp.argmax(probs, axis=-1).astype(jnp.int32)
        conf = jnp.max(probs, axis=-1)
    if cfg.alg == "topk_margin":
        top2 = jax.lax.top_k(probs, 2)[0]
        conf = top2[..., 0] - top2[..., 1]
    elif cfg.alg == "entropy":
        conf = jnp.sum(probs * jnp.log(probs + 1e-10), axis=-1)
    return conf, x0


def _ranks(scores_bl: Array) -> Array:
    """Rank [B, L] of each position under descending score (ties: lower position first)."""
    order = jnp.argsort(-scores_bl, axis=-1, stable=True)
    return jnp.argsort(order, axis=-1, stable=True)


def _step(i: Array, x_bl: Array, logits_blv: Array, rng: Array, frac: Array,
          cfg: DreamGenerationConfig) -> Array:
    """One denoising step of ``_sample``: the ids [B, L] after step i."""
    k_pos, k_tok, k_alg = dream_step_keys(rng, i)
    masked = x_bl == cfg.mask_token_id
    last = i == cfg.steps - 1
    conf, x0 = sample_tokens(logits_blv, k_tok, cfg)
    if cfg.alg == "origin":
        p = jnp.where(last, jnp.float32(1.0), frac[i])
        chosen = masked & (jax.random.uniform(k_pos, x_bl.shape) < p)
        return jnp.where(chosen, x0, x_bl)
    b = x_bl.shape[0]
    n_mask = jnp.sum(masked).astype(jnp.float32) / jnp.float32(b)
    count = jnp.floor(jnp.where(last, n_mask, n_mask * frac[i])).astype(jnp.int32)
    scores = jnp.where(masked, conf, -jnp.inf)
    if cfg.alg_temp:
        g = jax.random.gumbel(k_alg, scores.shape, jnp.float32)
        scores = jnp.where(masked, scores / cfg.alg_temp + g, -jnp.inf)
    chosen = masked & (_ranks(scores) < count)
    return jnp.where(chosen, x0, x_bl)


def diffusion_generate(predict_fn: PredictFn, params: Any, input_ids: Array,
                       attention_mask: Array | None, rng: Array,
                       config: DreamGenerationConfig, max_length: int | None = None, *,
                       trace: bool = False) -> Array | tuple[Array, Array]:
    """Generates ``config.max_new_tokens`` tokens after each (left-padded) prompt.

    Args:
      predict_fn: ``(params, ids, mask) -> logits`` with row i predicting token i
        (``predict_fn_of(model)``).
      params: model params (any sharding).
      input_ids: [B, Lp] int prompts, left-padded.
      attention_mask: [B, Lp] 1 for real tokens, 0 for padding, or None (no padding).
      rng: PRNG key; step i draws from ``dream_step_keys(rng, i)``.
      config: DreamGenerationConfig (static).
      max_length: the model's max_position_embeddings, checked when given.
      trace: also return the trace (the same ids either way).
    Returns:
      ids [B, Lp + max_new_tokens] int32: the prompt followed by the completion; with
      ``trace``, (ids, decoded_at [B, max_new_tokens] int32: the step that unmasked each
      completion token, -1 if none did: TraceRL's step map, dLLM-RL's denoise_step_map).
    """
    b, lp = input_ids.shape
    total = lp + config.max_new_tokens
    if max_length is not None and total > max_length:
        raise ValueError(f"prompt length {lp} + max_new_tokens {config.max_new_tokens} = {total} "
                         f"exceeds the model's max_position_embeddings {max_length}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {attention_mask.shape} != input_ids shape "
                         f"{input_ids.shape}")
    mask = None
    if attention_mask is not None:  # the generated positions are real (the reference pads 1)
        mask = jnp.concatenate([attention_mask.astype(jnp.int32),
                                jnp.ones((b, config.max_new_tokens), jnp.int32)], axis=1)
    x = jnp.concatenate([input_ids.astype(jnp.int32),
                         jnp.full((b, config.max_new_tokens), config.mask_token_id, jnp.int32)],
                        axis=1)
    frac = jnp.asarray(transfer_fractions(config.steps, config.eps))

    def body(i, carry):
        x, dec = carry
        new = _step(i, x, predict_fn(params, x, mask), rng, frac, config)
        masked = config.mask_token_id
        return new, jnp.where((x == masked) & (new != masked), i, dec)
    x, dec = jax.lax.fori_loop(0, config.steps, body, (x, jnp.full(x.shape, -1, jnp.int32)))
    return (x, dec[:, lp:]) if trace else x


def predict_fn_of(model: Any) -> PredictFn:
    """``PredictFn`` of a d1jax model (Dream or LLaDA) through ``predictor.predict_logits``."""
    def predict_fn(params, ids, mask):
        return predictor.predict_logits(model, params, ids, mask)
    return predict_fn


def make_diffusion_generate(model: Any, config: DreamGenerationConfig
                            ) -> Callable[[Any, Array, Array | None, Array], Array]:
    """Jitted ``(params, input_ids, attention_mask, rng) -> ids`` for ``model``."""
    max_length = getattr(model.config, "max_position_embeddings",
                         getattr(model.config, "max_sequence_length", None))
    fn = predict_fn_of(model)

    @jax.jit
    def generate(params, input_ids, attention_mask, rng):
        return diffusion_generate(fn, params, input_ids, attention_mask, rng, config, max_length)
    return generate
