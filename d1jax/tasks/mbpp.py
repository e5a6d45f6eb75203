"""MBPP (Hugging Face ``google-research-datasets/mbpp``, config ``full``): 374 training and
500 test problems ``{task_id, text, code, test_list, test_setup_code}``.

Evaluation: evalplus's instruct prompt with MBPP's problem in evalplus's layout (the text and
its first test inside a docstring), the answer prefilled with an open ```python block;
pass@1 = problems whose code passes all of ``test_list`` (after ``test_setup_code``), the
original benchmark's rule. Training: DiffuCoder's prompt and rewards (``code.py``) on the
training split, each assert of ``test_list`` a test of the reward. ``source="toy"`` gives
generated problems for the :tiny configs, offline.
"""

from __future__ import annotations

from d1jax.tasks import code, sources
from d1jax.tasks.base import Example, Task

NAME = "mbpp"
HUB_ID, HUB_CONFIG = "google-research-datasets/mbpp", "full"


def normalize(row: dict) -> Example:
    missing = [k for k in ("task_id", "text", "test_list") if k not in row]
    if missing:
        raise ValueError(f"MBPP row lacks {', '.join(missing)}; got keys {sorted(map(str, row))}")
    text, tests = row["text"], row["test_list"]
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text {sources.show(text)} is not a non-empty string")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"test_list must be a non-empty list of strings; got {sources.show(tests)}")
    setup = row.get("test_setup_code") or ""
    return {"task_id": str(row["task_id"]), "entry_point": None,
            "prompt": f'"""\n{text}\n{tests[0]}\n"""\n', "question": text, "prefix": "",
            "tests": list(tests), "setup": setup,
            "eval_test": f"{setup}\n" + "\n".join(tests) + "\n",
            "solution": row.get("code", "")}


def _load(source, split: str, cache_dir: str | None) -> list[Example]:
    rows = sources.load_rows(source or None, split=split, default_hub=HUB_ID,
                             hub_config=HUB_CONFIG, cache_dir=cache_dir)
    return sources.check_rows(NAME, rows, normalize)


def load_train(source=None, split: str = "train", cache_dir: str | None = None) -> list[Example]:
    """MBPP's training split (374 problems), or 256 generated ``"toy"`` problems."""
    return code.toy_rows(256, seed=0) if source == "toy" else _load(source, split, cache_dir)


def load_test(source=None, split: str = "test", cache_dir: str | None = None) -> list[Example]:
    """MBPP's test split (500 problems, task_id 11-510), or 16 generated ``"toy"`` ones."""
    return code.toy_rows(16, seed=1) if source == "toy" else _load(source, split, cache_dir)


def make_task() -> Task:
    return code.make_task(NAME, load_train, load_test)
