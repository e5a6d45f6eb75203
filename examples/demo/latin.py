"""The `:d1like` toy's SFT corpus: 4x4 Latin squares, a puzzle family beside Sudoku.

d1 fine-tunes on s1K, reasoning traces that are not its RL tasks, in the answer format its
parsers read. The toy's stand-in: Latin-square puzzles (each row and column holds 1-4 once;
no box rule), asked as "Solve the following Latin square: ..." and answered in the demo's
``<answer>`` format (``task.answer``). Every grid of the corpus breaks the box rule, so no
document is a Sudoku solution, and its puzzles have exactly one Latin completion, so none
is a Sudoku puzzle either (a Sudoku completion would be a second Latin one): the RL task's
prompts and solutions never appear in SFT. What transfers is the format and the row and
column reasoning; the box rule is left to the reward.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from d1jax.tasks import sudoku


def question(example: dict) -> str:
    """The Sudoku question's template with the family's name (same token count with the
    ``:d1like`` tokenizer, which is trained on both: ``data.prepare_data``)."""
    return f"Solve the following Latin square: {example['puzzle']}\n"


def build_messages(example: dict) -> list[dict]:
    return [{"role": "user", "content": question(example)}]


def is_sudoku(grid: str) -> bool:
    """Whether a full grid keeps every row, column and 2x2 box free of repeats."""
    return sudoku.count_solutions(grid) == 1


@functools.lru_cache(maxsize=1)
def latin_squares() -> np.ndarray:
    """All 576 4x4 Latin squares, [576, 16] int8, in lexicographic order."""
    rows = list(itertools.permutations(range(1, 5)))
    out = []
    for a, b, c in itertools.product(rows, repeat=3):
        cols = list(zip(a, b, c))
        if all(len(set(col)) == 3 for col in cols):
            out.append(a + b + c + tuple(10 - sum(col) for col in cols))
    return np.asarray(out, np.int8)


def count_latin_completions(puzzle: str) -> int:
    """How many Latin squares agree with the puzzle's given digits."""
    p = np.array([int(ch) for ch in puzzle], np.int8)
    given = p != 0
    return int((latin_squares()[:, given] == p[given]).all(axis=1).sum())


def generate_puzzles(n: int, seed: int, num_empty: tuple[int, int]) -> list[dict]:
    """``n`` distinct Latin-square puzzles with one completion, which breaks the box rule.

    Deterministic in ``seed``: a uniformly drawn non-Sudoku Latin square with a uniform
    number of cells in ``num_empty`` (inclusive) blanked at random, kept if its completion is
    unique. Rows are ``{"puzzle", "solution"}``, as the Sudoku pool's.
    """
    low, high = num_empty
    squares = ["".join(map(str, g)) for g in latin_squares()]
    squares = [g for g in squares if not is_sudoku(g)]
    out = sudoku.blank_cells(squares, n, seed, (low, high), count_latin_completions)
    if len(out) == n:
        return out
    raise RuntimeError(f"made only {len(out)} of {n} Latin-square puzzles with "
                       f"num_empty={num_empty!r}: ask for fewer empty cells")


def documents(examples: list[dict]) -> list[dict]:
    """SFT conversations: the Latin question and its solution in the demo's answer format."""
    from examples.demo import task as demo_task
    return [{"prompt": build_messages(ex), "completion": demo_task.answer(ex["solution"])}
            for ex in examples]
