"""d1's evaluation protocol (gen lengths 128/256/512, block 32, steps = length / 2, greedy).

  python -m d1jax.eval --config=configs/eval.py:gsm8k --workdir=runs/eval_gsm8k \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.eval --config=configs/eval.py:sudoku,tiny --workdir=/tmp/eval_tiny  # CPU smoke run

The variant is the task (gsm8k, the default, math500, sudoku, countdown, humaneval, mbpp, or
any registered task) and optionally "tiny", comma-separated: ``:sudoku,tiny``.
Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (eval_config).
"""

from d1jax import config


def get_config(arg=None):
    return config.eval_config(arg)
