"""One table for demo runs that differ only in their RL settings (docs/demo.md, the `:d1like`
alternatives): per run, the GRPO rows' accuracy, change over their start, rollout reward rise
and mechanism, and issue 45's three claims.

  python -m examples.demo.compare fast=runs/fast/p2_loop/results.json \\
      exact=runs/alt_exact/p2_loop/results.json budget=runs/alt_budget/p2_loop/results.json

Each argument is ``label=<a demo's results.json>`` (``python -m examples.demo``), or, for
settings run over pretraining seeds and variants, ``label=<a multi-seed results.json>``
(``python -m examples.demo.seeds``): then one line per run with the GRPO rows' change over
their start, mean over GRPO seeds, and the claims under each label, and how many runs
held each claim (all labels must name the same runs):

  python -m examples.demo.compare fast=docs/demo_d1like_fast_results.json \\
      exact_budget=docs/demo_d1like_seeds_results.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SETS = ("heldout", "d1_test")


def _row(r: dict, kind: str, start: str) -> str:
    row, ref = r["rows"][kind], r["rows"][start]
    acc = " / ".join(f"{row[s]['mean']:.1f}" for s in SETS)
    change = " / ".join(f"{row[s]['mean'] - ref[s]['mean']:+.1f}" for s in SETS)
    rise, m = row["reward_rise"], row["mechanism"]
    return (f"{acc} | {change} | {row['heldout']['sampled_mean']:.1f} | "
            f"{rise['mean']:+.3f} ± {rise['se']:.3f} | "
            f"{100 * m['zero_std_ratio']['first']:.0f}% -> {100 * m['zero_std_ratio']['last']:.0f}% | "
            f"{m['kl']['mean']:.4f}")


CLAIMS = ("d1 > SFT", "RL from base > base", "d1 > RL from base")
MODELS = ("base", "sft", "grpo_base", "d1")  # results' row names


def held(acc: dict[str, list[float]]) -> list[bool]:
    """Issue 45's three claims on greedy accuracy per set ({model: [held-out, d1 test]}),
    each judged on both sets."""
    above = lambda a, b: all(x > y for x, y in zip(acc[a], acc[b]))
    return [above("d1", "sft"), above("grpo_base", "base"), above("d1", "grpo_base")]


def _yes_no(flags: list[bool]) -> str:
    return " / ".join("yes" if h else "no" for h in flags)


def _claims(r: dict) -> str:
    return _yes_no(held({k: [r["rows"][k][s]["mean"] for s in SETS] for k in MODELS}))


def table(results: dict[str, dict]) -> str:
    """Markdown: two lines per labelled run (from the base, from SFT) and its claims."""
    head = ["run", "model", "held-out / d1 test: greedy", "change over start",
            "held-out: sampled", "rollout reward rise (± s.e.)",
            "groups all equal, first -> last quarter", "KL per token",
            "d1 > SFT / RL > base / d1 > RL from base"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, r in results.items():
        seeds = len(r["rows"]["d1"]["heldout"]["values"])
        lines.append(f"| {label} ({seeds} GRPO seeds) | +diffu-GRPO | "
                     f"{_row(r, 'grpo_base', 'base')} | {_claims(r)} |")
        lines.append(f"| | d1 (SFT + diffu-GRPO) | {_row(r, 'd1', 'sft')} | |")
    return "\n".join(lines)


def multi_table(results: dict[str, dict]) -> str:
    """Markdown for multi-seed results: per run, the base and SFT (shared by every label), and
    per label the change of RL from the base and of d1 over their starts and the claims; then
    how many runs held each claim, and all three, under each label."""
    first = next(iter(results.values()))["runs"]
    names = list(first)
    for label, r in results.items():
        if list(r["runs"]) != names:
            raise SystemExit(f"error: {label}'s runs {list(r['runs'])} are not {names}")
    greedy = lambda run, kind: [run["rows"][kind][s]["greedy"] for s in SETS]
    fmt = lambda xs: " / ".join(f"{x:.1f}" for x in xs)
    change = lambda a, b: " / ".join(f"{x - y:+.1f}" for x, y in zip(a, b))
    head = ["run", "base", "SFT"] + [f"{label}: {what}" for label in results for what in (
        "RL from base, change over base", "d1, change over SFT", " / ".join(CLAIMS))]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    counts = {label: [0] * (len(CLAIMS) + 1) for label in results}
    for name in names:
        cells = [name, fmt(greedy(first[name], "base")), fmt(greedy(first[name], "sft"))]
        for label, r in results.items():
            run = r["runs"][name]
            acc = {k: greedy(run, k) for k in MODELS}
            flags = held(acc)
            for i, h in enumerate(flags + [all(flags)]):
                counts[label][i] += h
            cells += [change(acc["grpo_base"], acc["base"]), change(acc["d1"], acc["sft"]),
                      _yes_no(flags)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for label, c in counts.items():
        lines.append(f"- {label}: " + ", ".join(f"{claim} {n} of {len(names)}" for claim, n in
                                                zip(CLAIMS + ("all three",), c)))
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="label=<a demo run's results.json>")
    args = parser.parse_args(argv)
    results = {}
    for arg in args.runs:
        label, _, path = arg.partition("=")
        if not path or not Path(path).is_file():
            raise SystemExit(f"error: {arg!r}: label=<an existing results.json>")
        results[label] = json.loads(Path(path).read_text())
    multi = {r.get("kind") == "multi_seed" for r in results.values()}
    if len(multi) > 1:
        raise SystemExit("error: single runs and multi-seed results mixed; compare like with like")
    print(multi_table(results) if multi.pop() else table(results))


if __name__ == "__main__":
    main()
