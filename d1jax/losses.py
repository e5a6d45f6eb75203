"""The objectives: d1's masked SFT loss and the diffu-GRPO policy loss.

Both are pure functions of arrays; ``update.py`` wires them to a model and an optimizer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.logprob import token_logps
from d1jax.model import LLaDA

Array = jax.Array


def grpo_loss(logps: Array, old_logps: Array, ref_logps: Array | None, advantages: Array,
              completion_mask: Array, *, epsilon: float, beta: float) -> tuple[Array, dict]:
    """d1's ``compute_loss`` on per-token log-probs.

    Args:
      logps: [B, Lc] current policy (differentiable).
      old_logps: [B, Lc] the policy that generated the rollout (same mask seed).
      ref_logps: [B, Lc] reference policy, or None when beta == 0.
      advantages: [B].
      completion_mask: [B, Lc] 1 up to and including the first EOS.
      epsilon: ratio clip. beta: weight of the k3 KL ``exp(r - l) - (r - l) - 1``.
    Returns:
      (loss, metrics): the per-token loss averaged over every completion token of the
      batch (token mean), and kl, clip_ratio, ratio mean/min/max over those tokens.
    """
    mask = completion_mask.astype(jnp.float32)
    n = jnp.maximum(mask.sum(), 1.0)
    ratio = jnp.exp(logps - old_logps)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    adv = advantages[:, None]
    l1, l2 = ratio * adv, clipped * adv
    per_token = -jnp.minimum(l1, l2)
    metrics = {}
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps")
        d = ref_logps - logps
        kl = jnp.exp(d) - d - 1.0
        per_token = per_token + beta * kl
        metrics["kl"] = (kl * mask).sum() / n
    loss = (per_token * mask).sum() / n
    valid = mask > 0
    metrics.update(
        clip_ratio=((l1 < l2).astype(jnp.float32) * mask).sum() / n,
        ratio_mean=(ratio * mask).sum() / n,
        ratio_min=jnp.min(jnp.where(valid, ratio, jnp.inf)),
        ratio_max=jnp.max(jnp.where(valid, ratio, -jnp.inf)))
    return loss, metrics


def sft_noise(key: Array, input_ids: Array, prompt_len: Array, mask_id: int,
              eps: float = 1e-3) -> tuple[Array, Array, Array]:
    """d1's dLLMDataCollator.forward_process: (noisy ids, is_masked, t) for [B, L] ids.

    t ~ U(0, 1) per row, mapped to (1 - eps) t + eps; each token masked with probability t;
    prompt tokens (position < prompt_len) restored and never counted.
    """
    b, l = input_ids.shape
    kt, km = jax.random.split(key)
    t = (1.0 - eps) * jax.random.uniform(kt, (b,)) + eps
    is_mask = jax.random.uniform(km, (b, l)) < t[:, None]
    is_mask &= jnp.arange(l)[None, :] >= prompt_len[:, None]
    return jnp.where(is_mask, mask_id, input_ids), is_mask, t


def sft_loss(model: LLaDA, params: Any, input_ids: Array, prompt_len: Array, key: Array, *,
             mask_id: int, eps: float = 1e-3, dropout_rng: Array | None = None,
             ) -> tuple[Array, dict]:
    """d1's dLLMTrainer loss: sum over masked tokens of CE / t, divided by the number of
    non-prompt positions in the batch (``numel - num_prompt_tokens``).

    input_ids [B, L] (right-padded with EOS, which is trained on), prompt_len [B].
    """
    noisy, is_mask, t = sft_noise(key, input_ids, prompt_len, mask_id, eps)
    rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
    h = model.apply({"params": params}, noisy, None, method=LLaDA.hidden,
                    deterministic=dropout_rng is None, rngs=rngs)
    ce = -token_logps(model, params, h, input_ids)
    b, l = input_ids.shape
    denom = b * l - jnp.minimum(prompt_len, l).sum()
    unscaled = jnp.where(is_mask, ce, 0.0)
    loss = (unscaled / t[:, None]).sum() / jnp.maximum(denom, 1)
    metrics = {"loss": loss, "unscaled_loss": unscaled.sum() / jnp.maximum(is_mask.sum(), 1),
               "mask_ratio": is_mask.sum() / jnp.maximum(denom, 1)}
    return loss, metrics
