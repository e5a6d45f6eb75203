"""One table for demo runs that differ only in their RL settings (docs/demo.md, the `:d1like`
alternatives): per run, the GRPO rows' accuracy, change over their start, rollout reward rise
and mechanism, and issue 45's three claims.

  python -m examples.demo.compare fast=runs/demo_d1like_seeds/p2_loop/results.json \\
      exact=runs/alt_exact/p2_loop/results.json budget=runs/alt_budget/p2_loop/results.json

Each argument is ``label=<a demo's results.json>`` (``python -m examples.demo``).
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


def _claims(r: dict) -> str:
    acc = {k: [r["rows"][k][s]["mean"] for s in SETS] for k in ("base", "sft", "grpo_base", "d1")}
    above = lambda a, b: all(x > y for x, y in zip(acc[a], acc[b]))
    held = [above("d1", "sft"), above("grpo_base", "base"), above("d1", "grpo_base")]
    return " / ".join("yes" if h else "no" for h in held)


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
    print(table(results))


if __name__ == "__main__":
    main()
