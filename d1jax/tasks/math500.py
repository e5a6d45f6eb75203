"""MATH: d1 trains on ``ankner/math-500`` (train split) and evaluates on
``HuggingFaceH4/MATH-500`` (test split, 500 problems).

Training rewards (diffu-grpo/reward_func.py), weights 1:

  ====================================  ===============================================  ========
  reward                                rule                                             range
  ====================================  ===============================================  ========
  correctness_reward_func_math          last ``\\boxed{}`` of the completion equals the  {0, 2.0}
                                        last ``\\boxed{}`` of the reference solution
  boxed_and_answer_tags_format_reward   0.5 * (1 if ``<answer>`` present, else 0         {0.25, 0.5,
                                        + 1 if the answer holds the box marker else 0.5)  0.75, 1.0}
  ====================================  ===============================================  ========

d1 spells the box marker ``"\\boxed"`` in a non-raw string, where ``\\b`` is a backspace:
its check looks for ``"\\x08oxed"`` and practically never fires, so its format reward is
0.25 or 0.75. We keep d1's value (``D1_BOX_MARKER``); ``make_task(box_marker="\\\\boxed")``
gives the evidently intended check.

Evaluation (eval/parse_and_get_acc.py): the last brace-balanced ``\\boxed{}`` (else the
first ``<answer>`` content), equal to the reference answer after Hendrycks normalisation.
``equivalence="math_verify"`` swaps the comparison for ``math-verify``'s (optional).
"""

from __future__ import annotations

import functools
from typing import Any

from d1jax.tasks import rewards
from d1jax.tasks import math_equiv, sources
from d1jax.tasks.base import XML_SYSTEM_PROMPT, Example, Task, Verdict, batched, user_turn

TRAIN_HUB_ID, TEST_HUB_ID = "ankner/math-500", "HuggingFaceH4/MATH-500"

# diffu-grpo/data_utils.py get_math_questions: text between the system prompt and problem.
TRAIN_INSTRUCTION = ("You are a math expert. You will be given a question to solve. Solve it "
                     "step by step. Wrap the final answer in a \\boxed{}. \n\n")

# eval/math500.py MATH500_SYSTEM_PROMPT, stray quote after </answer> included.
EVAL_SYSTEM_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. "
    "Wrap the final answer in a \\boxed{}.\n"
    "Respond in the following format:\n"
    "<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>\" \n")

D1_BOX_MARKER = "\x08oxed"  # what d1's "\boxed" literal is (backspace + "oxed")
EQUIVALENCES = ("d1", "math_verify")


def _equal(equivalence: str, timeout_s: float, train: bool):
    if equivalence == "math_verify":
        math_equiv.require_math_verify()  # when the task is built, not at the first score
        return functools.partial(_math_verify, timeout_s=timeout_s)
    return math_equiv.d1_equiv if train else math_equiv.d1_eval_equiv


def _math_verify(gold, pred, timeout_s: float) -> bool:
    return math_equiv.math_verify_equiv(None if gold is None else str(gold),
                                        None if pred is None else str(pred), timeout_s)


# ---------------------------------------------------------------------------- rewards


def ground_truth(example: Example) -> str | None:
    """d1's training target: the last ``\\boxed{}`` of ``solution`` (the ``answer`` column
    when there is no solution, or where d1's extraction would crash on it)."""
    if "solution" in example:
        boxed = rewards.boxed_answer(example["solution"])
        if boxed is not None:
            return boxed
    return example.get("answer")


def make_correctness_reward(equivalence: str = "d1", timeout_s: float = 5.0):
    equal = _equal(equivalence, timeout_s, train=True)

    def correctness_reward_func_math(completion: str, example: Example) -> float:
        """2.0 if the completion's last box matches the reference's, else 0.0."""
        pred = rewards.boxed_answer(completion)
        return 2.0 if equal(ground_truth(example), completion if pred is None else pred) else 0.0
    return correctness_reward_func_math


def make_format_reward(box_marker: str = D1_BOX_MARKER):
    def boxed_and_answer_tags_format_reward(completion: str, example: Example) -> float:
        """0.5 * (answer tag present + (1.0 if the marker is in the answer else 0.5))."""
        score, answer = 0.0, completion
        if "<answer>" in completion:
            answer = completion.split("<answer>")[1].split("</answer>")[0]
            score += 1.0
        score += 1.0 if box_marker in answer else 0.5
        return 0.5 * score
    return boxed_and_answer_tags_format_reward


# ---------------------------------------------------------------------------- evaluation


def parse_answer(text: str) -> str | None:
    """d1's ``parse_math_answers`` extraction: last box, else first ``<answer>`` content."""
    parsed = rewards.boxed_answer(text)
    if not parsed:
        tag = rewards.first_answer(text)
        if tag is not None:
            parsed = tag.strip()
    return parsed


def make_verdict(equivalence: str = "d1", timeout_s: float = 5.0):
    equal = _equal(equivalence, timeout_s, train=False)

    def verdict(record: dict) -> Verdict:
        parsed = parse_answer(record.get("generations", ""))
        ok = parsed is not None and equal(parsed, record.get("ground_truth", ""))
        return Verdict(extracted=parsed, correct=ok, hits=float(ok), total=1)
    return verdict


# ---------------------------------------------------------------------------- data


def _check_row(row: dict, for_eval: bool = False) -> Example:
    """A MATH row has a problem and the reference its path reads: training uses
    ``ground_truth`` (the solution's last \\boxed{}, else the answer), evaluation the
    ``answer`` column when there is one (``record``)."""
    if "problem" not in row or not ({"solution", "answer"} & row.keys()):
        raise ValueError(f"MATH rows need 'problem' and 'solution' or 'answer'; "
                         f"got keys {sorted(map(str, row))}")
    for key in ("problem", "solution", "answer"):
        if key in row and not isinstance(row[key], str):
            raise ValueError(f"{key} {sources.show(row[key])} is not a string")
    if not row["problem"].strip():
        raise ValueError("problem is empty")
    if for_eval and "answer" in row:
        if not row["answer"].strip():
            raise ValueError(f"answer {sources.show(row['answer'])} is empty (evaluation "
                             f"scores against it)")
    elif not (ground_truth(row) or "").strip():  # None: an unbalanced box, no answer
        raise ValueError(f"no reference answer: solution {sources.show(row.get('solution'))} "
                         f"has no complete \\boxed{{}} and answer is "
                         f"{sources.show(row.get('answer'))}")
    return dict(row)


def load_train(source=None, split: str = "train", cache_dir: str | None = None) -> list[Example]:
    """d1's MATH training rows (``problem``, ``solution``, ...)."""
    rows = sources.load_rows(source, split=split, default_hub=TRAIN_HUB_ID, cache_dir=cache_dir)
    return sources.check_rows("MATH", rows, _check_row)


def load_test(source=None, split: str = "test", cache_dir: str | None = None) -> list[Example]:
    """MATH-500 (``problem``, ``solution``, ``answer``, ...), d1's evaluation set."""
    rows = sources.load_rows(source, split=split, default_hub=TEST_HUB_ID, cache_dir=cache_dir)
    return sources.check_rows("MATH", rows, functools.partial(_check_row, for_eval=True))


def build_messages(example: Example) -> list[dict]:
    return user_turn(f"{XML_SYSTEM_PROMPT}\n\n{TRAIN_INSTRUCTION}{example['problem']}")


def build_eval_messages(example: Example) -> list[dict]:
    return user_turn(EVAL_SYSTEM_PROMPT + "\n\n" + example["problem"])


def record(example: Example, generation: str) -> dict[str, Any]:
    truth = example["answer"] if "answer" in example else ground_truth(example)
    return {"question": example["problem"], "generations": generation, "ground_truth": truth}


def make_task(equivalence: str = "d1", timeout_s: float = 5.0,
              box_marker: str = D1_BOX_MARKER) -> Task:
    """MATH as d1 runs it. ``equivalence``: "d1" (string rules) or "math_verify"."""
    if equivalence not in EQUIVALENCES:
        raise ValueError(f"equivalence={equivalence!r}: must be one of {EQUIVALENCES}")
    if equivalence == "math_verify":
        math_equiv.require_math_verify()
    funcs = (batched(make_correctness_reward(equivalence, timeout_s)),
             batched(make_format_reward(box_marker)))
    return Task(name="math500", system_prompt=XML_SYSTEM_PROMPT, reward_funcs=funcs,
                reward_weights=(1.0, 1.0), build_messages=build_messages,
                eval_system_prompt=EVAL_SYSTEM_PROMPT, build_eval_messages=build_eval_messages,
                record=record, verdict=make_verdict(equivalence, timeout_s),
                load_train=load_train, load_test=load_test, ground_truth=ground_truth,
                correct_reward=0)
