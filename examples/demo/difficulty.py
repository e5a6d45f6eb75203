"""How much of a 4x4 Sudoku the box rule decides (issue 60, item 1: a measurement).

The `:d1like` toy fine-tunes on Latin squares (rows and columns, no box rule) and leaves the
box rule to the reward. Its share of a puzzle is measured here as docs/demo.md measures it:
passes of naked singles (each pass fills every empty cell that its filled peers leave one
digit, ``data.solver_depths``) with rows and columns only, against rows, columns and boxes.

``row_column_share`` measures a list of puzzles; ``generate`` draws unique-solution puzzles
with a given number of empty cells (optionally only "box-needed" ones, where row and column
singles stall before the grid is full: ``singles``); ``census`` measures every unique-solution puzzle
with k empty cells. docs/demo.md's table ("Toward issue 60"):

    python -m examples.demo.difficulty --empty=6,8,10,11,12 --n=256 --seed=0
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np

from d1jax.tasks import sudoku
from examples.demo import latin


def _peer_matrix(box: bool) -> np.ndarray:
    """[16, 16] float32: 1 where two distinct cells share a row or column (or, with
    ``box``, a 2x2 box)."""
    r, c = np.divmod(np.arange(16), 4)
    same = (r[:, None] == r) | (c[:, None] == c)
    if box:
        same |= (r[:, None] // 2 == r // 2) & (c[:, None] // 2 == c // 2)
    return (same & ~np.eye(16, dtype=bool)).astype(np.float32)


def as_array(puzzles) -> np.ndarray:
    """Puzzle strings ("0" = empty) or an int array -> [N, 16] int8."""
    if isinstance(puzzles, np.ndarray):
        return puzzles.astype(np.int8).reshape(-1, 16)
    bad = [p for p in puzzles if len(p) != 16 or set(p) - set("01234")]
    if bad:
        raise ValueError(f"puzzle {bad[0]!r}: must be 16 characters of 0-4")
    return np.array([[int(ch) for ch in p] for p in puzzles], np.int8).reshape(-1, 16)


def singles(puzzles, box: bool) -> np.ndarray:
    """The grids [N, 16] after passes of naked singles until none applies (0 = still
    empty): rows and columns only, or with ``box`` rows, columns and boxes (the batch form of
    ``data.solver_depths``, which the test checks it against)."""
    grid = as_array(puzzles).copy()
    peers = _peer_matrix(box)
    digits = np.arange(1, 5, dtype=np.int8)
    while True:
        onehot = (grid[:, :, None] == digits).astype(np.float32)       # [N, 16, 4]
        free = (peers @ onehot) == 0                                      # digit not in a peer
        single = (grid == 0) & (free.sum(-1) == 1)
        if not single.any():
            return grid
        grid = np.where(single, (free.argmax(-1) + 1).astype(np.int8), grid)


def row_column_share(puzzles) -> dict:
    """Share of the empty cells that row-and-column singles fill, and that singles with the
    box rule fill, over all puzzles together; share of puzzles where row-and-column singles
    stall; share of puzzles with more than one Latin completion (no row and column reasoning
    can decide them)."""
    p = as_array(puzzles)
    empty = int((p == 0).sum())
    if not empty:
        raise ValueError("row_column_share: the puzzles have no empty cell")
    rc, full = singles(p, box=False), singles(p, box=True)
    strs = ["".join(map(str, row)) for row in p]
    return {"puzzles": len(p), "empty_cells": empty,
            "row_column_share": float(1 - (rc == 0).sum() / empty),
            "with_box_share": float(1 - (full == 0).sum() / empty),
            "row_column_stall": float((rc == 0).any(axis=1).mean()),
            "latin_ambiguous": float(np.mean([latin.count_latin_completions(s) > 1
                                              for s in strs]))}


def generate(n: int, num_empty: int, seed: int = 0, box_needed: bool = False,
             max_draws: int = 200_000, exclude=()) -> list[dict]:
    """Up to ``n`` distinct unique-solution puzzles with ``num_empty`` empty cells, none in
    ``exclude`` (fewer when ``max_draws`` draws do not find them): a uniformly drawn solved
    grid with ``num_empty`` cells blanked uniformly, kept if its solution is unique and, with
    ``box_needed``, if row-and-column singles stall on it. Deterministic in ``seed``
    (numpy RNG); rows ``{"puzzle", "solution"}``."""
    if not 0 <= num_empty <= 16:
        raise ValueError(f"num_empty={num_empty}: must be in 0..16")
    grids = sudoku.solution_grids()
    rng, seen, out = np.random.default_rng(seed), set(exclude), []
    for _ in range(max_draws):
        if len(out) == n:
            break
        grid = grids[rng.integers(len(grids))]
        holes = set(rng.choice(16, num_empty, replace=False).tolist())
        puzzle = "".join("0" if i in holes else d for i, d in enumerate(grid))
        if puzzle in seen or sudoku.count_solutions(puzzle) != 1:
            continue
        seen.add(puzzle)
        if not box_needed or (singles([puzzle], box=False) == 0).any():
            out.append({"puzzle": puzzle, "solution": grid})
    return out


def unique_puzzles(num_empty: int) -> np.ndarray:
    """Every unique-solution puzzle with ``num_empty`` empty cells, [M, 16] int8: for each
    set of blanked cells, the solved grids whose givens no other grid shares."""
    grids = np.array([[int(ch) for ch in g] for g in sudoku.solution_grids()], np.int64)
    masks = np.array([[i not in s for i in range(16)]
                      for s in itertools.combinations(range(16), num_empty)], bool)
    out = []
    for chunk in np.array_split(masks, max(1, len(masks) // 2000)):
        keys = (grids[None] * chunk[:, None]) @ (5 ** np.arange(16, dtype=np.int64))
        order = np.argsort(keys, axis=1)
        s = np.take_along_axis(keys, order, axis=1)
        pad = np.full((len(s), 1), -1)
        lone = (s != np.hstack([pad, s[:, :-1]])) & (s != np.hstack([s[:, 1:], pad]))
        m, j = np.nonzero(lone)
        out.append((grids[order[m, j]] * chunk[m]).astype(np.int8))
    return np.concatenate(out)


def census(num_empty: int) -> dict:
    """Every unique puzzle with ``num_empty`` empty cells: how many, the share of their
    empty cells that singles fill (rows and columns; with boxes), the share of puzzles where
    row-and-column singles stall (box-needed) and their number."""
    p = unique_puzzles(num_empty) if 0 < num_empty <= 16 else []
    if not len(p):
        raise ValueError(f"num_empty={num_empty}: no unique-solution puzzle has that many")
    rc, full = singles(p, box=False), singles(p, box=True)
    stall = (rc == 0).any(axis=1)
    return {"unique": len(p), "row_column_share": float(1 - (rc == 0).mean() * 16 / num_empty),
            "with_box_share": float(1 - (full == 0).mean() * 16 / num_empty),
            "row_column_stall": float(stall.mean()), "box_needed": int(stall.sum())}


def demo_sets() -> dict:
    """The demo's 256 held-out puzzles (regenerated as ``data.prepare_data`` does, default
    config), d1's 256 test puzzles (its CSV: ``$D1JAX_DATA_DIR`` or the download) and those
    of them with one solution."""
    from examples.demo.config import get_config
    d = get_config("").demo.data
    d1_all = sudoku.load_test(subsample=None)
    pool = sudoku.generate_puzzles(d.num_train + d.num_heldout, seed=d.seed,
                                   exclude=[r["puzzle"] for r in d1_all],
                                   num_empty=tuple(d.num_empty))
    d1 = [r["puzzle"] for r in sudoku.load_test()]
    return {"demo held-out (6-10 empty)": [r["puzzle"] for r in pool[:d.num_heldout]],
            "d1 test (8 empty)": d1,
            "d1 test, unique only": [p for p in d1 if sudoku.count_solutions(p) == 1]}


def table(args) -> list[dict]:
    """One row per empty-cell count and kind (all unique puzzles, drawn plain, drawn
    box-needed), then one per demo set."""
    rows = []
    for k in args.empty:
        c = census(k)
        rows.append({"set": f"all unique, {k} empty", "puzzles": c.pop("unique"), **c})
        for kind, needed in (("drawn", False), ("drawn box-needed", True)):
            ps = [r["puzzle"] for r in generate(args.n, k, args.seed, box_needed=needed)]
            rows.append({"set": f"{kind}, {k} empty", **row_column_share(ps)})
    if not args.no_demo_sets:
        rows += [{"set": name, **row_column_share(ps)} for name, ps in demo_sets().items()]
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table (shares in %)."""
    cols = ("puzzles", "row_column_share", "with_box_share", "row_column_stall",
            "latin_ambiguous")
    out = ["| set | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        cells = [f"{r[c]:.1%}" if isinstance(r.get(c), float) else
                 ("" if r.get(c) is None else f"{r[c]:,}") for c in cols]
        out.append(f"| {r['set']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--empty", default="6,8,10,11,12", help="empty-cell counts, comma-separated")
    ap.add_argument("--n", type=int, default=256, help="puzzles drawn per count and kind")
    ap.add_argument("--seed", type=int, default=0, help="the draws' numpy seed")
    ap.add_argument("--no_demo_sets", action="store_true", help="skip held-out / d1 test")
    ap.add_argument("--json", action="store_true", help="JSON rows instead of markdown")
    a = ap.parse_args(argv)
    try:
        a.empty = [int(x) for x in a.empty.split(",")]
        rows = table(a)
    except ValueError as e:  # a count that is not an integer, or has no unique puzzle
        ap.error(f"--empty: {e}")
    print(json.dumps(rows, indent=1) if a.json else markdown(rows))


if __name__ == "__main__":
    main()
