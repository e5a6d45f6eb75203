"""JustGRPO (arXiv 2601.15165) on code: LeapLabTHU/JustGRPO's train.py values (the objective's
``:authors`` variant, listed in configs/justgrpo_gsm8k.py) on d1jax's code task, DiffuCoder's
AceCode rows (``TIGER-Lab/AceCode-89K``; HumanEval has no training split) with DiffuCoder's
rewards: the share of unit tests passed (weight 2.0, run in d1jax/tasks/sandbox.py's
subprocesses) and its code format (0.5).

Not theirs: the paper reports HumanEval and MBPP, but the repository has released only its
GSM8K recipe (its README at b37fa3e lists code tasks as to do). The data, prompt and rewards
here are DiffuCoder's, as configs/grpo_humaneval.py's.

  python -m d1jax.main --config=configs/justgrpo_code.py --workdir=runs/justgrpo_code \
      --config.model.path=/path/to/LLaDA-8B-Instruct \
      --config.task.source=acecode_hard.jsonl  # DiffuCoder's recipes/process_data.py output
  python -m d1jax.eval --config=configs/eval.py:humaneval --workdir=runs/eval_jg_humaneval \
      --config.model.path=runs/justgrpo_code/hf                      # pass@1 at 256 and 512

``:tiny`` trains on generated problems (``task.source="toy"``) from a random model (reward 0);
configs/grpo_code_toy.py:justgrpo is the run on a warm-started tiny model whose reward rises.
Fields and their meaning: d1jax/config/defaults.py (grpo; config.grpo.justgrpo).
"""

from d1jax import config


def get_config(arg=None):
    c = config.grpo("humaneval", f"authors,{arg or ''}", objective="justgrpo")
    if c.model.random_init:  # :tiny: generated problems, nothing downloaded
        c.task.source = "toy"
    return c
