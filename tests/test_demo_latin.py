"""The `:d1like` demo's SFT corpus (examples/demo/latin.py): Latin-square puzzles in the
demo's answer format that are never Sudoku, and the data stage that tokenizes both
questions alike (examples/demo/data.py)."""

import itertools
import sys
from pathlib import Path

import pytest

from d1jax.config import ConfigError
from d1jax.model.tokenizer import load_tokenizer
from d1jax.tasks import format_prompt, get_task

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples/ sits beside the package, not in it
from examples.demo import config as demo_config  # noqa: E402
from examples.demo import data as demo_data  # noqa: E402
from examples.demo import latin  # noqa: E402
from examples.demo import task as demo_task  # noqa: E402
from tests.sudoku_units import BOXES, COLS, ROWS, units_ok  # noqa: E402


def _completions(puzzle: str, units) -> int:
    """Brute force, independent of latin.py: fill the empty cells every way, count grids
    whose units each hold 1-4 once."""
    holes = [i for i, d in enumerate(puzzle) if d == "0"]
    n = 0
    for digits in itertools.product("1234", repeat=len(holes)):
        g = list(puzzle)
        for i, d in zip(holes, digits):
            g[i] = d
        n += units_ok("".join(g), units)
    return n


def test_latin_squares_are_all_576_and_half_are_sudoku():
    squares = ["".join(map(str, g)) for g in latin.latin_squares()]
    assert len(squares) == len(set(squares)) == 576  # the number of 4x4 Latin squares
    assert all(units_ok(g, ROWS + COLS) for g in squares)
    sudoku_ones = [g for g in squares if units_ok(g, BOXES)]
    assert len(sudoku_ones) == 288  # the number of 4x4 Sudoku grids
    assert [latin.is_sudoku(g) for g in squares] == [units_ok(g, BOXES) for g in squares]


def test_corpus_puzzles_have_one_latin_completion_that_breaks_the_box_rule():
    rows = latin.generate_puzzles(24, seed=3, num_empty=(6, 7))
    assert len({r["puzzle"] for r in rows}) == 24
    for r in rows:
        p, s = r["puzzle"], r["solution"]
        assert 6 <= p.count("0") <= 7
        assert all(a in ("0", b) for a, b in zip(p, s))
        assert units_ok(s, ROWS + COLS) and not units_ok(s, BOXES)
        assert _completions(p, ROWS + COLS) == 1 == latin.count_latin_completions(p)
        # No Sudoku completion at all: the puzzle is not one of the RL task's.
        assert _completions(p, ROWS + COLS + BOXES) == 0
    assert latin.generate_puzzles(24, seed=3, num_empty=(6, 7)) == rows  # deterministic
    docs = latin.documents(rows[:2])
    assert docs[0]["completion"] == demo_task.answer(rows[0]["solution"])
    assert docs[0]["prompt"] == [{"role": "user", "content":
                                  f"Solve the following Latin square: {rows[0]['puzzle']}\n"}]


def _small(arg: str):
    c = demo_config.get_config(arg)
    c.unlock()
    c.demo.data.num_train, c.demo.data.num_heldout = 300, 64
    return c.demo


def test_d1like_data_stage_tokenizes_both_questions_to_one_length(tmp_path):
    demo = _small("d1like")
    assert demo.sft.corpus == "latin" and demo_config.get_config(None).demo.sft.corpus == "sudoku"
    data = demo_data.prepare_data(demo, tmp_path / "d1like")
    tok = load_tokenizer(data["tokenizer"])
    task = get_task(demo_task.NAME)
    rows = latin.generate_puzzles(8, seed=0, num_empty=(6, 10))
    lengths = {len(tok(format_prompt(tok, latin.build_messages(r)), add_special_tokens=False)
                   ["input_ids"]) for r in rows}
    ex = {"puzzle": "1200340000120031", "solution": "1243342121124331"}
    assert lengths == {data["prompt_length"]} == {
        len(tok(task.eval_prompt(tok, ex), add_special_tokens=False)["input_ids"])}
    corpus = demo_data.sft_corpus(demo, data)
    assert len(corpus.rows) == 300
    assert all(r["prompt"][0]["content"].startswith("Solve the following Latin square")
               for r in corpus.rows)
    # A workdir whose tokenizer was trained without the Latin text: said, not trained on.
    demo_data.prepare_data(_small(None), tmp_path / "default")
    with pytest.raises(ConfigError, match="new --workdir"):
        demo_data.prepare_data(demo, tmp_path / "default")


def test_latin_corpus_refuses_a_partial_writer():
    demo = demo_config.get_config("d1like").demo
    demo.sft.solved_depth = 1
    with pytest.raises(ConfigError, match="solved_depth"):
        demo_config.check(demo)
