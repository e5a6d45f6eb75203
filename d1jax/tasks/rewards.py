"""Safe text helpers shared by the task rewards and the scorer.

d1 reads answers out of model text with a handful of rules: ``<answer>`` tags, the last
``\\boxed{}``, and for Countdown an arithmetic expression that it runs through ``eval``.
This module gives the same answers in linear time (d1's regexes backtrack quadratically on
some inputs) and evaluates arithmetic by walking a whitelisted syntax tree, so model text is
never executed.
"""

from __future__ import annotations

import ast
import operator
import re

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# ---------------------------------------------------------------------------- answer tags


def split_answer(text: str) -> str:
    """Text after the last ``<answer>`` and before the next ``</answer>``, stripped.

    d1's ``extract_xml_answer`` (GSM8K training rewards): with no tags at all it is the
    whole text, stripped.
    """
    return text.split(ANSWER_OPEN)[-1].split(ANSWER_CLOSE)[0].strip()


def answer_spans(text: str) -> list[str]:
    """Contents of every ``<answer>...</answer>`` pair, unstripped, left to right.

    Same result as ``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)``: each match
    runs from an opening tag to the first closing tag after it.
    """
    spans, pos = [], 0
    while (start := text.find(ANSWER_OPEN, pos)) >= 0:
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            break
        spans.append(text[start + len(ANSWER_OPEN):end])
        pos = end + len(ANSWER_CLOSE)
    return spans


def first_answer(text: str) -> str | None:
    """First ``<answer>...</answer>`` content (``re.search`` in d1's eval parsers), or None."""
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return None
    end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
    return None if end < 0 else text[start + len(ANSWER_OPEN):end]


def last_answer(text: str) -> str | None:
    """Last ``<answer>...</answer>`` content (d1's training ``extract_solution``), or None."""
    spans = answer_spans(text)
    return spans[-1] if spans else None


# ---------------------------------------------------------------------------- \boxed{}


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (brace-balanced) of ``text``, as the Hendrycks MATH code.

    Quirks kept from d1 (parser_helper.py): ``\\boxed `` (with a space) wins and runs to the
    next ``$``; ``\\fbox`` is the fallback; with neither the whole text comes back; an
    unbalanced box gives None.
    """
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return text
    depth = 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[idx:i + 1]
    return None


def remove_boxed(boxed: str) -> str:
    """Content of ``\\boxed{...}`` / ``\\boxed ...``; other strings come back unchanged."""
    if "\\boxed " in boxed:
        if not boxed.startswith("\\boxed "):
            raise ValueError(f"'\\boxed ' not at the start of {boxed[:40]!r}")
        return boxed[len("\\boxed "):]
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{"):-1]
    return boxed


def boxed_answer(text: str) -> str | None:
    """``remove_boxed(last_boxed_only_string(text))``, or None where d1's call raises.

    Without any box this is the whole text (d1's behaviour); None means an unbalanced box.
    """
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed)


# ---------------------------------------------------------------------------- arithmetic

# d1's character whitelist for Countdown expressions (it admits ``**`` and ``//``, which
# the evaluator below refuses).
_D1_ARITH_CHARS = re.compile(r"^[\d+\-*/().\s]+$")
_NUMBER = re.compile(r"\d+")

MAX_EXPR_CHARS = 1000  # longer expressions are refused unparsed
MAX_EXPR_NODES = 256  # syntax-tree nodes
MAX_MAGNITUDE = 1e15  # any operand or intermediate result beyond this is refused

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub,
           ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def d1_arithmetic_chars(expr: str) -> bool:
    """d1's check that ``expr`` holds only digits, ``+-*/().`` and whitespace."""
    return _D1_ARITH_CHARS.match(expr) is not None


def numbers_in(expr: str) -> list[int] | None:
    """The integers written in ``expr`` (runs of ``\\d``, Unicode digits included), as d1's
    ``validate_equation`` reads them; None where ``int()`` fails (over 4300 digits)."""
    try:
        return [int(n) for n in _NUMBER.findall(expr)]
    except ValueError:
        return None


class _Refused(Exception):
    """The expression is outside the whitelist or the limits."""


def _check(value: int | float) -> int | float:
    if value != value or abs(value) > MAX_MAGNITUDE:  # NaN or too large
        raise _Refused(f"magnitude {value!r}")
    return value


def _walk(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        return _check(_BINARY[type(node.op)](left, right))  # ZeroDivisionError propagates
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_walk(node.operand)))
    raise _Refused(type(node).__name__)


def safe_arithmetic(expr: str) -> int | float | None:
    """Value of an arithmetic expression, or None if it is not one we accept.

    Accepted: int/float literals, ``+ - * /`` (binary and unary ``+``/``-``) and
    parentheses, at most ``MAX_EXPR_CHARS`` characters and ``MAX_EXPR_NODES`` nodes, every
    value within ``MAX_MAGNITUDE``. Refused (None): ``**``, ``//``, names, calls, anything
    else; syntax errors; division by zero. Parsing is Python's own (as ``eval`` parses,
    including its stripping of leading spaces and tabs), evaluation a walk over the tree
    with Python's int/float operators, so accepted expressions get ``eval``'s exact value.
    """
    if len(expr) > MAX_EXPR_CHARS:
        return None
    try:
        tree = ast.parse(expr.lstrip(" \t"), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if sum(1 for _ in ast.walk(tree)) > MAX_EXPR_NODES:
        return None
    try:
        return _walk(tree)
    except (_Refused, ZeroDivisionError, OverflowError):
        return None
