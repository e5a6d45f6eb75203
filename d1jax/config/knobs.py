"""Config groups declared once: each knob's default, type and meaning are one dataclass field.

A group declared here is a frozen dataclass whose fields are the config's knobs, made with
``knob(default, doc, tiny=...)``. ``group(cls, tiny)`` builds the run config's ConfigDict
group from it (the defaults, the CPU-sized ones with ``tiny``); ``translate(cls, group)``
reads it back into the typed dataclass the run uses (``d1jax.run.spec``), each value checked
against the field's type, so a knob is written in one place and read in one place.

    @dataclasses.dataclass(frozen=True)
    class LoopSpec:
        save_every: int = knob(100, "Checkpoint every N optimizer steps.", tiny=2)

    c.train = group(LoopSpec, tiny)        # d1jax.config.defaults
    spec = translate(LoopSpec, c.train)    # d1jax.run.spec

``knob(..., config=TEXT)`` gives a knob whose config value is text the translation parses
(``train.accept_changes``: comma-separated names in the config, a tuple in the spec).
``describe(cls)`` lists the knobs with their meaning (what ``defaults.py``'s comments say
for the groups not declared here yet).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import ml_collections as mlc

_MISSING = object()


def knob(default: Any, doc: str, *, tiny: Any = _MISSING, config: Any = _MISSING) -> Any:
    """A dataclass field with its default, meaning, CPU-sized default and, where the config
    holds text the translation parses, the config's default."""
    return dataclasses.field(default=default, metadata={
        "doc": doc, "tiny": default if tiny is _MISSING else tiny,
        "config": default if config is _MISSING else config, "parsed": config is not _MISSING})


def fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "doc" in f.metadata]


def group(cls, tiny: bool, **overrides: Any) -> mlc.ConfigDict:
    """The ConfigDict group of ``cls``: every knob's default (its tiny one with ``tiny``),
    then ``overrides``."""
    values = {f.name: f.metadata["config"] if f.metadata["parsed"] else
              f.metadata["tiny"] if tiny else f.default for f in fields(cls)}
    unknown = set(overrides) - set(values)
    if unknown:
        raise TypeError(f"{cls.__name__} has no knobs {sorted(unknown)}")
    return mlc.ConfigDict({**values, **overrides})


def translate(cls, config_group, prefix: str, **derived: Any):
    """``cls`` from a config group: each spec knob read once and checked against its
    field's type (``ConfigError`` naming ``prefix.field`` otherwise); ``derived`` gives
    fields whose value the caller computed from the group (e.g. parsed text)."""
    from d1jax.config.defaults import ConfigError
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        if f.name in derived:
            continue
        if f.metadata["parsed"]:
            raise TypeError(f"{prefix}.{f.name} is parsed text: pass its value as derived")
        value = config_group.get(f.name, f.default)
        kind = hints[f.name]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(f"{prefix}.{f.name}={value!r}: expected {kind.__name__}")
        values[f.name] = value
    return cls(**values, **derived)


def describe(cls) -> dict[str, str]:
    """knob name -> its meaning."""
    return {f.name: f.metadata["doc"] for f in fields(cls)}


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """Checkpointing, logging, stopping and export of a training loop: ``config.train``."""

    num_steps: int = knob(1000, "Optimizer steps in the whole run.", tiny=4)
    log_every: int = knob(1, "Metrics every N optimizer steps.")
    sample_every: int = knob(20, "Sample completions as text every N steps.", tiny=2)
    save_every: int = knob(100, "Checkpoint every N optimizer steps.", tiny=2)
    max_to_keep: int = knob(5, "Newest checkpoints kept.", tiny=2)
    keep_best_metric: str = knob(
        "", 'Also keep the best checkpoint by this logged metric ("" off).')
    async_checkpoints: bool = knob(True, "Save in the background.")
    export_hf: bool = knob(
        True, "Write the final model in the Hugging Face layout to <workdir>/hf.")
    stop_after: int = knob(
        0, "Stop (as if preempted, with a save) after this many steps; 0 off.")
    if_incompatible: str = knob(
        "refuse", 'Workdir checkpoints from another config, or none restores: "refuse" (exit '
        '1, nothing changed) or "move_aside" (old run moved to <workdir>/previous/<time>, '
        "start at step 0).")
    accept_changes: tuple[str, ...] = knob(
        (), 'Comma-separated resume fields whose change is accepted on resume, e.g. '
        '"optim.learning_rate" (d1jax.run.resume.RESUME_FIELDS); the spec holds them parsed.',
        config="")
    compile_cache: str = knob(
        "workdir", "Persistent XLA compilation cache of `python -m d1jax.main`, so a rerun "
        'after preemption loads its programs instead of compiling them: "workdir" '
        '(<workdir>/compile_cache), a path (one cache for many runs), or "" (off). '
        "JAX_COMPILATION_CACHE_DIR, when set, wins. Read by the commands (d1jax.cli).")
    stopped_exit_code: int = knob(
        75, "Exit code after a save on SIGTERM or stop_after, so a scheduler reruns the job "
        "(75: EX_TEMPFAIL); 0 if it must read as success.")
