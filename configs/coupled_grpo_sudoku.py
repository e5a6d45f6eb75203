"""coupled-GRPO (DiffuCoder, arXiv 2506.20639): d1's clipped GRPO loss on coupled
log-probs, complementary mask pairs that score every completion token once per pair.
Every other knob is d1's (configs/grpo_sudoku.py), so runs compare with diffu-GRPO.

  python -m d1jax.main --config=configs/coupled_grpo_sudoku.py --workdir=runs/coupled_grpo_sudoku \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/coupled_grpo_sudoku.py:tiny --workdir=/tmp/coupled_grpo_sudoku_tiny  # CPU

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo;
config.grpo.coupled_grpo for its own knobs).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("sudoku", arg, objective="coupled_grpo")
