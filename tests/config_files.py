"""The repository's config files (``configs/**/*.py``), loaded by path as ``--config=`` loads
them: one loader for every test that builds a config without the command line."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from d1jax import config

ROOT = Path(__file__).resolve().parents[1]


def load_module(path: str | Path) -> ModuleType:
    """The module of the Python file ``path`` (relative to the repository root, or absolute),
    imported fresh under a name of its own (``configs/dream/eval.py`` -> ``config_dream_eval``)
    so that two files of one stem do not share a module."""
    path = Path(path)
    path = path if path.is_absolute() else ROOT / path
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)
    name = "config_" + "_".join(rel.with_suffix("").parts[1 if rel.parts[0] == "configs" else 0:])
    return config.config_module(path, name)


def load_config(path: str | Path, arg: str | None = None):
    """``get_config(arg)`` of the config file ``path``. ``path`` may carry the argument as the
    command line does (``"configs/eval.py:sudoku,tiny"``); an explicit ``arg`` wins."""
    file, _, flag_arg = str(path).partition(":")
    return load_module(file).get_config(arg if arg is not None else (flag_arg or None))
