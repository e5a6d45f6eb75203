"""What the SFT and GRPO loops share: checkpoint/resume, metrics, preemption, export."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from d1jax import checkpoint as ckpt_lib
from d1jax import config as config_lib
from d1jax import metrics as metrics_lib
from d1jax.model import lora as lora_lib
from d1jax.model import family as family_lib
from d1jax.run import interrupt, resume
from d1jax.run import lock as lock_lib
from d1jax.run import spec as spec_lib
from d1jax.run.spec import LoopSpec, RunSpec


class RunStopped(Exception):
    """A training run stopped before its last step, after saving: rerun it to resume.

    ``d1jax.main`` turns it into one line and ``train.stopped_exit_code`` (75, EX_TEMPFAIL,
    by default), so a scheduler can tell "rerun me" from "done" (0); after Ctrl-C, 130.
    """

    def __init__(self, step: int, total: int, reason: str, exit_code: int):
        super().__init__(f"stopped at step {step} of {total} ({reason}) with a checkpoint "
                         "saved; rerun the same command to resume")
        self.step, self.total, self.reason, self.exit_code = step, total, reason, exit_code


@dataclasses.dataclass
class RunContext:
    """Per-run services: checkpointer, metric writer, progress bar, preemption flag."""

    workdir: Path
    loop: LoopSpec
    checkpointer: ckpt_lib.Checkpointer
    stop: interrupt.StopRequest  # SIGTERM or Ctrl-C asked the loop to save and stop
    config_json: str  # written beside the run once restore() settled which run this is
    identity: dict  # the config fields that shape the state, saved with every checkpoint
    writer: metrics_lib.MetricWriter | None = None  # opened by restore(), at the resume step
    progress: metrics_lib.Progress | None = None
    stop_reason: str = "train.stop_after"  # why should_stop() said stop
    lock: lock_lib.WorkdirLock | None = None  # taken by prepare(), released by close()

    @classmethod
    def create(cls, spec: RunSpec, workdir: Path) -> "RunContext":
        checkpointer = _checkpointer(spec.train, workdir)
        stop = interrupt.StopRequest(checkpointer.directory).install()
        return cls(workdir, spec.train, checkpointer, stop, spec.config_json,
                   dict(spec.identity), lock=lock_lib.held(workdir))

    def restore(self, state: Any) -> tuple[int, Any, dict]:
        """(step, state, meta) of the newest readable checkpoint, or (0, state, {}) for a
        new run; opens the metric writer with every row after that step dropped. When no
        checkpoint restores: RestoreError, or with if_incompatible=move_aside a new run."""
        try:
            out = self.checkpointer.restore(ckpt_lib.abstract_like(state))
        except ckpt_lib.RestoreError as e:
            if self.loop.if_incompatible != "move_aside":
                raise
            self.checkpointer.close()
            steps = "; ".join(ln.strip() for ln in str(e).splitlines()[1:] if ln.startswith("  "))
            resume.start_over(self.workdir, f"no checkpoint restores ({steps})")
            self.checkpointer = _checkpointer(self.loop, self.workdir)
            out = None
        step, restored, meta = out if out is not None else (0, state, {})
        if out is not None:
            print(f"resumed from {self.checkpointer.directory}/{step}", flush=True)
        if jax.process_index() == 0:
            (self.workdir / "config.json").write_text(self.config_json)
        self.writer = metrics_lib.MetricWriter(self.workdir, resume_step=step)
        return step, restored, meta

    def save(self, step: int, state: Any, meta: dict, force: bool = False) -> bool:
        """Saves (when due or forced) with the run's identity in the metadata."""
        return self.checkpointer.save(step, state, {**meta, "identity": self.identity},
                                      force=force)

    def should_stop(self, step: int) -> bool:
        """SIGTERM or Ctrl-C on any host, or the config's stop_after reached."""
        code = np.array([interrupt.REASONS.index(self.stop.reason)], np.int32)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            code = multihost_utils.process_allgather(code)
        if code.max() > 0:
            self.stop_reason = interrupt.REASONS[int(code.max())]
            return True
        return self.loop.stop_after > 0 and step >= self.loop.stop_after

    def log(self, step: int, scalars: dict[str, Any], texts: dict[str, str] | None = None):
        self.stop.progressed = True  # a step finished: Ctrl-C now saves before stopping
        clean = self.writer.write_scalars(step, scalars)
        if texts:
            self.writer.write_texts(step, texts)
        if self.progress is not None:
            shown = {k: clean[k] for k in ("loss", "reward", "kl") if k in clean}
            self.progress.update(1, **shown)
        return clean

    def close(self) -> None:
        self.checkpointer.close()
        if self.writer is not None:
            self.writer.close()
        self.stop.uninstall()
        if self.progress is not None:
            self.progress.close()
        if self.lock is not None:
            self.lock.release()

    def check_finished(self, step: int, total: int) -> None:
        """Raises RunStopped when the loop ended before ``total`` (SIGTERM or stop_after)."""
        if step < total:
            code = (interrupt.CTRL_C_EXIT if self.stop_reason == "Ctrl-C" else
                    self.loop.stopped_exit_code)
            raise RunStopped(step, total, self.stop_reason, code)


def _checkpointer(t: LoopSpec, workdir: Path) -> ckpt_lib.Checkpointer:
    return ckpt_lib.Checkpointer(workdir, save_every=t.save_every, max_to_keep=t.max_to_keep,
                                 best_metric=t.keep_best_metric or None,
                                 async_save=t.async_checkpoints)


def export_hf(workdir: Path, setup, state, source_dir: str | None) -> Path:
    """Writes the final policy (adapters merged) and tokenizer in the Hugging Face layout.

    ``source_dir``: the Hugging Face directory the model was loaded from (None for a
    random model), whose remote code and tokenizer files belong beside the export.
    """
    out = workdir / "hf"
    params = lora_lib.merge(state.policy_params(), setup.model.lora)
    family_lib.of(setup.model).save(out, setup.model_config, params, max_shard_size="2GB",
                                    source_dir=source_dir, tokenizer=setup.tokenizer)
    if jax.process_index() == 0:
        (out / "d1jax_export.json").write_text(json.dumps({"time": time.time()}))
    return out


def _check_model_outside(spec: RunSpec, workdir: str) -> None:
    """The checkpoint a run reads must not be its workdir (a run writes config.json there)
    nor inside what the run writes, exports or moves aside (``hf/``, ``checkpoints/``...)."""
    wd = Path(workdir).expanduser().resolve()
    written = [wd / name for name in resume.RUN_FILES + ("tokenizer",)]
    for key in ("path", "tokenizer_path"):
        given = getattr(spec.model, key)
        if not given:
            continue
        p = Path(given).expanduser().resolve()
        if p == wd:
            raise config_lib.ConfigError(
                f"--workdir {workdir} is config.model.{key}: a run writes config.json, "
                "checkpoints/ and hf/ there; use another --workdir")
        inside = next((w for w in written if p == w or w in p.parents), None)
        if inside is not None:
            raise config_lib.ConfigError(
                f"config.model.{key}={given!r} is inside the workdir's {inside.name}/, which "
                "this run writes (an export, or a move aside, would replace what it reads); "
                "copy it out or use another --workdir")


def prepare(config, workdir: str) -> tuple[RunSpec, Path]:
    """Before any compute: the config translated and validated, then the workdir, locked for
    this run (``lock.WorkdirBusy`` if another process writes there; ``RunContext.close``, or
    the process's exit, releases it)."""
    spec = spec_lib.from_config(config)
    _check_model_outside(spec, workdir)
    wd = config_lib.check_workdir(workdir)
    lock = lock_lib.acquire(wd)
    try:
        if spec.stage in ("sft", "grpo"):
            resume.check(spec, wd)
    except BaseException:
        lock.release()
        raise
    return spec, wd
