"""wd1: ratio-free weighted likelihood (arXiv 2507.08838; xiaohangt/wd1
``wd1/trainers/rev_grpo_trainer.py``, ``RevDiffuGRPOTrainer.compute_loss``).

For a group of G completions o_i of one prompt with advantages A_i, and the current policy's
sequence log-likelihood l_i = sum_c m_ic log pi(o_ic) (d1's one-step estimator,
``logprob.per_token_logps``: completion fully masked, prompt masked with probability p):

  w+_i = softmax_i(A),   w-_i = softmax_i(-A),
  L_group = - sum_i w+_i l_i + sum_i w-_i l_i,

and the loss is the mean of L_group over the batch's groups. No ratio, no old-policy or
reference pass: one likelihood of the current policy per update. ``negative=False`` drops the
second term (the authors' ``wll_d1_pos_only`` trainer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from d1jax.model import LLaDA
from d1jax.objectives import logprob, masking

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class WD1Config:
    """wd1 knobs; defaults from the authors' ``wd1/train.yaml`` and ``run/wll_NP_*.sh``."""

    group_size: int = 6  # G: completions per prompt, contiguous in the batch (softmax span).
    negative: bool = True  # Keep the w- term (wll_d1_neg); False: positive part only.
    p_mask_prompt: float = 0.15  # p: probability of masking each prompt token.
    use_attention_mask: bool = True  # False attends to prompt padding, as the authors do.
    seq_chunk: int | None = None  # Completion positions per head chunk (None: automatic).

    def __post_init__(self):
        if self.group_size < 1 or not 0.0 <= self.p_mask_prompt <= 1.0:
            raise ValueError(f"group_size={self.group_size} must be >= 1 and p_mask_prompt="
                             f"{self.p_mask_prompt} in [0, 1]")


def wd1_weights(advantages_b: Array, group_size: int) -> tuple[Array, Array]:
    """(w+ [B], w- [B]): softmax of A and of -A within each contiguous group of G."""
    b = advantages_b.shape[0]
    if b % group_size:
        raise ValueError(f"batch of {b} rows does not split into groups of {group_size}: "
                         "keep each prompt's G completions together and B a multiple of G")
    a_ng = advantages_b.astype(jnp.float32).reshape(-1, group_size)
    return (jax.nn.softmax(a_ng, axis=-1).reshape(b),
            jax.nn.softmax(-a_ng, axis=-1).reshape(b))


def wd1_objective(logps_bc: Array, completion_mask_bc: Array, advantages_b: Array, *,
                  group_size: int, negative: bool = True) -> tuple[Array, dict[str, Array]]:
    """The wd1 loss from per-token log-probs (see module doc).

    Args:
      logps_bc: [B, C] current policy log pi(o_ic) (differentiable).
      completion_mask_bc: [B, C] m_ic. advantages_b: [B] A_i, groups of ``group_size``.
    Returns:
      (loss, metrics): positive_loss (- sum w+ l per group, mean over groups),
      negative_loss (sum w- l), seq_logp_mean (mean l_i).
    """
    if logps_bc.shape != completion_mask_bc.shape or advantages_b.shape != logps_bc.shape[:1]:
        raise ValueError(f"logps {logps_bc.shape}, completion_mask {completion_mask_bc.shape} "
                         f"and advantages {advantages_b.shape} must be [B, C], [B, C], [B]")
    w_pos_b, w_neg_b = wd1_weights(advantages_b, group_size)
    return wd1_weighted_loss(logps_bc, completion_mask_bc, w_pos_b, w_neg_b,
                             logps_bc.shape[0] / group_size, negative=negative)


def wd1_weighted_loss(logps_bc: Array, completion_mask_bc: Array, w_pos_b: Array,
                      w_neg_b: Array, n_groups: float, *, negative: bool = True
                      ) -> tuple[Array, dict[str, Array]]:
    """``wd1_objective`` with the weights given: (- sum w+ l + sum w- l) / n_groups.

    For rows that are not whole groups (a strided micro-batch): weights taken from the
    whole batch (``wd1_weights``) and ``n_groups`` = rows / G, so the mean over micro-batches
    equals the whole batch's loss.
    """
    seq_b = jnp.sum(logps_bc * completion_mask_bc.astype(jnp.float32), axis=-1)
    pos = -jnp.sum(w_pos_b * seq_b) / n_groups
    neg = jnp.sum(w_neg_b * seq_b) / n_groups
    loss = pos + neg if negative else pos
    return loss, {"positive_loss": pos, "negative_loss": neg, "seq_logp_mean": seq_b.mean()}


def wd1_loss(model: LLaDA, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
             completion_ids_bc: Array, completion_mask_bc: Array, advantages_b: Array,
             rng: Array, cfg: WD1Config, *, dropout_rng: Array | None = None
             ) -> tuple[Array, dict[str, Array]]:
    """The wd1 loss of one update: one current-policy pass, no old or reference pass.

    Args:
      prompt_ids_bp: [B, P] int. prompt_mask_bp: [B, P] (1 = real token).
      completion_ids_bc: [B, C] int. completion_mask_bc: [B, C], 1 up to the first EOS.
      advantages_b: [B] A_i, each prompt's G completions contiguous.
      rng: the mask key of this inner iteration (draws the prompt mask).
      dropout_rng: LoRA dropout (None: deterministic).
    Returns:
      (loss, metrics) of ``wd1_objective``.
    """
    attn_bl = masking.attention_mask(prompt_mask_bp, completion_ids_bc.shape[1],
                                     cfg.use_attention_mask)
    logps_bc = logprob.per_token_logps(
        model, params, prompt_ids_bp, completion_ids_bc, jnp.zeros((1,), jnp.int32),
        p_mask_prompt=cfg.p_mask_prompt, mask_rng=rng, attention_mask_bl=attn_bl,
        seq_chunk=cfg.seq_chunk, dropout_rng=dropout_rng)[0]
    return wd1_objective(logps_bc, completion_mask_bc, advantages_b,
                         group_size=cfg.group_size, negative=cfg.negative)
