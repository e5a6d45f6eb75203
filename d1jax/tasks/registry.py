"""The tasks by name: one entry per task (``TaskEntry``) holding every fact that other modules
need of it, and the registry of those entries.

``get_task`` builds the entry's ``Task`` (prompts, rewards, parser, loaders); the config
builders read its default mu, training source and evaluation sizes (``d1jax.config.defaults``),
the input checks its named sources, the scorer its file-name tokens and report
(``d1jax.eval.score``), SFT its trajectories (``d1jax.train.sft``). None of them asks which
task it has.

Built in: ``d1jax.tasks.table`` (d1's gsm8k, math500, sudoku, countdown; humaneval, mbpp;
letters; s1k, SFT data). Another task registers with ``register_task(name, make_task, ...)``
from its own module; a run names that module in ``$D1JAX_TASK_MODULES`` (comma-separated,
importable from PYTHONPATH), imported when a config is built and when ``get_task`` is asked
for a task it does not know yet (docs/evaluation.md, "Adding a task").
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from d1jax import plugins
from d1jax.tasks.base import Example, Task

# Modules that register tasks, imported by ``load_modules`` (comma-separated).
MODULES_ENV = "D1JAX_TASK_MODULES"
KINDS = ("d1", "code", "toy", "sft", "")  # d1's four, code, toys, SFT data, any other


def reasoning_answer(example: Example) -> str:
    """The default SFT trajectory of a row with a known answer: d1's reasoning/answer layout
    around its ``answer`` (or ``solution``)."""
    answer = str(example.get("answer", example.get("solution", "")))
    return f"<reasoning>\nWork it out step by step.\n</reasoning>\n<answer>\n{answer}\n</answer>"


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """One task and every fact the rest of the package needs of it."""

    name: str  # config.task.name
    # (**options) -> Task (``get_task(name, **options)``); None: SFT data without rewards.
    make: Callable[..., Task] | None
    kind: str = ""  # which list names it (tasks.TASK_NAMES: "d1", CODE_TASKS, TOY_TASKS)
    aliases: tuple[str, ...] = ()  # other names get_task takes ("math" for math500)
    mu: int = 12  # config.grpo.num_iterations at full size (d1's NUM_ITER of the task)
    # config.task.source of the full-size GRPO configs ("": the loader's default; ':tiny' and
    # ':generated' keep "").
    train_source: str = ""
    sources: tuple[str, ...] = ()  # source names its loaders take beside files and Hub ids
    eval_examples: int = 0  # config.eval.num_examples at full size (0: all)
    gen_lengths: tuple[int, ...] = (128, 256, 512)  # config.eval.gen_lengths at full size
    # First tokens of a generation file's name that name it besides its own name (``gsm``),
    # and the substring d1's parse_and_get_acc.py picks it by ("": none).
    file_tokens: tuple[str, ...] = ()
    d1_substring: str = ""
    # SFT: (row) -> the completion a generated row trains on (default: ``reasoning_answer``);
    # ``sft_rows(source)``: SFT pairs of its own ({"prompt", "completion"}) instead.
    trajectory: Callable[[Example], str] = reasoning_answer
    sft_rows: Callable[..., list[dict]] | None = None
    math_equivalence: bool = False  # make takes equivalence= (the scorer's --math-equivalence)
    # Verdicts give partial credit (hits / total): summaries also report fully solved items.
    reports_solved: bool = False
    # (sample file .jsonl, test rows) -> pass@k summary (code tasks; None: no sample files).
    score_samples: Callable[[Any, list], dict] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"task {self.name!r}: kind={self.kind!r}, not one of {KINDS}")
        if (self.make is None) == (self.sft_rows is None):
            raise ValueError(f"task {self.name!r}: give make (a task with rewards) or sft_rows "
                             "(SFT data without rewards), not both or neither")

    def build(self, **options) -> Task:
        if self.make is None:
            rows = self.sft_rows
            raise ValueError(f"{self.name} is SFT data without rewards: use "
                             f"{rows.__module__}.{rows.__name__}")
        return self.make(**options)


TASKS: dict[str, TaskEntry] = {}  # name -> entry, in registration order
_ALIASES: dict[str, str] = {}  # alias -> name


def _same_maker(a: TaskEntry, b: TaskEntry) -> bool:
    """Both from the same function of the same module (a module imported again)."""
    fa, fb = a.make or a.sft_rows, b.make or b.sft_rows
    return (fa.__module__, fa.__qualname__) == (fb.__module__, fb.__qualname__)


def register_task(name: str, make_task: Callable[..., Task] | None, **facts) -> TaskEntry:
    """Makes ``get_task(name, **options)`` return ``make_task(**options)``; ``facts`` are the
    other fields of its ``TaskEntry`` (mu, eval_examples, gen_lengths, ...). Run configs then
    name it (``config.task.name``) like one of d1's. Registering it again from the same module
    replaces it; a name taken by another task is a ValueError."""
    importlib.import_module("d1jax.tasks.table")  # the built-ins first: their names are taken
    entry = TaskEntry(name, make_task, **facts)
    for key in (name,) + entry.aliases:
        known = TASKS.get(_ALIASES.get(key, key))
        if known is not None and not (known.name == name and _same_maker(known, entry)):
            whose = {"d1": "one of d1's", "": "already registered"}.get(known.kind, "built in")
            raise ValueError(f"task name {key!r} is {whose} ({known.name}): register under "
                             "another name")
    TASKS[name] = entry
    _ALIASES.update({a: name for a in entry.aliases})
    return entry


def load_modules() -> None:
    """Imports the built-in tasks and the modules named in ``$D1JAX_TASK_MODULES``."""
    importlib.import_module("d1jax.tasks.table")
    plugins.import_named(MODULES_ENV, "task")


def find(name: str) -> TaskEntry | None:
    """The entry of ``name`` (or an alias), None when no task has it."""
    key = _ALIASES.get(name, name)
    if key not in TASKS:
        load_modules()
        key = _ALIASES.get(name, name)
    return TASKS.get(key)


def entry(name: str) -> TaskEntry:
    """The entry of ``name``; ValueError listing the tasks when none has it."""
    found = find(name)
    if found is None:
        raise ValueError(f"unknown task {name!r}: choose one of {', '.join(names())}")
    return found


def names(kind: str | None = None) -> tuple[str, ...]:
    """The tasks with rewards, in registration order (of ``kind`` only, if given)."""
    load_modules()
    return tuple(e.name for e in TASKS.values()
                 if e.make is not None and kind in (None, e.kind))


def get_task(name: str, **options) -> Task:
    """The task called ``name`` (gsm8k, math500, sudoku, countdown, humaneval, mbpp, letters;
    "math" also works; or one added with ``register_task``).

    ``options`` go to its ``make_task``, e.g. ``get_task("math500", equivalence="math_verify")``.
    """
    return entry(name).build(**options)
