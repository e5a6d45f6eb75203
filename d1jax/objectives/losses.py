"""The objectives: the diffu-GRPO policy loss and d1's masked SFT loss.

``grpo_loss`` is a pure function of per-token log-probs (any estimator's); ``sft_loss`` runs
the model. ``objectives.table`` wires them to the update. Shape letters: B batch, C completion
length, L sequence length.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.objectives.logprob import model_head, head_logps
from d1jax.model.predictor import MaskPredictor

Array = jax.Array


def _masked_mean(x_bc: Array, mask_bc: Array, n: Array) -> Array:
    return jnp.sum(x_bc * mask_bc) / n


def old_or_current(logps_bc: Array, old_logps_bc: Array | None,
                   old_is_current: Array | None) -> Array:
    """The old policy's log-probs for the ratio: the detached current ones when
    ``old_logps_bc`` is None (mu == 1) or ``old_is_current`` (may be traced) is true."""
    if old_logps_bc is None:
        return jax.lax.stop_gradient(logps_bc)
    if old_is_current is not None:
        return jnp.where(old_is_current, jax.lax.stop_gradient(logps_bc), old_logps_bc)
    return old_logps_bc


def clipped_terms(ratio_bc: Array, advantages_b: Array, epsilon: float) -> tuple[Array, Array]:
    """PPO's two surrogate terms (ratio A, clip(ratio, 1 - eps, 1 + eps) A), A per row; the
    per-token policy loss is -min of the two, and a token counts as clipped where the first
    is the smaller (d1's ``is_clipped`` as written)."""
    adv_b1 = advantages_b[:, None].astype(jnp.float32)
    return ratio_bc * adv_b1, jnp.clip(ratio_bc, 1.0 - epsilon, 1.0 + epsilon) * adv_b1


def k3_kl(ref_logps_bc: Array, logps_bc: Array) -> Array:
    """The k3 estimator of KL(policy || ref) per token: exp(ref - logp) - (ref - logp) - 1."""
    diff = ref_logps_bc - logps_bc
    return jnp.exp(diff) - diff - 1.0


def grpo_loss(logps_bc: Array, old_logps_bc: Array | None, ref_logps_bc: Array | None,
              advantages_b: Array, completion_mask_bc: Array, *, epsilon: float, beta: float,
              max_tokens: int | None = None, old_is_current: Array | None = None,
              group_tokens_b: Array | None = None, group_size: int | None = None
              ) -> tuple[Array, dict[str, Array]]:
    """d1's ``DiffuGRPOTrainer.compute_loss`` on per-token log-probs.

    per-token loss = -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A) + beta KL, with
    ratio = exp(logp - old) and KL the k3 estimator exp(ref - logp) - (ref - logp) - 1.

    Args:
      logps_bc: [B, C] current policy (differentiable).
      old_logps_bc: [B, C] the policy that generated the rollout, same mask seed; None is d1's
        mu == 1 case (the detached current log-probs: ratio 1, gradient A grad logp).
      old_is_current: [] bool (may be traced) or None: when true, ``old_logps_bc`` is
        ignored and the detached current log-probs are the old ones (the first inner
        iteration, whose old pass the rollout skipped: ``pure_steps.first_old_from_update``).
      ref_logps_bc: [B, C] reference policy; unused (may be None) when beta == 0.
      advantages_b: [B].
      completion_mask_bc: [B, C], 1 up to and including the first EOS.
      epsilon: ratio clip. beta: KL weight (0: no KL term, no reference needed).
      max_tokens: None is the token mean over the batch (sum / mask.sum()); an int divides
        by that constant instead (Dr. GRPO: B x max completion length).
      group_tokens_b: [B] or None: d1's normalisation. Each row's loss is divided by the
        completion tokens of its whole group of ``group_size`` rows (counted on the full
        batch, ``group_token_counts``, as a group may span micro-batches), and the sum by the
        groups in these rows: averaged over micro-batches, this is the mean over groups of
        each group's token mean, d1's mean over its one-group GPU micro-batches.
    Returns:
      (loss, metrics): kl (only when beta != 0), clip_ratio (d1's ``is_clipped`` as written:
      the share of tokens where ratio A < clip(ratio) A), ratio_mean/min/max, all over the
      completion mask.
    """
    if logps_bc.shape != completion_mask_bc.shape or advantages_b.shape != logps_bc.shape[:1]:
        raise ValueError(f"logps {logps_bc.shape}, completion_mask {completion_mask_bc.shape} "
                         f"and advantages {advantages_b.shape} must be [B, C], [B, C], [B]")
    mask = completion_mask_bc.astype(jnp.float32)
    n_tokens = jnp.maximum(mask.sum(), 1.0)
    ratio = jnp.exp(logps_bc - old_or_current(logps_bc, old_logps_bc, old_is_current))
    loss1, loss2 = clipped_terms(ratio, advantages_b, epsilon)
    per_token = -jnp.minimum(loss1, loss2)
    metrics: dict[str, Array] = {}
    if beta != 0.0:
        if ref_logps_bc is None:
            raise ValueError("beta != 0 needs ref_logps (computed once per rollout)")
        kl = k3_kl(ref_logps_bc, logps_bc)
        per_token = per_token + beta * kl
        metrics["kl"] = _masked_mean(kl, mask, n_tokens)
    if group_tokens_b is not None:
        if max_tokens is not None or not group_size:
            raise ValueError("group_tokens_b needs group_size and excludes max_tokens")
        row_b = jnp.sum(per_token * mask, axis=1) / jnp.maximum(group_tokens_b, 1.0)
        loss = jnp.sum(row_b) / (logps_bc.shape[0] / group_size)
    else:
        denom = n_tokens if max_tokens is None else jnp.float32(max_tokens)
        loss = jnp.sum(per_token * mask) / denom
    valid = mask > 0
    any_valid = jnp.any(valid)
    metrics.update(
        clip_ratio=_masked_mean((loss1 < loss2).astype(jnp.float32), mask, n_tokens),
        ratio_mean=_masked_mean(ratio, mask, n_tokens),
        ratio_min=jnp.where(any_valid, jnp.min(jnp.where(valid, ratio, jnp.inf)), 1.0),
        ratio_max=jnp.where(any_valid, jnp.max(jnp.where(valid, ratio, -jnp.inf)), 1.0))
    return loss, metrics


def group_token_counts(completion_mask_bc: Array, group_size: int) -> Array:
    """[B] completion tokens of each row's group of ``group_size`` contiguous rows (a
    prompt's G completions are contiguous in a rollout)."""
    b = completion_mask_bc.shape[0]
    if b % group_size:
        raise ValueError(f"{b} rows do not split into groups of {group_size} (grpo.token_mean "
                         "'group' needs whole groups)")
    per_group = completion_mask_bc.astype(jnp.float32).sum(1).reshape(-1, group_size).sum(1)
    return jnp.repeat(per_group, group_size)


def sft_noise(key: Array, input_ids_bl: Array, prompt_len_b: Array, mask_id: int,
              eps: float = 1e-3) -> tuple[Array, Array, Array]:
    """d1's ``dLLMDataCollator.forward_process``: (noisy ids [B, L], is_masked [B, L], t [B]).

    t ~ U(0, 1) per row mapped to (1 - eps) t + eps; each token masked with probability t;
    prompt tokens (position < prompt_len) are restored and never count as masked.
    """
    b, l = input_ids_bl.shape
    k_t, k_m = jax.random.split(key)
    t_b = (1.0 - eps) * jax.random.uniform(k_t, (b,)) + eps
    is_mask = jax.random.uniform(k_m, (b, l)) < t_b[:, None]
    is_mask &= jnp.arange(l)[None, :] >= prompt_len_b[:, None]
    return jnp.where(is_mask, mask_id, input_ids_bl), is_mask, t_b


def sft_loss(model: MaskPredictor, params: Any, input_ids_bl: Array, prompt_len_b: Array, key: Array, *,
             eps: float = 1e-3, dropout_rng: Array | None = None,
             seq_chunk: int | None = None) -> tuple[Array, dict[str, Array]]:
    """d1's ``dLLMTrainer.compute_loss`` (LLaDA's SFT objective).

    The completion (everything after ``prompt_len``, EOS padding included) is masked with
    ratio t ~ U(eps, 1); loss = sum over masked tokens of CE / t, divided by the number of
    completion positions in the batch (``numel - num_prompt_tokens``).

    Args:
      input_ids_bl: [B, L] prompt + completion, right-padded with EOS (trained on, as d1).
      prompt_len_b: [B] prompt lengths (never masked, never counted).
      key: noise key. dropout_rng: LoRA dropout (None: deterministic).
    Returns:
      (loss, metrics): unscaled_loss (mean CE over masked tokens) and mask_ratio.
    """
    if input_ids_bl.ndim != 2 or prompt_len_b.shape != input_ids_bl.shape[:1]:
        raise ValueError(f"input_ids {input_ids_bl.shape} must be [B, L] and prompt_len "
                         f"{prompt_len_b.shape} [B]")
    noisy_bl, is_mask_bl, t_b = sft_noise(key, input_ids_bl, prompt_len_b,
                                          model.config.mask_token_id, eps)
    rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
    h_bld = model.apply({"params": params}, noisy_bl, None, method=type(model).hidden,
                        deterministic=dropout_rng is None, rngs=rngs)
    head, scale = model_head(model, params)
    ce_bl = -head_logps(h_bld, head, input_ids_bl, scale=scale, seq_chunk=seq_chunk)
    b, l = input_ids_bl.shape
    n_completion = jnp.maximum(b * l - jnp.clip(prompt_len_b, 0, l).sum(), 1)
    unscaled_bl = jnp.where(is_mask_bl, ce_bl, 0.0)
    loss = jnp.sum(unscaled_bl / t_b[:, None]) / n_completion
    n_masked = jnp.maximum(is_mask_bl.sum(), 1)
    return loss, {"unscaled_loss": unscaled_bl.sum() / n_masked,
                  "mask_ratio": is_mask_bl.sum() / n_completion}
