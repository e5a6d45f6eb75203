"""Plugin modules: how a model family, an objective or a task from outside the package joins
its registry. A run names the modules in an environment variable (``$D1JAX_FAMILY_MODULES``,
``$D1JAX_OBJECTIVE_MODULES``, ``$D1JAX_TASK_MODULES``); importing one registers what it
defines (docs/models.md, "Adding a family", and the like for objectives and tasks)."""

from __future__ import annotations

import importlib
import os


def import_named(env: str, kind: str) -> None:
    """Imports every module named in ``$env`` (comma-separated, blanks skipped, importable from
    PYTHONPATH); one it cannot import is a ValueError naming it and the ``kind`` it was to
    register ("family", "objective", "task")."""
    for name in filter(None, (n.strip() for n in os.environ.get(env, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ValueError(f"cannot import the {kind} module {name!r} ({e}); is it on "
                             f"PYTHONPATH?") from None
