"""diffu-GRPO on gsm8k with d1's hyperparameters, on Dream-v0-Instruct-7B.

d1's LoRA list (q, k, v, o, up, down, gate) lands on all seven of Dream's projections.

  python -m d1jax.main --config=configs/dream/grpo_gsm8k.py --workdir=runs/dream_grpo_gsm8k \
      --config.model.path=/path/to/Dream-v0-Instruct-7B
  python -m d1jax.main --config=configs/dream/grpo_gsm8k.py:tiny --workdir=/tmp/dream_grpo_tiny  # CPU

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo).
"""

from d1jax import config


def get_config(arg=None):
    return config.grpo("gsm8k", arg, checkpoint="dream")
