"""SPG (arXiv 2510.09541): sandwiched policy gradient, the ELBO for positive-advantage
sequences and the EUBO/ELBO mixture for negative ones, on J block-masked copies (beta 0).
Every other knob is d1's (configs/grpo_sudoku.py), so runs compare with diffu-GRPO.
``:authors``: SPG's own Sudoku run (spg_mix/sudoku_new_*.sbatch): its split of the puzzles
with its 3-shot prompt, prompt length 1500, temperature 0.3, mu 4, EUBO beta 1.0.

  python -m d1jax.main --config=configs/spg_sudoku.py --workdir=runs/spg_sudoku \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/spg_sudoku.py:tiny --workdir=/tmp/spg_sudoku_tiny  # CPU

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo;
config.grpo.spg for its own knobs).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("sudoku", arg, objective="spg")
