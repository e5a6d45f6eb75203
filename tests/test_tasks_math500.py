"""MATH: d1's correctness and format rewards, its answer equivalence (Hendrycks
normalisation), the optional math-verify backend and its time limit."""

import sys
import time

import pytest

from d1jax.tasks import math500, math_equiv

SOLUTION = "so the answer is \\boxed{\\frac{1}{2}}."

# (completion, (correctness, format)) computed once by running d1's
# diffu-grpo/reward_func.py (correctness_reward_func_math, boxed_and_answer_tags_format_reward).
D1_REWARDS = [
    ("<answer>\n\\boxed{\\frac12}\n</answer>", (2.0, 0.75)),
    ("", (0.0, 0.25)),                                           # empty
    ("\\boxed{0.5}", (2.0, 0.25)),                               # 0.5 -> \frac{1}{2}; no tags
    ("<answer>\\boxed{1/2}</answer>", (2.0, 0.75)),
    ("<answer>\\boxed{\\frac{1}{2}</answer>", (0.0, 0.75)),      # unbalanced box
    ("<answer><answer>\\boxed{\\dfrac{1}{2}}</answer></answer>", (2.0, 0.75)),  # nested tags
    ("\\boxed{x/y}", (0.0, 0.25)),                               # d1's int() error path
    ("<answer>\x08oxed</answer>", (0.0, 1.0)),                   # what d1's "\boxed" really is
    ("\\boxed{1}\\boxed{\\frac{1}{2}}", (2.0, 0.25)),            # the last box counts
    ("<answer>1/2</answer>", (0.0, 0.75)),                       # no box: whole text compared
    ("\\boxed {1/2}$", (0.0, 0.25)),
    ("\\boxed{\\sqrt}", (0.0, 0.25)),
]


@pytest.mark.parametrize("text, expected", D1_REWARDS)
def test_rewards_equal_d1(text, expected):
    task = math500.make_task()
    got = tuple(f([text], [{"problem": "p", "solution": SOLUTION}])[0] for f in task.reward_funcs)
    assert got == expected


def test_intended_box_check_is_an_option():
    fixed = math500.make_format_reward(box_marker="\\boxed")
    assert fixed("<answer>\\boxed{2}</answer>", {}) == 1.0
    assert fixed("<answer>2</answer>", {}) == 0.75
    assert math500.make_format_reward()("<answer>\\boxed{2}</answer>", {}) == 0.75  # d1's value


# (generation, extracted, correct) for ground truth "\frac{1}{2}", from d1's parse_math_answers.
D1_EVAL = [
    ("\\boxed{\\frac12}", "\\frac12", True),
    ("<answer>\\frac{1}{2}</answer>", "<answer>\\frac{1}{2}</answer>", False),
    ("no box here", "no box here", False),
    ("\\boxed{\\frac{1}{2}", None, False),
    ("\\boxed{0.5}", "0.5", True),
    ("\\boxed{\\text{ a}\\text{ b}}", "\\text{ a}\\text{ b}", False),
    ("", "", False),
]


@pytest.mark.parametrize("text, extracted, correct", D1_EVAL)
def test_eval_parser_equals_d1(text, extracted, correct):
    v = math500.make_verdict()({"question": "q", "generations": text, "ground_truth": "\\frac{1}{2}"})
    assert (v.extracted, v.correct) == (extracted, correct)


@pytest.mark.parametrize("a, b, equal", [
    ("\\dfrac{3}{4}", "3/4", True), ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("x = 5", "5", True), (".5", "0.5", True), ("\\sqrt3", "\\sqrt{3}", True),
    ("90^\\circ", "90", True), ("10\\%", "10", True), ("\\$5", "5", True),
    ("5 \\text{ cm}", "5", True), ("2", "3", False),
    ("\\frac", "\\frac", True),       # d1's normalisation raises: raw strings compared
    ("a/b", "a/b", True), ("a/b", "\\frac{a}{b}", False),
])
def test_d1_equivalence_rules(a, b, equal):
    assert math_equiv.d1_equiv(a, b) is equal


def test_eval_equivalence_float_branch():
    assert math_equiv.d1_eval_equiv(0.5, "0.5000001")
    assert not math_equiv.d1_eval_equiv(0.5, "half")
    assert math_equiv.d1_equiv(None, None) and not math_equiv.d1_equiv("1", None)


def test_normalisation_is_fast_on_long_input():
    t0 = time.perf_counter()
    for s in ["\\frac" * 20000, "\\sqrt{" * 20000, "1/" * 50000, "\\text{ " * 9000]:
        math_equiv.d1_equiv(s, s + "x")
    assert time.perf_counter() - t0 < 1.0


def test_math_verify_missing_gives_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import now fails
    with pytest.raises(ImportError, match="pip install math-verify"):
        math500.make_task(equivalence="math_verify")
    with pytest.raises(ValueError, match="equivalence"):
        math500.make_task(equivalence="sympy")


def test_worker_time_limit_kills_a_hanging_call():
    worker = math_equiv.TimeLimitedWorker(timeout_s=1.0)
    try:
        t0 = time.perf_counter()
        assert worker.call(time.sleep, 30, default="timed out") == "timed out"
        assert time.perf_counter() - t0 < 10
        assert worker.call(abs, -3) == 3  # a fresh worker after the kill
    finally:
        worker.close()


def test_math_verify_backend():
    pytest.importorskip("math_verify", reason="optional package math-verify is not installed")
    task = math500.make_task(equivalence="math_verify", timeout_s=20.0)
    rec = {"question": "q", "generations": "so \\boxed{0.50}", "ground_truth": "\\frac{1}{2}"}
    assert task.verdict(rec).correct                        # d1's rules say no
    assert not math500.make_task().verdict(rec).correct
    rec["generations"] = "\\boxed{__import__('os').system('false')}"
    assert not task.verdict(rec).correct


def test_loaders_on_local_files(tmp_path):
    import json
    rows = [{"problem": "1+1?", "solution": "It is $\\boxed{2}$.", "answer": "2"}]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (loaded,) = math500.load_test(tmp_path / "m.jsonl")
    assert loaded == rows[0] and math500.ground_truth(loaded) == "2"
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q"}))
    with pytest.raises(ValueError, match="problem"):
        math500.load_train(tmp_path / "bad.jsonl")


@pytest.mark.parametrize("row, problem", [
    ({"problem": "1+1?", "solution": "It is \\boxed{2"},  # unbalanced: d1's parser fails
     "no reference answer: solution 'It is \\\\boxed{2' has no complete \\boxed{} "
     "and answer is None"),
    ({"problem": "", "answer": "2"}, "problem is empty"),
    ({"problem": "1+1?", "answer": 2}, "answer 2 is not a string"),
    ({"question": "1+1?", "answer": "2"}, "need 'problem' and 'solution' or 'answer'"),
])
def test_bad_record_names_file_line_and_problem(tmp_path, row, problem):
    import json
    from d1jax.tasks import BadRecordError
    path = tmp_path / "m.jsonl"
    good = {"problem": "1+1?", "solution": "It is $\\boxed{2}$.", "answer": "2"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    for load in (math500.load_train, math500.load_test):
        with pytest.raises(BadRecordError) as e:
            load(path)
        assert str(e.value).startswith(f"MATH data {path} line 2: ") and problem in str(e.value)


def test_eval_needs_the_answer_column_it_scores_against(tmp_path):
    """Training reads the solution's box; evaluation reads ``answer`` when present."""
    import json
    from d1jax.tasks import BadRecordError
    row = {"problem": "1+1?", "solution": "It is $\\boxed{2}$.", "answer": " "}
    (tmp_path / "m.jsonl").write_text(json.dumps(row) + "\n")
    assert math500.ground_truth(math500.load_train(tmp_path / "m.jsonl")[0]) == "2"
    with pytest.raises(BadRecordError, match=r"m\.jsonl line 1: answer ' ' is empty"):
        math500.load_test(tmp_path / "m.jsonl")
