"""TraceRL for the full-attention families (LLaDA, Dream): Gen-Verse/dLLM-RL
``train/rl_llada.py``, ``train/rl_dream.py`` (``configs/rl_llada.yaml``, ``rl_dream.yaml``).
The block diffusion variant (SDAR, TraDo) is ``d1jax.objectives.tracerl``, whose config
(``TraceRLConfig``) and objective this module shares; what differs here:

- No training blocks: the distinct steps of the whole response are ranked and ``shrink``
  merges ranks k at a time (their ``collapse_k_unique`` over the whole step map). Round r's
  copy is the prompt followed by the response with every token of round >= r masked (their
  ``mask_pos = order_full >= step_val``); its p_mask is round r. One forward of P + C per
  copy, no clean stream: a token's log-prob is the model's prediction at its position
  (LLaDA) or at the row before (Dream's shift, which ``MaskPredictor.hidden`` applies).
- Attention: the prompt's padding is attended unless ``use_attention_mask`` (the sampler's):
  rl_llada.py passes no mask (nor does their LLaDA rollout); rl_dream.py masks the prompt's
  padding keys. ``their_dream_forward`` reproduces the rest of rl_dream.py's training
  forward: RoPE positions 0..L-1 across the left padding (their rollout, and d1jax, count
  real tokens only) and the response's first position dropped as a key when the copy holds
  the pad token there (their ``idx <= start_pos``).
- ``post_num``: the response's pad tokens after its first ``post_num`` (counted on the
  response, not on a copy's p_mask) are never scored; random_masking and coupled mask them in
  every copy.
- random_masking: one t ~ U(lower_p, upper_p) per copy, each response position masked and
  scored with probability t; coupled: that copy and its complement. Theirs draws
  ``mask_times_per_sample`` such copies per row at once; here each inner iteration's seed
  draws one (the objective scores a token once per iteration).
- Loss per copy (their ``forward_process``), r = exp(logp - old), not clamped:

    -sum_c p_mask min(r A, clip(r, 1 - eps, 1 + eps) A) / max(n_mask, 1)
    + beta sum_c p_mask (exp(old - logp) - 1 + logp - old)      (k3; not divided by n_mask)

  then the mean over copies with a non-empty p_mask and A != 0 (a dropped group, as in
  tracerl.py), counted on the whole batch.

Shape letters: B completions, P prompt, C completion, R rounds (copies).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import logprob, tracerl

Array = jax.Array


def is_full_attention(model: MaskPredictor, cfg: tracerl.TraceRLConfig) -> bool:
    """True for a model without training blocks (LLaDA, Dream); ValueError where the config
    asks such a model for blocks, or asks Dream's training forward of another family."""
    if cfg.their_dream_forward and not getattr(model, "shifted_prediction", False):
        raise ValueError(f"TraceRL their_dream_forward=True is rl_dream.py's forward; "
                         f"{type(model).__name__} is not Dream: set it to False")
    if getattr(model.config, "block_size", None) is not None:
        return False
    if cfg.block_size is not None:
        raise ValueError(f"TraceRL block_size={cfg.block_size}: {type(model).__name__} has "
                         "full attention and its TraceRL (dLLM-RL rl_llada.py, rl_dream.py) "
                         "has no training blocks; leave grpo.tracerl.block_size at 0")
    return True


def num_rounds(cfg: tracerl.TraceRLConfig, completion_len: int) -> int:
    """R: ceil(C / shrink) for the trace (at most C distinct steps), 1 for random_masking,
    2 for coupled."""
    return tracerl.num_rounds(cfg, completion_len)


def tail_pads(completion_bc: Array, pad_id: int, post_num: int | None) -> Array:
    """[B, C] the response's pad tokens past its first ``post_num`` (None: none)."""
    pad = completion_bc == pad_id
    if post_num is None:
        return jnp.zeros_like(pad)
    return pad & (jnp.cumsum(pad, axis=1) > post_num)


def draw_rounds(cfg: tracerl.TraceRLConfig, key: Array, decoded_at_bc: Array | None,
                shape: tuple) -> Array:
    """[B, C] int32 rounds (-1: never scored): the trace's ranks over the whole response, or
    one random draw (t per row) for the random variants."""
    if cfg.method == "TraceRL":
        if decoded_at_bc is None:
            raise ValueError("TraceRL needs the rollout's trace: per_row['decoded_at'] [B, C] "
                             "(the block sampler's decoded_at)")
        return tracerl.trace_rounds(decoded_at_bc, shape[1], cfg.shrink)
    k_t, k_u = jax.random.split(key)
    t = jax.random.uniform(k_t, (shape[0], 1), minval=cfg.lower_p, maxval=cfg.upper_p)
    noise = jax.random.uniform(k_u, shape) < t
    return jnp.where(noise, 0, 1 if cfg.method == "coupled" else -1).astype(jnp.int32)


def copies(cfg: tracerl.TraceRLConfig, completion_bc: Array, round_bc: Array, rounds: int,
           mask_id: int, pad_id: int) -> tuple[Array, Array]:
    """(noised copies [B, R, C], p_mask [B, R, C]) as their prepare_inputs_and_labels."""
    r = jnp.arange(rounds)[None, :, None]
    tail = tail_pads(completion_bc, pad_id, cfg.post_num)[:, None, :]
    in_round = round_bc[:, None, :] == r
    if cfg.method == "TraceRL":
        masked = round_bc[:, None, :] >= r
    else:
        masked = in_round | tail
    noised = jnp.where(masked, mask_id, completion_bc[:, None, :]).astype(jnp.int32)
    return noised, in_round & ~tail


def row_scale(cfg: tracerl.TraceRLConfig, completion_bc: Array, round_bc: Array,
              advantages_b: Array, rounds: int, pad_id: int) -> Array:
    """[B] B / n_rows: n_rows the copies with a non-empty p_mask of completions with A != 0,
    counted on the whole batch (a micro-batch's loss is the mean of sum x scale)."""
    _, pm = copies(cfg, completion_bc, round_bc, rounds, 0, pad_id)
    n = jnp.sum(jnp.any(pm, axis=-1) & (advantages_b != 0)[:, None]).astype(jnp.float32)
    b = completion_bc.shape[0]
    return jnp.full((b,), b / jnp.maximum(n, 1.0), jnp.float32)


def round_logps(model: MaskPredictor, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
                completion_bc: Array, round_bc: Array, cfg: tracerl.TraceRLConfig, *,
                use_lora: bool = True, dropout_rng: Array | None = None) -> Array:
    """[B, C] log p of each completion token in its own round's copy (0 where never scored);
    one forward of P + C per copy, the copies one after another (memory flat in R)."""
    c, mask_id, pad_id = completion_bc.shape[1], model.config.mask_token_id, model.config.pad_token_id
    rounds = num_rounds(cfg, c)
    noised, scored = copies(cfg, completion_bc, round_bc, rounds, mask_id, pad_id)
    b, p = prompt_ids_bp.shape
    head, scale = logprob.model_head(model, params)
    rngs_of = (lambda r: {}) if dropout_rng is None else (
        lambda r: {"dropout": jax.random.fold_in(dropout_rng, r)})

    def one(r):
        copy_bc = noised[:, r]
        ids = jnp.concatenate([prompt_ids_bp.astype(jnp.int32), copy_bc], axis=1)
        attn = positions = None
        if cfg.use_attention_mask or cfg.their_dream_forward:
            attn = jnp.concatenate([prompt_mask_bp.astype(jnp.int32),
                                    jnp.ones_like(copy_bc)], axis=1)
        if cfg.their_dream_forward:  # rl_dream.py: arange positions, idx <= start_pos
            attn = attn.at[:, p].set((copy_bc[:, 0] != pad_id).astype(jnp.int32))
            positions = jnp.arange(p + c)
        h = model.apply({"params": params}, ids, attn, method=type(model).hidden,
                        positions=positions, use_lora=use_lora,
                        deterministic=dropout_rng is None, rngs=rngs_of(r), keep_last=c)
        lp = logprob.head_logps(h, head, completion_bc, scale=scale, seq_chunk=cfg.seq_chunk)
        return jnp.where(scored[:, r], lp, 0.0)

    return jnp.sum(jax.lax.map(one, jnp.arange(rounds)), axis=0)


def tracerl_loss(model: MaskPredictor, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
                 completion_bc: Array, advantages_b: Array, round_bc: Array, scale_b: Array,
                 cfg: tracerl.TraceRLConfig, *, epsilon: float,
                 old_logps_bc: Array | None = None, dropout_rng: Array | None = None,
                 old_is_current: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """``round_logps`` of the current params, then their per-copy loss (module doc) through
    ``tracerl.tracerl_objective``: each token's policy term weighted 1 / n_mask of its copy.
    ``round_bc``: ``draw_rounds``; ``scale_b``: ``row_scale`` of the whole batch."""
    rounds = num_rounds(cfg, completion_bc.shape[1])
    lp = round_logps(model, params, prompt_ids_bp, prompt_mask_bp, completion_bc, round_bc, cfg,
                     dropout_rng=dropout_rng)
    _, pm = copies(cfg, completion_bc, round_bc, rounds, 0, model.config.pad_token_id)
    n_br = jnp.maximum(jnp.sum(pm, axis=-1), 1).astype(jnp.float32)  # [B, R]
    per_copy = jnp.take_along_axis(n_br, jnp.clip(round_bc, 0, rounds - 1), axis=1)
    scored = jnp.any(pm, axis=1) & (advantages_b != 0)[:, None]  # A = 0: a dropped group
    return tracerl.tracerl_objective(lp, old_logps_bc, advantages_b, scored, scale_b,
                                     epsilon=epsilon, beta=cfg.beta,
                                     k3=cfg.use_kl_estimator_k3, old_is_current=old_is_current,
                                     policy_weight_bc=1.0 / per_copy, clamp=None)
