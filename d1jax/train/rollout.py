"""Host-side pieces of a GRPO rollout: prompt encoding and reward metrics (rewards come from
``Task.reward_columns`` and ``Task.weigh``).

Prompts are left-padded (and left-truncated, as d1 does with ``max_prompt_length``) to one
fixed length so the jitted sampler and update compile once for the whole run.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from d1jax.tasks import format_prompt


def encode_prompts(tokenizer, texts: Sequence[str], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask [N, length], left-padded with pad, left-truncated."""
    pad = tokenizer.pad_token_id
    ids = np.full((len(texts), length), pad, np.int32)
    mask = np.zeros((len(texts), length), np.int32)
    for i, t in enumerate(tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
        t = t[-length:]
        if len(t):
            ids[i, length - len(t):] = t
            mask[i, length - len(t):] = 1
    return ids, mask


def uniform_prompt_length(tokenizer, texts: Sequence[str]) -> int:
    """The token length shared by every prompt text; an error if they differ (callers that
    train and generate without padding, like the CPU demo, rely on it)."""
    lengths = {len(t) for t in tokenizer(list(texts), add_special_tokens=False)["input_ids"]}
    if len(lengths) != 1:
        raise ValueError(f"prompts tokenize to {min(lengths)}..{max(lengths)} tokens: "
                         "expected a single length")
    return lengths.pop()


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
