"""s1K (``simplescaling/s1K``): the reasoning traces of d1's SFT stage.

Each row becomes d1's SFT pair (SFT/sft_trainer.py ``preprocess_dataset``): a user turn
``SFT_SYSTEM_PROMPT + "\\n\\n" + question`` and the assistant trajectory
``<reasoning>{thinking_trajectories[0]}</reasoning>\\n<answer>{attempt}</answer>``.
d1 then shuffles with Python's ``random`` seeded 42 and keeps the first 1% for evaluation;
``split`` reproduces that ("train", "eval"; "all" keeps the dataset order).
"""

from __future__ import annotations

import random

from d1jax.tasks import sources
from d1jax.tasks.base import Example, user_turn

HUB_ID = "simplescaling/s1K"
SPLITS = ("train", "eval", "all")

# SFT/sft_trainer.py SYSTEM_PROMPT (differs from the GRPO one: "Your reasoning here").
SFT_SYSTEM_PROMPT = """
Respond in the following format:
<reasoning>
Your reasoning here
</reasoning>
<answer>
...
</answer>
"""


def trajectory(row: dict) -> str:
    """d1's SFT target text for one s1K row."""
    return (f"<reasoning>{row['thinking_trajectories'][0]}</reasoning>\n"
            f"<answer>{row['attempt']}</answer>")


def check_row(row: dict) -> None:
    """ValueError unless ``row`` has what ``to_sft_example`` reads: a question, a first
    thinking trajectory and an attempt, all strings."""
    missing = {"question", "thinking_trajectories", "attempt"} - row.keys()
    if missing:
        raise ValueError(f"s1K rows need question, thinking_trajectories and attempt; "
                         f"missing {sorted(missing)}")
    paths = row["thinking_trajectories"]
    if not (isinstance(paths, (list, tuple)) and paths and isinstance(paths[0], str)):
        raise ValueError(f"thinking_trajectories {sources.show(paths)} is not a non-empty "
                         f"list of strings")
    for key in ("question", "attempt"):
        if not isinstance(row[key], str) or not row[key].strip():
            raise ValueError(f"{key} {sources.show(row[key])} is not a non-empty string")


def to_sft_example(row: dict) -> Example:
    """``{"prompt": chat messages, "completion": trajectory, "question"}``."""
    check_row(row)
    return {"prompt": user_turn(SFT_SYSTEM_PROMPT + "\n\n" + row["question"]),
            "completion": trajectory(row), "question": row["question"]}


def load_train(source=None, split: str = "train", eval_fraction: float = 0.01,
               seed: int = 42, cache_dir: str | None = None) -> list[Example]:
    """d1's SFT examples from s1K (the Hub's ``train`` split, or a local copy).

    ``split``: "train" / "eval" are d1's shuffled 99% / 1% split (``random.Random(seed)``
    shuffle, first ``int(len * eval_fraction)`` for eval); "all" is every row in order.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: must be one of {SPLITS}")
    rows = sources.load_rows(source, split="train", default_hub=HUB_ID, cache_dir=cache_dir)
    examples = sources.check_rows("s1K", rows, to_sft_example)
    if split == "all":
        return examples
    random.Random(seed).shuffle(examples)
    n_eval = int(len(examples) * eval_fraction)
    return examples[:n_eval] if split == "eval" else examples[n_eval:]
