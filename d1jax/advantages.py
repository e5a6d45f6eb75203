"""Advantage estimators by name. Rewards arrive as [B] with each group of G contiguous."""

from __future__ import annotations

from typing import Callable

import numpy as np


def group_mean(rewards: np.ndarray, group: int) -> np.ndarray:
    """d1: reward minus its group's mean, no std division."""
    r = rewards.reshape(-1, group)
    return (r - r.mean(1, keepdims=True)).reshape(-1)


def grpo(rewards: np.ndarray, group: int, eps: float = 1e-4) -> np.ndarray:
    """DeepSeekMath GRPO: (r - mean) / (std + eps), std unbiased as torch's."""
    r = rewards.reshape(-1, group)
    std = r.std(1, ddof=1, keepdims=True) if group > 1 else np.zeros_like(r[:, :1])
    return ((r - r.mean(1, keepdims=True)) / (std + eps)).reshape(-1)


def dr_grpo(rewards: np.ndarray, group: int) -> np.ndarray:
    """Dr. GRPO (Liu et al. 2025): mean-centred, no std; pair with a constant-length
    normaliser in the loss. The advantage itself equals d1's group mean baseline."""
    return group_mean(rewards, group)


ESTIMATORS: dict[str, Callable[..., np.ndarray]] = {
    "group_mean": group_mean, "grpo": grpo, "dr_grpo": dr_grpo}


def compute(name: str, rewards, group: int) -> np.ndarray:
    """Advantages [B] of ``rewards`` [B] (groups of ``group`` contiguous) by estimator name."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose from {sorted(ESTIMATORS)}")
    rewards = np.asarray(rewards, np.float32)
    if rewards.ndim != 1 or rewards.shape[0] % group:
        raise ValueError(f"rewards of shape {rewards.shape} do not split into groups of {group}")
    return ESTIMATORS[name](rewards, group).astype(np.float32)
