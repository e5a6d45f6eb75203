"""Compile a run's programs for a TPU topology from this host and report per-chip HBM,
loop-aware FLOPs, XLA's time estimates and MFU (no TPU, no weights, no data needed).

  python -m d1jax.plan --config=configs/grpo_gsm8k.py --topology=v5p:2x2x1 --mesh=1,4,1

Exits 1 with one line per program that does not fit (what it needs, what the chip has,
the change that would make it fit), XLA's refusals for lack of HBM included; a program
that does not compile for another reason ends the plan with one line naming it.
``--json=FILE`` also writes the figures as JSON. A repeat plan reads what the last one
compiled from ``--cache_dir`` (d1jax/plan/cache.py).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from d1jax.cli import parse_flags, run_stage

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config (.py), ':variant' allowed.")
_TOPOLOGY = flags.DEFINE_string("topology", "v5p:2x2x1",
                                "TPU topology ('v5p:2x2x1', 'v5e:2x4') or slice ('v5p-8').")
_MESH = flags.DEFINE_string("mesh", "", "data,fsdp,tensor sizes (one may be -1), and expert "
                                        "for a family with experts (LLaDA2); default: "
                                        "config.mesh.shape.")
_JSON = flags.DEFINE_string("json", "", "Also write the figures to this JSON file.")
_PROGRAMS = flags.DEFINE_list("programs", [], "Plan only these programs (e.g. rollout,"
                               "grpo_update); default every program of the run.")
_CACHE = flags.DEFINE_string("cache_dir", None, "Compiled figures kept for the next plan "
                             "(d1jax/plan/cache.py); default $D1JAX_PLAN_CACHE or "
                             "~/.cache/d1jax/plan; '' plans without a cache.")


def _mesh_shape(text: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) not in (3, 4):
        raise app.UsageError(f"--mesh={text!r}: give three sizes data,fsdp,tensor, e.g. 1,4,1, "
                             f"or four, data,fsdp,tensor,expert, for a family with experts")
    return shape


def _progress(e) -> None:
    how = " (figures from the plan cache)" if e.cached else ""
    if e.refused:
        how += f": XLA refused it, {e.total_bytes / 2**30:,.1f} GiB per chip"
    print(f"compiled {e.program} in {e.compile_s:.0f} s{how}", file=sys.stderr, flush=True)


def main(argv):
    del argv
    from d1jax.config import check_inputs
    from d1jax.run.spec import STAGES
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/grpo_gsm8k.py")
    # Through the stage runner d1jax.main and d1jax.eval use (one error: line for a mistake);
    # a model path that is set must exist, checked before libtpu loads (its config.json and
    # tokenizer: a plan reads no weights). No workdir: a plan writes only its --json and its
    # own cache.
    run_stage(config, None, {stage: _plan for stage in STAGES},
              before=lambda c: check_inputs(c, data=False, weights=False), needs_workdir=False)


def _plan(config, workdir: None) -> None:
    """Plans ``config``'s programs on --topology, prints the table; exit 1 naming each
    program that does not fit."""
    from d1jax.config import ConfigError
    from d1jax.plan import compile as plan_lib, report
    del workdir
    run = plan_lib.as_spec(config)  # the one translation of the config
    if _JSON.value and not os.path.isdir(os.path.dirname(os.path.abspath(_JSON.value))):
        raise ConfigError(f"--json={_JSON.value}: its directory does not exist (checked before "
                          "compiling)")
    plan_lib.require_libtpu()
    try:
        estimates = plan_lib.plan(run, _TOPOLOGY.value, _mesh_shape(_MESH.value),
                                  on_estimate=_progress, cache_dir=_CACHE.value,
                                  programs=tuple(_PROGRAMS.value))
    except (ValueError, ImportError) as e:  # a topology or mesh the planner cannot use
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    print(report.table(estimates))
    if run.grpo is not None and getattr(run.grpo.hparams, "routing_replay", False):
        print("note: grpo_update is planned without routing replay's old_routing batch field "
              "(the update routes by its own forward)", file=sys.stderr)
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            f.write(report.to_json(estimates))
    failures = [plan_lib.failure_line(e, run) for e in estimates if not e.fits]
    for line in failures:
        print(line, file=sys.stderr)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: parse_flags(argv, example="configs/grpo_gsm8k.py"))
