"""GSM8K: d1's five rewards and its evaluation parser on hand-made cases, and the loaders
on tiny local files in the openai/gsm8k schema (never the network)."""

import json

import pytest

from d1jax.tasks import DataUnavailableError, gsm8k, sources

# Expected (xmlcount, soft, strict, int, correctness) for reference answer "72": computed
# once by running d1's diffu-grpo/reward_func.py on these strings (scratch dir, not
# committed).
D1_REWARDS = [
    ("<reasoning>\nabc\n</reasoning>\n<answer>\n72\n</answer>\n", (0.5, 0.0, 0.5, 0.5, 2.0)),
    ("", (0.0, 0.0, 0.0, 0.0, 0.0)),
    ("<reasoning>\nabc\n</reasoning>\n", (0.25, 0.0, 0.0, 0.0, 0.0)),                 # no answer
    ("<answer><answer>72</answer></answer>", (0.0, 0.0, 0.0, 0.5, 2.0)),                # nested
    ("<reasoning>\nx\n</reasoning>\n<answer>\n5\n</answer>\n<answer>\n72\n</answer>\n",  # repeated
     (0.25, 0.0, 0.0, 0.5, 2.0)),
    ("<reasoning>\nx\n</reasoning>\n<answer>\n72\n</answer>\nextra words", (0.478, 0.0, 0.0, 0.5, 2.0)),
    ("<answer>\n\u0667\u0662\n</answer>", (0.126, 0.0, 0.0, 0.5, 0.0)),  # Arabic-Indic 72: isdigit
    ("<reasoning>\na\nb\n</reasoning>\n<answer>\n72\n</answer>\n", (0.5, 0.0, 0.0, 0.5, 2.0)),
    ("<answer> 72 </answer>", (0.0, 0.0, 0.0, 0.5, 2.0)),
    ("<answer>\u00b2</answer>", (0.0, 0.0, 0.0, 0.5, 0.0)),  # superscript two: isdigit too
    ("<reasoning>\nx\n</reasoning>\n<answer>\n72\n</answer>\n\n", (0.498, 0.0, 0.5, 0.5, 2.0)),
    ("<reasoning>x</reasoning>\n\n<answer>72</answer>", (0.0, 0.5, 0.0, 0.5, 2.0)),
    ("<answer>\n-72\n</answer>", (0.126, 0.0, 0.0, 0.0, 0.0)),
]


@pytest.mark.parametrize("text, expected", D1_REWARDS)
def test_rewards_equal_d1(text, expected):
    example = {"question": "q", "answer": "72"}
    got = tuple(f([text], [example])[0] for f in gsm8k.REWARD_FUNCS)
    assert got == pytest.approx(expected, abs=1e-9)


# (generation, extracted, correct) for ground truth 72.0, from d1's eval/parse_and_get_acc.py.
D1_EVAL = [
    ("The answer is \\boxed{72}.", 72.0, True),
    ("\\boxed{...} then \\boxed{72 dollars}", 72.0, True),
    ("<answer>\nIt costs 43,500 dollars\n</answer>", 500.0, False),
    ("<answer>72</answer> \\boxed{}", 72.0, True),
    ("", None, False),
    ("\\boxed{\n72}", None, False),
    ("<answer>1 2 72</answer>", 72.0, True),
    ("\\boxed{72.0}", 72.0, True),
    ("\\boxed{\u0667\u0662}", 72.0, True),
    ("\\boxed{-72}", -72.0, False),
]


@pytest.mark.parametrize("text, extracted, correct", D1_EVAL)
def test_eval_parser_equals_d1(text, extracted, correct):
    v = gsm8k.verdict({"question": "q", "generations": text, "ground_truth": 72.0})
    assert (v.extracted, v.correct) == (extracted, correct)


# The first \\boxed{} wins over every other number (the <answer> text, numbers after the box,
# later boxes), and inside it the first number, not the last. Expected values from d1's
# eval/parse_and_get_acc.py ``parse_gsm_answers`` run on these strings (scratch dir, not
# committed); ground truth 72.0.
D1_EVAL_BOX_VS_OTHER_NUMBERS = [
    ("<reasoning>\n12 * 6 = 72, plus 18 is 90\n</reasoning>\n<answer>\n\\boxed{72}\n</answer>\n"
     "Check: 90 - 18 = 100", 72.0, True),
    ("<answer>\nThe total is 90\n</answer>\n\\boxed{72}", 72.0, True),  # box over <answer>
    ("<answer>\n\\boxed{72}, with tax 90\n</answer>", 72.0, True),
    ("\\boxed{72} dollars, not 90", 72.0, True),
    ("\\boxed{72 + 18 = 90}", 72.0, True),  # first number inside the box
    ("\\boxed{x = 18, so 72}", 18.0, False),
    ("\\boxed{72} or \\boxed{90}", 72.0, True),  # first box
    ("\\boxed{18} or \\boxed{72}", 18.0, False),
    ("\\boxed{1,072}", 1.0, False),  # float() fails: the first number, 1
    ("\\boxed{\\$72.00 total: 90}", 72.0, True),
    ("\\boxed{x} <answer>18 then 72</answer> 90", 72.0, True),  # no number boxed: <answer>'s last
    ("\\boxed{...} \\boxed{..} <answer>5 and 72</answer>", 72.0, True),
    ("<answer>72 first, then 90</answer> <answer>72</answer>", 90.0, False),  # first <answer>
    ("\\boxed{}\n<answer>\n90 - 18 = 72\n</answer>\n\\boxed{x}", 72.0, True),
    ("\\boxed{72\n} <answer>90</answer>", 90.0, False),  # a box never spans lines
]


@pytest.mark.parametrize("text, extracted, correct", D1_EVAL_BOX_VS_OTHER_NUMBERS)
def test_eval_parser_prefers_the_first_boxed_number_as_d1(text, extracted, correct):
    v = gsm8k.verdict({"question": "q", "generations": text, "ground_truth": 72.0})
    assert (v.extracted, v.correct) == (extracted, correct)


def test_reference_answers():
    assert gsm8k.extract_hash_answer("so 5+5=10\n#### 1,000") == "1,000"
    assert gsm8k.extract_hash_answer("no marker") is None
    assert gsm8k.reference_value("so\n#### $1,000.50") == 1000.5
    ex = {"question": "q?", "answer": "10", "solution": "5+5\n#### 10"}
    task = gsm8k.make_task()
    assert task.verdict(task.record(ex, "<answer>\\boxed{10}</answer>")).correct is True
    assert gsm8k.make_task().record(ex, "g") == {"question": "q?", "generations": "g",
                                                  "ground_truth": 10.0}


ROWS = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "Half of 10?", "answer": "10/2=5\n#### 5"}]


def test_load_parquet_and_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train.parquet")
    rows = gsm8k.load_train(tmp_path / "train.parquet")
    assert rows[0] == {"question": ROWS[0]["question"], "answer": "7", "solution": ROWS[0]["answer"]}
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    assert gsm8k.load_test(tmp_path / "t.jsonl") == rows


def test_load_folder_with_splits(tmp_path):
    """A folder that ``datasets`` reads by file names (train.jsonl / test.jsonl)."""
    folder = tmp_path / "gsm"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (folder / "test.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    cache = str(tmp_path / "cache")
    assert [r["answer"] for r in gsm8k.load_train(folder, cache_dir=cache)] == ["7"]
    assert [r["answer"] for r in gsm8k.load_test(folder, cache_dir=cache)] == ["5"]


def test_load_saved_dataset(tmp_path):
    import datasets
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "d"))
    assert len(gsm8k.load_train(tmp_path / "d")) == 2


def test_offline_hub_error_is_clear(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataUnavailableError, match=r"openai/gsm8k.*source="):
        gsm8k.load_train()


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        gsm8k.load_train(tmp_path / "missing.parquet")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"q": 1}) + "\n")
    with pytest.raises(ValueError, match="question"):
        gsm8k.load_train(tmp_path / "bad.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ValueError, match="unsupported"):
        sources.read_file(tmp_path / "x.txt")


@pytest.mark.parametrize("row, problem", [
    ({"question": "q?", "answer": "so it is 7"},
     "answer has no '#### <number>' final answer: 'so it is 7'"),
    ({"question": "q?", "answer": "so\n#### seven"}, "answer has no '#### <number>'"),
    ({"question": "", "answer": "#### 7"}, "question '' is not a non-empty string"),
    ({"question": "q?", "answer": 7}, "answer 7 is not a string"),
])
def test_bad_record_names_file_line_and_problem(tmp_path, row, problem):
    from d1jax.tasks import BadRecordError
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(row) + "\n")
    for load in (gsm8k.load_train, gsm8k.load_test):
        with pytest.raises(BadRecordError) as e:
            load(path)
        assert str(e.value).startswith(f"gsm8k data {path} line 2: ") and problem in str(e.value)


def test_bad_parquet_record_names_its_row_index(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from d1jax.tasks import BadRecordError
    rows = ROWS + [{"question": "q?", "answer": "no final line"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    with pytest.raises(BadRecordError, match=r"train\.parquet row index 2: answer has no"):
        gsm8k.load_train(tmp_path / "train.parquet")
