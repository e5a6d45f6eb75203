"""Generated Sudoku text for the CPU demo's stand-in base model.

The demo's "pretraining corpus" is conversations in the chat format: a puzzle question
and an answer whose grid is right only in part (each empty cell is replaced by a wrong
digit with probability ``noise``), written in d1's ``<answer>`` format or, with
probability ``format_noise``, as four space-separated rows with no tags (``rows_answer``), which neither
d1's reward nor its evaluation parser can read (text of mixed quality and format, as a
web corpus would hold). Trained on it with the masked-diffusion objective (on the answers,
``sft.objective="sft"``, as the demo does, or on whole documents, ``"pretrain"``), this gives
a base model that knows the format and little Sudoku, and leaves room for SFT on clean
trajectories (d1's stage 1) and diffu-GRPO (stage 2) to improve it.
"""

from __future__ import annotations

import random
from typing import Sequence

from d1jax.train.sft_data import solution_trajectory


def noisy_grid(puzzle: str, solution: str, noise: float, rng: random.Random) -> str:
    """``solution`` with each of the puzzle's empty cells wrong with probability ``noise``."""
    out = []
    for p, s in zip(puzzle, solution):
        if p == "0" and rng.random() < noise:
            out.append(rng.choice([d for d in "1234" if d != s]))
        else:
            out.append(s)
    return "".join(out)


def rows_answer(grid: str) -> str:
    """The grid as four space-separated rows, untagged (no 16-digit run to parse); as many
    tokens as the tagged answer with the demo's tokenizer, so the answer's length does not
    give its format away."""
    return "Solution:\n\n" + " ".join(grid[i:i + 4] for i in range(0, 16, 4)) + "\n"


def pretraining_documents(task, examples: Sequence[dict], noise: float, seed: int,
                          format_noise: float = 0.0) -> list[dict]:
    """One conversation per puzzle, its answer grid corrupted at rate ``noise`` and
    written untagged with probability ``format_noise``."""
    for name, v in (("answer_noise", noise), ("format_noise", format_noise)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name}={v}: must be in [0, 1]")
    rng = random.Random(seed)
    docs = []
    for ex in examples:
        grid = noisy_grid(ex["puzzle"], ex["solution"], noise, rng)
        if rng.random() < format_noise:
            completion = rows_answer(grid)
        else:
            completion = solution_trajectory(task.name, ex, grid=grid, reasoning=task.reasoning)
        docs.append({"prompt": task.build_messages(ex), "completion": completion})
    return docs
