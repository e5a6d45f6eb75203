"""4x4 Sudoku: d1's prompt, its partial-credit reward, its evaluation parser, and a seeded
generator of puzzles with exactly one solution.

Reward (diffu-grpo/reward_func.py ``sudoku_reward_func``), weight 1, range [0, 1]: the
digits of the last ``<answer>`` are padded with '0' or cut to 16 and the fraction of the
puzzle's empty cells they fill correctly is the reward (0 with no ``<answer>``).

Evaluation (eval/parse_and_get_acc.py): the answer is found by five patterns in turn
(code block in the answer, answer content, text after ``</answer>``, a 16-digit run
before ``</answer>``, any 16-digit word), whitespace removed, padded or cut to 16;
accuracy is correct cells / empty cells, pooled over puzzles. ``Verdict.correct`` is the
stricter "every empty cell right".

Data: d1's test set is ``dataset/4x4_test_sudoku.csv`` of its repository (500 puzzles, 8
empty cells each; its evaluation uses a seeded 256 of them). Training puzzles come from
``generate_puzzles`` (deduplicated against the whole test set) unless a source is given.
"""

from __future__ import annotations

import functools
import os
import random
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from d1jax.tasks import rewards
from d1jax.tasks import sources
from d1jax.tasks.base import Example, Task, Verdict, batched, user_turn

TEST_FILE, D1_TRAIN_FILE = "4x4_test_sudoku.csv", "4x4_sudoku_unique_puzzles.csv"
EVAL_SUBSAMPLE = 256  # d1's eval.py num_evals["sudoku"]

# diffu-grpo/data_utils.py and eval/sudoku.py SUDOKU_SYSTEM_PROMPT (identical in both).
SYSTEM_PROMPT = """
Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading left-to-right, top-to-bottom, where '0' represents empty cells.

Rules:
- Fill empty cells with digits 1-4
- Each row must contain digits 1-4 exactly once
- Each column must contain digits 1-4 exactly once
- Each 2x2 box must contain digits 1-4 exactly once

Important: Your solution must be a COMPLETE 16-character string with only the digits 1-4, representing your final solved grid.

Respond in this exact format:
<reasoning>
Your step-by-step solving process
</reasoning>
<answer>
[16-character solution string with no spaces or separators]
</answer>
"""

# ---------------------------------------------------------------------------- SPG's setup
# SPG's Sudoku (facebookresearch/SPG a1c7120, dataset "sudoku_new"): its own split of the
# puzzles (dataset/train_sudoku_split_new.csv, dataset/test_sudoku_split_new.csv) and a few-shot
# prompt (spg/data_utils.py:125-149 get_sudoku_questions_new, with d1's system prompt); its
# runs use all three worked examples (spg_mix/sudoku_new_*.sbatch FEW_SHOT=3), given here as
# in spg/data_utils.py:60-62.
SPG_RAW_URL = "https://raw.githubusercontent.com/facebookresearch/SPG/main/dataset/"
SPG_TRAIN_FILE, SPG_TEST_FILE = "train_sudoku_split_new.csv", "test_sudoku_split_new.csv"
SPG_SHOTS = (
    'Question:\nSolve the following Sudoku puzzle: 3014002020004130\nAnswer:\n<reasoning>\nInterpret puzzle as 4 rows of 4:\nR1: 3 0 1 4\nR2: 0 0 2 0\nR3: 2 0 0 0\nR4: 4 1 3 0\n\nFill easy singles:\nR1 missing 2 → R1C2=2.\nR4 missing 2 → R4C4=2.\nBox D (R3-4,C3-4) then needs {1,4}; column4 can only accept 1 → R3C4=1, R3C3=4.\nR3 now missing 3 → R3C2=3.\nColumn1 missing 1 → R2C1=1.\nColumn2 missing 4 → R2C2=4.\nLast cell R2C4=3.\n\nFinal grid:\nR1: 3 2 1 4\nR2: 1 4 2 3\nR3: 2 3 4 1\nR4: 4 1 3 2\n</reasoning>\n<answer>\n3214142323414132\n</answer>',
    'Question:\nSolve the following Sudoku puzzle: 0000100420013142\nAnswer:\n<reasoning>\nInterpret puzzle as 4 rows of 4:\nR1: 0 0 0 0\nR2: 1 0 0 4\nR3: 2 0 0 1\nR4: 3 1 4 2\n\nFill easy singles:\nCol1 missing 4 → R1C1=4.\nCol4 missing 3 → R1C4=3.\nBox A (R1-2,C1-2) missing {2,3} and R1 now needs {1,2} → R1C2=2, R2C2=3.\nR1C3=1.\nR2 now missing 2 → R2C3=2.\nCol2 missing 4 → R3C2=4, then R3C3=3.\n\nFinal grid:\nR1: 4 2 1 3\nR2: 1 3 2 4\nR3: 2 4 3 1\nR4: 3 1 4 2\n</reasoning>\n<answer>\n4213132424313142\n</answer>',
    "Question:\nSolve the following Sudoku puzzle: 2001403002001420\nAnswer:\n<reasoning>\nInterpret puzzle as 4 rows of 4:\nR1: 2 0 0 1\nR2: 4 0 3 0\nR3: 0 2 0 0\nR4: 1 4 2 0\n\nFill easy singles:\nR1 missing {3,4}; Col2 can't be 1 so R1C2=3 → R1C3=4.\nR4 missing 3 → R4C4=3.\nCol4 missing {2,4}; R2 must take 2 → R2C4=2 → R2C2=1.\nCol1 missing 3 → R3C1=3.\nCol3 missing 1 → R3C3=1 → R3C4=4.\n\nFinal grid:\nR1: 2 3 4 1\nR2: 4 1 3 2\nR3: 3 2 1 4\nR4: 1 4 2 3\n</reasoning>\n<answer>\n2341413232141423\n</answer>",
)


def spg_file(name: str) -> Path:
    """A data file of SPG's repository: ``$D1JAX_DATA_DIR/NAME`` if there, else the cached
    download of the public copy."""
    local = os.environ.get("D1JAX_DATA_DIR")
    if local and (Path(local) / name).is_file():
        return Path(local) / name
    return sources.download(SPG_RAW_URL + name)


def spg_messages(example: Example) -> list[dict]:
    """SPG's prompt: the system prompt, the first ``few_shot`` worked examples, then the
    puzzle as a "Question: ... Answer:" turn (one user message, as d1)."""
    shots = "\n\n".join(SPG_SHOTS[:example["few_shot"]])
    return user_turn(f"{SYSTEM_PROMPT}\n\n{shots}\n\nQuestion: Solve the following Sudoku "
                     f"puzzle: {example['puzzle']}\nAnswer:\n")


# ---------------------------------------------------------------------------- scoring


def cell_accuracy(answer: str, solution: str, puzzle: str) -> tuple[int, int]:
    """(correct cells, empty cells): ``answer`` padded with '0' / cut to 16 characters,
    compared with ``solution`` on the cells that are '0' in ``puzzle``."""
    answer = answer[:16].ljust(16, "0")
    empty = [i for i in range(16) if puzzle[i] == "0"]
    if len(solution) < 16:
        raise ValueError(f"sudoku solution {solution!r} is not 16 characters long")
    return sum(answer[i] == solution[i] for i in empty), len(empty)


def sudoku_reward_func(completion: str, example: Example) -> float:
    """Fraction of empty cells the last ``<answer>``'s digits get right, in [0, 1]."""
    answer = rewards.last_answer(completion)
    if answer is None:
        return 0.0
    digits = "".join(c for c in answer.strip() if c.isdigit())  # d1: str.isdigit
    if not digits:
        return 0.0
    right, empty = cell_accuracy(digits, example["solution"], example["puzzle"])
    return right / empty if empty else 0.0


REWARD_FUNCS = (batched(sudoku_reward_func),)

_TERMINATORS = ("<|eot_id|>", "<|endoftext|>")
_DIGITS_SPACES = re.compile(r"[\d\s]*")
_SIXTEEN_BEFORE_CLOSE = re.compile(r"(\d{16})\s*</answer>")
_SIXTEEN_WORD = re.compile(r"\b(\d{16})\b")
_PUZZLE_IN_QUESTION = re.compile(r"Sudoku puzzle: ([0-9]{16})")


def _first(text: str, needles: Iterable[str], start: int) -> int:
    found = [i for i in (text.find(n, start) for n in needles) if i >= 0]
    return min(found) if found else -1


def _code_block_in_answer(text: str) -> str | None:
    """``<answer>.*?```\\s*([\\d\\s]+)```  `` (DOTALL), in linear time."""
    a = text.find("<answer>")
    if a < 0:
        return None
    pos = a + len("<answer>")
    while (p := text.find("```", pos)) >= 0:
        run_end = _DIGITS_SPACES.match(text, p + 3).end()
        if run_end > p + 3 and text.startswith("```", run_end):
            return text[p + 3:run_end]
        pos = p + 1
    return None


def _answer_to_terminator(text: str) -> str | None:
    """``<answer>(.*?)(?:<|eot_id|>|<|endoftext|>|</answer>)`` (DOTALL)."""
    a = text.find("<answer>")
    if a < 0:
        return None
    end = _first(text, _TERMINATORS + ("</answer>",), a + len("<answer>"))
    return None if end < 0 else text[a + len("<answer>"):end]


def _after_answer(text: str) -> str | None:
    """``</answer>\\s*(.*?)(?:<|eot_id|>|<|endoftext|>|$)`` (DOTALL)."""
    c = text.find("</answer>")
    if c < 0:
        return None
    k = c + len("</answer>")
    while k < len(text) and text[k].isspace():
        k += 1
    end = len(text) - 1 if text.endswith("\n") and k < len(text) else len(text)
    term = _first(text, _TERMINATORS, k)
    return text[k:end if term < 0 else min(term, end)]


def parse_answer(text: str) -> str:
    """d1's ``parse_sudoku_answers`` extraction: the first pattern with a non-blank
    capture, whitespace removed ('' if none)."""
    finders = (_code_block_in_answer, _answer_to_terminator, _after_answer,
               lambda t: (m := _SIXTEEN_BEFORE_CLOSE.search(t)) and m.group(1),
               lambda t: (m := _SIXTEEN_WORD.search(t)) and m.group(1))
    for find in finders:
        found = find(text)
        if found and found.strip():
            return re.sub(r"\s", "", found.strip())
    return ""


def puzzle_from_question(question: str) -> str:
    """The puzzle d1's parser reads from an eval question."""
    if len(question) >= 16 and all(c.isdigit() for c in question[:16]):
        return question[:16]
    m = _PUZZLE_IN_QUESTION.search(question)
    if not m:
        raise ValueError(f"no 16-digit sudoku puzzle in question {question[:80]!r}")
    return m.group(1)


def verdict(record: dict) -> Verdict:
    """Cells right out of empty cells, as d1 pools them; ``correct``: all of them."""
    puzzle = puzzle_from_question(record.get("question", ""))
    answer = parse_answer(record.get("generations", ""))
    truth = str(record.get("ground_truth", ""))
    if answer:
        answer = answer[:16].ljust(16, "0")  # what d1 reports as the extracted answer
        right, empty = cell_accuracy(answer, truth, puzzle)
    else:
        right, empty = 0, puzzle.count("0")
    return Verdict(extracted=answer, correct=empty > 0 and right == empty, hits=right,
                   total=empty)


# ---------------------------------------------------------------------------- generator


@functools.cache
def solution_grids() -> tuple[str, ...]:
    """All 288 solved 4x4 grids, as 16-character strings in lexicographic order."""
    grids, cells = [], [0] * 16

    def fits(i: int, d: int) -> bool:
        r, c = divmod(i, 4)
        box = [(r // 2 * 2 + dr) * 4 + c // 2 * 2 + dc for dr in (0, 1) for dc in (0, 1)]
        peers = [r * 4 + k for k in range(4)] + [k * 4 + c for k in range(4)] + box
        return all(cells[j] != d for j in peers if j < i)

    def fill(i: int) -> None:
        if i == 16:
            grids.append("".join(map(str, cells)))
            return
        for d in range(1, 5):
            if fits(i, d):
                cells[i] = d
                fill(i + 1)
        cells[i] = 0

    fill(0)
    return tuple(grids)


@functools.cache
def _grid_array() -> np.ndarray:
    return np.array([[int(c) for c in g] for g in solution_grids()], np.int8)


def count_solutions(puzzle: str) -> int:
    """How many solved grids agree with the puzzle's given digits."""
    p = np.array([int(c) for c in puzzle], np.int8)
    given = p != 0
    return int((_grid_array()[:, given] == p[given]).all(axis=1).sum())


def blank_cells(grids: Sequence[str], n: int, seed: int, num_empty: tuple[int, int],
                completions: Callable[[str], int], exclude: Iterable[str] = ()) -> list[Example]:
    """Up to ``n`` distinct puzzles (fewer when 200 n + 1,000 draws do not find them): a
    uniformly drawn grid of ``grids`` with a uniform number of cells in ``num_empty``
    (inclusive) blanked at random, kept if ``completions(puzzle)`` is 1 and it is not in
    ``exclude``. Deterministic in ``seed``; rows ``{"puzzle", "solution"}``."""
    low, high = num_empty
    rng, seen = random.Random(seed), set(exclude)
    out: list[Example] = []
    for _ in range(200 * n + 1000):
        if len(out) == n:
            break
        grid = grids[rng.randrange(len(grids))]
        holes = set(rng.sample(range(16), rng.randint(low, high)))
        puzzle = "".join("0" if i in holes else d for i, d in enumerate(grid))
        if puzzle not in seen and completions(puzzle) == 1:
            seen.add(puzzle)
            out.append({"puzzle": puzzle, "solution": grid})
    return out


def generate_puzzles(n: int, seed: int = 0, exclude: Iterable[str] = (),
                     num_empty: int | tuple[int, int] = 8) -> list[Example]:
    """``n`` distinct puzzles with exactly one solution, none in ``exclude``.

    Deterministic in ``seed``: a uniformly drawn solved grid with ``num_empty`` cells (an
    int, or an inclusive (low, high) range) blanked at random, kept if its solution is
    unique. Rows are ``{"puzzle", "solution"}``.
    """
    low, high = (num_empty, num_empty) if isinstance(num_empty, int) else num_empty
    if not 0 <= low <= high <= 16:
        raise ValueError(f"num_empty={num_empty!r}: must be in 0..16")
    out = blank_cells(solution_grids(), n, seed, (low, high), count_solutions, exclude)
    if len(out) < n:
        raise RuntimeError(f"made only {len(out)} of {n} distinct unique-solution puzzles "
                           f"with num_empty={num_empty!r}; ask for fewer or more empty cells")
    return out


# ---------------------------------------------------------------------------- data


_UNITS = tuple([("row", k + 1, [4 * k + j for j in range(4)]) for k in range(4)]
               + [("column", k + 1, [4 * j + k for j in range(4)]) for k in range(4)]
               + [("box", k + 1, [(k // 2 * 2 + dr) * 4 + k % 2 * 2 + dc
                                  for dr in (0, 1) for dc in (0, 1)]) for k in range(4)])


def _cell(row: dict, name: str) -> str:
    """The row's ``Name`` (d1's CSV header) or ``name`` value, as a string."""
    key = name.capitalize() if name.capitalize() in row else name
    if key not in row:
        raise ValueError(f"no {name.capitalize()!r} (or {name!r}) column; the row has "
                         f"{sorted(map(str, row))}")
    value = row[key]
    if value is None or value == "":
        raise ValueError(f"no value in column {key!r}")
    # A CSV read with type inference turns "0140..." into an int: restore the zeros.
    return str(value).zfill(16) if isinstance(value, int) else str(value)


def _grid_fault(grid: str, digits: str) -> str | None:
    """What keeps ``grid`` from being 16 characters of ``digits`` (None: nothing)."""
    span = f"{digits[0]}-{digits[-1]}"
    if len(grid) != 16:
        return f"has {len(grid)} cells, expected 16 digits {span}"
    bad = next((i for i, c in enumerate(grid) if c not in digits), None)
    return None if bad is None else f"has {grid[bad]!r} at cell {bad + 1}, expected digits {span}"


def check_puzzle(puzzle: str, solution: str) -> None:
    """ValueError unless ``puzzle`` is 16 digits 0-4 (0 blank) and ``solution`` a solved
    grid (rows, columns and 2x2 boxes each hold 1-4 once) that keeps the puzzle's givens."""
    for name, grid, digits in (("puzzle", puzzle, "01234"), ("solution", solution, "1234")):
        if fault := _grid_fault(grid, digits):
            raise ValueError(f"{name} {grid!r} {fault}")
    for kind, k, cells in _UNITS:
        if sorted(solution[i] for i in cells) != list("1234"):
            seen = "".join(solution[i] for i in cells)
            raise ValueError(f"solution {solution!r} is not a solved grid: {kind} {k} reads "
                             f"{seen!r}, expected each of 1-4 once")
    clash = next((i for i in range(16) if puzzle[i] not in ("0", solution[i])), None)
    if clash is not None:
        r, c = divmod(clash, 4)
        raise ValueError(f"solution {solution!r} has {solution[clash]} at row {r + 1} column "
                         f"{c + 1} where puzzle {puzzle!r} gives {puzzle[clash]}")


def _normalize(row: dict) -> Example:
    puzzle, solution = _cell(row, "puzzle"), _cell(row, "solution")
    check_puzzle(puzzle, solution)
    return {"puzzle": puzzle, "solution": solution}


def _examples(rows: list) -> list[Example]:
    return sources.check_rows("sudoku", rows, _normalize)


def load_test(source=None, subsample: int | None = EVAL_SUBSAMPLE,
              cache_dir: str | None = None) -> list[Example]:
    """d1's test puzzles (its CSV unless ``source``; "spg": SPG's 256 test puzzles, with its
    3-shot prompt); ``subsample`` picks d1's seeded evaluation subset (256, in d1's order;
    None: all 500)."""
    if source == "spg":
        rows = sources.read_file(spg_file(SPG_TEST_FILE))
        return [{**ex, "few_shot": len(SPG_SHOTS)} for ex in _examples(rows)]
    src = sources.d1_file(TEST_FILE) if source is None else source
    rows = sources.load_rows(src, split="test", cache_dir=cache_dir)
    return sources.d1_eval_subset(_examples(rows), subsample)


def load_train(source=None, split: str = "train", n: int = 10_000, seed: int = 0,
               num_empty: int | tuple[int, int] = 8, test_source=None,
               exclude_test: bool = True, cache_dir: str | None = None) -> list[Example]:
    """Training puzzles.

    ``source=None``: ``generate_puzzles(n, seed, num_empty=...)``, none of them in the test
    set (read from ``test_source``, default d1's; ``exclude_test=False`` skips this).
    ``source="d1"``: d1's own training CSV, minus the 500 rows d1 holds out. ``"spg"``:
    SPG's training split, minus the 500 rows it holds out the same way
    (spg/diffu_grpo_train.py:69-73), each prompted with SPG's 3 worked examples
    (``spg_messages``). Otherwise a file or directory with Puzzle/Solution columns.
    """
    if source is None:
        exclude = ([r["puzzle"] for r in load_test(test_source, subsample=None,
                                                  cache_dir=cache_dir)]
                   if exclude_test else [])
        return generate_puzzles(n, seed, exclude=exclude, num_empty=num_empty)
    if source == "d1":
        rows = sources.read_file(sources.d1_file(D1_TRAIN_FILE))
        return sources.d1_train_holdout(_examples(rows))
    if source == "spg":
        rows = sources.read_file(spg_file(SPG_TRAIN_FILE))
        return [{**ex, "few_shot": len(SPG_SHOTS)}
                for ex in sources.d1_train_holdout(_examples(rows))]
    return _examples(sources.load_rows(source, split=split, cache_dir=cache_dir))


def question(example: Example) -> str:
    return f"Solve the following Sudoku puzzle: {example['puzzle']}\n"


def build_messages(example: Example) -> list[dict]:
    """d1's prompt, or SPG's few-shot one for an example that names ``few_shot``."""
    if example.get("few_shot"):
        return spg_messages(example)
    return user_turn(f"{SYSTEM_PROMPT}\n\n{question(example)}")


def record(example: Example, generation: str) -> dict[str, Any]:
    return {"question": question(example), "generations": generation,
            "ground_truth": example["solution"]}


def ground_truth(example: Example) -> str:
    return example["solution"]


def solution_trajectory(example: Example) -> str:
    """The SFT target of a generated puzzle: its solution's rows as the reasoning, then the
    grid, in d1's reasoning/answer layout."""
    sol = example["solution"]
    rows = " ".join(sol[i:i + 4] for i in range(0, 16, 4))
    return f"<reasoning>\nRows: {rows}\n</reasoning>\n<answer>\n{sol}\n</answer>"


def make_task() -> Task:
    """d1's Sudoku task."""
    return Task(name="sudoku", system_prompt=SYSTEM_PROMPT, reward_funcs=REWARD_FUNCS,
                reward_weights=(1.0,), build_messages=build_messages,
                eval_system_prompt=SYSTEM_PROMPT, build_eval_messages=build_messages,
                record=record, verdict=verdict, load_train=load_train, load_test=load_test,
                ground_truth=ground_truth)
