"""d1's masked SFT on s1K reasoning traces (SFT/sft_train.py hyperparameters), on Dream-v0-Base-7B.

  python -m d1jax.main --config=configs/dream/sft_s1k.py --workdir=runs/dream_sft_s1k \
      --config.model.path=/path/to/Dream-v0-Base-7B
  python -m d1jax.main --config=configs/dream/sft_s1k.py:tiny --workdir=/tmp/dream_sft_tiny  # CPU

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (sft).
"""

from d1jax import config


def get_config(arg=None):
    return config.sft(arg, checkpoint="dream")
