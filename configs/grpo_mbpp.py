"""diffu-GRPO on MBPP's training split (374 problems, ``google-research-datasets/mbpp``
``full``) with d1's hyperparameters (train.yaml; mu 12, d1's default) and DiffuCoder's
rewards: the share of the problem's asserts passed (weight 2.0, run in
d1jax/tasks/sandbox.py's subprocesses) and its code format (0.5).

  python -m d1jax.main --config=configs/grpo_mbpp.py --workdir=runs/grpo_mbpp \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/grpo_mbpp.py:tiny --workdir=/tmp/grpo_mbpp_tiny  # CPU, ~2 min
  python -m d1jax.eval --config=configs/eval.py:mbpp --workdir=runs/eval_mbpp \
      --config.model.path=runs/grpo_mbpp/hf                          # pass@1 at 256 and 512

``:tiny`` trains on generated one-line function problems (``task.source="toy"``), offline.
Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo); the task:
d1jax/tasks/mbpp.py.
"""

from d1jax import config


def get_config(arg=None):
    c = config.grpo("mbpp", arg)
    if c.model.random_init:  # :tiny: generated problems, nothing downloaded
        c.task.source = "toy"
    return c
