"""Config variants: the ``ARG`` of ``--config=configs/x.py:ARG``, one syntax for every config
file. ``ARG`` is comma-separated words in any order, each one of the words that config
declares, and nothing is the full-size run: ``:tiny``, ``:authors,tiny``, ``:sudoku,tiny``
(configs/eval.py), ``:dream,tiny`` (configs/tracerl_math.py), ``:d1like,ci`` (the demo).
Anything else is one ConfigError naming the config file and listing its words
(docs/training.md, "Config variants")."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

from d1jax.knobs import ConfigError

# Outside the package: the config files (configs/, a user's) and the demo's examples/.
_PACKAGE = Path(__file__).resolve().parents[1]


def parse(arg: str | None, allowed: Sequence[str],
          exclusive: Iterable[Sequence[str]] = ()) -> frozenset[str]:
    """The words of ``arg``, each one of ``allowed``; at most one word of each group in
    ``exclusive`` (``("tiny", "full")``; the eval config's tasks). ConfigError otherwise, in
    one line that names the config file asking and lists ``allowed``."""
    given = [w.strip() for w in (arg or "").split(",") if w.strip()]
    unknown = [w for w in given if w not in allowed]
    if unknown:
        bad = unknown[0]
        use = (f"use comma-separated words from {', '.join(allowed)}, or nothing" if allowed
               else "it takes none")
        parts = bad.split("-")
        if len(parts) > 1 and all(p in allowed for p in parts):  # the old ':sudoku-tiny'
            use += f" (':{','.join(parts)}', not ':{bad}')"
        raise ConfigError(f"unknown config variant {bad!r}{_where()}: {use}")
    for group in exclusive:
        both = [w for w in given if w in group]
        if len(both) > 1:
            raise ConfigError(f"config variant {arg!r}{_where()} names {' and '.join(both)}: "
                              f"choose one of {', '.join(group)}")
    return frozenset(given)


def _where() -> str:
    """`` for configs/x.py``: the file whose ``get_config`` asked, the outermost one on the
    stack (configs/demo_sudoku.py's calls examples/demo/config.py's), relative to the working
    directory when inside it; '' when no config file asked (a builder called from code)."""
    found, frame = None, sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if frame.f_code.co_name == "get_config" and _PACKAGE not in path.parents:
            found = path
        frame = frame.f_back
    if found is None:
        return ""
    rel = os.path.relpath(found)
    return f" for {found if rel.startswith('..') else rel}"
