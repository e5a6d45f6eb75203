"""The planner's output: a markdown table and JSON rows of ``Estimate`` values."""

from __future__ import annotations

import json
import math
from typing import Sequence

from d1jax.plan.compile import Estimate

GIB = 2**30

COLUMNS = ("program", "mesh d,f,t", "remat", "args GiB (rules)", "temp GiB", "total GiB",
           "of GiB", "fits", "TFLOP model", "XLA/analytic", "est. s", "MFU",
           "tok/s/chip", "seq/s/chip", "weights repl.", "logits")


def _mesh_cell(m: dict) -> str:
    """data,fsdp,tensor sizes, and the expert axis's where the mesh has one (LLaDA2)."""
    return ",".join(str(m.get(a, 1)) for a in ("data", "fsdp", "tensor")) \
        + (f",{m['expert']}" if "expert" in m else "")


def _cells(e: Estimate) -> list[str]:
    m = e.mesh
    per_chip_s = e.seconds
    rate = (lambda x: f"{x / e.chips / per_chip_s:,.0f}") if e.tokens and not e.refused \
        else (lambda x: "-")
    ratio = e.flops_xla / e.flops_hardware if e.flops_hardware else math.nan
    # XLA refused the program: its total is the one figure XLA gave, no time was estimated
    fits = "NO (XLA)" if e.refused else "yes" if e.fits else "NO"
    return [
        e.program + (f" (1 of {e.calls} calls)" if e.calls > 1 else ""), _mesh_cell(m),
        "on" if e.remat else "off",
        f"{e.argument_bytes / GIB:.2f} ({e.argument_bytes_by_rules / GIB:.2f})",
        f"{e.temp_bytes / GIB:,.2f}", f"{e.total_bytes / GIB:,.2f}",
        f"{e.capacity_bytes / GIB:.1f}", fits,
        f"{e.flops_model / 1e12:,.1f}", f"{ratio:.3f}",
        "-" if e.refused else f"{per_chip_s:.3g}",
        "-" if e.refused else f"{100 * e.mfu:.1f}%", rate(e.tokens), rate(e.sequences),
        "YES" if e.weights_replicated else "no",
        {True: "YES", False: "no", None: "?"}[e.logits_materialised],
    ]


def table(estimates: Sequence[Estimate]) -> str:
    """Markdown table, one row per program."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(e)) + " |" for e in estimates]
    return "\n".join(lines)


def to_json(estimates: Sequence[Estimate]) -> str:
    return json.dumps([e.row() for e in estimates], indent=2, default=float)
