"""The CPU demo: d1's recipe in miniature on 4x4 Sudoku (Table 1 of the paper).

  python -m examples.demo --config=configs/demo_sudoku.py --workdir=runs/demo          # 1,627 s on a busy 2-core VM
  python -m examples.demo --config=configs/demo_sudoku.py:compare --workdir=runs/demo  # + wd1, SPG, coupled-GRPO: ~1,700 s summed over stages
  python -m examples.demo --config=configs/demo_sudoku.py:ci --workdir=runs/demo_ci    # shortened, for tests
  python -m examples.demo --config=configs/demo_sudoku.py:d1like --workdir=runs/demo_d1like
      # d1's design (issue 45): SFT on Latin squares, not Sudoku; RL on Sudoku (docs/demo.md)
  python -m examples.demo.seeds --config=configs/demo_sudoku.py:seeds --pretrain_seeds=0,1,2 \
      --variants=unrolled,loop --workdir=runs/demo_seeds --jobs=2
      # the multi-seed table (docs/demo.md): 6 whole demos of a harder toy (budgets and times there)

Times: one core of a 2-core x86 VM shared with other jobs (docs/demo.md).

Fields and their meaning: examples/demo/config.py; stages: examples/demo/run.py
(run from the repository root: the demo is an example built on d1jax, not part of it).
"""

from examples.demo import config


def get_config(arg=None):
    return config.get_config(arg)
