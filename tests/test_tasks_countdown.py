"""Countdown: d1's reward and eval parser on hand-made cases (with the safe evaluator's
documented refusals), generated instances checked by an independent brute-force solver,
and the test set's loading, order and disjointness."""

import itertools
import json
import operator
import time
from fractions import Fraction

import pytest

from d1jax.tasks import countdown


# (completion, numbers, target, d1's reward) computed once by running d1's
# diffu-grpo/reward_func.py compute_score (scratch dir, not committed).
D1_REWARDS = [
    ("<answer>3*5+7</answer>", [3, 5, 7], 22, 1.0),
    ("", [3, 5, 7], 22, 0.0),                                  # no answer
    ("<answer></answer>", [3, 5, 7], 22, 0.1),                 # empty answer
    ("<answer>3*5+7 = 22</answer>", [3, 5, 7], 22, 0.1),       # extra number (the target)
    ("<answer>1/(4-4)</answer>", [4, 4, 1], 1, 0.1),           # division by zero
    ("<answer>3*5+7+7</answer>", [3, 5, 7], 22, 0.1),          # a number repeated
    ("<answer>3*5</answer>", [3, 5, 7], 22, 0.1),              # a number unused
    ("<answer>\u0663*\u0665+\u0667</answer>", [3, 5, 7], 22, 0.1),  # non-ASCII digits
    ("<answer>__import__('os').system('echo hi')</answer>", [3, 5, 7], 22, 0.1),
    ("<answer>(3*5)+7</answer>\n<answer>3+5+7</answer>", [3, 5, 7], 22, 0.1),  # last tag counts
    ("<answer><answer>3*5+7</answer></answer>", [3, 5, 7], 22, 0.1),  # nested
    ("<answer>\n(7 + 3 * 5)\n</answer>", [3, 5, 7], 22, 1.0),
    ("<answer>(1/3)*3</answer>", [1, 3, 3], 1, 1.0),           # float arithmetic, as eval
    ("<answer>3*5+7", [3, 5, 7], 22, 0.0),                     # unclosed tag
    ("<answer>3 5 7</answer>", [3, 5, 7], 22, 0.1),
    ("<answer>(3)(5)+7</answer>", [3, 5, 7], 22, 0.1),
]
# Where d1's eval() would run ** or //, the safe evaluator refuses: 0.1 (d1: 1.0).
SAFE_DEVIATIONS = [
    ("<answer>2**10+3</answer>", [2, 10, 3], 1027, 0.1),
    ("<answer>15//2+3*5</answer>", [15, 2, 3, 5], 22, 0.1),
    ("<answer>9**9**9</answer>", [9, 9, 9], 1, 0.1),            # d1's eval would not finish
]


@pytest.mark.parametrize("text, nums, target, expected", D1_REWARDS + SAFE_DEVIATIONS)
def test_reward(text, nums, target, expected):
    t0 = time.perf_counter()
    reward = countdown.REWARD_FUNCS[0]([text], [{"nums": nums, "target": target}])[0]
    assert reward == expected
    assert time.perf_counter() - t0 < 0.1


# d1's rule on the numbers (reward_func.py validate_equation, and eval/parse_and_get_acc.py's
# own copy): sorted(integers written in the answer) == sorted(given numbers), i.e. each given
# number used exactly as many times as it is given, and no other number. Every answer below
# reaches its target exactly, so that rule alone decides: 1.0 when it holds, 0.1 when not
# (written from the rule; d1's compute_score gives the same, run once in a scratch dir).
# (answer, numbers, target, d1's reward, what the case isolates)
COUNT_RULE = [
    ("7+7+3+5", [3, 5, 7], 22, 0.1, "a given number used twice"),
    ("3*5", [3, 5, 7], 15, 0.1, "a given number left out"),
    ("3*5+7*1", [3, 5, 7], 22, 0.1, "a number that was not given"),
    ("4+4+1+0", [4, 4, 1], 9, 0.1, "a zero that was not given"),
    ("4+1", [4, 4, 1], 5, 0.1, "a number given twice used once"),
    ("4*4", [4, 4, 1], 16, 0.1, "the once-given number left out"),
    ("(4+4)*(1+4-4)", [4, 4, 1], 8, 0.1, "a number given twice used three times"),
    ("4*4*1", [4, 4, 1], 16, 1.0, "a number given twice used twice"),
    ("1+4*4", [4, 4, 1], 17, 1.0, "any order"),
    ("5+7+3", [3, 5, 7], 15, 1.0, "each once"),
]


@pytest.mark.parametrize("answer, nums, target, expected, case", COUNT_RULE,
                         ids=[c[-1] for c in COUNT_RULE])
def test_each_given_number_is_used_exactly_as_often_as_given(answer, nums, target, expected,
                                                             case):
    assert eval(answer) == target  # our own constant, not model text: the value is right
    example = {"nums": nums, "target": target}
    assert countdown.countdown_reward_func(f"<answer>\n{answer}\n</answer>", example) == expected
    # The evaluation parser applies the same rule to the boxed expression.
    record = {"question": "", "generations": f"\\boxed{{{answer}}}",
              "ground_truth": [nums, target]}
    assert countdown.verdict(record).correct == (expected == 1.0)


# (generation, extracted, correct) for Numbers [3, 5, 7], Target 22, from d1's
# eval/parse_and_get_acc.py parse_countdown_answers.
D1_EVAL = [
    ("\\boxed{3 \\times 5 + 7}", "3 * 5 + 7", True),
    ("\\boxed{3*5+7 = 22}", "3*5+7", True),
    ("<answer>3*5+7</answer>", "<answer>3*5+7</answer>", False),  # no box: the whole text
    ("\\boxed{3*5+7", "\\boxed{3*5+7", False),                   # unbalanced
    ("3*5+7", "3*5+7", True),
    ("\\boxed{7+5*3}\\boxed{1}", "1", False),
]


@pytest.mark.parametrize("text, extracted, correct", D1_EVAL)
def test_eval_parser_equals_d1(text, extracted, correct):
    for truth in ([[3, 5, 7], 22], "[[3, 5, 7], 22]"):  # a non-list falls back to the question
        rec = {"question": "Numbers: [3, 5, 7]\nTarget: 22", "generations": text, "ground_truth": truth}
        v = countdown.verdict(rec)
        assert (v.extracted, v.correct) == (extracted, correct)


def brute_force(nums, target) -> bool:
    """Independent reference: every order of the numbers, both bracketings, all operators."""
    ops = [operator.add, operator.sub, operator.mul,
           lambda a, b: a / b if b != 0 else None]
    for a, b, c in itertools.permutations([Fraction(n) for n in nums]):
        for f, g in itertools.product(ops, repeat=2):
            for value in (_apply(g, _apply(f, a, b), c), _apply(g, a, _apply(f, b, c))):
                if value is not None and value == target:
                    return True
    return False


def _apply(op, a, b):
    return None if a is None or b is None else op(a, b)


def test_generated_instances_are_solvable_and_distinct():
    rows = countdown.generate_instances(300, seed=5)
    assert len({countdown.instance_key(r) for r in rows}) == 300
    for r in rows:
        assert len(r["nums"]) == 3 and all(1 <= n <= 100 for n in r["nums"])
        assert 1 <= r["target"] <= 100
        assert brute_force(r["nums"], r["target"])
        expr = countdown.solve(r["nums"], r["target"])
        assert countdown.countdown_reward_func(f"<answer>{expr}</answer>", r) == 1.0


def test_generator_is_deterministic():
    assert countdown.generate_instances(30, seed=1) == countdown.generate_instances(30, seed=1)
    assert countdown.generate_instances(30, seed=1) != countdown.generate_instances(30, seed=2)


def test_unsolvable_has_no_solution():
    assert countdown.solve([1, 1, 1], 100) is None and not brute_force([1, 1, 1], 100)


def test_test_set_order_and_solutions(shared_d1):
    rows = countdown.load_test(shared_d1 / countdown.TEST_FILE)
    assert len(rows) == 256
    shard = json.loads((shared_d1 / "eval_baselines" / "countdown_instruct_256_128_0_generations.json").read_text())
    assert [g["ground_truth"] for g in shard["generations"]] == \
        [[r["nums"], r["target"]] for r in rows[0::7]]  # d1's seeded order, shard 0
    for r in rows:
        expr = countdown.ground_truth(r)  # every test instance is solvable
        assert expr is not None and brute_force(r["nums"], r["target"])
        assert countdown.countdown_reward_func(f"<answer>\n{expr}\n</answer>", r) == 1.0


def test_train_set_disjoint_from_test_set(shared_d1):
    test_file = shared_d1 / countdown.TEST_FILE
    test = {countdown.instance_key(r) for r in countdown.load_test(test_file, subsample=None)}
    train = countdown.load_train(n=2000, seed=0, test_source=test_file)
    assert len(train) == 2000 and not test & {countdown.instance_key(r) for r in train}


def test_local_sources(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"nums": [1, 2, 3], "target": 6}\n{"input": "4,5,6", "output": "15"}\n')
    assert countdown.load_train(tmp_path / "t.jsonl") == [{"nums": [1, 2, 3], "target": 6},
                                                         {"nums": [4, 5, 6], "target": 15}]
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match="nums"):
        countdown.load_train(tmp_path / "bad.jsonl")


def test_d1_holdout_equals_datasets_shuffle(monkeypatch):
    """source="d1": d1 shuffles with datasets' Dataset.shuffle(seed=42) and drops the last
    500 rows; checked against datasets itself, on a stand-in for the Hub dataset."""
    import datasets
    from d1jax.tasks import sources
    rows = [{"nums": [i % 97 + 1, 2, 3] + ([4] if i % 5 == 0 else []), "target": i % 100 + 1}
            for i in range(800)]
    monkeypatch.setattr(sources, "_from_hub", lambda name, config, split, cache_dir: rows)
    three = [r for r in rows if len(r["nums"]) == 3]
    expected = datasets.Dataset.from_list(three).shuffle(seed=42)
    expected = expected.select(range(len(three) - 500)).to_list()
    assert countdown.load_train("d1") == expected


BAD_COUNTDOWN_ROWS = [  # (jsonl line, what the error must say)
    ('{"nums": "1,2,3", "target": 6}', "nums '1,2,3' is not a non-empty list of integers"),
    ('{"nums": [], "target": 6}', "nums [] is not a non-empty list of integers"),
    ('{"numbers": [1, 2.5, 3], "target": 6}', "numbers [1, 2.5, 3] is not a non-empty list"),
    ('{"nums": [1, 2, 3], "target": "6"}', "target '6' is not an integer"),
    ('{"nums": [1, 2, 3], "target": null}', "target None is not an integer"),
    ('{"nums": [1, 2, 3]}', "need nums (or numbers) and target"),
    ('{"input": "30,,93", "output": "23"}', "input '30,,93' is not comma-separated integers"),
    ('{"input": "30,100,93", "output": "x"}', "output 'x' is not an integer"),
]


@pytest.mark.parametrize("line, problem", BAD_COUNTDOWN_ROWS)
def test_bad_record_names_file_line_and_problem(tmp_path, line, problem):
    from d1jax.tasks import BadRecordError
    path = tmp_path / "t.jsonl"
    path.write_text('{"nums": [1, 2, 3], "target": 6}\n' + line + "\n")
    for load in (countdown.load_train, lambda p: countdown.load_test(p, subsample=None)):
        with pytest.raises(BadRecordError) as e:
            load(path)
        assert str(e.value).startswith(f"countdown data {path} line 2: ")
        assert problem in str(e.value)

