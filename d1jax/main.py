"""Entry point: parses flags and runs the stage the config names. Nothing else.

  python -m d1jax.main --config=configs/grpo_sudoku.py:tiny --workdir=/tmp/run

Each stage module exposes ``run(config, workdir)`` so tests and notebooks call it directly.
"""

from __future__ import annotations

import importlib
import os
import sys

from absl import app, flags
from ml_collections import config_flags

STAGES = {
    "sft": "d1jax.train.sft",
    "grpo": "d1jax.train.grpo",
    "eval": "d1jax.eval.evaluate",
    "demo": "d1jax.demo.run",
    "forward": "d1jax.demo.forward",
}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (.py), ':variant' allowed.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics); default config.workdir.")


def maybe_initialize_distributed() -> None:
    """Joins a multi-process run when launch/ (or the user) set D1JAX_COORDINATOR."""
    coordinator = os.environ.get("D1JAX_COORDINATOR")
    if not coordinator:
        return
    import jax
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # Every process waits for the others' CPU topology (default 2 minutes): on a loaded
        # machine a slow starter is not a failure.
        minutes = int(os.environ.get("D1JAX_TOPOLOGY_TIMEOUT_MINUTES", "10"))
        jax.config.update("jax_cpu_get_local_topology_timeout_minutes", minutes)
        jax.config.update("jax_cpu_get_global_topology_timeout_minutes", minutes)
    jax.distributed.initialize(coordinator, int(os.environ["D1JAX_NUM_PROCESSES"]),
                               int(os.environ["D1JAX_PROCESS_ID"]))


def main(argv):
    del argv
    maybe_initialize_distributed()
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/grpo_sudoku.py:tiny")
    stage = config.get("stage")
    if stage not in STAGES:
        sys.exit(f"error: config.stage={stage!r} is not one of {sorted(STAGES)}")
    workdir = _WORKDIR.value or config.get("workdir")
    if not workdir:
        sys.exit("error: no workdir: pass --workdir=DIR or set config.workdir")
    try:
        importlib.import_module(STAGES[stage]).run(config, workdir)
    except _user_errors() as e:  # a mistake in a config or a file: one clear line
        sys.exit(f"error: {e}")


def _user_errors() -> tuple[type[BaseException], ...]:
    from d1jax.model import UnsupportedConfigError
    from d1jax.tasks.sources import DataUnavailableError
    from d1jax.config import ConfigError
    from d1jax.model.weights import CheckpointError
    return (ConfigError, CheckpointError, UnsupportedConfigError, DataUnavailableError)


if __name__ == "__main__":
    app.run(main)
