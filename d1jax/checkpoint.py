"""Orbax checkpointing of a run: train state pytree + JSON metadata, with auto-resume.

* ``state``: any pytree of arrays (params or adapters, optimizer state, step, rng,
  synced reference). Restored onto the *current* shardings, so a run saved on one mesh
  resumes on another.
* ``meta``: JSON (data iterator position, step metrics, the config fields that shape the
  state: ``d1jax.run.resume``).

Nothing readable is ever deleted. Retention is d1jax's, not Orbax's: a step is removed only
when it is older than a step this process saved *and read back* (or restored), so a failed
save or a fallback never costs the steps before it. An unreadable step is moved aside, not
deleted, and only once an older step has restored; when none restores, ``RestoreError``.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
import tensorstore as ts

log = logging.getLogger(__name__)


def _single_writer_arrays() -> None:
    """On one CPU process, Orbax writes each replicated array whole from one replica.

    Orbax's default (replica-parallel saving, on CPU and TPU) splits every replicated array
    into one slice a replica, each cut by an eagerly dispatched ``slice_in_dim``, so that
    processes share the writes. A single process writes every byte either way, and on the
    CPU the devices are host memory: the slices are pure overhead, about 1 s of CPU a save
    of a tiny model on 8 devices (288 slices), 15% of a 6-step run of the letters toy.
    Other platforms and multi-process runs keep Orbax's default."""
    if jax.process_count() == 1 and jax.default_backend() == "cpu":
        # The registered handler keeps its other settings (its array metadata store); the
        # switch is a private attribute of Orbax 0.12's ArrayHandler (absent: no change).
        handler = ocp.type_handlers.get_type_handler(jax.Array)
        if hasattr(handler, "_use_replica_parallel"):
            handler._use_replica_parallel = False


class RestoreError(RuntimeError):
    """The run has checkpoints and none of them restores (one line per step says why)."""


def list_steps(directory: str | Path) -> list[int]:
    """Committed checkpoint steps in ``directory`` (Orbax's step folders), newest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((int(p.name) for p in d.iterdir() if p.name.isdigit() and p.is_dir()),
                  reverse=True)


def read_meta(directory: str | Path, step: int) -> dict[str, Any]:
    """The JSON metadata saved with ``step`` (raises if it is missing or unreadable)."""
    return json.loads((Path(directory) / str(step) / "meta" / "metadata").read_text())


def sync_processes(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


class Checkpointer:
    """CheckpointManager over ``<workdir>/checkpoints`` with save-every-N and keep-best.

    Args:
      workdir: run directory.
      save_every: save when ``step % save_every == 0`` (and always when ``force``).
      max_to_keep: newest read-back checkpoints kept (plus the best one when
        ``best_metric``, and any newer step not read back yet); 0 keeps all.
      best_metric: name of a metric in ``meta["metrics"]``; keeps the best by it.
      best_mode: "max" or "min".
      async_save: write in a background thread (``wait()`` before exit).
    """

    def __init__(self, workdir: str | Path, save_every: int = 100, max_to_keep: int = 3,
                 best_metric: str | None = None, best_mode: str = "max", async_save: bool = True):
        self.workdir = Path(workdir).resolve()
        self.directory = self.workdir / "checkpoints"
        self.save_every = save_every
        self.max_to_keep = max_to_keep
        self.best_metric, self.best_mode = best_metric, best_mode
        _single_writer_arrays()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "meta"))
        self._read_back: set[int] = set()  # steps of this lineage known to read back
        self._pending: list[int] = []  # saved by this process, not yet read back

    def should_save(self, step: int) -> bool:
        return self.save_every > 0 and step % self.save_every == 0

    def save(self, step: int, state: Any, meta: dict[str, Any], force: bool = False) -> bool:
        """Saves if ``step`` is due (or ``force``). Returns whether a save started."""
        if not (force or self.should_save(step)) or step in self.manager.all_steps():
            return False
        self._settle()
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        self._pending.append(step)
        if jax.process_index() == 0:
            from tqdm import tqdm  # above the progress bar, not inside it
            tqdm.write(f"checkpoint: saving step {step} to {self.directory}")
        return True

    def restore(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """Restores the newest readable checkpoint onto ``abstract_state``'s shardings.

        ``abstract_state`` is a pytree of ``jax.ShapeDtypeStruct`` with ``sharding`` set
        (``abstract_like(state)``). Returns (step, state, meta), or None if the run has no
        checkpoint. Newer steps that did not restore are moved aside once an older one does;
        if none restores, ``RestoreError`` names each step and why, and nothing is moved.
        """
        failures: list[tuple[int, str]] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                self._check_array_store(step)
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: try the next
                log.debug("checkpoint step %d unreadable", step, exc_info=True)
                failures.append((step, _reason(e)))
                continue
            self._read_back.add(step)
            self._move_aside(failures)
            return step, out["state"], dict(out["meta"])
        if failures:
            lines = "\n".join(f"  step {s}: {why}" for s, why in failures)
            raise RestoreError(
                f"no checkpoint in {self.directory} restores, nothing was changed:\n{lines}\n"
                "rerun with the config that wrote them, use another --workdir, or pass "
                "--config.train.if_incompatible=move_aside to start over with the old run "
                "moved aside")
        return None

    def _move_aside(self, failures: list[tuple[int, str]]) -> None:
        """Unreadable steps newer than the restored one go to ``checkpoints_unreadable/``
        (their numbers are saved again as the run continues)."""
        if not failures:
            return
        aside = self.workdir / "checkpoints_unreadable"
        if jax.process_index() == 0:
            aside.mkdir(exist_ok=True)
            for step, why in failures:
                dest = aside / f"{step}.{time.strftime('%Y%m%dT%H%M%S')}"
                shutil.move(str(self.directory / str(step)), dest)
                print(f"warning: checkpoint step {step} does not restore ({why}); moved to "
                      f"{dest}", flush=True)
        sync_processes("d1jax_checkpoint_move_aside")
        self.manager.reload()

    def _check_array_store(self, step: int) -> None:
        """Lists the keys of the step's array store (OCDBT) in one synchronous read.

        A missing or corrupt store is found here, before Orbax reads every array
        concurrently: a failure there leaves the other reads in flight, and they later call
        into Orbax's closed event loop ("Event loop is closed" tracebacks).
        """
        store = self.directory / str(step) / "state"
        if not (store / "manifest.ocdbt").exists():
            raise FileNotFoundError(f"{store / 'manifest.ocdbt'} is missing")
        ts.KvStore.open({"driver": "ocdbt", "base": f"file://{store}"}).result().list().result()

    def _settle(self) -> None:
        """Waits for the save in flight, reads each finished step back, then prunes."""
        self.manager.wait_until_finished()
        for step in self._pending:
            try:
                self._check_array_store(step)
                read_meta(self.directory, step)
            except Exception as e:  # noqa: BLE001 - a bad save keeps everything older
                print(f"warning: checkpoint step {step} did not read back ({_reason(e)}); "
                      "older checkpoints are kept", flush=True)
                continue
            self._read_back.add(step)
        self._pending = []
        self._prune()

    def _prune(self) -> None:
        """Keeps the newest ``max_to_keep`` steps up to the newest read-back one, every newer
        step, and the best; removes only steps older than a read-back step."""
        if self.max_to_keep <= 0 or not self._read_back:
            return
        anchor = max(self._read_back)
        steps = sorted(self.manager.all_steps(), reverse=True)
        keep = {s for s in steps if s > anchor}
        keep.update([s for s in steps if s <= anchor][:self.max_to_keep])
        if self.best_metric:
            keep.add(self._best(steps))
        for step in steps:
            if step not in keep and step < anchor:
                self.manager.delete(step)

    def _best(self, steps: list[int]) -> int:
        sign = 1.0 if self.best_mode == "max" else -1.0

        def score(step: int) -> float:
            try:
                return sign * float(read_meta(self.directory, step)["metrics"][self.best_metric])
            except (OSError, KeyError, TypeError, ValueError):
                return float("-inf")
        return max(steps, key=score)

    def wait(self) -> None:
        self._settle()

    def close(self) -> None:
        self._settle()
        self.manager.close()


def _reason(e: BaseException) -> str:
    """The first line of an exception, short enough for one line per step."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) describing ``tree``: the restore target."""
    def one(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
    return jax.tree.map(one, tree)
