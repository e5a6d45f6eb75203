"""d1's tasks: GSM8K, MATH500, 4x4 Sudoku and Countdown (plus s1K, the SFT data, and
``letters``, a toy a random tiny model learns: the install check's), and the code tasks
HumanEval and MBPP (code.py; their tests run in sandbox.py's subprocesses).

    task = get_task("gsm8k")
    rows = task.load_train()                                  # dataset rows (dicts)
    prompt = format_prompt(tokenizer, task.build_messages(rows[0]))
    rewards = task.reward_funcs[0](completions, rows[:len(completions)])

Each module holds one task's prompts (exactly d1's text), its GRPO rewards, d1's
evaluation parser and its data loaders; ``d1jax.eval.score`` scores generation files with them.
"""

from __future__ import annotations

import importlib
from typing import Callable

from d1jax.tasks.base import EVAL_PREFILL, Task, Verdict, XML_SYSTEM_PROMPT, format_prompt
from d1jax.tasks.sources import BadRecordError, DataUnavailableError

TASK_NAMES = ("gsm8k", "math500", "sudoku", "countdown")
CODE_TASKS = ("humaneval", "mbpp")  # code.py: DiffuCoder's rewards, sandboxed tests, pass@1
TOY_TASKS = ("letters",)  # learnable by a random tiny model: the install check's (letters.py)
_ALIASES = {"math": "math500", "gsm": "gsm8k"}

__all__ = ["CODE_TASKS", "EVAL_PREFILL", "TASK_NAMES", "TOY_TASKS", "BadRecordError",
           "DataUnavailableError", "Task", "Verdict", "XML_SYSTEM_PROMPT", "format_prompt", "get_task", "register_task"]

# Tasks added by a program built on d1jax (name -> make_task), e.g. examples/demo's.
_REGISTERED: dict[str, Callable[..., Task]] = {}


def get_task(name: str, **options) -> Task:
    """The task called ``name`` (gsm8k, math500, sudoku, countdown; "math" also works; or
    one added with ``register_task``).

    ``options`` go to the module's ``make_task``, e.g.
    ``get_task("math500", equivalence="math_verify")``.
    """
    key = _ALIASES.get(name, name)
    if key in _REGISTERED:
        return _REGISTERED[key](**options)
    if key == "s1k":
        raise ValueError("s1k is SFT data without rewards: use d1jax.tasks.s1k.load_train")
    if key not in TASK_NAMES + CODE_TASKS + TOY_TASKS:
        raise ValueError(f"unknown task {name!r}: choose one of "
                         f"{', '.join(TASK_NAMES + CODE_TASKS + TOY_TASKS + tuple(_REGISTERED))}")
    return importlib.import_module(f"d1jax.tasks.{key}").make_task(**options)


def register_task(name: str, make_task: Callable[..., Task]) -> None:
    """Makes ``get_task(name, **options)`` return ``make_task(**options)`` in this process,
    so run configs name the task (``config.task.name``) like one of d1's."""
    if _ALIASES.get(name, name) in TASK_NAMES + CODE_TASKS + ("s1k",):
        raise ValueError(f"task name {name!r} is one of d1's: register under another name")
    _REGISTERED[name] = make_task
