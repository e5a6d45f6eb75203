"""coupled-GRPO (DiffuCoder, arXiv 2506.20639) on 4x4 Sudoku, on DiffuCoder-7B-Instruct.

Default: d1's knobs (as configs/coupled_grpo_sudoku.py), so runs compare with diffu-GRPO.
``:authors``: DiffuCoder's own recipe (recipes/config_coupled_code.yaml, run.sh): full
fine-tuning, beta 0.01, mu 2, the leave-one-out advantage, 8 prompts x G 10 a step, lr 1e-6
with a cosine to 0.1 x lr, a reference synced every 64 steps; rollouts through Dream's
diffusion_generate (alg entropy, temperature 1.0, top_p 0.95, 256 tokens in 256 steps, no
blocks).

  python -m d1jax.main --config=configs/diffucoder/coupled_grpo_sudoku.py:authors \
      --workdir=runs/diffucoder_coupled --config.model.path=/path/to/DiffuCoder-7B-Instruct
  python -m d1jax.main --config=configs/diffucoder/coupled_grpo_sudoku.py:authors,tiny \
      --workdir=/tmp/diffucoder_tiny  # CPU

Fields: docs/configs.md; builder d1jax/config/defaults.py (grpo; config.grpo.coupled_grpo for
its own knobs).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("sudoku", arg, objective="coupled_grpo", checkpoint="diffucoder")
