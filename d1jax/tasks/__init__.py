"""d1's tasks: GSM8K, MATH500, 4x4 Sudoku and Countdown (plus s1K, the SFT data).

    task = get_task("gsm8k")
    rows = task.load_train()                                  # dataset rows (dicts)
    prompt = format_prompt(tokenizer, task.build_messages(rows[0]))
    rewards = task.reward_funcs[0](completions, rows[:len(completions)])

Each module holds one task's prompts (exactly d1's text), its GRPO rewards, d1's
evaluation parser and its data loaders; ``d1jax.eval.score`` scores generation files with them.
"""

from __future__ import annotations

import importlib

from d1jax.tasks.base import EVAL_PREFILL, Task, Verdict, XML_SYSTEM_PROMPT, format_prompt
from d1jax.tasks.sources import BadRecordError, DataUnavailableError

TASK_NAMES = ("gsm8k", "math500", "sudoku", "countdown")
_ALIASES = {"math": "math500", "gsm": "gsm8k"}

__all__ = ["EVAL_PREFILL", "TASK_NAMES", "BadRecordError", "DataUnavailableError", "Task",
           "Verdict", "XML_SYSTEM_PROMPT", "format_prompt", "get_task", "task_from_config"]


def get_task(name: str, **options) -> Task:
    """The task called ``name`` (gsm8k, math500, sudoku, countdown; "math" also works).

    ``options`` go to the module's ``make_task``, e.g.
    ``get_task("math500", equivalence="math_verify")``.
    """
    key = _ALIASES.get(name, name)
    if key == "s1k":
        raise ValueError("s1k is SFT data without rewards: use d1jax.tasks.s1k.load_train")
    if key not in TASK_NAMES:
        raise ValueError(f"unknown task {name!r}: choose one of {', '.join(TASK_NAMES)}")
    return importlib.import_module(f"d1jax.tasks.{key}").make_task(**options)


def task_from_config(config) -> Task:
    """The task a run config names (``config.task.name``, and ``config.task.prompt``
    when it is not d1's own prompt)."""
    prompt = config.task.get("prompt", "d1")
    return get_task(config.task.name, **({} if prompt == "d1" else {"prompt": prompt}))
