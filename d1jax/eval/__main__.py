"""``python -m d1jax.eval --config=configs/eval.py:TASK --workdir=DIR``: d1's evaluation.

Parses its flags and runs ``evaluate.run`` through the stage runner ``d1jax.main`` uses
(``cli.run_stage``: the persistent compilation cache, one ``error:`` line for a mistake in
the config or a file, or for a program out of device memory). Multi-host evaluation goes
through ``python -m d1jax.main``, which joins the distributed run first.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from d1jax.cli import parse_flags, run_stage

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/eval.py:TASK[-tiny].")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (generations, accuracy); default config.workdir.")


def main(argv) -> None:
    del argv
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/eval.py:gsm8k")
    if config.get("stage") != "eval":
        sys.exit(f"error: config.stage={config.get('stage')!r}: python -m d1jax.eval runs "
                 "eval configs (configs/eval.py); python -m d1jax.main runs the others")
    run_stage(config, _WORKDIR.value, {"eval": "d1jax.eval.evaluate"})


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: parse_flags(
        argv, example="configs/eval.py:sudoku,tiny", check_inputs=True))
