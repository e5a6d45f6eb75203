"""A knob: one dataclass field carrying its default, its CPU-sized default (``tiny``), its
meaning and the values it allows; a group: a frozen dataclass of knobs.

The declaration half of ``d1jax.config.knobs`` (which builds the ConfigDict groups from these
fields and translates them back), kept below every layer that declares knobs: the run's groups
(``d1jax.config.groups``) and the objectives' own, each next to its module
(``d1jax.objectives.wd1.WD1Knobs``, ...), without importing the config layer.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable

_MISSING = object()


class ConfigError(ValueError):
    """A config that cannot run; raised before any compute."""


def knob(default: Any, doc: str, *, tiny: Any = _MISSING, choices: tuple = (),
         parse: Callable[[Any], Any] | None = None, kind: Any = None,
         low: int | None = None, high: int | None = None) -> Any:
    """A dataclass field: the config's default, the knob's meaning, its CPU-sized default,
    the values allowed, and where the spec holds another form, the function that makes it
    (the config's value then checked against ``kind``, default the default's type).
    ``low``, ``high``: the least and greatest values allowed (of each element, for a tuple,
    which must not be empty)."""
    meta = {"doc": doc, "default": default, "tiny": default if tiny is _MISSING else tiny,
            "choices": tuple(choices), "parse": parse, "low": low, "high": high,
            "kind": kind if kind is not None or parse is None else type(default)}
    if parse is None:
        return dataclasses.field(default=default, metadata=meta)
    return dataclasses.field(default_factory=lambda: parse(default), metadata=meta)


def subgroup(cls, doc: str) -> Any:
    """A nested group of knobs (its own ConfigDict inside the parent's)."""
    return dataclasses.field(default_factory=cls, metadata={"doc": doc, "group": cls})


def fields(cls) -> list[dataclasses.Field]:
    """The knobs (and nested groups) of ``cls``, in declaration order. A class with
    ``more_groups`` (``(after, field holding them, () -> [(name, group class, doc)])``) gets
    those groups spliced in after the knob ``after``: groups whose set is open (the registered
    objectives' own knobs under ``config.grpo``)."""
    out = [f for f in dataclasses.fields(cls) if "doc" in f.metadata]
    more = getattr(cls, "more_groups", None)
    if more is None:
        return out
    after, _, declared = more
    extra = []
    for name, group_cls, doc in declared():
        f = subgroup(group_cls, doc)
        f.name = name
        extra.append(f)
    at = next(i for i, f in enumerate(out) if f.name == after) + 1
    return out[:at] + extra + out[at:]


def frozen(cls):
    """A group: a frozen dataclass whose bounds (``low=``, ``high=``) hold however it is
    built, so a notebook's ``LoopSpec(sample_every=0)`` fails at once, not at ``step % 0``."""
    cls.__post_init__ = check_bounds
    cls = dataclasses.dataclass(frozen=True)(cls)
    hints = typing.get_type_hints(cls)  # real types where the module defers annotations
    for f in dataclasses.fields(cls):
        f.type = hints.get(f.name, f.type)
    return cls


def check_value_bounds(f: dataclasses.Field, value: Any, where: str) -> None:
    """ConfigError naming ``where``, the value and the bound when ``value`` is outside the
    knob's ``low``/``high`` (a count of 0 would end a run in ``step % 0`` hours later)."""
    low, high = f.metadata.get("low"), f.metadata.get("high")
    if (low is None and high is None) or value is None:
        return
    if isinstance(value, tuple):
        if not value or (low is not None and min(value) < low):
            raise ConfigError(f"{where}={value!r}: needs at least one value, each >= {low}")
        value = max(value)
    if low is not None and value < low:
        raise ConfigError(f"{where}={value!r}: must be >= {low}")
    if high is not None and value > high:
        raise ConfigError(f"{where}={value!r}: must be <= {high}")


def check_bounds(spec) -> None:
    """Every bounded knob of a group instance, however it was made (``translate``, or a
    notebook's ``LoopSpec(...)`` / ``dataclasses.replace``): the groups' ``__post_init__``."""
    for f in fields(type(spec)):
        if "group" not in f.metadata:
            check_value_bounds(f, getattr(spec, f.name), f"{type(spec).__name__}.{f.name}")


def shared(target, spec, **extra: Any) -> Any:
    """``target`` (a library dataclass) built from the knobs of the translated group
    ``spec`` that it has a field of the same name for, then ``extra``."""
    names = {f.name for f in fields(type(spec))}
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(target)
              if f.name in names}
    return target(**{**values, **extra})
