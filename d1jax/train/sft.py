"""Masked SFT (d1's stage 1, SFT/sft_train.py): prompt kept, completion masked with
t ~ U(eps, 1), cross-entropy on masked tokens weighted by 1/t.

  python -m d1jax.main --config=configs/sft_s1k.py:tiny --workdir=/tmp/sft_tiny

The examples come from s1K, from a generated task's solution trajectories, or from a
caller (``run(..., data=SFTData(...))``), e.g. examples/demo's noisy pretraining corpus.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

from d1jax import config as config_lib
from d1jax import sharding
from d1jax.objectives.batch import SFTBatch
from d1jax.run import context
from d1jax.run.build import build, data_parallel_size
from d1jax.run.spec import RunSpec
from d1jax.tasks import registry
from d1jax.train import jit_steps as steps_lib
from d1jax.train import loop
from d1jax.train.data import ExampleIterator, check_examples
from d1jax.train.sft_data import encode_sft, trajectory_examples


@dataclasses.dataclass(frozen=True)
class SFTData:
    """What an SFT run trains on: rows ``{"prompt": chat messages, "completion": text}``, and
    how a batch of them becomes tokens: ``encode(tokenizer, rows, max_length, split=...)``
    returns ``input_ids`` [B, max_length] and ``prompt_len`` [B] (the span the loss never
    masks); d1's ``encode_sft`` by default."""

    rows: list[dict]
    encode: Callable[..., dict[str, np.ndarray]] = encode_sft


def sft_examples(spec: RunSpec) -> list[dict]:
    """(prompt messages, completion text) pairs of the configured task: s1K's traces, or
    d1's prompt and a solution trajectory for a generated task (an offline stand-in)."""
    entry = registry.entry(spec.task.name)
    if entry.sft_rows is not None:  # SFT data of its own (s1k)
        rows = entry.sft_rows(spec.task.source)
    else:
        task = spec.task.build()
        rows = trajectory_examples(task, task.load_train(spec.task.source))
    return rows[:spec.task.num_train] if spec.task.num_train else rows


class SFTEngine:
    """One masked-SFT step at a time on ``data``, for ``loop.train``."""

    def __init__(self, spec: RunSpec, setup, data: SFTData):
        sr = spec.sft_run
        self.s, self.sft, self.encode = setup, sr, data.encode
        self.total = sr.num_steps(len(data.rows), spec.train.num_steps)
        self.steps = steps_lib.for_run(spec, setup.model, setup.mesh, setup.ids, self.total)
        self.state = self.steps.init(setup.params)
        self.data = ExampleIterator(data.rows, sr.batch_size, seed=spec.seed)
        self.key = jax.random.key(spec.seed)
        self.desc = "sft"

    def load(self, state) -> None:
        self.state = state

    def advance(self, step: int):
        t0 = time.perf_counter()
        s, sr = self.s, self.sft
        enc = self.encode(s.tokenizer, next(self.data), sr.max_length, split=sr.split_tokenize)
        batch = SFTBatch(**{k: sharding.host_to_global(v, s.mesh, s.rules)
                            for k, v in enc.items()})
        self.state, m = self.steps.sft_update(self.state, batch, jax.random.fold_in(self.key, step))
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        dt = time.perf_counter() - t0
        m.update(time_step=dt, tokens_per_s=enc["input_ids"].size / dt)
        yield step + 1, m, None


def run(config, workdir: str, data: SFTData | None = None) -> dict:
    """Runs masked SFT as configured (on ``data`` when given); returns the last metrics.
    Raises ``context.RunStopped`` when stopped early (SIGTERM, stop_after) after saving."""
    spec, wd = context.prepare(config, workdir)
    data = data if data is not None else SFTData(sft_examples(spec))
    rows = data.rows
    mesh = spec.mesh.build()
    config_lib.check_batch(spec.sft_run.batch_size, 1, data_parallel_size(mesh),
                           "sft.batch_size", spec.optim.grad_accum)
    check_examples(len(rows), spec.sft_run.batch_size, "sft.batch_size", spec.task.source)
    s = build(spec, wd, mesh, texts=lambda: [m["content"] for r in rows[:512] for m in r["prompt"]]
              + [r["completion"] for r in rows[:512]])
    return loop.train(spec, wd, s, SFTEngine(spec, s, data))
