"""The demo's results: mean and spread per recipe row, the table and the reward plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROWS = (("base", "LLaDA-tiny (base)"), ("sft", "+SFT"), ("grpo_base", "+diffu-GRPO"),
        ("d1", "d1 (SFT + diffu-GRPO)"))


def summarize(runs: dict[str, list[Path]], evals: dict, set_names: list[str]) -> dict:
    """Mean and spread (std over seeds, and min..max) per row and evaluation set."""
    rows = {}
    for kind, _ in ROWS:
        if not runs[kind]:  # a GRPO start the config left out
            continue
        rows[kind] = {}
        for name in set_names:
            vals = [evals[d.name][name]["accuracy"] for d in runs[kind]]
            solved = [evals[d.name][name]["solved"] for d in runs[kind]]
            rows[kind][name] = {"mean": float(np.mean(vals)), "std": float(np.std(vals)),
                                "min": float(np.min(vals)), "max": float(np.max(vals)),
                                "values": vals, "solved_mean": float(np.mean(solved))}
            if "sampled_accuracy" in evals[runs[kind][0].name][name]:
                sampled = [evals[d.name][name]["sampled_accuracy"] for d in runs[kind]]
                rows[kind][name].update(sampled_mean=float(np.mean(sampled)),
                                        sampled_std=float(np.std(sampled)), sampled_values=sampled)
    return {"rows": rows, "sets": set_names, "per_run": evals}


_SET_TITLES = {"heldout": "held-out generated", "d1_test": "d1's 4x4 test set"}


def results_table(results: dict) -> str:
    """Mean ± std over seeds (one run for base and SFT); greedy is d1's protocol."""
    rows = results["rows"]
    cols = []  # (set, key of the mean, title)
    for s in results["sets"]:
        cols.append((s, "", f"{_SET_TITLES[s]}: greedy (d1 protocol)"))
        if "sampled_mean" in rows["base"][s]:
            cols.append((s, "sampled_", f"{_SET_TITLES[s]}: sampled, T=0.9"))
    lines = ["| model | " + " | ".join(t for *_, t in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for kind, title in ROWS:
        if kind not in rows:
            continue
        cells = []
        for s, pre, _ in cols:
            r = rows[kind][s]
            many = len(r["values"]) > 1
            cells.append(f"{r[pre + 'mean']:.1f}" + (f" ± {r[pre + 'std']:.1f}" if many else ""))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_rewards(wd: Path, seeds, out: Path, evals: dict | None = None) -> None:
    """Left: mean rollout reward per optimizer step of every GRPO run (one line per seed,
    running mean over 40 steps, drawn from step 11). Right (with ``evals``): held-out greedy
    cell accuracy of each starting model and of every GRPO run started from it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from d1jax.metrics import read_jsonl
    kinds = (("grpo_base", "base", "tab:blue", "diffu-GRPO from base"),
             ("d1", "sft", "tab:red", "d1: diffu-GRPO from SFT"))
    fig, axes = plt.subplots(1, 2 if evals else 1, figsize=(11 if evals else 7, 4),
                             squeeze=False, gridspec_kw={"width_ratios": [2, 1]} if evals else None)
    ax = axes[0, 0]
    for kind, _, color, title in kinds:
        for i, seed in enumerate(seeds):
            path = wd / f"{kind}_s{seed}" / "metrics.jsonl"
            if not path.exists():  # a GRPO start the config left out
                continue
            rows = [r for r in read_jsonl(path) if "reward" in r]
            steps = [r["step"] for r in rows]
            smooth = _smooth([r["reward"] for r in rows], 40)
            smooth[:10] = np.nan  # a mean of a few rollouts: not drawn
            ax.plot(steps, smooth, color=color, alpha=0.8, label=title if i == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("rollout reward (running mean, 40 steps)")
    ax.set_title("reward on training prompts during diffu-GRPO")
    ax.grid(alpha=0.3)
    ax.legend()
    if evals:
        ax = axes[0, 1]
        for x, (kind, start, color, _) in enumerate(kinds):
            runs = [evals[f"{kind}_s{seed}"]["heldout"]["accuracy"] for seed in seeds
                    if f"{kind}_s{seed}" in evals]
            if start not in evals or not runs:
                continue
            before = evals[start]["heldout"]["accuracy"]
            ax.plot([2 * x, 2 * x + 1], [before, np.mean(runs)], color=color, lw=2)
            ax.scatter([2 * x], [before], color=color, marker="s", zorder=3)
            ax.scatter([2 * x + 1] * len(runs), runs, color=color, zorder=3)
        ax.set_xticks(range(4), ["base", "+GRPO", "SFT", "d1"])
        ax.set_ylabel("held-out greedy cell accuracy %")
        ax.set_title("before / after diffu-GRPO (dots: seeds)")
        ax.grid(alpha=0.3)
    fig.suptitle("4x4 Sudoku, tiny LLaDA on CPU")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _smooth(values: list[float], width: int = 8) -> np.ndarray:
    v = np.asarray(values, float)
    if len(v) < 2:
        return v
    k = min(width, len(v))
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.empty_like(v)
    for i in range(len(v)):
        lo = max(0, i - k + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out
