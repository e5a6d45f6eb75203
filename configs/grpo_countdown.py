"""diffu-GRPO on countdown with d1's hyperparameters (train.yaml; mu from the task's sbatch),
on d1's three-number Countdown rows; ``:generated`` trains on generated instances instead.

  python -m d1jax.main --config=configs/grpo_countdown.py --workdir=runs/grpo_countdown \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/grpo_countdown.py:tiny --workdir=/tmp/grpo_countdown_tiny  # CPU, ~1 min

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("countdown", arg)
