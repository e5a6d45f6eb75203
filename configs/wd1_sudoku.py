"""wd1 (arXiv 2507.08838): ratio-free weighted likelihood, softmax(A) and softmax(-A) weights
within each group of G; one current-policy pass per update, no old or reference pass (beta 0).
Every other knob is d1's (configs/grpo_sudoku.py), so runs compare with diffu-GRPO.

  python -m d1jax.main --config=configs/wd1_sudoku.py --workdir=runs/wd1_sudoku \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/wd1_sudoku.py:tiny --workdir=/tmp/wd1_sudoku_tiny  # CPU

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo;
config.grpo.wd1 for its own knobs).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("sudoku", arg, objective="wd1")
