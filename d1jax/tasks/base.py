"""What every task provides (the ``Task`` record), the prompt pieces tasks share, and the
small adapters that turn per-item rules into d1's batched reward functions."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np

Example = dict[str, Any]
RewardFunc = Callable[[list[str], list[Example]], list[float]]

# d1's GRPO system prompt for GSM8K, MATH and Countdown (diffu-grpo/data_utils.py).
XML_SYSTEM_PROMPT = """
Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>
"""

# d1's evaluation prefills the answer with this after the chat template (eval/gsm8k.py).
EVAL_PREFILL = "<reasoning>"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How d1's evaluation parser judges one generation.

    ``hits / total`` is the item's share of d1's pooled accuracy: 1/1 or 0/1 for most
    tasks, correct cells / empty cells for Sudoku. ``correct`` is the strict verdict
    (for Sudoku: every empty cell right).
    """

    extracted: Any
    correct: bool
    hits: float
    total: int

    @property
    def credit(self) -> float:
        """This item's accuracy in [0, 1] (0 when it has nothing to score)."""
        return self.hits / self.total if self.total else 0.0


@dataclasses.dataclass(frozen=True)
class Task:
    """One of d1's tasks: data, prompts, GRPO rewards and the evaluation protocol.

    Training: ``build_messages(example)`` is the chat d1's GRPO prompts with (system prompt
    inside the user turn, no system role), ``reward_funcs`` score completions against the
    dataset rows (``f(completions, examples) -> list[float]``), combined with
    ``reward_weights`` (d1 leaves TRL's default: all 1.0).

    Evaluation: ``build_eval_messages(example)`` is d1's eval chat (eval/*.py), to be
    followed by ``EVAL_PREFILL`` after the chat template (see ``eval_prompt``);
    ``record(example, generation)`` is one item of d1's generation JSON layout;
    ``verdict(record)`` judges such an item with d1's parse rules (eval/parse_and_get_acc.py).
    """

    name: str
    system_prompt: str
    reward_funcs: tuple[RewardFunc, ...]
    reward_weights: tuple[float, ...]
    build_messages: Callable[[Example], list[dict]]
    eval_system_prompt: str
    build_eval_messages: Callable[[Example], list[dict]]
    record: Callable[[Example, str], dict]
    verdict: Callable[[dict], Verdict]
    load_train: Callable[..., list[Example]]
    load_test: Callable[..., list[Example]]
    ground_truth: Callable[[Example], Any]
    eval_prefill: str = EVAL_PREFILL  # appended to the eval prompt after the chat template
    # Judges many records at once (code tasks run them in a pool); None: ``verdict`` each.
    verdicts: Callable[[list[dict]], list[Verdict]] | None = None
    # Index of the reward function that tells a right answer: its value is >= ``correct_at``
    # exactly when the answer is right (math500, gsm8k: 2.0 or 0; countdown: 1.0, 0.1 well
    # formed, 0); what TraceRL's estimator reads (``correctness``). None: the weighted reward
    # is itself a share correct in [0, 1] (letters, sudoku's cells).
    correct_reward: int | None = None
    correct_at: float = 1.0

    def __post_init__(self):
        if len(self.reward_funcs) != len(self.reward_weights):
            raise ValueError(f"task {self.name}: {len(self.reward_funcs)} reward functions but "
                             f"{len(self.reward_weights)} weights")
        if self.correct_reward is not None and not 0 <= self.correct_reward < len(
                self.reward_funcs):
            raise ValueError(f"task {self.name}: correct_reward={self.correct_reward} is not the "
                             f"index of one of its {len(self.reward_funcs)} reward functions")

    def eval_prompt(self, tokenizer, example: Example) -> str:
        """d1's evaluation prompt text: eval chat, chat template, then ``eval_prefill``
        (d1's ``<reasoning>``; the code tasks prefill an open ```python block)."""
        return format_prompt(tokenizer, self.build_eval_messages(example)) + self.eval_prefill

    def reward_columns(self, completions: Sequence[str], examples: Sequence[Example]
                       ) -> np.ndarray:
        """Rewards [B, F] float32, one column per reward function (unweighted)."""
        return np.stack([np.asarray(f(list(completions), list(examples)), np.float32)
                         for f in self.reward_funcs], axis=1)

    def weigh(self, columns: np.ndarray) -> np.ndarray:
        """[B]: the weighted sum of reward columns [B, F], as d1's trainer combines them."""
        return (columns * np.asarray(self.reward_weights, np.float32)).sum(1)

    def correctness(self, columns: np.ndarray) -> np.ndarray:
        """[B] float32 in [0, 1] from reward columns [B, F]: 1.0 where ``correct_reward``'s
        column is >= ``correct_at``, else 0.0; without one, the weighted reward, which must
        lie in [0, 1]."""
        if self.correct_reward is not None:
            return (columns[:, self.correct_reward] >= self.correct_at).astype(np.float32)
        total = self.weigh(columns)
        if total.size and not 0.0 <= total.min() <= total.max() <= 1.0:
            raise ValueError(
                f"task {self.name}: a weighted reward of {float(total.max()):g} (min "
                f"{float(total.min()):g}) is not a share correct in [0, 1], which "
                "correctness-based advantages (grpo.advantage='zscore_filtered') read; "
                "declare the task's correctness reward (Task.correct_reward) or choose "
                "another grpo.advantage")
        return total

    def total_reward(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        """Weighted sum of the rewards of each completion."""
        return [float(r) for r in self.weigh(self.reward_columns(completions, examples))]


def format_prompt(tokenizer, messages: Sequence[dict]) -> str:
    """Chat messages through the tokenizer's chat template, as d1 builds prompts
    (``add_generation_prompt=True, tokenize=False``)."""
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                         tokenize=False)


def user_turn(content: str) -> list[dict]:
    """d1 puts everything, system prompt included, in a single user message."""
    return [{"role": "user", "content": content}]


def batched(item_reward: Callable[[str, Example], float]) -> RewardFunc:
    """Turns ``item_reward(completion, example)`` into ``f(completions, examples)``.

    The batched function keeps the item function's name (it names the logged metric).
    """
    @functools.wraps(item_reward)
    def reward(completions: list[str], examples: list[Example]) -> list[float]:
        if len(completions) != len(examples):
            raise ValueError(f"{item_reward.__name__}: {len(completions)} completions but "
                             f"{len(examples)} examples")
        return [float(item_reward(c, e)) for c, e in zip(completions, examples)]
    return reward
