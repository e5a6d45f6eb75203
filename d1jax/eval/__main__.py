"""``python -m d1jax.eval --config=configs/eval.py:TASK --workdir=DIR``: d1's evaluation.

Parses its flags and calls ``evaluate.run``; a mistake in the config or a file ends with
one ``error:`` line, as ``d1jax.main`` reports it. Multi-host evaluation goes through
``python -m d1jax.main``, which joins the distributed run first.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from d1jax.cli import parse_flags, user_errors

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/eval.py:TASK[-tiny].")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory; default config.workdir.")


def main(argv) -> None:
    del argv
    from d1jax.eval import evaluate

    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config=configs/eval.py:gsm8k")
    workdir = _WORKDIR.value or config.get("workdir")
    if not workdir:
        sys.exit("error: no workdir: pass --workdir=DIR or set config.workdir")
    try:
        evaluate.run(config, workdir)
    except user_errors() as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: parse_flags(
        argv, example="configs/eval.py:sudoku-tiny", check_inputs=True))
