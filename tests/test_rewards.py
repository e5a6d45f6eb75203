"""d1jax.tasks.rewards: answer-tag and box extraction against d1's regexes, and the safe
arithmetic evaluator against Python's own arithmetic (never against ``eval`` of model text)."""

import re
import time

import pytest
from hypothesis import given, settings, strategies as st

from d1jax.tasks import rewards

PIECES = ["<answer>", "</answer>", "\n", " ", "x", "1", "{", "}", "\\boxed{", "\\boxed ", "$",
          "\\fbox", "<reasoning>"]
texts = st.lists(st.sampled_from(PIECES), max_size=20).map("".join) | st.text(max_size=30)


@settings(max_examples=300, deadline=None)
@given(texts)
def test_answer_tags_match_d1_regexes(text):
    spans = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert rewards.answer_spans(text) == spans
    assert rewards.last_answer(text) == (spans[-1] if spans else None)
    m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert rewards.first_answer(text) == (m.group(1) if m else None)
    assert rewards.split_answer(text) == text.split("<answer>")[-1].split("</answer>")[0].strip()


@pytest.mark.parametrize("text, boxed", [
    ("a \\boxed{1} b \\boxed{2+{3}} c", "2+{3}"),
    ("no box", "no box"),                      # d1: the whole text comes back
    ("\\boxed{\\frac{1}{2}", None),            # unbalanced: d1's remove_boxed raises
    ("$\\boxed 5$ and more", "5"),             # "\boxed " runs to the next $
    ("\\fbox{7}", "\\fbox{7}"),                # found, but only \boxed{ is unwrapped
    ("\\boxed}{x}", None),                     # closing brace first never balances
])
def test_boxed_answer(text, boxed):
    assert rewards.boxed_answer(text) == boxed


@pytest.mark.parametrize("expr, value", [
    ("3*5+7", 22), ("(1/3)*3", 1.0), ("7 - -2", 9), ("  2+2", 4), ("\n(8)/ 4\n", 2.0),
    ("1.5*2", 3.0), ("+3", 3), ("10/4", 2.5),
])
def test_safe_arithmetic_values(expr, value):
    assert rewards.safe_arithmetic(expr) == value


@pytest.mark.parametrize("expr", [
    "2**10", "9**9**9", "7//2", "1/0", "1/(4-4)", "abs(-1)", "__import__('os')", "x+1",
    "(3)(5)", "3 5", "", "   ", "1e400*1e400", "1" * 20 + "*2", "[1]", "1 if 1 else 2",
    "\u0663+\u0665",  # Arabic-Indic digits: Python's parser rejects them, as d1's eval does
    "(" * 300 + "1" + ")" * 300, "1+" * 600 + "1",
])
def test_safe_arithmetic_refuses(expr):
    t0 = time.perf_counter()
    assert rewards.safe_arithmetic(expr) is None
    assert time.perf_counter() - t0 < 0.1


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.integers(0, 999).map(str),
                    lambda e: st.tuples(e, st.sampled_from("+-*/"), e).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
                    max_leaves=6))
def test_safe_arithmetic_equals_python_arithmetic(expr):
    """Independent reference: recursive evaluation of the fully parenthesised expression
    with Python's operators (None: division by zero or a value past the magnitude limit)."""
    def ref(s):
        if not s.startswith("("):
            return int(s)
        depth, body = 0, s[1:-1]
        for i, ch in enumerate(body):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and ch in "+-*/" and i > 0:
                a, b = ref(body[:i]), ref(body[i + 1:])
                if a is None or b is None or (ch == "/" and b == 0):
                    return None
                value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0}[ch]
                return None if abs(value) > rewards.MAX_MAGNITUDE else value
        raise AssertionError(s)
    assert rewards.safe_arithmetic(expr) == ref(expr)


def test_numbers_in_reads_unicode_digits_like_d1():
    assert rewards.numbers_in("3*5+7") == [3, 5, 7]
    # Every occurrence, in order (Countdown's rule counts them): re.findall(r"\d+", ...).
    assert rewards.numbers_in("7+7*(3-7)") == [7, 7, 3, 7]
    assert rewards.numbers_in("10/05+100") == [10, 5, 100]
    assert rewards.numbers_in("\u0663*\u0665") == [3, 5]  # int() accepts them, as in d1
    assert rewards.numbers_in("1.5") == [1, 5]
    assert rewards.numbers_in("9" * 5000) is None        # beyond int()'s digit limit
    assert rewards.d1_arithmetic_chars("(1+2)*3 / 4")
    assert not rewards.d1_arithmetic_chars("1+a")
