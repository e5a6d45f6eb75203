"""d1's evaluation protocol on a Dream checkpoint (gen lengths 128/256/512, block 32, steps =
gen/2, greedy). ``:TASK`` or ``:TASK,tiny`` (configs/eval.py).

  python -m d1jax.eval --config=configs/dream/eval.py:gsm8k --config.model.path=/path/to/Dream \
      --workdir=runs/dream_eval
"""

from d1jax import config


def get_config(arg=None):
    return config.eval_config(arg, checkpoint="dream")
