"""Entry point: parses flags and runs the stage the config names. Nothing else.

  python -m d1jax.main --config=configs/grpo_sudoku.py:tiny --workdir=/tmp/run

Each stage module exposes ``run(config, workdir)`` so tests and notebooks call it directly.
"""

from __future__ import annotations

import difflib
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
_CHECK_FITS = flags.DEFINE_string(
    "check_fits", "", "Before loading weights, compile the run's programs for this TPU topology "
    "('v5p-8', 'v5p:2x2x1'; 'attached': this TPU VM's slice) and stop with one line per program "
    "that does not fit in HBM (d1jax.plan; needs libtpu, not a TPU).")


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
        if _CHECK_FITS.value:
            check_fits(config, _CHECK_FITS.value)
        importlib.import_module(STAGES[stage]).run(config, workdir)
    except _user_errors() as e:  # a mistake in a config or a file: one clear line
        sys.exit(f"error: {e}")


def check_fits(config, topology: str) -> None:
    """``plan.check_fits`` for ``topology`` ('attached': the TPU this process runs on); a
    program that does not fit ends the run with the planner's line, before any weights load."""
    from d1jax import plan
    if config.stage not in ("grpo", "sft", "eval"):
        raise plan.DoesNotFit(f"--check_fits plans grpo, sft and eval runs, not stage={config.stage!r}")
    estimates = plan.check_fits(config, None if topology == "attached" else topology)
    worst = max(estimates, key=lambda e: e.total_bytes)
    print(f"check_fits: {len(estimates)} programs fit on {worst.topology} (largest: {worst.program}, "
          f"{worst.total_bytes / 2**30:.1f} of {worst.capacity_bytes / 2**30:.1f} GiB per chip)",
          flush=True)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parser, except that an unknown ``--config.KEY`` override ends in one line."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError):  # what ml_collections raises for a missing key
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        # The config without overrides, loaded by a fresh flag set (FLAGS keeps the failed parse).
        plain = [a for a in argv if a not in overrides]
        fresh = flags.FlagValues()
        config = config_flags.DEFINE_config_file("config", None, "", flag_values=fresh,
                                                 sys_argv=plain)
        fresh(plain, known_only=True)
        for arg in overrides:
            message = unknown_key_message(config.value, arg[len("--config."):].split("=", 1)[0])
            if message:
                sys.exit(f"error: {message}")
        raise


def unknown_key_message(config, key: str) -> str | None:
    """None if the dotted ``key`` names a field of ``config``, else a line naming the closest."""
    node = config
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            candidates = _closest(key, list(_dotted_keys(config)))
            hint = (f"closest valid keys: {', '.join(candidates)}" if candidates else
                    "see the config file for its fields")
            return f"unknown config key {key!r} in --config.{key}=...; {hint}"
        node = node[part]
    return None


def _closest(key: str, valid: list[str], n: int = 3) -> list[str]:
    """Up to n valid keys most like ``key``, by the whole path or by the last name alone."""
    def score(k: str) -> float:
        return max(difflib.SequenceMatcher(None, key, k).ratio(),
                   difflib.SequenceMatcher(None, key.split(".")[-1], k.split(".")[-1]).ratio())
    return [k for k in sorted(valid, key=score, reverse=True)[:n] if score(k) >= 0.6]


def _dotted_keys(config, prefix: str = ""):
    for name, value in config.items():
        yield prefix + name
        if hasattr(value, "keys"):
            yield from _dotted_keys(value, f"{prefix}{name}.")


def _user_errors() -> tuple[type[BaseException], ...]:
    from d1jax.model import UnsupportedConfigError
    from d1jax.tasks.sources import DataUnavailableError
    from d1jax.config import ConfigError
    from d1jax.model.weights import CheckpointError
    from d1jax.plan.compile import DoesNotFit
    return (ConfigError, CheckpointError, UnsupportedConfigError, DataUnavailableError,
            DoesNotFit)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
