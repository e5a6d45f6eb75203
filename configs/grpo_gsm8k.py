"""diffu-GRPO on gsm8k with d1's hyperparameters (train.yaml; mu from the task's sbatch).

  python -m d1jax.main --config=configs/grpo_gsm8k.py --workdir=runs/grpo_gsm8k \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/grpo_gsm8k.py:tiny --workdir=/tmp/grpo_gsm8k_tiny  # CPU, ~1 min

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("gsm8k", arg)
