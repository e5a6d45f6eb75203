"""The demo's Sudoku task: d1's 4x4 Sudoku with a short prompt and answer.

The prompt is the question alone, without d1's 180-word system prompt, and the answer is
``<answer>\\ngrid\\n</answer>`` with no ``<reasoning>`` section (so evaluation prefills
nothing). Rewards, d1's parser and the data loaders are d1's Sudoku task's. Importing this
module registers the task as ``NAME``, so a run config reaches it by name
(``config.task.name``) through the public loops (``d1jax.train.sft/grpo``, ``d1jax.eval``).
"""

from __future__ import annotations

import dataclasses

from d1jax import tasks
from d1jax.tasks import Task, format_prompt, sudoku

NAME = "sudoku_compact"


def build_messages(example: dict) -> list[dict]:
    """The question alone, in one user turn (d1 puts its whole prompt in the user turn)."""
    return [{"role": "user", "content": sudoku.question(example)}]


def answer(grid: str) -> str:
    """A completion in the demo's format: the grid between ``<answer>`` tags."""
    return f"<answer>\n{grid}\n</answer>"


@dataclasses.dataclass(frozen=True)
class CompactSudoku(Task):
    """Completions start at ``<answer>``: the evaluation prompt has no ``<reasoning>`` prefill."""

    def eval_prompt(self, tokenizer, example: dict) -> str:
        return format_prompt(tokenizer, self.build_eval_messages(example))


def make_task() -> Task:
    d1 = tasks.get_task("sudoku")
    fields = {f.name: getattr(d1, f.name) for f in dataclasses.fields(Task)}
    fields.update(name=NAME, system_prompt="", build_messages=build_messages,
                  eval_system_prompt="", build_eval_messages=build_messages)
    return CompactSudoku(**fields)


tasks.register_task(NAME, make_task)
