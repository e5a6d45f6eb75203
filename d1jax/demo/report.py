"""The demo's results: mean and spread per recipe row, the table and the reward plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from d1jax.demo.config import OBJECTIVES, row_kind

NAMES = {"diffu_grpo": "diffu-GRPO", "wd1": "wd1", "spg": "SPG", "coupled_grpo": "coupled-GRPO"}
# Table order: the two starting models, then each objective from the base and from SFT.
ROWS = (("base", "LLaDA-tiny (base)"), ("sft", "+SFT")) + tuple(
    (row_kind(o, start), f"+{NAMES[o]}" if start == "base" else
     ("d1 (SFT + diffu-GRPO)" if o == "diffu_grpo" else f"SFT + {NAMES[o]}"))
    for start in ("base", "sft") for o in OBJECTIVES)


def rollout_rewards(stage_dir: Path, mu: int) -> np.ndarray:
    """Mean reward of each rollout of a GRPO run (its mu optimizer steps log the same one)."""
    from d1jax.metrics import read_jsonl
    rows = [r for r in read_jsonl(stage_dir / "metrics.jsonl") if "reward" in r]
    return np.array([r["reward"] for r in rows if (r["step"] - 1) % mu == 0], float)


def reward_rise(runs: list[Path], mu: int, frac: float = 0.25) -> dict:
    """Rollout reward of the last ``frac`` of the rollouts minus the first ``frac``, mean over
    the runs, with its standard error from the rollout-to-rollout spread (each rollout holds
    new prompts, so their difficulty is the noise a rise has to clear)."""
    diffs, vars_ = [], []
    for d in runs:
        r = rollout_rewards(d, mu)
        k = max(1, int(len(r) * frac))
        first, last = r[:k], r[-k:]
        diffs.append(float(last.mean() - first.mean()))
        vars_.append(float(first.var(ddof=1) / k + last.var(ddof=1) / k) if k > 1 else np.nan)
    return {"mean": float(np.mean(diffs)), "values": diffs,
            "se": float(np.sqrt(np.sum(vars_)) / len(runs))}


def summarize(runs: dict[str, list[Path]], evals: dict, set_names: list[str],
              mu: int = 1) -> dict:
    """Mean and spread (std over seeds, and min..max) per row and evaluation set; for the
    GRPO rows the rise of the rollout reward over training (``reward_rise``, ``mu`` optimizer
    steps per rollout)."""
    rows = {}
    for kind, _ in ROWS:
        if not runs.get(kind):  # a GRPO start or objective the config left out
            continue
        rows[kind] = {}
        if kind not in ("base", "sft"):
            rows[kind]["reward_rise"] = reward_rise(runs[kind], mu)
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
    rise = any("reward_rise" in r for r in rows.values())
    lines = ["| model | " + " | ".join(t for *_, t in cols) + (
        " | rollout reward, last - first quarter (± s.e.) |" if rise else " |"),
        "|---" * (len(cols) + 1 + rise) + "|"]
    for kind, title in ROWS:
        if kind not in rows:
            continue
        cells = []
        for s, pre, _ in cols:
            r = rows[kind][s]
            many = len(r["values"]) > 1
            cells.append(f"{r[pre + 'mean']:.1f}" + (f" ± {r[pre + 'std']:.1f}" if many else ""))
        if rise:
            r = rows[kind].get("reward_rise")
            cells.append(f"{r['mean']:+.3f} ± {r['se']:.3f}" if r else "")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_COLORS = {"diffu_grpo": "tab:red", "wd1": "tab:blue", "spg": "tab:green",
           "coupled_grpo": "tab:purple"}


def plot_rewards(wd: Path, runs: dict[str, list[Path]], out: Path, evals: dict | None = None,
                 smooth: int = 40) -> None:
    """Left: rollout reward per optimizer step of each GRPO row (objective x start), mean over
    its seeds, running mean over ``smooth`` steps (drawn once 10 steps are in it). Right (with
    ``evals``): held-out greedy cell accuracy of every GRPO run (dots: seeds, bar: mean) and of
    its starting model (dashed line)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from d1jax.metrics import read_jsonl
    grpo_rows = [(o, start) for start in ("base", "sft") for o in OBJECTIVES
                 if runs.get(row_kind(o, start))]
    fig, axes = plt.subplots(1, 2 if evals else 1, figsize=(13 if evals else 7, 4.5),
                             squeeze=False, gridspec_kw={"width_ratios": [3, 2]} if evals else None)
    ax = axes[0, 0]
    for o, start in grpo_rows:
        curves = []
        for d in runs[row_kind(o, start)]:
            path = d / "metrics.jsonl"
            rows = [r for r in read_jsonl(path) if "reward" in r] if path.exists() else []
            if rows:
                curves.append(_smooth([r["reward"] for r in rows], smooth))
        if not curves:
            continue
        n = min(len(c) for c in curves)
        mean = np.mean([c[:n] for c in curves], axis=0)
        mean[:min(10, n)] = np.nan  # a mean of a few rollouts: not drawn
        ax.plot(np.arange(1, n + 1), mean, color=_COLORS[o], ls="-" if start == "sft" else "--",
                label=f"{NAMES[o]} from {'SFT' if start == 'sft' else 'base'}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"rollout reward (mean of seeds, running mean over {smooth} steps)")
    ax.set_title("reward on training prompts during GRPO")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if evals:
        ax = axes[0, 1]
        for x, (o, start) in enumerate(grpo_rows):
            accs = [evals[d.name]["heldout"]["accuracy"] for d in runs[row_kind(o, start)]
                    if d.name in evals]
            if not accs:
                continue
            ax.bar(x, np.mean(accs), color=_COLORS[o], alpha=0.35 if start == "base" else 0.7)
            ax.scatter([x] * len(accs), accs, color="k", s=12, zorder=3)
            if start in evals:
                before = evals[start]["heldout"]["accuracy"]
                ax.hlines(before, x - 0.4, x + 0.4, color="k", ls="--", lw=1)
        ax.set_xticks(range(len(grpo_rows)),
                      [f"{NAMES[o]}\n{'SFT' if s == 'sft' else 'base'}" for o, s in grpo_rows],
                      fontsize=7)
        ax.set_ylabel("held-out greedy cell accuracy %")
        ax.set_title("after GRPO (dots: seeds; dashed: its start)")
        ax.grid(alpha=0.3, axis="y")
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
