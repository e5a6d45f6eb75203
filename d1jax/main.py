"""Entry point: parses flags and runs the stage the config names. Nothing else.

  python -m d1jax.main --config=configs/grpo_sudoku.py:tiny --workdir=/tmp/run

Each stage module exposes ``run(config, workdir)`` so tests and notebooks call it directly.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from d1jax import distributed
from d1jax.cli import parse_flags, run_stage, unknown_key_message, user_errors  # noqa: F401

STAGES = {
    "sft": "d1jax.train.sft",
    "grpo": "d1jax.train.grpo",
    "eval": "d1jax.eval.evaluate",
}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (.py), ':variant' allowed.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics); default config.workdir.")
_CHECK_FITS = flags.DEFINE_string(
    "check_fits", "", "Before loading weights, compile the run's programs for this TPU topology "
    "('v5p-8', 'v5p:2x2x1'; 'attached': this TPU VM's slice) and stop with one line per program "
    "that does not fit in HBM (d1jax.plan; needs libtpu, not a TPU).")


def main(argv):
    del argv
    try:
        distributed.initialize_from_env()
    except ValueError as e:  # a bad D1JAX_* variable: one line
        sys.exit(f"error: {e}")
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/grpo_sudoku.py:tiny")
    topology = _CHECK_FITS.value
    run_stage(config, _WORKDIR.value, STAGES,
              before=(lambda c: check_fits(c, topology)) if topology else None)


def check_fits(config, topology: str) -> None:
    """``plan.check_fits`` for ``topology`` ('attached': the TPU this process runs on); a
    program that does not fit ends the run with the planner's line, before any weights load."""
    from d1jax import plan
    plan.require_libtpu()
    if config.stage not in ("grpo", "sft", "eval"):
        raise plan.DoesNotFit(f"--check_fits plans grpo, sft and eval runs, not stage={config.stage!r}")
    run = plan.as_spec(config)  # the one translation of the config the planner reads
    estimates = plan.check_fits(run, None if topology == "attached" else topology)
    worst = max(estimates, key=lambda e: e.total_bytes)
    print(f"check_fits: {len(estimates)} programs fit on {worst.topology} (largest: {worst.program}, "
          f"{worst.total_bytes / 2**30:.1f} of {worst.capacity_bytes / 2**30:.1f} GiB per chip)",
          flush=True)


if __name__ == "__main__":  # model and data paths and the task checked before any work
    app.run(main, flags_parser=lambda argv: parse_flags(argv, check_inputs=True))
