"""Config groups declared once: each knob's default, type and meaning are one dataclass field.

A group (``d1jax.config.groups``) is a frozen dataclass whose fields are the config's knobs,
made with ``knob(default, doc, tiny=...)``. ``group(cls, tiny)`` builds the run config's
ConfigDict group from it (the defaults, the CPU-sized ones with ``tiny``);
``translate(cls, group, prefix)`` reads it back into the typed dataclass the run uses
(``d1jax.run.spec``, whose spec classes are these groups or subclasses of them that add
methods), each value checked against the field's type and allowed values, so a knob is
written in one place and read in one place.

    @dataclasses.dataclass(frozen=True)
    class LoopSpec:
        save_every: int = knob(100, "Checkpoint every N optimizer steps.", tiny=2)

    c.train = group(LoopSpec, tiny)               # d1jax.config.defaults
    spec = translate(LoopSpec, c.train, "train")  # d1jax.run.spec

A knob's default is the config's value. ``choices`` lists the values allowed (the error
names them); ``parse`` turns the config's value into the spec's (``model.dtype``: a name in
the config, a dtype in the spec), checked against ``kind`` (default: the default's type)
instead of the field's type. ``subgroup(cls, doc)`` nests a group (``grpo.wd1``).
A knob the library takes is declared on the library's config, and a group takes it from
there: ``rank: int = of(LoraConfig)``, or every knob at once, ``group_of(SamplerConfig, doc)``.
``shared(target, spec)`` passes a translated group's knobs to a library type with fields of
the same names (``grpo`` -> ``objectives.GRPOConfig``), so no knob is copied by hand.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable

import ml_collections as mlc

# The declarations (a knob, a group, its bounds) live below the config layer, so a library
# config (an objective's knobs) declares its own; re-exported here for the config's readers.
from d1jax.knobs import (ConfigError, check_bounds, check_value_bounds, fields, group_of, knob,
                         of, shared, subgroup)

__all__ = ["ConfigError", "check_bounds", "describe", "fields", "group", "group_of", "knob", "of",
           "shared", "subgroup", "translate"]


def _optional(kind) -> tuple[Any, bool]:
    """(the type inside ``X | None``, True) or (kind, False)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0], True
    return kind, False


def group(cls, tiny: bool, omit: tuple[str, ...] = (), **overrides: Any) -> mlc.ConfigDict:
    """The ConfigDict group of ``cls``: every knob's default (its tiny one with ``tiny``)
    but those in ``omit``, then ``overrides``. A knob typed ``X | None`` whose value is
    None becomes a placeholder of type X (a command-line override still parses as X)."""
    names = {f.name for f in fields(cls)}
    unknown = (set(overrides) | set(omit)) - names
    if unknown:
        raise TypeError(f"{cls.__name__} has no knobs {sorted(unknown)}")
    values = {}
    for f in fields(cls):
        if f.name in omit:
            continue
        if "group" in f.metadata:
            values[f.name] = overrides.get(f.name, group(f.metadata["group"], tiny))
            continue
        value = overrides.get(f.name, f.metadata["tiny"] if tiny else f.metadata["default"])
        inner, optional = _optional(f.type)
        if value is None and optional and f.metadata["parse"] is None:
            value = mlc.config_dict.placeholder(inner)
        values[f.name] = value
    return mlc.ConfigDict(values)


def _name(kind) -> str:
    if isinstance(kind, tuple):
        return " or ".join(map(_name, kind))
    return getattr(kind, "__name__", str(kind))


def _checked(f: dataclasses.Field, value: Any, where: str) -> Any:
    """``value`` if it has the knob's type (ints pass as floats, lists as tuples), else a
    ConfigError naming the knob, the value and the type expected."""
    kind = f.metadata["kind"] or f.type
    inner, optional = _optional(kind)
    if value is None and optional:
        return None
    origin = typing.get_origin(inner)
    if origin is tuple and isinstance(value, (tuple, list)):
        item = typing.get_args(inner)[0] if typing.get_args(inner) else object
        value = tuple(value)
        if all(_is(x, item) for x in value):
            return tuple(float(x) if item is float else x for x in value)
        raise ConfigError(f"{where}={value!r}: expected a tuple of {_name(item)}")
    if origin is None and _is(value, inner):
        return float(value) if inner is float else value
    want = f"a tuple of {_name(typing.get_args(inner)[0])}" if origin is tuple else _name(inner)
    raise ConfigError(f"{where}={value!r}: expected {want}{' or None' if optional else ''}")


def _is(value: Any, kind: Any) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds or object in kinds
    if float in kinds and isinstance(value, int):
        return True
    return isinstance(value, kinds)


def translate(cls, config_group, prefix: str, **derived: Any):
    """``cls`` from a config group (a ConfigDict or a mapping): each knob read once, checked
    against its type and allowed values (``ConfigError`` naming ``prefix.knob``, the value
    and what is allowed), parsed where declared; a knob missing from the group takes its
    default. ``derived`` gives fields the caller computed (e.g. from other groups). Groups
    spliced in by ``more_groups`` are held as (name, group) pairs in the field it names."""
    values = {}
    for f in fields(cls):
        where = f"{prefix}.{f.name}"
        if f.name in derived:  # computed by the caller from knobs it names: bounds still hold
            check_value_bounds(f, derived[f.name], where)
            continue
        if "group" in f.metadata:
            values[f.name] = translate(f.metadata["group"], config_group.get(f.name) or {}, where)
            continue
        value = _checked(f, config_group.get(f.name, f.metadata["default"]), where)
        choices = f.metadata["choices"]
        if choices and value not in choices:
            raise ConfigError(f"{where}={value!r}: choose one of {', '.join(map(str, choices))}")
        check_value_bounds(f, value, where)
        values[f.name] = f.metadata["parse"](value) if f.metadata["parse"] else value
    more = getattr(cls, "more_groups", None)
    if more is not None:
        own = {f.name for f in dataclasses.fields(cls)}
        values[more[1]] = tuple((k, values.pop(k)) for k in list(values) if k not in own)
    return cls(**values, **derived)


def describe(cls, prefix: str = "") -> dict[str, str]:
    """knob name (nested groups' as ``group.knob``) -> its meaning."""
    out = {}
    for f in fields(cls):
        out[prefix + f.name] = f.metadata["doc"]
        if "group" in f.metadata:
            out.update(describe(f.metadata["group"], f"{prefix}{f.name}."))
    return out
