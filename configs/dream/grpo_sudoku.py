"""diffu-GRPO on 4x4 Sudoku with d1's hyperparameters, on Dream-v0-Instruct-7B.

  python -m d1jax.main --config=configs/dream/grpo_sudoku.py --workdir=runs/dream_grpo_sudoku \
      --config.model.path=/path/to/Dream-v0-Instruct-7B
  python -m d1jax.main --config=configs/dream/grpo_sudoku.py:tiny --workdir=/tmp/dream_sudoku_tiny  # CPU

``--config.grpo.objective=wd1`` (with ``--config.grpo.beta=0``), ``spg`` (beta 0) or
``coupled_grpo`` runs a successor on the same loop. Fields: docs/configs.md; builder
d1jax/config/defaults.py (grpo).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("sudoku", arg, checkpoint="dream")
