"""Sudoku: d1's partial-credit reward and eval parser on hand-made cases; the generator's
puzzles checked by an independent backtracking solver; test-set loading and disjointness."""

import json

import pytest

from d1jax.tasks import sudoku

PUZZLE, SOLUTION = "3102200002100320", "3142243142131324"

# (completion, reward) computed once by running d1's diffu-grpo/reward_func.py
# sudoku_reward_func on these strings (scratch dir, not committed).
D1_REWARDS = [
    ("<answer>\n3142243142131324\n</answer>", 1.0),
    ("", 0.0),
    ("<answer></answer>", 0.0),
    ("<answer>3142</answer>", 0.125),                          # too short: padded with 0
    ("<answer>31422431421313241111</answer>", 1.0),            # too long: cut to 16
    ("<answer>3a1b4c2d2431421313 24</answer>", 1.0),           # letters and spaces dropped
    ("<answer>\n3 1 4 2\n2 4 3 1\n4 2 1 3\n1 3 2 4\n</answer>", 1.0),
    ("<answer>\uff13\uff11\uff14\uff12243142131324</answer>", 0.875),  # fullwidth digits kept
    ("<answer>0000000000000000</answer><answer>3142243142131324</answer>", 1.0),  # last tag
    ("<answer><answer>3142243142131324</answer></answer>", 1.0),  # nested
    ("3142243142131324", 0.0),                                 # no tags
    ("<answer>3100200002100320</answer>", 0.0),                # the puzzle itself
    ("<answer>\u00b2142243142131324</answer>", 1.0),
]


@pytest.mark.parametrize("text, expected", D1_REWARDS)
def test_reward_equals_d1(text, expected):
    reward = sudoku.REWARD_FUNCS[0]([text], [{"puzzle": PUZZLE, "solution": SOLUTION}])[0]
    assert reward == expected


# (generation, extracted, correct cells) for the puzzle above (8 empty cells), from d1's
# eval/parse_and_get_acc.py parse_sudoku_answers.
D1_EVAL = [
    ("<answer>\n3142243142131324\n</answer>", "3142243142131324", 8),
    ("<answer>\n```\n3142\n2431\n4213\n1324\n```\n</answer>", "3142243142131324", 8),
    ("</answer>\n3142243142131324<|endoftext|>", "3142243142131324", 8),
    ("the grid 3142243142131324 done", "3142243142131324", 8),
    ("<answer>31</answer>", "3100000000000000", 0),
    ("", "", 0),
    ("<answer>\n3142 2431 4213 1324<|eot_id|>", "3142243142131324", 8),
]


@pytest.mark.parametrize("text, extracted, cells", D1_EVAL)
def test_eval_parser_equals_d1(text, extracted, cells):
    rec = {"question": f"Solve the following Sudoku puzzle: {PUZZLE}\n", "generations": text,
           "ground_truth": SOLUTION}
    v = sudoku.verdict(rec)
    assert (v.extracted, v.hits, v.total, v.correct) == (extracted, cells, 8, cells == 8)


def test_eval_needs_a_puzzle():
    with pytest.raises(ValueError, match="no 16-digit sudoku puzzle"):
        sudoku.verdict({"question": "hello", "generations": "", "ground_truth": SOLUTION})


def solutions(puzzle: str, limit: int = 2) -> list[str]:
    """Independent reference: plain backtracking over rows, columns and 2x2 boxes."""
    grid = [int(c) for c in puzzle]
    found = []

    def ok(i, d):
        r, c = divmod(i, 4)
        br, bc = r // 2 * 2, c // 2 * 2
        return (all(grid[r * 4 + k] != d for k in range(4))
                and all(grid[k * 4 + c] != d for k in range(4))
                and all(grid[(br + a) * 4 + bc + b] != d for a in range(2) for b in range(2)))

    def search():
        if len(found) >= limit:
            return
        if 0 not in grid:
            found.append("".join(map(str, grid)))
            return
        i = grid.index(0)
        for d in range(1, 5):
            if ok(i, d):
                grid[i] = d
                search()
                grid[i] = 0

    search()
    return [g for g in found if valid_grid(g)]


def valid_grid(g: str) -> bool:
    units = ([g[r * 4:r * 4 + 4] for r in range(4)] + [g[c::4] for c in range(4)]
             + [g[r * 4 + c] + g[r * 4 + c + 1] + g[r * 4 + c + 4] + g[r * 4 + c + 5]
                for r in (0, 2) for c in (0, 2)])
    return all(sorted(u) == ["1", "2", "3", "4"] for u in units)


def test_generated_puzzles_have_exactly_one_solution():
    puzzles = sudoku.generate_puzzles(1000, seed=3)
    assert len({p["puzzle"] for p in puzzles}) == 1000
    for p in puzzles:
        assert p["puzzle"].count("0") == 8
        assert all(a in ("0", b) for a, b in zip(p["puzzle"], p["solution"]))
        assert solutions(p["puzzle"]) == [p["solution"]]


def test_generator_is_deterministic_and_respects_options():
    a = sudoku.generate_puzzles(20, seed=7)
    assert a == sudoku.generate_puzzles(20, seed=7)
    assert a != sudoku.generate_puzzles(20, seed=8)
    excluded = {p["puzzle"] for p in a[:10]}
    assert not excluded & {p["puzzle"] for p in sudoku.generate_puzzles(20, seed=7, exclude=excluded)}
    ranged = sudoku.generate_puzzles(30, seed=1, num_empty=(4, 10))
    assert all(4 <= p["puzzle"].count("0") <= 10 for p in ranged)
    with pytest.raises(ValueError, match="num_empty"):
        sudoku.generate_puzzles(1, num_empty=17)


def test_solution_grids_are_all_valid_grids():
    grids = sudoku.solution_grids()
    assert len(set(grids)) == 288  # the known number of 4x4 Sudoku grids
    assert all(solutions(g) == [g] for g in grids[::16])


def test_test_set_and_d1_eval_order(shared_d1):
    rows = sudoku.load_test(shared_d1 / sudoku.TEST_FILE, subsample=None)
    assert len(rows) == 500 and all(len(r["puzzle"]) == 16 for r in rows)
    assert rows[1]["puzzle"] == "0140432014020000"  # leading zero kept (d1 reads str)
    counts = []
    for r in rows[:100]:
        found = solutions(r["puzzle"], limit=5)
        assert r["solution"] in found and sudoku.count_solutions(r["puzzle"]) == len(found)
        counts.append(len(found))
    # A fact of d1's test set: some puzzles have several solutions (124 of the 500), yet
    # d1 scores against its one stored solution. Our generator only makes unique ones.
    assert counts.count(1) < 100
    subset = sudoku.load_test(shared_d1 / sudoku.TEST_FILE)
    assert len(subset) == 256
    # d1's 256-length shard 0 holds items 0, 7, 14, ... of its seeded evaluation order.
    shard = json.loads((shared_d1 / "eval_baselines" / "sudoku_instruct_256_128_0_generations.json").read_text())
    assert [g["question"] for g in shard["generations"]] == \
        [sudoku.record(r, "")["question"] for r in subset[0::7]]


def test_train_set_disjoint_from_test_set(shared_d1):
    test = {r["puzzle"] for r in sudoku.load_test(shared_d1 / sudoku.TEST_FILE, subsample=None)}
    train = sudoku.load_train(n=3000, seed=0, test_source=shared_d1 / sudoku.TEST_FILE)
    assert len(train) == 3000 and not test & {r["puzzle"] for r in train}


def test_train_from_data_dir_env(shared_d1, monkeypatch, tmp_path):
    monkeypatch.setenv("D1JAX_DATA_DIR", str(shared_d1))
    monkeypatch.setenv("D1JAX_CACHE", str(tmp_path))
    assert len(sudoku.load_train(n=5)) == 5


def test_offline_download_error_is_clear(monkeypatch, tmp_path):
    import urllib.request
    from d1jax.tasks import DataUnavailableError

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")
    monkeypatch.delenv("D1JAX_DATA_DIR", raising=False)
    monkeypatch.setenv("D1JAX_CACHE", str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(DataUnavailableError, match=r"raw\.githubusercontent.*4x4_test_sudoku"):
        sudoku.load_test()


def test_local_csv_with_inferred_ints(tmp_path):
    """A CSV read with type inference loses leading zeros; rows get them back."""
    assert sudoku._normalize({"Puzzle": 140432014020000, "Solution": 2143432114323214}) == \
        {"puzzle": "0140432014020000", "solution": "2143432114323214"}
    (tmp_path / "p.csv").write_text("Puzzle,Solution\n0140432014020000,2143432114323214\n")
    assert sudoku.load_train(tmp_path / "p.csv")[0]["puzzle"] == "0140432014020000"


BAD_SUDOKU_ROWS = [  # (CSV line after the header, what the error must say)
    ("12340000,3142243142131324", "puzzle '12340000' has 8 cells, expected 16 digits 0-4"),
    ("31022000021003x0,3142243142131324", "puzzle '31022000021003x0' has 'x' at cell 15"),
    ("3102200002100320,3142243142131325", "solution '3142243142131325' has '5' at cell 16"),
    ("3102200002100320,3142243142131342",  # last row swapped: columns 3 and 4 break
     "not a solved grid: column 3 reads '4314', expected each of 1-4 once"),
    ("3102200002100320,1234341221434321",
     "has 1 at row 1 column 1 where puzzle '3102200002100320' gives 3"),
    ("3102200002100320,", "no value in column 'Solution'"),
]


@pytest.mark.parametrize("line, problem", BAD_SUDOKU_ROWS)
def test_bad_record_names_file_line_and_problem(tmp_path, line, problem):
    from d1jax.tasks import BadRecordError
    path = tmp_path / "train.csv"
    path.write_text(f"Puzzle,Solution\n{PUZZLE},{SOLUTION}\n{line}\n")
    for load in (sudoku.load_train, lambda p: sudoku.load_test(p, subsample=None)):
        with pytest.raises(BadRecordError) as e:
            load(path)
        assert str(e.value).startswith(f"sudoku data {path} line 3: ") and problem in str(e.value)


def test_missing_solution_column_is_named(tmp_path):
    from d1jax.tasks import BadRecordError
    (tmp_path / "p.jsonl").write_text(json.dumps({"puzzle": PUZZLE}) + "\n")
    with pytest.raises(BadRecordError, match=r"p\.jsonl line 1: no 'Solution' \(or 'solution'\) "
                                             r"column; the row has \['puzzle'\]"):
        sudoku.load_train(tmp_path / "p.jsonl")


def test_check_puzzle_agrees_with_an_independent_grid_check():
    """check_puzzle accepts a solution exactly when valid_grid (above) does: on solved
    grids, the same grids with two cells swapped, and random strings of 1-4."""
    import random
    rng = random.Random(0)
    grids = list(sudoku.solution_grids()[::9])
    grids += [g[1] + g[0] + g[2:] for g in grids]
    grids += ["".join(rng.choice("1234") for _ in range(16)) for _ in range(200)]
    for grid in grids:
        try:
            sudoku.check_puzzle("0" * 16, grid)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted == valid_grid(grid), grid
