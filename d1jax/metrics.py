"""Metrics on process 0: TensorBoard event files, a JSONL log, sample texts, progress bar."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np


def _scalar(v: Any) -> float | None:
    try:
        f = float(np.asarray(v))
    except (TypeError, ValueError):
        return None
    return f


class MetricWriter:
    """Writes scalars to ``<workdir>/metrics.jsonl`` and TensorBoard, texts to samples.jsonl.

    Only process 0 writes; other processes get a no-op writer. ``resume_step``: the step a
    run resumed from; rows of later steps (logged before an interruption, replayed now) are
    dropped from the JSONL files and purged from TensorBoard, so each step appears once.
    """

    def __init__(self, workdir: str | Path, enabled: bool | None = None, tensorboard: bool = True,
                 resume_step: int | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.workdir = Path(workdir)
        self._tb = None
        if not self.enabled:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            for name in ("metrics.jsonl", "samples.jsonl"):
                _drop_rows_after(self.workdir / name, resume_step)
        self._jsonl = open(self.workdir / "metrics.jsonl", "a", buffering=1)
        self._samples = open(self.workdir / "samples.jsonl", "a", buffering=1)
        if tensorboard:
            SummaryWriter = _summary_writer()
            purge = resume_step + 1 if resume_step is not None and (
                self.workdir / "tensorboard").exists() else None
            self._tb = SummaryWriter(str(self.workdir / "tensorboard"), purge_step=purge)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> dict[str, float]:
        clean = {k: s for k, v in scalars.items() if (s := _scalar(v)) is not None}
        if not self.enabled:
            return clean
        self._jsonl.write(json.dumps({"step": step, **{
            k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
        return clean

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        if not self.enabled:
            return
        self._samples.write(json.dumps({"step": step, **texts}) + "\n")
        if self._tb is not None:
            for k, v in texts.items():
                self._tb.add_text(k, v, step)

    def flush(self) -> None:
        if self.enabled:
            self._jsonl.flush()
            self._samples.flush()
            if self._tb is not None:
                self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.flush()
            self._jsonl.close()
            self._samples.close()
            if self._tb is not None:
                self._tb.close()


def _summary_writer():
    """tensorboardX's ``SummaryWriter``, imported without torch when torch is not loaded yet:
    tensorboardX's writer tries ``import torch`` only to accept torch tensors (these writers
    pass floats and strings), which costs about 2 s of every run's start where torch is
    installed. The import sees torch as absent for that moment only."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX's fallback
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


def _drop_rows_after(path: Path, step: int) -> None:
    """Rewrites a JSONL log without the rows of steps after ``step`` (atomically)."""
    if not path.exists():
        return
    def keep(line: str) -> bool:
        try:
            return json.loads(line).get("step", 0) <= step
        except ValueError:  # a line cut short by the kill that interrupted the run
            return False
    lines = path.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if ln.strip() and keep(ln)]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; for a resumed run the last row of each step wins."""
    rows: dict[int, dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = row
    return [rows[k] for k in sorted(rows)]


class Progress:
    """A tqdm progress bar on process 0 with rate and ETA; a plain line when not a tty."""

    def __init__(self, total: int, initial: int = 0, desc: str = "train"):
        self.enabled = jax.process_index() == 0
        self._bar = None
        self._t0 = time.perf_counter()
        if self.enabled:
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True,
                             mininterval=1.0)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: f"{v:.4g}" if isinstance(v, float) else v
                                       for k, v in postfix.items()}, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
