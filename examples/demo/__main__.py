"""The demo's one command, run from the repository root:

  python -m examples.demo --config=configs/demo_sudoku.py --workdir=runs/demo

The config's ``stage``: "demo" (configs/demo_sudoku.py: examples/demo/run.py), "forward"
(configs/forward_demo.py: a forward pass, an install check) or "eval" (configs/eval.py with
``--config.task.name=sudoku_compact``: one of the demo's exported models scored by d1jax's
evaluation at the demo's prompt). As with ``python -m d1jax.main``, a mistake in the config
or a path ends in one ``error:`` line.
"""

from absl import app, flags
from ml_collections import config_flags

from d1jax.cli import parse_flags, run_stage
from examples.demo import task  # noqa: F401  (registers the demo's task for eval configs)

STAGES = {"demo": "examples.demo.run", "forward": "examples.demo.forward",
          "eval": "d1jax.eval.evaluate"}

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/demo_sudoku.py[:ci|:compare], "
                                          "configs/forward_demo.py or an eval config.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; default config.workdir.")


def main(argv) -> None:
    del argv
    run_stage(_CONFIG.value, _WORKDIR.value, STAGES)


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: parse_flags(
        argv, example="configs/demo_sudoku.py", check_inputs=True))
