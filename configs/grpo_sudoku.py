"""diffu-GRPO on sudoku with d1's hyperparameters (train.yaml; mu from the task's sbatch), on
d1's training puzzles; ``:generated`` trains on d1jax's generated puzzles instead.

  python -m d1jax.main --config=configs/grpo_sudoku.py --workdir=runs/grpo_sudoku \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/grpo_sudoku.py:tiny --workdir=/tmp/grpo_sudoku_tiny  # CPU, ~1 min

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("sudoku", arg)
