"""Loop-aware matmul FLOPs of a lowered (pre-optimisation) HLO module.

XLA's ``cost_analysis`` counts a while loop's body once. This walks the module's call
graph instead: a ``dot`` costs 2 x output elements x contracted size; a while loop
multiplies its body by its trip count, read from its condition (``i < N``, also as the
first term of ``(i < N) & ...``: a bounded data-dependent loop, counted at its bound) and
the counter's initial constant; a conditional costs its costliest branch (an upper bound).
FLOPs are global (the unpartitioned program): divide by the chip count for one chip.
"""

from __future__ import annotations

import dataclasses
import math
import re

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_SHAPE = re.compile(r"^[a-z]+[0-9]*\[([0-9,]*)\]")
_CALLS = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)"
                    r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_DIMS = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")


@dataclasses.dataclass
class Instr:
    name: str
    shape: str  # result type text (a tuple type keeps its parentheses)
    op: str
    operands: list[str]
    attrs: str


def _split_type(rest: str) -> tuple[str, str]:
    """(result type, text after it) of ``TYPE op(...)...``; tuple types nest parentheses."""
    if not rest.startswith("("):
        typ, _, tail = rest.partition(" ")
        return typ, tail
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[:i + 1], rest[i + 2:]
    raise ValueError(f"unbalanced tuple type in HLO line: {rest[:120]}")


def _parse_instr(line: str) -> Instr | None:
    body = line.strip()
    if body.startswith("ROOT "):
        body = body[5:]
    name, sep, rest = body.partition(" = ")
    if not sep:
        return None
    typ, tail = _split_type(rest)
    op, _, args = tail.partition("(")
    depth, end = 1, 0
    for end, ch in enumerate(args):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            break
    operands = [a.strip().split(" ")[-1].lstrip("%") for a in args[:end].split(",") if a.strip()]
    return Instr(name.lstrip("%"), typ, op.strip(), operands, args[end + 1:])


def parse_module(text: str) -> tuple[dict[str, list[Instr]], str]:
    """(computation name -> instructions, entry computation name) of HLO text."""
    comps: dict[str, list[Instr]] = {}
    entry, current = "", None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and not line.startswith(" "):
                current = m.group(1)
                comps[current] = []
                if line.startswith("ENTRY"):
                    entry = current
        elif line.startswith("}"):
            current = None
        else:
            ins = _parse_instr(line)
            if ins is not None:
                comps[current].append(ins)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def _dims(shape: str) -> list[int]:
    m = _SHAPE.match(shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def dot_flops(ins: Instr, shapes: dict[str, str]) -> float:
    """2 x output elements x the contracted size of the lhs."""
    m = _DIMS.search(ins.attrs)
    lhs = _dims(shapes[ins.operands[0]])
    contracted = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
    return 2.0 * math.prod(_dims(ins.shape)) * contracted


class LoopFlops:
    """Walks a module; ``total()`` is loop-aware, ``once()`` counts every body once (as
    ``cost_analysis`` does). ``default_trips`` is used for loops whose count is unknown;
    ``unknown_loops`` counts them."""

    def __init__(self, text: str, default_trips: int = 1):
        self.comps, self.entry = parse_module(text)
        self.default_trips = default_trips
        self.unknown_loops = 0

    def total(self) -> float:
        return self._flops(self.entry, loops=True, memo={})

    def once(self) -> float:
        return self._flops(self.entry, loops=False, memo={})

    def trip_count(self, while_ins: Instr, parent: list[Instr]) -> int | None:
        """N - i0 of a loop whose condition is ``i < N`` (or ``(i < N) & ...``)."""
        cond = dict(_CALLS.findall(while_ins.attrs)).get("condition")
        instrs = {i.name: i for i in self.comps.get(cond, [])}
        root = self.comps[cond][-1] if cond in self.comps else None
        if root is not None and root.op == "and":
            root = next((instrs[o] for o in root.operands if o in instrs
                         and instrs[o].op == "compare"), None)
        if root is None or root.op != "compare" or "direction=LT" not in root.attrs:
            return None
        counter, bound = (instrs.get(o) for o in root.operands)
        if counter is None or bound is None or counter.op != "get-tuple-element":
            return None
        n = _constant(bound)
        if n is None:
            return None
        index = int(re.search(r"index=(\d+)", counter.attrs).group(1))
        return n - self._initial(while_ins, parent, index)

    def _initial(self, while_ins: Instr, parent: list[Instr], index: int) -> int:
        by_name = {i.name: i for i in parent}
        init = by_name.get(while_ins.operands[0])
        if init is None or init.op != "tuple" or index >= len(init.operands):
            return 0
        start = by_name.get(init.operands[index])
        value = _constant(start) if start is not None else None
        return 0 if value is None else value

    def _flops(self, comp: str, loops: bool, memo: dict) -> float:
        if comp in memo:
            return memo[comp]
        instrs = self.comps[comp]
        shapes = {i.name: i.shape for i in instrs}
        total = 0.0
        for ins in instrs:
            if ins.op == "dot":
                total += dot_flops(ins, shapes)
            elif ins.op == "while":
                called = dict(_CALLS.findall(ins.attrs))
                body = self._flops(called["body"], loops, memo)
                trips = self.trip_count(ins, instrs) if loops else 1
                if trips is None:
                    self.unknown_loops += 1
                    trips = self.default_trips
                total += trips * body
            elif ins.op == "conditional":
                names = [n for k, n in _CALLS.findall(ins.attrs) if k.endswith("computation")]
                m = _BRANCHES.search(ins.attrs)
                if m:
                    names += [n.strip().lstrip("%") for n in m.group(1).split(",")]
                total += max((self._flops(n, loops, memo) for n in names), default=0.0)
            elif ins.op in ("call", "fusion", "custom-call"):
                for key, name in _CALLS.findall(ins.attrs):
                    if key in ("to_apply", "calls") and name in self.comps:
                        total += self._flops(name, loops, memo)
        memo[comp] = total
        return total


def _constant(ins: Instr) -> int | None:
    """The value of an integer scalar ``constant(N)``, else None."""
    if ins.op != "constant" or len(ins.operands) != 1:
        return None
    try:
        return int(ins.operands[0])
    except ValueError:
        return None


_TYPED = re.compile(r"\b(pred|[subfc]\d+|bf16|f\de\w+)\[([0-9,]+)\](\{[^}]*\})?")
_BITS = {"pred": 8, "bf16": 16}


def shape_key(dims) -> tuple[int, ...]:
    """An array's axis sizes without unit axes, sorted: equal for an array, its
    transpose and its reshapes that add unit axes."""
    return tuple(sorted(int(d) for d in dims if int(d) != 1))


def largest_with_dim(text: str, dims_of_interest, skip_shapes=frozenset(),
                     skip_typed=frozenset()) -> int:
    """Bytes of the largest array in HLO ``text`` with an axis whose size is in
    ``dims_of_interest`` (an int or a set; in a compiled SPMD program sizes are per chip),
    0 if none. Arrays whose ``shape_key`` is in ``skip_shapes``, or whose (HLO dtype,
    ``shape_key``) is in ``skip_typed`` (the vocab weights, their shards and gathered
    copies), and arrays in another memory space than HBM (a layout's
    ``S(n)``: on-chip copies of tiles) are left out: the largest activation carrying the
    vocabulary axis, to tell logits of a few rows from those of a whole sequence."""
    wanted = {dims_of_interest} if isinstance(dims_of_interest, int) else set(dims_of_interest)
    best = 0
    for dtype, dims_text, layout in _TYPED.findall(text):
        dims = [int(d) for d in dims_text.split(",")]
        key = shape_key(dims)
        if wanted.intersection(dims) and key not in skip_shapes \
                and (dtype, key) not in skip_typed and "S(" not in layout:
            bits = _BITS.get(dtype) or int(re.match(r"[a-z]+?(\d+)", dtype).group(1))
            best = max(best, math.prod(dims) * bits // 8)
    return best


# Custom calls libtpu's cost model may price at -1 s ("unknown") instead of their cost:
# ConcatBitcast (slices put side by side in on-chip memory, a layout change that moves no
# HBM bytes) appears in large v4, v5e and v6e programs, and each of those priced takes
# exactly 1 s off ``cost_analysis()["optimal_seconds"]`` (an 8B rollout on v4-8: -9.92 s
# with ten of them); ``compile._xla_seconds`` gives them back. AssumeGatherIndicesInBound
# (a gather's indices asserted in range) appears in mixture-of-experts programs (the routed
# tokens' gathers): a tiny LLaDA2 SFT update on v5p-8 has six and -5.996 s, LLaDA2.0-mini's
# 22 and -9.495 s. Whole seconds are given back only up to the analytic minimum's.
UNPRICED_CUSTOM_CALLS = ("ConcatBitcast", "AssumeGatherIndicesInBound")


def unpriced_custom_calls(text: str) -> int:
    """Instructions of compiled HLO ``text`` that libtpu's cost model may price at -1 s."""
    return sum(len(re.findall(rf'custom_call_target="{name}"', text))
               for name in UNPRICED_CUSTOM_CALLS)
