"""The scorer on d1's published LLaDA-8B-Instruct generations (one 256-length shard per
task in ../shared/data/d1/eval_baselines), against two oracles:

* D1_RESULTS: what d1's own parser (eval/parse_and_get_acc.py, unchanged, tiktoken
  stubbed since token counts are not scored) returned on these files, run once in a
  scratch directory outside the repository: the items it judged correct (for Sudoku the
  correct cells of each puzzle).
* For GSM8K and Sudoku also a deliberately plain second implementation of d1's rules
  written below with d1's regexes, compared item by item.
"""

import json
import re
from pathlib import Path

import pytest

from d1jax.eval import score


GSM8K_WRONG = [4, 7, 21, 24, 27, 30, 31, 34, 40, 43, 44, 50, 52, 64, 73, 80, 82, 83, 91, 101,
               110, 111, 114, 121, 126, 127, 128, 129, 131, 134, 137, 141, 144, 147, 149, 150,
               151, 165, 166, 168, 186, 189, 197, 201, 202]
D1_RESULTS = {  # file: (task, items, d1's numerator, d1's denominator, per-item results)
    "gsm8k_instruct_256_128_0_generations.json":
        ("gsm8k", 205, 160, 205, [i not in GSM8K_WRONG for i in range(205)]),
    "math500_instruct_256_128_0_generations.json":
        ("math500", 84, 26, 84, [i in {1, 2, 4, 12, 13, 14, 16, 19, 20, 28, 36, 40, 45, 46, 49, 51,
                                       53, 54, 60, 61, 64, 66, 67, 68, 73, 75} for i in range(84)]),
    "countdown_instruct_256_128_0_generations.json":
        ("countdown", 37, 7, 37, [i in {0, 7, 18, 21, 27, 30, 36} for i in range(37)]),
    "sudoku_instruct_256_128_0_generations.json":  # correct cells out of 8 per puzzle
        ("sudoku", 37, 23, 296, [int(c) for c in "1201000100300100010021110010012000130"]),
}


@pytest.fixture
def shards(shared_d1):
    """conftest's shared_d1 skips when ../shared/data/d1 is absent."""
    return shared_d1 / "eval_baselines"


@pytest.mark.parametrize("file_name", sorted(D1_RESULTS))
def test_shard_matches_d1_parser(shards, file_name):
    task, n, hits, total, per_item = D1_RESULTS[file_name]
    r = score.score_file(shards / file_name, details=True)
    assert (r["task"], r["gen_length"], r["n"], r["hits"], r["total"]) == (task, 256, n, hits, total)
    got = [it["hits"] for it in r["items"]] if task == "sudoku" else [it["correct"] for it in r["items"]]
    assert got == per_item
    assert r["accuracy"] == pytest.approx(hits / total)
    if task == "sudoku":
        assert r["solved"] == 0 and r["solved_accuracy"] == 0.0


# ---------------------------------------------------------------- plain second oracle


def plain_gsm8k(generation: str, truth: float) -> bool:
    answer = None
    for box in re.findall(r"\\boxed{(.*?)}", generation):
        box = box.strip()
        if box and not re.match(r"^\.+$", box):
            try:
                answer = float(box)
            except ValueError:
                nums = re.findall(r"-?\d+\.?\d*", box)
                answer = float(nums[0]) if nums else None
            if answer is not None:
                break
    if answer is None:
        m = re.search(r"<answer>(.*?)</answer>", generation, re.DOTALL)
        if m and m.group(1).strip():
            text = m.group(1).strip()
            try:
                answer = float(text)
            except ValueError:
                nums = re.findall(r"-?\d+\.?\d*", text)
                answer = float(nums[-1]) if nums else None
    return answer == truth


def plain_sudoku(generation: str, truth: str, question: str) -> int:
    puzzle = re.search(r"Sudoku puzzle: ([0-9]{16})", question).group(1)
    patterns = [r"<answer>.*?```\s*([\d\s]+)```",
                r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
                r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
                r".*?(\d{16})\s*</answer>", r"\b(\d{16})\b"]
    answer = ""
    for p in patterns:
        m = re.search(p, generation, re.DOTALL)
        if m and m.group(1).strip():
            answer = m.group(1).strip()
            break
    answer = re.sub(r"\s", "", answer)
    if not answer:
        return 0
    answer = (answer + "0" * 16)[:16]
    return sum(answer[i] == truth[i] for i in range(16) if puzzle[i] == "0")


def test_plain_oracle_agrees_item_by_item(shards):
    for name, plain in (("gsm8k", plain_gsm8k), ("sudoku", plain_sudoku)):
        path = shards / f"{name}_instruct_256_128_0_generations.json"
        items = json.loads(path.read_text())["generations"]
        ours = score.score_file(path, details=True)["items"]
        for item, mine in zip(items, ours):
            if name == "gsm8k":
                assert mine["correct"] == plain(item["generations"], item["ground_truth"])
            else:
                assert mine["hits"] == plain(item["generations"], item["ground_truth"], item["question"])


# ---------------------------------------------------------------- CLI and API


def test_cli_table_and_json(shards, capsys):
    assert score.main([str(shards)]) == 0
    out = capsys.readouterr().out
    for line in ("gsm8k_instruct_256_128", "78.05%", "30.95%", "18.92%", "7.77%",
                 "cells 23/296, solved 0/37"):
        assert line in out
    assert score.main([str(shards / "countdown_instruct_256_128_0_generations.json"), "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert (r["task"], r["gen_length"], r["n"], r["correct"]) == ("countdown", 256, 37, 7)


def _write(path: Path, records, **extra):
    path.write_text(json.dumps({"generations": records, **extra}))
    return path


def test_pooling_inference_and_errors(tmp_path, capsys):
    rec = {"question": "q", "generations": "\\boxed{3}", "ground_truth": 3.0}
    bad = {**rec, "ground_truth": 4.0}
    _write(tmp_path / "gsm8k_ckpt_a_128_64_0_generations.json", [rec, bad])
    _write(tmp_path / "gsm8k_ckpt_a_128_64_1_generations.json", [rec])
    (r,) = score.score_paths([tmp_path])
    assert (r["setup"], r["task"], r["gen_length"], r["n"], r["correct"]) == \
        ("gsm8k_ckpt_a_128_64", "gsm8k", 128, 3, 2)
    assert len(r["files"]) == 2
    assert score.infer_task("math_llada_sft_512_256") == "math500"
    assert score.infer_task("countdown_math-ckpt_128_64") == "countdown"  # first token wins
    assert score.infer_task("my_gsm_run") == "gsm8k"                      # d1's substring rule
    assert score.infer_gen_length("sudoku_instruct_512_256") == 512
    odd = _write(tmp_path / "results.json", [rec], gen_length=64)
    with pytest.raises(ValueError, match="cannot tell the task"):
        score.score_file(odd)
    assert score.score_file(odd, task="gsm8k")["gen_length"] == 64
    assert score.main([str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "broken_generations.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON"):
        score.score_file(tmp_path / "broken_generations.json", task="gsm8k")


def test_score_records_for_a_generation_cli():
    """What a generation loop calls with its own records (d1's layout)."""
    from d1jax.tasks import get_task
    task = get_task("sudoku")
    ex = {"puzzle": "3102200002100320", "solution": "3142243142131324"}
    recs = [task.record(ex, "<answer>3142243142131324</answer>"), task.record(ex, "<answer>31</answer>")]
    r = score.score_records(recs, "sudoku")
    assert (r["hits"], r["total"], r["solved"], r["solved_accuracy"]) == (8, 16, 1, 0.5)
    with pytest.raises(ValueError, match="item 0 cannot be scored as sudoku"):
        score.score_records([{"question": "none", "generations": "", "ground_truth": "1"}], "sudoku")
