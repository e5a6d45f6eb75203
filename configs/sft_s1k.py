"""Masked SFT on s1K reasoning traces: d1's first stage (SFT/sft_train.py hyperparameters).

  python -m d1jax.main --config=configs/sft_s1k.py --workdir=runs/sft_s1k \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/sft_s1k.py:tiny --workdir=/tmp/sft_tiny  # CPU, ~1 min

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (sft).
"""

from d1jax import config


def get_config(arg=None):
    return config.sft(arg)
