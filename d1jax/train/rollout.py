"""Host-side pieces of a GRPO rollout: prompt texts and reward metrics (rewards come from
``Task.reward_columns`` and ``Task.weigh``). Prompts are encoded by
``d1jax.model.tokenizer.encode_prompts``, left-padded to one fixed length so the jitted
sampler and update compile once for the whole run.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from d1jax.tasks import format_prompt


def chat_prompts(tokenizer, task, examples: Sequence[dict]) -> list[str]:
    """d1's prompt text: the task's chat messages through the tokenizer's chat template."""
    return [format_prompt(tokenizer, task.build_messages(ex)) for ex in examples]


def reward_metrics(task, per_func: np.ndarray, group: int) -> dict[str, float]:
    """d1's logged reward metrics: per-function means, total, group std, zero-std ratio."""
    total = task.weigh(per_func)
    std = total.reshape(-1, group).std(1, ddof=1) if group > 1 else np.zeros(len(total))
    out = {f"rewards/{getattr(f, '__name__', i)}": float(per_func[:, i].mean())
           for i, f in enumerate(task.reward_funcs)}
    out.update(reward=float(total.mean()), reward_std=float(std.mean()),
               zero_std_ratio=float((std < 1e-6).mean()))
    return out


def repeat_examples(examples: Sequence[Any], group: int) -> list[Any]:
    """Each example G times in a row (the layout group advantages expect)."""
    return [ex for ex in examples for _ in range(group)]
