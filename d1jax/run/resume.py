"""Resume compatibility: a workdir's checkpoints resume only under the config that shaped them.

Each checkpoint's metadata records the run's identity (``spec.RESUME_FIELDS``: architecture,
LoRA, optimizer, objective, batch, data order, task). Before anything is written, ``check``
compares it with the new config and refuses a change in one line naming each field
(old -> new) and the two ways out; ``train.if_incompatible=move_aside`` moves the old run
aside instead (never deleting it) and starts over. ``train.accept_changes`` lets named
fields change (e.g. a lower learning rate) when the state still restores.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import jax

from d1jax import checkpoint as ckpt_lib
from d1jax.config import ConfigError
from d1jax.run.spec import RunSpec

# What a run writes in its workdir that belongs to its lineage (moved aside together).
RUN_FILES = ("checkpoints", "checkpoints_unreadable", "metrics.jsonl", "samples.jsonl",
             "tensorboard", "hf", "config.json")


class IncompatibleResume(ConfigError):
    """The workdir holds checkpoints of a run with another state-shaping config."""


def recorded_identity(workdir: Path) -> tuple[int, dict[str, Any]] | None:
    """(step, identity) of the newest checkpoint whose metadata reads and records one."""
    for step in ckpt_lib.list_steps(Path(workdir) / "checkpoints"):
        try:
            meta = ckpt_lib.read_meta(Path(workdir) / "checkpoints", step)
        except (OSError, ValueError):
            continue
        if "identity" in meta:
            return step, dict(meta["identity"])
    return None


def changes(old: dict[str, Any], new: dict[str, Any], accepted=()) -> list[str]:
    """'field old -> new' for each field that differs, except the accepted ones. A field the
    old identity does not record (a checkpoint older than the field) is not compared: a
    d1jax upgrade does not refuse a run it can still restore."""
    fields = [f for f in new if f in old and f not in accepted]
    return [f"{f} {json.dumps(old.get(f))} -> {json.dumps(new.get(f))}"
            for f in sorted(fields) if old.get(f) != new.get(f)]


def check(spec: RunSpec, workdir: Path) -> None:
    """Refuses (or, with if_incompatible=move_aside, moves aside) a workdir whose newest
    checkpoint was written under another identity; run before anything is written."""
    found = recorded_identity(workdir)
    if found is None:
        return
    step, old = found
    diff = changes(old, dict(spec.identity), spec.train.accept_changes)
    if not diff:
        return
    if spec.train.if_incompatible == "move_aside":
        start_over(workdir, f"its checkpoints (step {step}) were written with {'; '.join(diff)}",
                   RUN_FILES + ("tokenizer",))
        return
    raise IncompatibleResume(
        f"workdir {workdir} holds a run at step {step} written with another config: "
        f"{'; '.join(diff)}. Use another --workdir, or pass "
        "--config.train.if_incompatible=move_aside to start over with the old run moved to "
        f"{workdir}/previous/ (nothing is deleted)")


def start_over(workdir: Path, why: str, names: tuple[str, ...] = RUN_FILES) -> Path:
    """Moves the workdir's run files (``names``; with the config changed, also the tiny
    tokenizer trained for the old run) into ``previous/<time>/``; returns that folder."""
    dest = Path(workdir) / "previous" / time.strftime("%Y%m%dT%H%M%S")
    if jax.process_index() == 0:
        dest.mkdir(parents=True, exist_ok=True)
        for name in names:
            if (Path(workdir) / name).exists():
                shutil.move(str(Path(workdir) / name), dest / name)
        print(f"starting over: {why}; the old run was moved to {dest}", flush=True)
    ckpt_lib.sync_processes("d1jax_start_over")
    return dest
