"""The one training loop: a run's life around a step object.

``train(spec, workdir, setup, engine)`` owns everything a run does besides its steps: the
run context (checkpoints, metrics, progress, the stop signals), restoring the newest
checkpoint and the data position with it, saving at ``train.save_every`` boundaries and at
the end, the Hugging Face export of a finished run, and the check that it finished
(``context.RunStopped`` otherwise). SFT (``sft.SFTEngine``) and GRPO
(``engine.GRPOEngine``) hand it an engine with the ``Engine`` interface below; the loop
never looks inside a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Protocol

from d1jax.metrics import Progress
from d1jax.run import context
from d1jax.run.spec import RunSpec
from d1jax.train.data import ExampleIterator


class Engine(Protocol):
    """What the loop drives. ``state`` is the train state the engine steps (the loop
    restores into it through ``load``); ``data`` the example order, saved with every
    checkpoint; ``total`` the run's optimizer steps; ``desc`` the progress bar's label."""

    state: Any
    data: ExampleIterator
    total: int
    desc: str

    def load(self, state: Any) -> None:
        """Continue from ``state`` (a restored checkpoint)."""

    def advance(self, step: int) -> Iterator[tuple[int, dict | None, dict | None]]:
        """One unit of work from optimizer step ``step`` (SFT: one step; GRPO: one rollout
        and its mu updates), yielding after each optimizer step ``(step, metrics to log or
        None, sample texts or None)``; never past ``total``. A checkpoint may follow a unit."""


def crossed(start: int, end: int, every: int) -> bool:
    """A multiple of ``every`` lies in (start, end]: a save is due after that unit."""
    return every > 0 and end // every > start // every


def train(spec: RunSpec, workdir: Path, setup, engine: Engine) -> dict:
    """Runs ``engine`` from the newest checkpoint in ``workdir`` to ``engine.total`` steps;
    returns the last logged metrics. ``setup``: the run's ``build.Setup`` (the export needs
    its model, config and tokenizer). Raises ``context.RunStopped`` when stopped early
    (SIGTERM, Ctrl-C, ``train.stop_after``), after saving."""
    t, total = spec.train, engine.total
    ctx = context.RunContext.create(spec, workdir)
    last: dict = {}
    try:  # from here close() runs however the run ends: it gives back the signal handlers
        step, state, meta = ctx.restore(engine.state)
        engine.load(state)
        if meta:
            engine.data.set_state(meta["data"])
        ctx.progress = Progress(total, initial=step, desc=engine.desc)
        while step < total and not ctx.should_stop(step):
            start = step
            for step, metrics, texts in engine.advance(step):
                if metrics is not None:
                    last = ctx.log(step, metrics, texts)
            ctx.save(step, engine.state, {"data": engine.data.get_state(), "metrics": last},
                     force=crossed(start, step, t.save_every))
        ctx.save(step, engine.state, {"data": engine.data.get_state(), "metrics": last},
                 force=True)
        ctx.checkpointer.wait()
        if t.export_hf and step >= total:
            context.export_hf(workdir, setup, engine.state, source_dir=spec.model.path or None)
    finally:
        ctx.close()
    ctx.check_finished(step, total)
    return last
