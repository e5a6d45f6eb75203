"""Countdown with three numbers: reach the target with + - * / using each number once.

Reward (diffu-grpo/reward_func.py ``countdown_reward_func``), weight 1, values {0, 0.1, 1}:
0 without an ``<answer>``; 0.1 when the last answer's numbers are not exactly the given
ones, or it does not evaluate, or misses the target; 1.0 when it is within 1e-5 of the
target. d1 evaluates with ``eval``; we use ``rewards.safe_arithmetic`` (the same value for
every expression of + - * / and parentheses; ``**``, ``//`` and oversized expressions are
refused, so they score 0.1 where d1 might give 1.0).

Evaluation (eval/countdown.py, eval/parse_and_get_acc.py): the last ``\\boxed{}`` (with no
box at all, the whole generation; with an unbalanced one, the first ``<answer>``),
``\\div \\times \\cdot`` mapped to ``/ * *``, an ``expr = n`` cut to ``expr``; correct when
the numbers are exactly the given ones and the value is within 1e-5 of the target.

Data: d1's test set is ``dataset/countdown_cd3_test.jsonl`` of its repository (256
instances, evaluated in a seeded order). Training instances come from
``generate_instances`` (none in the test set) unless a source is given; ``source="d1"`` is
d1's own ``Jiayi-Pan/Countdown-Tasks-3to4`` (three-number rows, minus d1's held-out 500).
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from typing import Any, Iterable

from d1jax.tasks import rewards
from d1jax.tasks import sources
from d1jax.tasks.base import XML_SYSTEM_PROMPT, Example, Task, Verdict, batched, user_turn

TEST_FILE, D1_TRAIN_HUB = "countdown_cd3_test.jsonl", "Jiayi-Pan/Countdown-Tasks-3to4"
EVAL_SUBSAMPLE = 256  # d1's eval.py num_evals["countdown"]
CORRECT, WELL_FORMED, NO_ANSWER = 1.0, 0.1, 0.0

# eval/countdown.py CTD_SYSTEM_PROMPT (no newline before "Respond", as in d1).
EVAL_SYSTEM_PROMPT = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to "
    "exactly the provided target number. You may use the operations +, -, *, and / as needed, "
    "but each number must be used exactly once. Think step-by-step. After reasoning, provide "
    "only your final expression inside \\boxed{} tags without including an equals sign or the "
    "target number. For example: \\boxed{a + b * c}Respond in the following format:\n"
    "<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>")


def train_instruction(nums: list[int], target: int) -> str:
    """diffu-grpo/data_utils.py get_countdown_questions, after the system prompt."""
    return (f"Using only the numbers {nums}, create an arithmetic expression that evaluates to "
            f"exactly {target}. You must use all numbers from the list, and each number must be "
            "used exactly once. You may use the operations +, -, *, and / as needed. After "
            "reasoning, provide only your final expression inside <answer></answer> tags without "
            "including an equals sign or the target number. For example, if the numbers are "
            "[2, 3, 4] and the target is 5, a valid answer is: <answer>\n2*4-3\n</answer>")


def uses_exactly(expr: str, nums: Iterable[int]) -> bool:
    """d1's ``validate_equation``: the integers written in ``expr`` are ``nums``."""
    found = rewards.numbers_in(expr)
    return found is not None and sorted(found) == sorted(int(n) for n in nums)


def evaluate(expr: str) -> int | float | None:
    """d1's character whitelist, then the safe evaluator (None: not evaluable)."""
    return rewards.safe_arithmetic(expr) if rewards.d1_arithmetic_chars(expr) else None


def hits_target(expr: str, nums: Iterable[int], target: float) -> bool:
    if not uses_exactly(expr, nums):
        return False
    value = evaluate(expr.strip())
    return value is not None and abs(value - target) < 1e-5


def countdown_reward_func(completion: str, example: Example) -> float:
    """1.0 correct, 0.1 an answer that misses, 0.0 no ``<answer>``."""
    answer = rewards.last_answer(completion)
    if answer is None:
        return NO_ANSWER
    ok = hits_target(answer.strip(), example["nums"], example["target"])
    return CORRECT if ok else WELL_FORMED


REWARD_FUNCS = (batched(countdown_reward_func),)

# ---------------------------------------------------------------------------- evaluation

_EXPR_CHARS = frozenset("0123456789+-*/() ")
_VALUE_CHARS = frozenset("0123456789. ")
_NUMBERS_IN_Q = re.compile(r"Numbers: \[([\d, ]+)\]", re.IGNORECASE)
_TARGET_IN_Q = re.compile(r"Target: (\d+)", re.IGNORECASE)


def _cut_equation(expr: str) -> str:
    """``re.search(r"([0-9+\\-*/() ]+)=[0-9. ]+", expr).group(1).strip()`` if it matches,
    in linear time: the first '=' with an expression run before and a digit after."""
    pos = 0
    while (eq := expr.find("=", pos)) >= 0:
        start = eq
        while start > 0 and expr[start - 1] in _EXPR_CHARS:
            start -= 1
        if start < eq and eq + 1 < len(expr) and expr[eq + 1] in _VALUE_CHARS:
            return expr[start:eq].strip()
        pos = eq + 1
    return expr


def parse_answer(text: str) -> str:
    """d1's ``parse_countdown_answers`` extraction of the expression."""
    expr = rewards.boxed_answer(text)
    if expr is None:  # d1's remove_boxed raised: unbalanced box
        tag = rewards.first_answer(text)
        expr = text if tag is None else tag.strip()
    expr = expr.replace(r"\div", "/").replace(r"\times", "*").replace(r"\cdot", "*")
    return _cut_equation(expr)


def _numbers_and_target(record: dict) -> tuple[list[int], int | None]:
    truth = record.get("ground_truth")
    if isinstance(truth, (list, tuple)) and len(truth) == 2:
        return list(truth[0]), truth[1]
    question = record.get("question", "")
    m, t = _NUMBERS_IN_Q.search(question), _TARGET_IN_Q.search(question)
    nums = [int(v) for v in m.group(1).split(",")] if m else []
    return nums, int(t.group(1)) if t else None


def verdict(record: dict) -> Verdict:
    nums, target = _numbers_and_target(record)
    expr = parse_answer(record.get("generations", ""))
    ok = target is not None and hits_target(expr, nums, target)
    return Verdict(extracted=expr, correct=ok, hits=float(ok), total=1)


# ---------------------------------------------------------------------------- generator


def _reachable(items: list[tuple[Fraction, str]]) -> dict[Fraction, str]:
    """Every value reachable from all of ``items`` (value, expression), one expression each."""
    if len(items) == 1:
        return {items[0][0]: items[0][1]}
    out: dict[Fraction, str] = {}
    for i, (a, ea) in enumerate(items):
        for j, (b, eb) in enumerate(items):
            if i == j:
                continue
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            combos = [(a + b, f"({ea}+{eb})"), (a - b, f"({ea}-{eb})"), (a * b, f"({ea}*{eb})")]
            if b != 0:
                combos.append((a / b, f"({ea}/{eb})"))
            for value, expr in combos:
                for v, e in _reachable(rest + [(value, expr)]).items():
                    out.setdefault(v, e)
    return out


def _pair_values(x, y) -> set:
    out = {x + y, x - y, y - x, x * y}
    if y != 0:
        out.add(Fraction(x) / y)
    if x != 0:
        out.add(Fraction(y) / x)
    return out


def reachable_values(nums: list[int]) -> set:
    """Exact values (ints / Fractions) reachable from three numbers, each used once."""
    a, b, c = nums
    return {w for x, y, z in ((a, b, c), (a, c, b), (b, c, a))
            for v in _pair_values(x, y) for w in _pair_values(v, z)}


def solve(nums: Iterable[int], target: int) -> str | None:
    """An expression using each number once that equals ``target`` exactly, or None."""
    found = _reachable([(Fraction(n), str(n)) for n in nums]).get(Fraction(target))
    return None if found is None else (found[1:-1] if found.startswith("(") else found)


def generate_instances(n: int, seed: int = 0, exclude: Iterable[tuple] = (),
                       max_number: int = 100, max_target: int = 100) -> list[Example]:
    """``n`` distinct solvable instances ``{"nums", "target"}``, none in ``exclude``.

    Deterministic in ``seed``: three numbers uniform in 1..max_number (repeats allowed, as
    in d1's test set), a target uniform among the integers in 1..max_target they reach.
    ``exclude`` holds (sorted numbers tuple, target) pairs, see ``instance_key``.
    """
    rng, seen, out = random.Random(seed), set(exclude), []
    for _ in range(50 * n + 1000):
        if len(out) == n:
            break
        nums = [rng.randint(1, max_number) for _ in range(3)]
        targets = sorted(int(v) for v in reachable_values(nums)
                         if v.denominator == 1 and 1 <= v <= max_target)
        if not targets:
            continue
        row = {"nums": nums, "target": rng.choice(targets)}
        if instance_key(row) not in seen:
            seen.add(instance_key(row))
            out.append(row)
    if len(out) < n:
        raise RuntimeError(f"made only {len(out)} of {n} distinct instances "
                           f"(max_number={max_number}, max_target={max_target})")
    return out


def instance_key(example: Example) -> tuple:
    """Identity of an instance: the numbers as a multiset, and the target."""
    return tuple(sorted(example["nums"])), int(example["target"])


# ---------------------------------------------------------------------------- data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _from_d1_test(row: dict) -> Example:
    """d1's test jsonl: ``{"input": "30,100,93", "output": "23"}``."""
    try:
        nums = [int(v) for v in str(row["input"]).split(",")]
    except ValueError:
        raise ValueError(f"input {sources.show(row['input'])} is not comma-separated "
                         f"integers") from None
    try:
        return {"nums": nums, "target": int(str(row["output"]))}
    except ValueError:
        raise ValueError(f"output {sources.show(row['output'])} is not an integer") from None


def _normalize(row: dict) -> Example:
    if "input" in row and "output" in row:
        return _from_d1_test(row)
    key = "nums" if "nums" in row else "numbers"
    if key not in row or "target" not in row:
        raise ValueError(f"countdown rows need nums (or numbers) and target, or input and "
                         f"output; got keys {sorted(map(str, row))}")
    nums, target = row[key], row["target"]
    if not (isinstance(nums, (list, tuple)) and nums and all(map(_is_int, nums))):
        raise ValueError(f"{key} {sources.show(nums)} is not a non-empty list of integers")
    if not _is_int(target):
        raise ValueError(f"target {sources.show(target)} is not an integer")
    return {"nums": list(nums), "target": target}


def _examples(rows: list) -> list[Example]:
    return sources.check_rows("countdown", rows, _normalize)


def load_test(source=None, subsample: int | None = EVAL_SUBSAMPLE,
              cache_dir: str | None = None) -> list[Example]:
    """d1's test instances, in d1's seeded evaluation order (``subsample=None``: file order)."""
    src = sources.d1_file(TEST_FILE) if source is None else source
    rows = sources.load_rows(src, split="test", cache_dir=cache_dir)
    return sources.d1_eval_subset(_examples(rows), subsample)


def load_train(source=None, split: str = "train", n: int = 10_000, seed: int = 0,
               test_source=None, exclude_test: bool = True,
               cache_dir: str | None = None) -> list[Example]:
    """Training instances: generated (``source=None``; test instances excluded unless
    ``exclude_test=False``), d1's (``source="d1"``), or a local file / directory."""
    if source is None:
        exclude = ([instance_key(r) for r in load_test(test_source, None, cache_dir)]
                   if exclude_test else [])
        return generate_instances(n, seed, exclude=exclude)
    if source == "d1":
        rows = sources.load_rows(D1_TRAIN_HUB, split=split, cache_dir=cache_dir)
        three = [r for r in _examples(rows) if len(r["nums"]) == 3]
        return sources.d1_train_holdout(three)
    return _examples(sources.load_rows(source, split=split, cache_dir=cache_dir))


def build_messages(example: Example) -> list[dict]:
    return user_turn(XML_SYSTEM_PROMPT + "\n" + train_instruction(example["nums"], example["target"]))


def build_eval_messages(example: Example) -> list[dict]:
    return user_turn(EVAL_SYSTEM_PROMPT + "\n\n" + eval_question(example))


def eval_question(example: Example) -> str:
    """The question eval/countdown.py puts after the system prompt."""
    return f"Numbers: {example['nums']}\nTarget: {example['target']}"


def record(example: Example, generation: str) -> dict[str, Any]:
    return {"question": eval_question(example), "generations": generation,
            "ground_truth": [example["nums"], example["target"]]}


def ground_truth(example: Example) -> str | None:
    """A correct expression (``solve``), for examples and checks; None if unsolvable."""
    return solve(example["nums"], example["target"])


def make_task() -> Task:
    return Task(name="countdown", system_prompt=XML_SYSTEM_PROMPT, reward_funcs=REWARD_FUNCS,
                reward_weights=(1.0,), build_messages=build_messages,
                correct_reward=0, correct_at=CORRECT,  # WELL_FORMED (0.1) is not right
                eval_system_prompt=EVAL_SYSTEM_PROMPT, build_eval_messages=build_eval_messages,
                record=record, verdict=verdict, load_train=load_train, load_test=load_test,
                ground_truth=ground_truth)
