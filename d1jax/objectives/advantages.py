"""Advantage estimators by name, and d1's completion mask.

Rewards arrive as [B] with the G completions of each prompt contiguous (B = num_prompts x G),
as TRL/d1 lay them out. The functions work on numpy or jax arrays alike. Each estimator's
record says which signal it reads: the task's weighted reward (d1 and its successors), or
each completion's correctness (TraceRL), whatever reward is logged (``signal``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
import numpy as np

ArrayLike = np.ndarray


def _groups(rewards: ArrayLike, group: int) -> ArrayLike:
    return rewards.reshape(-1, group)


def group_mean(rewards: ArrayLike, group: int) -> ArrayLike:
    """d1: A_i = r_i - mean(r of its group), no division by the std."""
    r = _groups(rewards, group)
    return (r - r.mean(1, keepdims=True)).reshape(-1)


def grpo(rewards: ArrayLike, group: int, eps: float = 1e-4) -> ArrayLike:
    """DeepSeekMath GRPO: (r - mean) / (std + eps), std unbiased (torch's ``std``) as TRL."""
    r = _groups(rewards, group)
    xp = jnp if isinstance(r, jnp.ndarray) else np
    std = r.std(1, ddof=1, keepdims=True) if group > 1 else xp.zeros_like(r[:, :1])
    return ((r - r.mean(1, keepdims=True)) / (std + eps)).reshape(-1)


def dr_grpo(rewards: ArrayLike, group: int) -> ArrayLike:
    """Dr. GRPO (Liu et al. 2025): mean-centred, no std. The advantage equals d1's group mean
    baseline; Dr. GRPO's other half is the loss normaliser (``grpo_loss(max_tokens=...)``)."""
    return group_mean(rewards, group)


def leave_one_out(rewards: ArrayLike, group: int) -> ArrayLike:
    """DiffuCoder's coupled-GRPO (RLOO baseline): A_i = r_i - mean of the other G-1 rewards
    of its group, unscaled (its recipe's ``scale_rewards: false``); G/(G-1) times d1's group
    mean advantage. A group of one has no other completion: its advantage is 0."""
    r = _groups(rewards, group)
    if group == 1:
        return (r * 0).reshape(-1)
    others = (r.sum(1, keepdims=True) - r) / (group - 1)
    return (r - others).reshape(-1)


def zscore_filtered(rewards: ArrayLike, group: int) -> ArrayLike:
    """TraceRL (dLLM-RL ``reward/rl_reward.py``): ``rewards`` are correctness (1/0, or a
    share correct in [0, 1]); (r - mean) / std with the population std, 0 where that std is
    0; a group whose mean (its share correct) is above 0.8 or below 0.2 is dropped there:
    its advantages are 0 here, and TraceRL's loss leaves rows with A = 0 out."""
    r = _groups(rewards, group)
    xp = jnp if isinstance(r, jnp.ndarray) else np
    mean, std = r.mean(1, keepdims=True), r.std(1, keepdims=True)
    z = xp.where(std > 0, (r - mean) / xp.where(std > 0, std, 1.0), 0.0)
    return xp.where((mean > 0.8) | (mean < 0.2), 0.0, z).reshape(-1)


@dataclasses.dataclass(frozen=True)
class Estimator:
    """One advantage estimator: ``fn(signal [B], group) -> advantages [B]``."""

    fn: Callable[..., ArrayLike]
    # True: the signal is each completion's correctness (``Task.correctness``: 1/0, or the
    # task's share correct), as TraceRL z-scores and filters; False: the weighted reward.
    reads_correctness: bool = False


ESTIMATORS: dict[str, Estimator] = {
    "group_mean": Estimator(group_mean), "grpo": Estimator(grpo),
    "dr_grpo": Estimator(dr_grpo), "leave_one_out": Estimator(leave_one_out),
    "zscore_filtered": Estimator(zscore_filtered, reads_correctness=True)}


def _estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose from {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def signal(name: str, task, columns: np.ndarray) -> np.ndarray:
    """[B] float32: what estimator ``name`` reads from ``task``'s reward columns [B, F]:
    ``task.correctness(columns)`` or ``task.weigh(columns)`` (the logged reward)."""
    read = task.correctness if _estimator(name).reads_correctness else task.weigh
    return np.asarray(read(columns), np.float32)


def from_columns(name: str, task, columns: np.ndarray, group: int) -> np.ndarray:
    """Advantages [B] float32 of a rollout: estimator ``name`` on its ``signal`` of
    ``task``'s reward columns [B, F] (what the GRPO loop trains on)."""
    return compute(name, signal(name, task, columns), group)


def compute(name: str, rewards: ArrayLike, group: int) -> np.ndarray:
    """Advantages [B] float32 of ``rewards`` [B] (groups of ``group`` contiguous; the
    estimator's ``signal``) by name: ``group_mean`` (d1), ``grpo`` (std-normalised),
    ``dr_grpo``, ``leave_one_out`` (DiffuCoder's coupled-GRPO) or ``zscore_filtered``
    (TraceRL, on correctness)."""
    est = _estimator(name)
    rewards = np.asarray(rewards, np.float32)
    if group < 1 or rewards.ndim != 1 or rewards.shape[0] % group:
        raise ValueError(f"rewards of shape {rewards.shape} do not split into groups of {group}")
    return np.asarray(est.fn(rewards, group), np.float32)


def completion_mask(completion_ids_bc: ArrayLike, eos_id: int) -> ArrayLike:
    """[B, C] int32: 1 for tokens up to and including the first EOS (every token when a row
    has none), as d1's ``_generate_and_score_completions``."""
    xp = jnp if isinstance(completion_ids_bc, jnp.ndarray) else np
    is_eos = completion_ids_bc == eos_id
    c = completion_ids_bc.shape[1]
    first_b = xp.where(is_eos.any(1), is_eos.argmax(1), c)
    return (xp.arange(c)[None, :] <= first_b[:, None]).astype(xp.int32)
