"""Orbax checkpointing of a run: train state pytree + JSON metadata, with auto-resume.

* ``state``: any pytree of arrays (params or adapters, optimizer state, step, rng,
  synced reference). Restored onto the *current* shardings, so a run saved on one mesh
  resumes on another.
* ``meta``: JSON (data iterator position, step metrics, config snapshot).

A corrupt latest checkpoint is reported and the previous one is used; nothing is ever
deleted except by Orbax's ``max_to_keep`` retention after a *successful* save.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
import tensorstore as ts

log = logging.getLogger(__name__)


class Checkpointer:
    """CheckpointManager over ``<workdir>/checkpoints`` with save-every-N and keep-best.

    Args:
      workdir: run directory.
      save_every: save when ``step % save_every == 0`` (and always when ``force``).
      max_to_keep: newest checkpoints kept (plus the best one when ``best_metric``).
      best_metric: name of a metric in ``meta["metrics"]``; keeps the best by it.
      best_mode: "max" or "min".
      async_save: write in a background thread (``wait()`` before exit).
    """

    def __init__(self, workdir: str | Path, save_every: int = 100, max_to_keep: int = 3,
                 best_metric: str | None = None, best_mode: str = "max", async_save: bool = True):
        self.directory = Path(workdir).resolve() / "checkpoints"
        self.save_every = save_every
        best_fn = None
        if best_metric:
            def best_fn(metrics, name=best_metric):
                return float(metrics.get(name, float("-inf") if best_mode == "max" else float("inf")))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, best_fn=best_fn, best_mode=best_mode,
            keep_checkpoints_without_metrics=False if best_fn else True,
            enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "meta"))
        self.best_metric = best_metric

    def should_save(self, step: int) -> bool:
        return self.save_every > 0 and step % self.save_every == 0

    def save(self, step: int, state: Any, meta: dict[str, Any], force: bool = False) -> bool:
        """Saves if ``step`` is due (or ``force``). Returns whether a save started."""
        if not (force or self.should_save(step)) or step in self.manager.all_steps():
            return False
        metrics = None
        if self.best_metric is not None:
            metrics = {k: float(v) for k, v in meta.get("metrics", {}).items()
                       if isinstance(v, (int, float))}
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            metrics=metrics, force=True)
        return True

    def restore(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """Restores the newest readable checkpoint onto ``abstract_state``'s shardings.

        ``abstract_state`` is a pytree of ``jax.ShapeDtypeStruct`` with ``sharding`` set
        (e.g. ``jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
        sharding=x.sharding), state)``). Returns (step, state, meta) or None if the run
        has no checkpoint.
        """
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                self._check_array_store(step)
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
                return step, out["state"], dict(out["meta"])
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: fall back
                log.error("checkpoint at step %d in %s is unreadable (%s: %s); trying the "
                          "previous one", step, self.directory, type(e).__name__, e)
                print(f"warning: checkpoint step {step} is corrupt or unreadable "
                      f"({type(e).__name__}); falling back to an earlier one", flush=True)
        return None

    def _check_array_store(self, step: int) -> None:
        """Lists the keys of the step's array store (OCDBT) in one synchronous read.

        A missing or corrupt store is found here, before Orbax reads every array
        concurrently: a failure there leaves the other reads in flight, and they later call
        into Orbax's closed event loop ("Event loop is closed" tracebacks).
        """
        store = self.directory / str(step) / "state"
        if (store / "manifest.ocdbt").exists():
            ts.KvStore.open({"driver": "ocdbt", "base": f"file://{store}"}).result().list().result()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) describing ``tree``: the restore target."""
    def one(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
    return jax.tree.map(one, tree)


class PreemptionFlag:
    """Set by SIGTERM (TPU preemption, ``kill``): the loop saves and exits cleanly."""

    def __init__(self):
        self._event = threading.Event()
        self._previous = None

    def install(self) -> "PreemptionFlag":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum, frame):
        del signum, frame
        print("SIGTERM received: saving a checkpoint and stopping", flush=True)
        self._event.set()

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    @property
    def is_set(self) -> bool:
        return self._event.is_set()
