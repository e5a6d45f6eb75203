"""GSM8K (Hugging Face ``openai/gsm8k``, config ``main``).

Training (diffu-grpo): d1's XML system prompt, five rewards summed with weight 1:

  =========================  ==================================================  ==========
  reward                     rule                                                range
  =========================  ==================================================  ==========
  xmlcount_reward_func       0.125 per well-placed tag, minus 0.001 per          (-inf, 0.5]
                             character after the closing tags
  soft_format_reward_func    ``<reasoning>..</reasoning> <answer>..</answer>``   {0, 0.5}
  strict_format_reward_func  the exact newline layout, nothing after             {0, 0.5}
  int_reward_func            the answer is all digits (``str.isdigit``)          {0, 0.5}
  correctness_reward_func    the answer equals the ``####`` answer (as strings)  {0, 2.0}
  =========================  ==================================================  ==========

Evaluation (eval/gsm8k.py, eval/parse_and_get_acc.py): the first ``\\boxed{..}`` that
parses as a number, else the last number in the first ``<answer>``; compared to the
reference as floats, exactly (``43,500`` reads as 43, as in d1).
"""

from __future__ import annotations

import re
from typing import Any

from d1jax.tasks import rewards
from d1jax.tasks import sources
from d1jax.tasks.base import XML_SYSTEM_PROMPT, Example, Task, Verdict, batched, user_turn

HUB_ID, HUB_CONFIG = "openai/gsm8k", "main"

# eval/gsm8k.py GSM_SYSTEM_PROMPT (note the space after "\boxed{}.").
EVAL_SYSTEM_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. "
    "Wrap the final answer in a \\boxed{}. \n"
    "Respond in the following format:\n"
    "<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>")

_STRICT_FORMAT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")
_REFERENCE = re.compile(r"####\s*\$?([\d,]+(?:\.\d+)?)")
_NUMBER = re.compile(r"-?\d+\.?\d*")
_DOTS = re.compile(r"^\.+$")


def extract_hash_answer(solution: str) -> str | None:
    """d1's training answer: the text after the first ``####``, stripped."""
    return solution.split("####")[1].strip() if "####" in solution else None


def reference_value(solution: str) -> float | None:
    """d1's evaluation answer (``Parser.extract_answer_gsm8k``): the number after ``####``."""
    m = _REFERENCE.search(solution)
    return float(m.group(1).replace(",", "")) if m else None


# ---------------------------------------------------------------------------- rewards


def count_xml(text: str) -> float:
    """d1's ``count_xml``: 0.125 per tag found exactly once, minus 0.001 per character
    after the answer tags (can go below zero on long tails)."""
    score = 0.0
    if text.count("<reasoning>\n") == 1:
        score += 0.125
    if text.count("\n</reasoning>\n") == 1:
        score += 0.125
    if text.count("\n<answer>\n") == 1:
        score += 0.125 - len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        score += 0.125 - (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return score


def soft_format_ok(text: str) -> bool:
    """``re.match(r"<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>", text)``, linear time.

    ``.`` stops at newlines, so ``</reasoning>`` must be on the first line and
    ``</answer>`` on the line of its ``<answer>``; ``\\s*`` may span lines.
    """
    if not text.startswith("<reasoning>"):
        return False
    first_eol = _eol(text, 0)
    pos, seen_from, seen_to = len("<reasoning>"), -1, -1
    while (end := text.find("</reasoning>", pos, first_eol)) >= 0:
        a = end + len("</reasoning>")
        while a < len(text) and text[a].isspace():
            a += 1
        if text.startswith("<answer>", a):
            start = a + len("<answer>")
            if not seen_from <= start < seen_to:  # else already searched: no </answer> there
                stop = _eol(text, start)
                if text.find("</answer>", start, stop) >= 0:
                    return True
                seen_from, seen_to = start, stop
        pos = end + 1
    return False


def _eol(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def xmlcount_reward_func(completion: str, example: Example) -> float:
    return count_xml(completion)


def soft_format_reward_func(completion: str, example: Example) -> float:
    return 0.5 if soft_format_ok(completion) else 0.0


def strict_format_reward_func(completion: str, example: Example) -> float:
    return 0.5 if _STRICT_FORMAT.match(completion) else 0.0


def int_reward_func(completion: str, example: Example) -> float:
    return 0.5 if rewards.split_answer(completion).isdigit() else 0.0


def correctness_reward_func(completion: str, example: Example) -> float:
    return 2.0 if rewards.split_answer(completion) == example["answer"] else 0.0


REWARD_FUNCS = tuple(batched(f) for f in (xmlcount_reward_func, soft_format_reward_func,
                                          strict_format_reward_func, int_reward_func,
                                          correctness_reward_func))

# ---------------------------------------------------------------------------- evaluation


def _boxed_contents(text: str):
    """Contents of ``re.findall(r"\\\\boxed{(.*?)}", text)`` in linear time."""
    pos = 0
    while (i := text.find("\\boxed{", pos)) >= 0:
        start = i + len("\\boxed{")
        eol = _eol(text, start)
        close = text.find("}", start, eol)
        if close < 0:
            pos = eol  # no later box on this line can close either
            continue
        yield text[start:close]
        pos = close + 1


def _number(text: str, last: bool) -> float | None:
    try:
        return float(text)
    except ValueError:
        found = _NUMBER.findall(text)
        return float(found[-1 if last else 0]) if found else None


def parse_answer(text: str) -> float | None:
    """d1's ``parse_gsm_answers`` extraction for one generation."""
    for content in _boxed_contents(text):
        content = content.strip()
        if content and not _DOTS.match(content):
            value = _number(content, last=False)
            if value is not None:
                return value
    answer = rewards.first_answer(text)
    if answer is not None and answer.strip():
        return _number(answer.strip(), last=True)
    return None


def verdict(record: dict) -> Verdict:
    """Judges one item ``{"question", "generations", "ground_truth"}`` as d1 does."""
    truth = record.get("ground_truth")
    if isinstance(truth, str):  # d1 writes floats; accept numeric strings too
        try:
            truth = float(truth.replace(",", ""))
        except ValueError:
            pass
    parsed = parse_answer(record.get("generations", ""))
    ok = parsed is not None and parsed == truth
    return Verdict(extracted=parsed, correct=ok, hits=float(ok), total=1)


# ---------------------------------------------------------------------------- data


def _normalize(row: dict) -> Example:
    if "question" not in row or "answer" not in row:
        raise ValueError(f"GSM8K row needs 'question' and 'answer' (openai/gsm8k schema); "
                         f"got keys {sorted(map(str, row))}")
    key = "solution" if "####" in str(row.get("solution", "")) else "answer"
    question, raw = row["question"], row[key]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question {sources.show(question)} is not a non-empty string")
    if not isinstance(raw, str):
        raise ValueError(f"{key} {sources.show(raw)} is not a string")
    final = extract_hash_answer(raw)
    # The training reward compares with the text after ####; it must hold a number.
    if final is None or not _NUMBER.search(final):
        raise ValueError(f"{key} has no '#### <number>' final answer: {sources.show(raw[-60:])}")
    return {"question": question, "answer": final, "solution": raw}


def load_train(source=None, split: str = "train", cache_dir: str | None = None) -> list[Example]:
    """Rows ``{"question", "answer" (text after ####), "solution" (full)}``."""
    rows = sources.load_rows(source, split=split, default_hub=HUB_ID, hub_config=HUB_CONFIG,
                             cache_dir=cache_dir)
    return sources.check_rows("gsm8k", rows, _normalize)


def load_test(source=None, split: str = "test", cache_dir: str | None = None) -> list[Example]:
    """d1's evaluation set: all of ``openai/gsm8k`` test (1319 questions)."""
    return load_train(source, split=split, cache_dir=cache_dir)


def build_messages(example: Example) -> list[dict]:
    return user_turn(XML_SYSTEM_PROMPT + "\n\n" + example["question"])


def build_eval_messages(example: Example) -> list[dict]:
    return user_turn(EVAL_SYSTEM_PROMPT + "\n\n" + example["question"])


def record(example: Example, generation: str) -> dict[str, Any]:
    solution = example.get("solution") or f"#### {example['answer']}"
    return {"question": example["question"], "generations": generation,
            "ground_truth": reference_value(solution)}


def ground_truth(example: Example) -> str | None:
    return example["answer"]


def make_task() -> Task:
    return Task(name="gsm8k", system_prompt=XML_SYSTEM_PROMPT, reward_funcs=REWARD_FUNCS,
                reward_weights=(1.0,) * len(REWARD_FUNCS), build_messages=build_messages,
                correct_reward=4, correct_at=2.0,  # correctness_reward_func: 2.0 or 0
                eval_system_prompt=EVAL_SYSTEM_PROMPT, build_eval_messages=build_eval_messages,
                record=record, verdict=verdict, load_train=load_train, load_test=load_test,
                ground_truth=ground_truth)
