"""The install check: diffu-GRPO on a toy task a random tiny LLaDA learns, on a CPU.

  python -m d1jax.main --config=configs/grpo_letters.py --workdir=runs/letters

30 optimizer steps (15 rollouts of 4 prompts x 8 completions) of the :tiny GRPO config on
``letters`` (d1jax/tasks/letters.py): the reward, the share of completion letters in a..e,
rises from about 0.44 to about 0.5 on screen. d1's tasks need a trained model: on a random one
their rewards stay at 0 (``configs/grpo_sudoku.py:tiny`` runs that pipeline in miniature).

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo).
"""

from d1jax import config
from d1jax.tasks import letters


def get_config(arg=None):
    config.variants.parse(arg, ("tiny",))  # one size: nothing or ':tiny'
    c = config.grpo(letters.NAME, "tiny")
    c.update_from_flattened_dict(letters.TINY_OVERRIDES)
    return c
