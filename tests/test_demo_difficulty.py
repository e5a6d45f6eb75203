"""examples/demo/difficulty.py: the share of a 4x4 Sudoku that row and column singles decide,
against hand-counted puzzles, an independent enumeration of the 288 grids and an independent
row-and-column solver written here."""

import collections
import itertools

import numpy as np
import pytest

from examples.demo import data, difficulty

# Solution grid 1234 / 3412 / 2143 / 4321.
# FULL: cells 0, 1, 4 empty. Cell 0: row 0 leaves {1, 2}, column 0 (-, -, 2, 4) leaves {1, 3}
# -> 1. Cell 1: row 0 leaves {1, 2}, column 1 (4, 1, 3) -> 2. Cell 4: row 1 (4, 1, 2) -> 3.
# Row and column singles fill 3 of 3 in one pass.
FULL = "0034" "0412" "2143" "4321"
# STALL: cells 0, 3, 5, 12, 15 empty. Cell 5: row 1 (3, 1, 2) -> 4, a row single. Cells 0, 3,
# 12, 15: each row and column leaves {1, 4} (rows 0 and 3 hold 2, 3; columns 0 and 3 hold
# 3, 2): rows and columns stall with 1 of 5 filled. Boxes decide: box 0 holds 2, 3, 4 -> cell
# 0 is 1, and so on. Its Latin completions: the solution and the one with the intercalate
# 1 4 / 4 1 in cells 0, 3, 12, 15 swapped (4231 ... 1324, box 0 then holds two 4s).
STALL = "0230" "3012" "2143" "0320"


def sudoku_grids() -> list[str]:
    """The 288 grids, enumerated row by row here (independent of d1jax's generator)."""
    perms = list(itertools.permutations("1234"))
    out = []
    for rows in itertools.product(perms, repeat=4):
        if any(len({r[c] for r in rows}) < 4 for c in range(4)):
            continue
        boxes = [{rows[2 * b + i][2 * s + j] for i in (0, 1) for j in (0, 1)}
                 for b in (0, 1) for s in (0, 1)]
        if all(len(x) == 4 for x in boxes):
            out.append("".join("".join(r) for r in rows))
    return out


GRIDS = sudoku_grids()


def completions(puzzle: str) -> list[str]:
    return [g for g in GRIDS if all(p in ("0", d) for p, d in zip(puzzle, g))]


def rc_singles(puzzle: str) -> str:
    """Row-and-column naked singles, one cell at a time until none applies."""
    g = list(puzzle)
    changed = True
    while changed:
        changed = False
        for i in range(16):
            if g[i] != "0":
                continue
            seen = {g[4 * (i // 4) + k] for k in range(4)} | {g[4 * k + i % 4] for k in range(4)}
            left = set("1234") - seen
            if len(left) == 1:
                g[i], changed = left.pop(), True
    return "".join(g)


def test_independent_enumeration_has_288_grids():
    assert len(GRIDS) == len(set(GRIDS)) == 288


def test_hand_counted_shares():
    assert completions(FULL) == completions(STALL) == ["1234341221434321"]
    m = difficulty.row_column_share([FULL, STALL])
    assert m["puzzles"] == 2 and m["empty_cells"] == 8
    assert m["row_column_share"] == pytest.approx(4 / 8)  # 3 of FULL's, 1 of STALL's
    assert m["with_box_share"] == 1.0
    assert m["row_column_stall"] == 0.5 and m["latin_ambiguous"] == 0.5
    rc = difficulty.singles([FULL, STALL], box=False)
    assert "".join(map(str, rc[0])) == "1234341221434321"
    assert "".join(map(str, rc[1])) == "0230341221430320"
    assert (difficulty.singles([FULL, STALL], box=True) > 0).all()


@pytest.mark.parametrize("k,box_needed", [(8, False), (8, True), (11, False), (12, True)])
def test_generated_puzzles_unique_and_box_needed(k, box_needed):
    rows = difficulty.generate(25, k, seed=3, box_needed=box_needed)
    assert len(rows) == 25 and len({r["puzzle"] for r in rows}) == 25
    for r in rows:
        assert r["puzzle"].count("0") == k
        assert completions(r["puzzle"]) == [r["solution"]]
        assert ("0" in rc_singles(r["puzzle"])) if box_needed else True
    assert rows == difficulty.generate(25, k, seed=3, box_needed=box_needed)  # seeded
    if box_needed:
        assert difficulty.row_column_share([r["puzzle"] for r in rows])["row_column_stall"] == 1


def test_batch_singles_match_data_solver_and_plain_loop():
    """Box rule: as data.solver_depths fills; rows and columns: as the loop above."""
    puzzles = [r["puzzle"] for r in difficulty.generate(60, 10, seed=5)]
    full = difficulty.singles(puzzles, box=True)
    rc = difficulty.singles(puzzles, box=False)
    for p, f, c in zip(puzzles, full, rc):
        assert len(data.solver_depths(p)) == p.count("0") and (f > 0).all()
        assert "".join(map(str, f)) == completions(p)[0]
        assert "".join(map(str, c)) == rc_singles(p)


def test_unique_puzzle_census_by_brute_force():
    """Every unique 12-empty (4-given) puzzle: grouped by givens over the 288 grids here."""
    groups = collections.Counter()
    for holes in map(set, itertools.combinations(range(16), 12)):
        for g in GRIDS:
            groups["".join("0" if i in holes else d for i, d in enumerate(g))] += 1
    expected = sorted(p for p, n in groups.items() if n == 1)
    got = difficulty.unique_puzzles(12)
    assert sorted("".join(map(str, row)) for row in got) == expected
    c = difficulty.census(12)
    assert c["unique"] == len(expected)
    assert c["box_needed"] == sum("0" in rc_singles(p) for p in expected)


def test_bad_input_one_line_error():
    with pytest.raises(ValueError, match="16 characters"):
        difficulty.row_column_share(["123"])
    with pytest.raises(ValueError, match="no empty cell"):
        difficulty.row_column_share(["1234341221434321"])
    with pytest.raises(ValueError, match="0..16"):
        difficulty.generate(1, 17)


def test_census_needs_a_unique_puzzle():
    with pytest.raises(ValueError, match="no unique-solution puzzle"):
        difficulty.census(13)  # 3 givens: no 4x4 puzzle with one solution
