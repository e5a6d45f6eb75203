"""d1's tasks: GSM8K, MATH500, 4x4 Sudoku and Countdown (plus s1K, the SFT data, and
``letters``, a toy a random tiny model learns: the install check's), and the code tasks
HumanEval and MBPP (code.py; their tests run in sandbox.py's subprocesses).

    task = get_task("gsm8k")
    rows = task.load_train()                                  # dataset rows (dicts)
    prompt = format_prompt(tokenizer, task.build_messages(rows[0]))
    rewards = task.reward_funcs[0](completions, rows[:len(completions)])

Each module holds one task's prompts (exactly d1's text), its GRPO rewards, d1's
evaluation parser and its data loaders; ``d1jax.eval.score`` scores generation files with them.
Each is registered once (``table.py``; another program's with ``register_task`` from a module
named in ``$D1JAX_TASK_MODULES``), with the facts other modules read (``registry.TaskEntry``).
"""

from __future__ import annotations

from d1jax.tasks.base import EVAL_PREFILL, Task, Verdict, XML_SYSTEM_PROMPT, format_prompt
from d1jax.tasks.registry import MODULES_ENV, TaskEntry, get_task, register_task
from d1jax.tasks.sources import BadRecordError, DataUnavailableError

# The registered tasks' lists by kind (their entries' ``kind``), read from the registry.
_KIND_LISTS = {"TASK_NAMES": "d1",  # d1's four
               "CODE_TASKS": "code",  # code.py: DiffuCoder's rewards, sandboxed tests, pass@1
               "TOY_TASKS": "toy"}  # learnable by a random tiny model: the install check's

__all__ = ["CODE_TASKS", "EVAL_PREFILL", "MODULES_ENV", "TASK_NAMES", "TOY_TASKS", "BadRecordError",
           "DataUnavailableError", "Task", "TaskEntry", "Verdict", "XML_SYSTEM_PROMPT",
           "format_prompt", "get_task", "register_task"]


def __getattr__(name: str):
    if name in _KIND_LISTS:
        from d1jax.tasks import registry
        return registry.names(_KIND_LISTS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
