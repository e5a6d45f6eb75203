"""A toy task a random tiny LLaDA learns within a few dozen GRPO steps: the install check.

``configs/grpo_letters.py`` runs diffu-GRPO on it, so a newcomer's first run shows its reward
rise on screen (d1's tasks need a trained model: on a random one their rewards stay at 0), and
the tests whose runs must learn use it (tests/learnable.py).

Prompts are "Write letters. <word>" with random 4-letter words over a..j (generated, nothing is
downloaded), so the tiny tokenizer trained on them is mostly pieces of such words and a random
model writes mostly those letters. Reward, in [0, 1]: the share of the completion's
characters, whitespace aside, that are one of a..e. A random model starts near 0.44 and its
completions differ, so GRPO has a signal from the first rollout; raising it needs no
reasoning, only a shift of the output distribution.
"""

from __future__ import annotations

import random

from d1jax.tasks.base import Example, Task, Verdict, batched, user_turn

NAME = "letters"
LETTERS = "abcdefghij"  # prompt words are made of these, so most tiny-tokenizer tokens are too
TARGET = frozenset("abcde")
SYSTEM_PROMPT = "Write letters."

# The :tiny GRPO config's changes for this task: short prompts, 4 groups of 8 completions a
# rollout, std-normalised advantages and a higher learning rate, so the reward rises within
# 30 steps (15 rollouts; docs/testing.md, "RL tests that learn", has the measurements).
TINY_OVERRIDES = {"task.name": NAME, "max_prompt_length": 24, "train.num_steps": 30,
                  "grpo.prompts_per_step": 4, "grpo.num_generations": 8,
                  "grpo.advantage": "grpo", "optim.learning_rate": 3e-3}


def target_share(completion: str, example: Example) -> float:
    """The share of ``completion``'s characters, whitespace aside, in TARGET (0 if none)."""
    del example
    chars = [c for c in completion if not c.isspace()]
    return sum(c in TARGET for c in chars) / len(chars) if chars else 0.0


def build_messages(example: Example) -> list[dict]:
    return user_turn(f"{SYSTEM_PROMPT} {example['word']}")


def load_train(source: str | None = None, n: int = 256, seed: int = 0) -> list[Example]:
    """``n`` prompts, each a short random word over LETTERS (so prompts differ)."""
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
