"""The task a random tiny LLaDA learns within a few dozen GRPO steps, for RL tests that learn.

It is the package's ``letters`` toy (d1jax/tasks/letters.py, the install check's task): prompts
"Write letters. <word>", reward the share of completion letters in a..e. This module holds what
the tests add: the :tiny run's overrides and flags, and the statistic runs that learn must pass.
"""

from __future__ import annotations

from d1jax.tasks import letters

NAME = letters.NAME
# The :tiny GRPO config's changes for this task (configs/grpo_letters.py applies the same):
# short prompts, 4 groups of 8 completions a rollout, std-normalised advantages and a higher
# learning rate, so the reward rises within 30 steps (docs/testing.md, "RL tests that learn").
OVERRIDES = letters.TINY_OVERRIDES
# d1jax.main's flags for that run (test_faults, test_multihost and conftest's session-wide
# ``learnable_reference`` run).
MAIN_FLAGS = ("--config=configs/grpo_letters.py",)

# `python -c MAIN <d1jax.main flags>` from the repository root: d1jax.main as `python -m` runs
# it (a harness may patch functions before this line runs).
MAIN = ("import runpy, sys; sys.argv[0] = 'd1jax.main'; "
        "runpy.run_module('d1jax.main', run_name='__main__')")


def config(objective: str = "diffu_grpo", **changes):
    """The :tiny GRPO config of ``objective`` on this task, with OVERRIDES and ``changes``
    (dotted field names); no Hugging Face export unless asked for."""
    from d1jax import config as config_lib
    c = config_lib.grpo(NAME, "tiny", objective=objective)
    c.update_from_flattened_dict({**OVERRIDES, "train.export_hf": False, **changes})
    return c


# Least rise of the reward (``rise`` below) a run of OVERRIDES must show, whatever the objective
# and seed; docs/testing.md has the measurements behind it.
MIN_RISE = 0.01
# The frozen control's changes: the loop refuses a learning rate of 0, and at 1e-12 the policy
# does not move measurably, so its rollouts are the untrained model's on the run's own prompts
# and sampling keys (the same seed), whatever the objective (docs/testing.md).
FROZEN = {"optim.learning_rate": 1e-12}
# Least ``gain`` over that control an objective's run must show (docs/testing.md).
MIN_GAIN = 0.01


def rise(rewards: list[float], k: int = 5) -> float:
    """Mean reward of the last ``k`` rollouts minus the first rollout's (the untrained model's;
    most of the rise comes within a few rollouts). One reward per rollout: metrics rows[::mu]."""
    return sum(rewards[-k:]) / k - rewards[0]


def gain(rewards: list[float], frozen: list[float], k: int = 5) -> float:
    """Mean reward of the last ``k`` rollouts minus the frozen control's over the same rollouts
    (one reward per rollout each). Paired on prompts and sampling keys, it leaves out the
    rollout-to-rollout noise that ``rise`` keeps: a policy that does not move scores 0."""
    return sum(rewards[-k:]) / k - sum(frozen[-k:]) / k
