"""The demo's box-needed data (``demo.data.box_needed``, examples/demo/data.py): GRPO's pool and
the held-out set are unique puzzles on which row and column singles stall, disjoint from each
other, from the pretraining pool and from d1's test set; the pretraining pool and tokenizer
are those of the same config without it. Checked against brute force written here."""

import collections
import itertools
import sys
from pathlib import Path

import pytest

from d1jax.config import ConfigError
from d1jax.tasks import DataUnavailableError, sudoku

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples/ sits beside the package, not in it
from examples.demo import config as demo_config  # noqa: E402
from examples.demo import data as demo_data  # noqa: E402
from examples.demo import evaluation  # noqa: E402
from tests.sudoku_units import BOXES, COLS, ROWS  # noqa: E402


def _grids(units) -> list[str]:
    """Every 4x4 grid of 1-4 whose ``units`` each hold 1-4 once (rows by permutation)."""
    out = []
    for rows in itertools.product(itertools.permutations("1234"), repeat=4):
        g = "".join("".join(r) for r in rows)
        if all(len({g[i] for i in u}) == 4 for u in units):
            out.append(g)
    return out


SUDOKU, LATIN = _grids(COLS + BOXES), _grids(COLS)


def completions(puzzle: str, grids) -> list[str]:
    return [g for g in grids if all(p in ("0", d) for p, d in zip(puzzle, g))]


def rc_singles_stall(puzzle: str) -> bool:
    """Whether row-and-column naked singles, one cell at a time, leave a cell empty."""
    g, changed = list(puzzle), True
    while changed:
        changed = False
        for i in range(16):
            left = set("1234") - {g[j] for j in ROWS[i // 4] + COLS[i % 4]}
            if g[i] == "0" and len(left) == 1:
                g[i], changed = left.pop(), True
    return "0" in g


def _demo(**data):
    c = demo_config.get_config("d1like")
    c.unlock()
    c.demo.data.update(dict(num_train=300, num_heldout=33, **data))
    return c.demo


def _read(path) -> list[dict]:
    return sudoku.load_test(path, subsample=None)


def test_box_needed_pool_and_heldout(tmp_path):
    assert (len(SUDOKU), len(LATIN)) == (288, 576)
    plain = demo_data.prepare_data(_demo(), tmp_path / "plain")
    assert plain["rl_train"] == plain["train"]  # the knob off: GRPO's pool is the train pool
    demo = _demo(box_needed=True, box_num_train=48, box_num_empty=(8, 10))
    data = demo_data.prepare_data(demo, tmp_path / "box")
    # The base's corpus and the tokenizer do not move with the knob.
    for key in ("train",):
        assert _read(data[key]) == _read(plain[key])
    assert (Path(data["tokenizer"]) / "tokenizer.json").read_text() == (
        Path(plain["tokenizer"]) / "tokenizer.json").read_text()
    assert data["prompt_length"] == plain["prompt_length"]
    pool, held = _read(data["rl_train"]), _read(data["heldout"])
    assert (len(pool), len(held)) == (48, 33)
    for rows, n in ((pool, 48), (held, 33)):
        assert len({r["puzzle"] for r in rows}) == n
        for r in rows:
            assert completions(r["puzzle"], SUDOKU) == [r["solution"]]
            assert rc_singles_stall(r["puzzle"])
            assert len(completions(r["puzzle"], LATIN)) > 1
        # spread evenly over 8-10 empty cells, and mixed (a first slice spans them)
        counts = collections.Counter(r["puzzle"].count("0") for r in rows)
        assert set(counts) == {8, 9, 10} and max(counts.values()) - min(counts.values()) <= 1
        assert len({r["puzzle"].count("0") for r in rows[:9]}) > 1
    # disjoint: pool vs held-out, and both vs the plain pool, plain held-out, d1's test set
    seen = {r["puzzle"] for k in ("train", "heldout") for r in _read(plain[k])}
    try:
        seen |= {r["puzzle"] for r in sudoku.load_test(subsample=None)}
    except DataUnavailableError:
        pass
    box = [r["puzzle"] for r in pool + held]
    assert len(set(box)) == 81 and not set(box) & seen
    # GRPO draws its prompts from the box-needed pool; the evaluation's held-out set is theirs
    cfg = demo_config.grpo_config(demo, data, tmp_path / "sft", 0)
    assert cfg.task.source == data["rl_train"] != data["train"]
    assert evaluation.eval_sets(demo, data)["heldout"][:5] == held[:5]
    # Written once, kept; other settings write another set beside it.
    assert demo_data.prepare_data(demo, tmp_path / "box") == data
    demo11 = _demo(box_needed=True, box_num_train=8, box_num_empty=(11, 11))
    held11 = _read(demo_data.prepare_data(demo11, tmp_path / "box")["heldout"])
    assert {r["puzzle"].count("0") for r in held11} == {11} and _read(data["heldout"]) == held
    # No box-needed puzzle has 0 empty cells: said in one line, as a config error.
    with pytest.raises(ConfigError, match="box_num_empty"):
        demo_data.prepare_data(_demo(box_needed=True, box_num_train=2, box_num_empty=(0, 0)),
                               tmp_path / "box")


def test_box_fields_checked():
    demo = _demo(box_num_empty=(9, 8))
    with pytest.raises(ConfigError, match=r"box_num_empty=\(9, 8\)"):
        demo_config.check(demo)
    with pytest.raises(ConfigError, match="box_num_train=0"):
        demo_config.check(_demo(box_needed=True, box_num_train=0))
    # Off by default; declared by ':d1like' only (the other variants' configs are unchanged).
    assert demo_config.get_config("d1like").demo.data.box_needed is False
    for arg in (None, "ci", "seeds", "compare"):
        demo = demo_config.get_config(arg).demo
        assert "box_needed" not in demo.data and not demo_config.box_needed(demo)


def test_measurement_table_reads_each_runs_results(tmp_path):
    """examples/demo/box_measure.py's table: one row per (run, model) and (run, set), the
    numbers of that run's box_eval.json in their columns."""
    import json
    from examples.demo import box_measure
    spread = lambda eq, sd, rw: {"all_equal": eq, "std": sd, "mean_reward": rw}
    for run, acc in (("p0", 30.0), ("p1", 55.0)):
        (tmp_path / run).mkdir()
        (tmp_path / run / "box_eval.json").write_text(json.dumps({
            "base/heldout": {"accuracy": acc - 10}, "base/box8": {"accuracy": acc - 20},
            "sft/heldout": {"accuracy": acc}, "sft/box8": {"accuracy": acc + 1.25},
            "sft/spread_box8": spread(0.5, 0.04, 0.5),
            "sft/spread_box8_T1.5": spread(acc / 1000, 0.125, 0.25)}))
    lines = box_measure.table([str(tmp_path / "p0"), str(tmp_path / "p1")]).splitlines()
    assert lines[0] == "| run | model | heldout | box8 |"
    assert "| p1 | sft | 55.0 | 56.2 |" in lines and "| p0 | base | 20.0 | 10.0 |" in lines
    assert "| p1 | box8 | 50% / 0.040 / 0.500 | 6% / 0.125 / 0.250 |" in lines
    assert lines[-4].startswith("| run | set | T=0.9: all equal") and "T=1.5" in lines[-4]


def test_latin_pick_accuracy_by_hand():
    """A puzzle with one Latin completion scores 100; tests/test_demo_difficulty.py's STALL
    (5 empty cells, two Latin completions that differ in 4 of them) scores (5 + 1) / 10."""
    from examples.demo import box_measure
    solution = "1234" "3412" "2143" "4321"
    full, stall = "0034" "0412" "2143" "4321", "0230" "3012" "2143" "0320"
    assert len(completions(stall, LATIN)) == 2 and len(completions(full, LATIN)) == 1
    assert box_measure.latin_pick_accuracy([{"puzzle": full, "solution": solution}]) == 100
    got = box_measure.latin_pick_accuracy([{"puzzle": p, "solution": solution}
                                           for p in (stall, full)])
    assert got == pytest.approx((60 + 100) / 2)


def test_eval_cache_settings_name_the_puzzles():
    """The evaluation cache is kept only for the same settings, the puzzles included: a
    workdir whose held-out set changed (``demo.data.box_needed`` flipped) re-evaluates."""
    demo = demo_config.get_config("d1like").demo
    plain = {"heldout": [{"puzzle": "1234341221434321"[:12] + "0000"}], "d1_test": []}
    box = {**plain, "heldout": [{"puzzle": "0000341221434321"}]}
    assert evaluation.eval_settings(demo, plain) == evaluation.eval_settings(demo, dict(plain))
    assert evaluation.eval_settings(demo, plain) != evaluation.eval_settings(demo, box)


def test_grpo_lora_rank_0_is_full_fine_tuning():
    """``demo.grpo.lora_rank`` 0 is documented as full fine-tuning: accepted, LoRA off."""
    c = demo_config.get_config("d1like")
    c.demo.grpo.lora_rank = 0
    demo_config.check(c.demo)
    data = {"train": "t.csv", "tokenizer": "tok", "prompt_length": 43}
    g = demo_config.grpo_config(c.demo, data, Path("sft"), seed=0)
    assert g.lora.enabled is False
    c.demo.grpo.lora_rank = -1
    with pytest.raises(ConfigError, match="demo.grpo.lora_rank=-1: must be >= 0"):
        demo_config.check(c.demo)
