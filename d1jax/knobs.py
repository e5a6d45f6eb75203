"""A knob: one dataclass field carrying its default, its CPU-sized default (``tiny``), its
meaning and the values it allows; a group: a frozen dataclass of knobs.

A knob is declared once, on the library config the pure functions take (``SamplerConfig``,
``GRPOConfig``, ``LoraConfig``, the objectives' ``WD1Config``, ...); a config group that shows
it (``d1jax.config.groups``) takes that field with ``of(SamplerConfig)``, or is the library
config's knobs as a whole (``group_of``). Library fields the run sets from elsewhere (token
ids, G from ``grpo.num_generations``) are plain fields, without a meaning: not knobs.

The declaration half of ``d1jax.config.knobs`` (which builds the ConfigDict groups from these
fields and translates them back), kept below every layer that declares knobs, without
importing the config layer.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Any, Callable

_MISSING = object()


class ConfigError(ValueError):
    """A config that cannot run; raised before any compute."""


def knob(default: Any, doc: str, *, tiny: Any = _MISSING, choices: tuple = (),
         parse: Callable[[Any], Any] | None = None, kind: Any = None,
         low: int | None = None, high: int | None = None,
         held_as: Callable[[Any], Any] | None = None) -> Any:
    """A dataclass field: the config's default, the knob's meaning, its CPU-sized default,
    the values allowed, and where the spec holds another form, the function that makes it
    (the config's value then checked against ``kind``, default the default's type).
    ``low``, ``high``: the least and greatest values allowed (of each element, for a tuple,
    which must not be empty). ``held_as``: on a library config whose field holds another
    form than the config's (None for the config's 0 or -1), the function that makes it: the
    field's default is ``held_as(default)``, and ``shared`` converts a group's value with it
    (groups keep the config's form, as the spec records it)."""
    meta = {"doc": doc, "default": default, "tiny": default if tiny is _MISSING else tiny,
            "choices": tuple(choices), "parse": parse, "low": low, "high": high,
            "held_as": held_as, "kind": kind if kind is not None or (parse, held_as) == (None, None)
            else type(default)}
    if held_as is not None:
        return dataclasses.field(default=held_as(default), metadata=meta)
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


def of(source, name: str | None = None) -> Any:
    """In a ``frozen`` class: the knob ``name`` (default: the attribute's own name) declared
    on the class ``source``, its default, tiny default, meaning and bounds as declared there.
    The attribute's annotation must be the source field's type (checked by ``frozen``)."""
    return dataclasses.field(metadata={"of": (source, name)})


def _borrowed(cls, name: str, placeholder: dataclasses.Field) -> dataclasses.Field:
    source, source_name = placeholder.metadata["of"]
    found = {f.name: f for f in dataclasses.fields(source)}.get(source_name or name)
    if found is None or "doc" not in found.metadata:
        raise TypeError(f"{cls.__name__}.{name}: {source.__name__} has no knob "
                        f"{source_name or name!r}")
    # "from": the class that declares it (docs/configs.md and tests/test_knobs.py read it).
    meta = {**found.metadata, "from": found.metadata.get("from", source), "type": found.type}
    if meta.get("held_as") is not None:  # a group holds the config's form
        return dataclasses.field(default=meta["default"], metadata=meta)
    if found.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=found.default_factory, metadata=meta)
    return dataclasses.field(default=found.default, metadata=meta)


def frozen(cls):
    """A group, or a library config with knobs: a frozen dataclass whose bounds (``low=``,
    ``high=``) hold however it is built, so a notebook's ``LoopSpec(sample_every=0)`` fails at
    once, not at ``step % 0``. The class's own ``__post_init__`` checks run first (their
    messages name the field), then the bounds. ``of(...)`` fields take the source's knob."""
    for name, value in list(vars(cls).items()):
        if isinstance(value, dataclasses.Field) and "of" in value.metadata:
            setattr(cls, name, _borrowed(cls, name, value))
    own = vars(cls).get("__post_init__")
    if own is None:
        cls.__post_init__ = check_bounds
    else:
        def __post_init__(self):
            own(self)
            check_bounds(self)
        cls.__post_init__ = __post_init__
    cls = dataclasses.dataclass(frozen=True)(cls)
    hints = typing.get_type_hints(cls)  # real types where the module defers annotations
    for f in dataclasses.fields(cls):
        f.type = hints.get(f.name, f.type)
        if "from" in f.metadata and f.metadata["type"] != f.type:
            raise TypeError(f"{cls.__name__}.{f.name} is annotated {f.type} but its knob on "
                            f"{f.metadata['from'].__name__} is {f.metadata['type']}")
    return cls


def group_of(source, doc: str, name: str | None = None):
    """The group of every knob of ``source`` (a library config), in its order, and nothing
    else: what a config group translates into before the library config is built from it
    with the fields the run computes (``shared``). Named ``<source>Knobs`` unless ``name``."""
    knobs = fields(source)
    namespace = {"__doc__": doc, "__annotations__": {f.name: f.type for f in knobs},
                 "__module__": sys._getframe(1).f_globals.get("__name__", source.__module__),
                 **{f.name: of(source) for f in knobs}}
    name = name or source.__name__.removesuffix("Config") + "Knobs"
    return frozen(type(name, (), namespace))


def zero_is_none(value: int | None) -> int | None:
    """A config's 0 ("automatic", "the model's") as a library config's None."""
    return value or None


def negative_is_none(value: int | None) -> int | None:
    """A config's -1 ("all") as a library config's None."""
    return None if value is None or value < 0 else value


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
    ``spec`` that it has a field of the same name for (in the form ``target`` holds, where
    its knob says ``held_as``), then ``extra``."""
    names = {f.name for f in fields(type(spec))}
    values = {}
    for f in dataclasses.fields(target):
        if f.name in names:
            held_as = f.metadata.get("held_as")
            value = getattr(spec, f.name)
            values[f.name] = held_as(value) if held_as is not None else value
    return target(**{**values, **extra})
