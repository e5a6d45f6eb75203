"""diffu-GRPO for HumanEval with d1's hyperparameters (train.yaml; mu 12, d1's default), on
DiffuCoder's training data (AceCode, ``TIGER-Lab/AceCode-89K``; HumanEval has no training
split) with DiffuCoder's rewards: the share of unit tests passed (weight 2.0, run in
d1jax/tasks/sandbox.py's subprocesses) and its code format (0.5).

  python -m d1jax.main --config=configs/grpo_humaneval.py --workdir=runs/grpo_humaneval \
      --config.model.path=/path/to/LLaDA-8B-Instruct \
      --config.task.source=acecode_hard.jsonl  # DiffuCoder's recipes/process_data.py output
  python -m d1jax.main --config=configs/grpo_humaneval.py:tiny --workdir=/tmp/grpo_he_tiny  # CPU, ~2 min
  python -m d1jax.eval --config=configs/eval.py:humaneval --workdir=runs/eval_humaneval \
      --config.model.path=runs/grpo_humaneval/hf                     # pass@1 at 256 and 512

``:tiny`` trains on generated one-line function problems (``task.source="toy"``), offline.
Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo); the task:
d1jax/tasks/humaneval.py.
"""

from d1jax import config


def get_config(arg=None):
    c = config.grpo("humaneval", arg)
    if c.model.random_init:  # :tiny: generated problems, nothing downloaded
        c.task.source = "toy"
    return c
