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
from d1jax import metrics as metrics_lib
from d1jax.model import lora as lora_lib
from d1jax.model import weights
from d1jax import config as config_lib
from d1jax.train import spec as spec_lib
from d1jax.train.spec import LoopSpec, RunSpec


@dataclasses.dataclass
class RunContext:
    """Per-run services: checkpointer, metric writer, progress bar, preemption flag."""

    workdir: Path
    loop: LoopSpec
    checkpointer: ckpt_lib.Checkpointer
    writer: metrics_lib.MetricWriter
    preempt: ckpt_lib.PreemptionFlag
    progress: metrics_lib.Progress | None = None

    @classmethod
    def create(cls, spec: RunSpec, workdir: Path) -> "RunContext":
        t = spec.train
        ck = ckpt_lib.Checkpointer(
            workdir, save_every=t.save_every, max_to_keep=t.max_to_keep,
            best_metric=t.keep_best_metric or None, async_save=t.async_checkpoints)
        if jax.process_index() == 0:
            (workdir / "config.json").write_text(spec.config_json)
        return cls(workdir, t, ck, metrics_lib.MetricWriter(workdir),
                   ckpt_lib.PreemptionFlag().install())

    def restore(self, state: Any) -> tuple[int, Any, dict]:
        """(step, state, meta) of the newest readable checkpoint, or (0, state, {})."""
        out = self.checkpointer.restore(ckpt_lib.abstract_like(state))
        if out is None:
            return 0, state, {}
        step, restored, meta = out
        print(f"resumed from {self.checkpointer.directory}/{step}", flush=True)
        return step, restored, meta

    def should_stop(self, step: int) -> bool:
        """Preempted on any host, or the config's stop_after reached."""
        flag = np.array([self.preempt.is_set], np.int32)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            flag = multihost_utils.process_allgather(flag)
        stop_after = self.loop.stop_after
        return bool(flag.any()) or (stop_after > 0 and step >= stop_after)

    def log(self, step: int, scalars: dict[str, Any], texts: dict[str, str] | None = None):
        clean = self.writer.write_scalars(step, scalars)
        if texts:
            self.writer.write_texts(step, texts)
        if self.progress is not None:
            shown = {k: clean[k] for k in ("loss", "reward", "kl") if k in clean}
            self.progress.update(1, **shown)
        return clean

    def close(self) -> None:
        self.checkpointer.close()
        self.writer.close()
        self.preempt.uninstall()
        if self.progress is not None:
            self.progress.close()


def export_hf(workdir: Path, setup, state, source_dir: str | None) -> Path:
    """Writes the final policy (adapters merged) and tokenizer in the Hugging Face layout.

    ``source_dir``: the Hugging Face directory the model was loaded from (None for a
    random model), whose remote code and tokenizer files belong beside the export.
    """
    out = workdir / "hf"
    params = lora_lib.merge(state.policy_params(), setup.model.lora)
    weights.save_hf_checkpoint(out, setup.model_config, params, max_shard_size="2GB",
                               source_dir=source_dir)
    if jax.process_index() == 0:
        setup.tokenizer.save_pretrained(str(out))
        (out / "d1jax_export.json").write_text(json.dumps({"time": time.time()}))
    return out


def prepare(config, workdir: str) -> tuple[RunSpec, Path]:
    """Before any compute: the config translated and validated, then the workdir."""
    spec = spec_lib.from_config(config)
    return spec, config_lib.check_workdir(workdir)
