"""s1K: d1's SFT trajectory format and its 99% / 1% split, on a tiny local parquet."""

import json
import random

import pytest

from d1jax.tasks import s1k


def _rows(n):
    return [{"question": f"Q{i}?", "solution": "s", "cot_type": "math", "source_type": "x",
             "metadata": "{}", "cot": None, "thinking_trajectories": [f"think {i}", "alt"],
             "attempt": f"A{i}"} for i in range(n)]


@pytest.fixture
def s1k_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "s1k.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(250)), path)
    return path


def test_sft_example_format(s1k_file):
    ex = s1k.load_train(s1k_file, split="all")[3]
    # SFT/sft_trainer.py: SYSTEM_PROMPT + "\n\n" + question; the first trajectory.
    assert ex["prompt"] == [{"role": "user", "content": (
        "\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
        "<answer>\n...\n</answer>\n\n\nQ3?")}]
    assert ex["completion"] == "<reasoning>think 3</reasoning>\n<answer>A3</answer>"


def test_split_is_d1s_seeded_shuffle(s1k_file):
    train, held = s1k.load_train(s1k_file), s1k.load_train(s1k_file, split="eval")
    assert (len(train), len(held)) == (248, 2)  # int(250 * 0.01) = 2 held out
    order = list(range(250))
    random.Random(42).shuffle(order)  # d1: random.seed(42); random.shuffle(...)
    assert [e["question"] for e in held] == [f"Q{i}?" for i in order[:2]]
    assert [e["question"] for e in train] == [f"Q{i}?" for i in order[2:]]


def test_bad_rows_and_split(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="thinking_trajectories"):
        s1k.load_train(tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match="split"):
        s1k.load_train(tmp_path / "x.jsonl", split="validation")


@pytest.mark.parametrize("change, problem", [
    ({"thinking_trajectories": []}, "thinking_trajectories [] is not a non-empty list of strings"),
    ({"thinking_trajectories": "think"}, "thinking_trajectories 'think' is not a non-empty list"),
    ({"attempt": None}, "attempt None is not a non-empty string"),
])
def test_bad_record_names_file_row_and_problem(tmp_path, change, problem):
    from d1jax.tasks import BadRecordError
    rows = _rows(3)
    rows[1] = {**rows[1], **change}
    path = tmp_path / "s1k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BadRecordError) as e:
        s1k.load_train(path)
    assert str(e.value).startswith(f"s1K data {path} line 2: ") and problem in str(e.value)
