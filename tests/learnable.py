"""A task a random tiny LLaDA learns within a few dozen GRPO steps, for RL tests that learn.

Prompts are "Write letters. <word>" with random 4-letter words over a..j (generated, nothing
is downloaded), so the tiny tokenizer trained on them (d1jax.model.tokenizer) is mostly
pieces of such words and a random model writes mostly those letters. Reward, in [0, 1]: the
share of the completion's characters, whitespace aside, that are one of a..e. A random model
starts near 0.4 and completions differ, so GRPO has a signal from step 1; raising it needs
no reasoning, only a shift of the output distribution. (Digits, one token each, were tried
first: a random model writes too few of them for 30 steps to move the share.)

Importing this module registers the task as ``learnable`` in ``d1jax.tasks``. Subprocess
runs register it by running d1jax.main through ``MAIN`` (``python -c MAIN <flags>``).
"""

from __future__ import annotations

import random

from d1jax import tasks
from d1jax.tasks.base import Example, Task, Verdict, batched, user_turn

NAME = "learnable"
LETTERS = "abcdefghij"  # prompt words are made of these, so most tiny-tokenizer tokens are too
TARGET = frozenset("abcde")
SYSTEM_PROMPT = "Write letters."

# The :tiny GRPO config's changes for this task: short prompts, 4 groups of 8 completions a
# rollout, std-normalised advantages and a higher learning rate, so the reward rises within
# 30 steps (15 rollouts; docs/testing.md, "RL tests that learn", has the measurements).
OVERRIDES = {"task.name": NAME, "max_prompt_length": 24, "train.num_steps": 30,
             "grpo.prompts_per_step": 4, "grpo.num_generations": 8, "grpo.advantage": "grpo",
             "optim.learning_rate": 3e-3}
FLAGS = tuple(f"--config.{k}={v}" for k, v in OVERRIDES.items())  # the same, for d1jax.main
# d1jax.main's flags for the :tiny GRPO config on this task (test_faults, test_multihost and
# conftest's session-wide ``learnable_reference`` run).
MAIN_FLAGS = ("--config=configs/grpo_sudoku.py:tiny", *FLAGS)

# `python -c MAIN <d1jax.main flags>` from the repository root: d1jax.main with the task.
MAIN = ("import runpy, sys; import tests.learnable; sys.argv[0] = 'd1jax.main'; "
        "runpy.run_module('d1jax.main', run_name='__main__')")


def config(objective: str = "diffu_grpo", **changes):
    """The :tiny GRPO config of ``objective`` on this task, with OVERRIDES and ``changes``
    (dotted field names); no Hugging Face export unless asked for."""
    from d1jax import config as config_lib
    c = config_lib.grpo(NAME, "tiny", objective=objective)
    for key, value in {**OVERRIDES, "train.export_hf": False, **changes}.items():
        *groups, name = key.split(".")
        node = c
        for g in groups:
            node = node[g]
        setattr(node, name, value)
    return c


# Least rise of the reward (``rise`` below) a run of OVERRIDES must show, whatever the objective
# and seed; docs/testing.md has the measurements behind it.
MIN_RISE = 0.01


def rise(rewards: list[float], k: int = 5) -> float:
    """Mean reward of the last ``k`` rollouts minus the first rollout's (the untrained model's;
    most of the rise comes within a few rollouts). One reward per rollout: metrics rows[::mu]."""
    return sum(rewards[-k:]) / k - rewards[0]


def target_share(completion: str, example: Example) -> float:
    """The share of ``completion``'s characters, whitespace aside, in TARGET (0 if none)."""
    chars = [c for c in completion if not c.isspace()]
    return sum(c in TARGET for c in chars) / len(chars) if chars else 0.0


def build_messages(example: Example) -> list[dict]:
    return user_turn(f"{SYSTEM_PROMPT} {example['word']}")


def load_train(source: str | None = None, n: int = 256, seed: int = 0) -> list[Example]:
    """``n`` prompts, each a short random lowercase word (so prompts differ)."""
    if source:
        raise ValueError(f"the {NAME} task generates its prompts: source={source!r} is unused")
    rng = random.Random(seed)
    return [{"word": "".join(rng.choice(LETTERS) for _ in range(4))} for _ in range(n)]


def verdict(record: dict) -> Verdict:
    credit = target_share(record["generation"], {})
    return Verdict(extracted=credit, correct=credit == 1.0, hits=credit, total=1)


def make_task() -> Task:
    return Task(name=NAME, system_prompt=SYSTEM_PROMPT, reward_funcs=(batched(target_share),),
                reward_weights=(1.0,), build_messages=build_messages,
                eval_system_prompt=SYSTEM_PROMPT, build_eval_messages=build_messages,
                record=lambda ex, gen: {**ex, "generation": gen}, verdict=verdict,
                load_train=load_train, load_test=lambda source=None: load_train(source, 16, 1),
                ground_truth=lambda ex: "abcde")


tasks.register_task(NAME, make_task)
