"""coupled-GRPO (DiffuCoder, arXiv 2506.20639) on Countdown, on DiffuCoder-7B-Instruct.

Default: d1's knobs; ``:authors``: DiffuCoder's recipe (see coupled_grpo_sudoku.py).

  python -m d1jax.main --config=configs/diffucoder/coupled_grpo_countdown.py:authors \
      --workdir=runs/diffucoder_countdown --config.model.path=/path/to/DiffuCoder-7B-Instruct
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("countdown", arg, objective="coupled_grpo", checkpoint="diffucoder")
