"""The CPU demo: d1's recipe in miniature on 4x4 Sudoku (Table 1 of the paper).

  python -m d1jax.main --config=configs/demo_sudoku.py --workdir=runs/demo          # 705 s measured (12 min)
  python -m d1jax.main --config=configs/demo_sudoku.py:compare --workdir=runs/demo  # + wd1, SPG, coupled-GRPO: ~1,700 s summed over stages
  python -m d1jax.main --config=configs/demo_sudoku.py:ci --workdir=runs/demo_ci    # shortened, for tests

Times: one core of a 2-core x86 VM shared with other jobs (docs/demo.md).

Fields and their meaning: d1jax/demo/config.py; stages: d1jax/demo/run.py.
"""

from d1jax.demo import config


def get_config(arg=None):
    return config.get_config(arg)
