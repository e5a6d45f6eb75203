"""Plain data across the sandbox's wall: the values a program's functions take and return.

Only exact builtin types pass: None, bool, int, float, complex, str, bytes, list, tuple, set,
frozenset, dict (a subclass, whose ``__eq__`` is the program's, is refused), nested at most
``MAX_DEPTH`` deep. A value is JSON: scalars as themselves (bool, int, float and str keep their
JSON types), containers as one-key objects (``{"l": [...]}`` a list, ``"t"`` a tuple, ``"s"`` a
set, ``"f"`` a frozenset, ``"d"`` a dict as ``[[key, value], ...]``, ``"b"`` bytes as hex,
``"c"`` a complex as ``[re, im]``), so a tuple stays a tuple and ``(1, 2) == [1, 2]`` is False on
both sides as in the program.

The trusted side decodes with ``decode_line``: at most ``MAX_LINE`` bytes, JSON only, every
object exactly one known key. Anything else raises ``NotPlain``: the call fails.
"""

import json

MAX_DEPTH = 64
MAX_LINE = 8 * 1024 * 1024  # bytes of one message


class NotPlain(ValueError):
    """A value that is not plain data (or a message that is not well formed)."""


_SCALARS = (type(None), bool, int, float, str)
_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_TYPES = {"l": list, "t": tuple, "s": set, "f": frozenset}


def encode(value, depth: int = 0):
    """``value`` as tagged JSON data; ``NotPlain`` for anything but the exact builtin types."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise NotPlain("nested too deep")
    if kind in _SCALARS:
        if kind is int and not -(10 ** 4000) < value < 10 ** 4000:
            raise NotPlain("an int too large")
        return value
    if kind in _TAGS:
        return {_TAGS[kind]: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise NotPlain(f"not plain data: {kind.__name__}")


def decode(data, depth: int = 0):
    """The value ``encode`` described; ``NotPlain`` on anything else."""
    kind = type(data)
    if depth > MAX_DEPTH:
        raise NotPlain("nested too deep")
    if kind in _SCALARS:
        return data
    if kind is not dict or len(data) != 1:
        raise NotPlain(f"not a tagged value: {kind.__name__}")
    ((tag, body),) = data.items()
    if tag in _TYPES and type(body) is list:
        items = [decode(v, depth + 1) for v in body]
        try:
            return _TYPES[tag](items)
        except TypeError as e:  # an unhashable set member
            raise NotPlain(str(e)) from None
    if tag == "d" and type(body) is list:
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise NotPlain("a dict item is not a pair")
            try:
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            except TypeError as e:
                raise NotPlain(str(e)) from None
        return out
    if tag == "b" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError as e:
            raise NotPlain(str(e)) from None
    if tag == "c" and type(body) is list and len(body) == 2 and \
            all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    raise NotPlain(f"unknown tag {tag!r}")


def dump_line(message: dict) -> bytes:
    """One message as a JSON line."""
    return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def parse_line(line: bytes) -> dict:
    """A message from the other side: one complete ASCII JSON line of at most ``MAX_LINE``
    bytes whose top level is an object; ``NotPlain`` otherwise."""
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise NotPlain("a message too long or cut short")
    try:
        message = json.loads(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError, MemoryError) as e:
        raise NotPlain(f"not JSON ({type(e).__name__})") from None
    if type(message) is not dict:
        raise NotPlain("a message is not an object")
    return message
