"""The CPU demo: d1's recipe in miniature on 4x4 Sudoku (Table 1 of the paper).

  python -m d1jax.main --config=configs/demo_sudoku.py --workdir=/tmp/d1jax_demo      # ~24 min measured on 2 shared cores
  python -m d1jax.main --config=configs/demo_sudoku.py:ci --workdir=/tmp/d1jax_demo_ci  # shortened

Fields and their meaning: d1jax/demo/config.py; stages: d1jax/demo/run.py.
"""

from d1jax.demo import config


def get_config(arg=None):
    return config.get_config(arg)
