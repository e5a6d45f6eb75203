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
from d1jax.metrics import Progress
from d1jax.objectives.batch import SFTBatch
from d1jax.run import context
from d1jax.run.build import build, data_parallel_size
from d1jax.run.spec import RunSpec
from d1jax.tasks import s1k
from d1jax.train import jit_steps as steps_lib
from d1jax.train.data import ExampleIterator
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
    if spec.task.name == "s1k":
        rows = s1k.load_train(spec.task.source)
    else:
        task = spec.task.build()
        rows = trajectory_examples(task, task.load_train(spec.task.source))
    return rows[:spec.task.num_train] if spec.task.num_train else rows


def run(config, workdir: str, data: SFTData | None = None) -> dict:
    """Runs masked SFT as configured (on ``data`` when given); returns the last metrics.
    Raises ``context.RunStopped`` when stopped early (SIGTERM, stop_after) after saving."""
    spec, wd = context.prepare(config, workdir)
    data = data if data is not None else SFTData(sft_examples(spec))
    rows, sr = data.rows, spec.sft_run
    mesh = spec.mesh.build()
    config_lib.check_batch(sr.batch_size, 1, data_parallel_size(mesh), "sft.batch_size",
                           spec.optim.grad_accum)
    s = build(spec, wd, mesh, texts=lambda: [m["content"] for r in rows[:512] for m in r["prompt"]]
              + [r["completion"] for r in rows[:512]])
    total = sr.num_steps(len(rows), spec.train.num_steps)
    steps = steps_lib.for_run(spec, s.model, s.mesh, s.ids, total)
    state = steps.init(s.params)
    ctx = context.RunContext.create(spec, wd)
    it = ExampleIterator(rows, sr.batch_size, seed=spec.seed)
    step, state, meta = ctx.restore(state)
    if meta:
        it.set_state(meta["data"])
    ctx.progress = Progress(total, initial=step, desc="sft")
    key = jax.random.key(spec.seed)
    last: dict = {}
    try:
        while step < total and not ctx.should_stop(step):
            t0 = time.perf_counter()
            enc = data.encode(s.tokenizer, next(it), sr.max_length, split=sr.split_tokenize)
            batch = SFTBatch(**{k: sharding.host_to_global(v, s.mesh, s.rules)
                                for k, v in enc.items()})
            state, m = steps.sft_update(state, batch, jax.random.fold_in(key, step))
            step += 1
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            dt = time.perf_counter() - t0
            m.update(time_step=dt, tokens_per_s=enc["input_ids"].size / dt)
            last = ctx.log(step, m)
            ctx.save(step, state, {"data": it.get_state(), "metrics": last})
        ctx.save(step, state, {"data": it.get_state(), "metrics": last}, force=True)
        ctx.checkpointer.wait()
        if spec.train.export_hf and step >= total:
            context.export_hf(wd, s, state, source_dir=spec.model.path or None)
    finally:
        ctx.close()
    ctx.check_finished(step, total)
    return last
