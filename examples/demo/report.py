"""The demo's results: mean and spread per recipe row, the table and the reward plot."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from examples.demo.config import OBJECTIVES, row_kind

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


# The GRPO loop's per-step metrics that say why RL moves or not (docs/demo.md): per rollout,
# the share of groups whose G rewards are all equal (zero advantage, no gradient from the
# policy term: d1jax/train/rollout.py) and the mean within-group reward std; per optimizer
# step, the k3 KL to the reference and the share of tokens the ratio clip binds
# (d1jax/objectives/losses.py).
ROLLOUT_METRICS = ("zero_std_ratio", "reward_std")
UPDATE_METRICS = ("kl", "clip_ratio")


def mechanism(stage_dir: Path, mu: int, frac: float = 0.25) -> dict:
    """One GRPO run's mechanism metrics from its metrics.jsonl.

    Rollout metrics (one value per rollout, read on the first of its ``mu`` steps): mean over
    the run and over its first and last ``frac`` of the rollouts. Update metrics (one per
    optimizer step): mean and max over the run. A metric the objective does not log (wd1 and
    SPG have no KL) is left out.
    """
    from d1jax.metrics import read_jsonl
    rows = read_jsonl(stage_dir / "metrics.jsonl")
    out = {}
    for name in ROLLOUT_METRICS:
        v = np.array([r[name] for r in rows if name in r and (r["step"] - 1) % mu == 0], float)
        if len(v):
            k = max(1, int(len(v) * frac))
            out[name] = {"mean": float(v.mean()), "first": float(v[:k].mean()),
                         "last": float(v[-k:].mean())}
    for name in UPDATE_METRICS:
        v = np.array([r[name] for r in rows if name in r], float)
        if len(v):
            out[name] = {"mean": float(v.mean()), "max": float(v.max())}
    return out


def mechanism_row(runs: list[Path], mu: int) -> dict:
    """Each statistic of ``mechanism`` over a row's runs (seeds): the mean of the runs'
    means, first and last quarters, the largest of their maxima; with the per-run values."""
    per_run = [mechanism(d, mu) for d in runs]
    out = {}
    for name in ROLLOUT_METRICS + UPDATE_METRICS:
        have = [m[name] for m in per_run if name in m]
        if len(have) == len(per_run):
            out[name] = {stat: float((np.max if stat == "max" else np.mean)(
                [h[stat] for h in have])) for stat in have[0]}
            out[name]["values"] = have
    return out


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
            rows[kind]["mechanism"] = mechanism_row(runs[kind], mu)
        for name in set_names:
            vals = [evals[d.name][name]["accuracy"] for d in runs[kind]]
            solved = [evals[d.name][name]["solved"] for d in runs[kind]]
            reward = [100.0 * evals[d.name][name]["reward"] for d in runs[kind]]
            rows[kind][name] = {"mean": float(np.mean(vals)), "std": float(np.std(vals)),
                                "min": float(np.min(vals)), "max": float(np.max(vals)),
                                "values": vals, "solved_mean": float(np.mean(solved)),
                                "reward_mean": float(np.mean(reward)),
                                "reward_std": float(np.std(reward)), "reward_values": reward}
            if "sampled_accuracy" in evals[runs[kind][0].name][name]:
                sampled = [evals[d.name][name]["sampled_accuracy"] for d in runs[kind]]
                rows[kind][name].update(sampled_mean=float(np.mean(sampled)),
                                        sampled_std=float(np.std(sampled)), sampled_values=sampled)
    return {"rows": rows, "sets": set_names, "per_run": evals}


_SET_TITLES = {"heldout": "held-out", "d1_test": "d1's 4x4 test set"}


def provenance(cwd: Path | None = None) -> dict:
    """The commit the demo runs on (with "+dirty" when the code it runs, d1jax/, examples/ or
    configs/, has uncommitted changes), the date, the device and jax's version: written into
    results.json, so a table always names its code and machine."""
    import datetime
    import subprocess

    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True,
                                  cwd=cwd or Path(__file__).resolve().parents[2]).stdout.strip()
        except OSError:  # no git on the machine
            return ""
    # A copy of a commit without its .git (`git archive`, as sent to another machine) names
    # its commit in D1JAX_DEMO_COMMIT.
    commit = os.environ.get("D1JAX_DEMO_COMMIT", "")
    if not commit:
        commit = git("rev-parse", "--short=7", "HEAD")
        if commit and git("status", "--porcelain", "--untracked-files=no", "--",
                          "d1jax", "examples", "configs"):
            commit += "+dirty"
    commit = commit or "unknown"
    import jax
    return {"commit": commit, "date": datetime.date.today().isoformat(),
            "device": jax.devices()[0].device_kind, "jax": jax.__version__}


def caption(results: dict) -> str:
    """The line above a published table: where it comes from."""
    return (f"<!-- generated by: python -m examples.demo.table RESULTS.json; commit "
            f"{results.get('commit', 'unknown')}, {results.get('date', '?')} -->")


def rollout_temperature(results: dict) -> float:
    """The temperature the sampled evaluations ran at (the rollouts'; results written before
    it was recorded ran at the demo's 0.9)."""
    return results.get("rollout_temperature", 0.9)


def results_table(results: dict) -> str:
    """Mean ± std over seeds (one run for base and SFT); greedy is d1's protocol."""
    rows = results["rows"]
    cols = []  # (set, key of the mean, title)
    for s in results["sets"]:
        cols.append((s, "", f"{_SET_TITLES[s]}: greedy" + (" (d1 protocol)" if s == "heldout" else "")))
        if s == "heldout":  # the GRPO reward on the same completions: where the two part,
            # the policy has learned a format one of them misreads (docs/demo.md)
            cols.append((s, "reward_", f"{_SET_TITLES[s]}: greedy, GRPO reward x 100"))
        if "sampled_mean" in rows["base"][s]:
            t = rollout_temperature(results)
            cols.append((s, "sampled_", f"{_SET_TITLES[s]}: sampled, T={t}"))
    rise = any("reward_rise" in r for r in rows.values())
    lines = ["| model | " + " | ".join(t for *_, t in cols) + (
        " | rollout reward rise (± s.e.) |" if rise else " |"),
        "|---" * (len(cols) + 1 + rise) + "|"]
    for kind, title in ROWS:
        if kind not in rows:
            continue
        cells = []
        for s, pre, _ in cols:
            r = rows[kind][s]
            many = len(r["values"]) > 1
            if pre + "mean" not in r:  # a results.json written before the column existed
                cells.append("")
                continue
            cells.append(f"{r[pre + 'mean']:.1f}" + (f" ± {r[pre + 'std']:.1f}" if many else ""))
        if rise:
            r = rows[kind].get("reward_rise")
            cells.append(f"{r['mean']:+.3f} ± {r['se']:.3f}" if r else "")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join([caption(results)] + lines)


def mechanism_table(results: dict) -> str:
    """Per GRPO row, mean over its seeds: equal-reward groups and within-group reward std
    over the first and last quarter of the rollouts, KL and clip fraction over the steps
    (the max: the largest step's of any seed)."""
    rows = results["rows"]
    head = ["groups with all rewards equal, first -> last quarter",
            "within-group reward std, first -> last quarter", "KL per token, mean (max)",
            "clipped tokens, mean (max)", "rollout reward rise (± s.e.)"]
    lines = ["| model | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for kind, title in ROWS:
        m = rows.get(kind, {}).get("mechanism")
        if m is None:
            continue
        cells = []
        for name, pct in (("zero_std_ratio", True), ("reward_std", False)):
            r = m.get(name)
            fmt = (lambda x: f"{100 * x:.0f}%") if pct else (lambda x: f"{x:.3f}")
            cells.append(f"{fmt(r['first'])} -> {fmt(r['last'])}" if r else "")
        for name, fmt in (("kl", "{:.4f}"), ("clip_ratio", "{:.4f}")):
            r = m.get(name)
            cells.append(f"{fmt.format(r['mean'])} ({fmt.format(r['max'])})" if r else "")
        rise = rows[kind]["reward_rise"]
        cells.append(f"{rise['mean']:+.3f} ± {rise['se']:.3f}")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join([caption(results)] + lines)


_COLORS = {"diffu_grpo": "tab:red", "wd1": "tab:blue", "spg": "tab:green",
           "coupled_grpo": "tab:purple"}


def plot_rewards(wd: Path, runs: dict[str, list[Path]], out: Path, evals: dict | None = None,
                 mu: int = 1, window: int = 16) -> None:
    """One panel per starting model: rollout reward per optimizer step of each objective, mean
    over its seeds and a trailing window of ``window`` rollouts (``mu`` optimizer steps each),
    with a band of ± one standard error of that mean (the rollouts' spread). Right (with
    ``evals``): each GRPO run's held-out greedy cell accuracy minus its starting model's
    (dots: seeds, bar: their mean)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grpo_rows = [(o, start) for start in ("base", "sft") for o in OBJECTIVES
                 if runs.get(row_kind(o, start))]
    starts = [s for s in ("base", "sft") if any(st == s for _, st in grpo_rows)]
    n_ax = len(starts) + bool(evals)
    fig, axes = plt.subplots(1, n_ax, figsize=(5 * n_ax, 4.5), squeeze=False)
    for ax, start in zip(axes[0], starts):
        for o, st in grpo_rows:
            if st != start:
                continue
            # [seeds, rollouts]: each rollout's mean reward over its fresh prompts.
            r = [rollout_rewards(d, mu) for d in runs[row_kind(o, st)]
                 if (d / "metrics.jsonl").exists()]
            n = min((len(x) for x in r), default=0)
            if n < window:
                continue
            r = np.stack([x[:n] for x in r])
            kernel = np.ones(window) / window
            mean = np.convolve(r.mean(0), kernel, "valid")  # trailing window of rollouts
            # s.e. of a window's mean: rollout-to-rollout spread over window x seeds rollouts
            se = r.std(ddof=1) / np.sqrt(window * r.shape[0])
            x = (np.arange(window, n + 1)) * mu
            ax.plot(x, mean, color=_COLORS[o], label=NAMES[o])
            ax.fill_between(x, mean - se, mean + se, color=_COLORS[o], alpha=0.15)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"rollout reward (mean of seeds and of {window} rollouts)")
        ax.set_title(f"GRPO from {'SFT' if start == 'sft' else 'the base'}: training prompts")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if evals:
        ax = axes[0, -1]
        for x, (o, start) in enumerate(grpo_rows):
            accs = [evals[d.name]["heldout"]["accuracy"] for d in runs[row_kind(o, start)]
                    if d.name in evals]
            if not accs or start not in evals:
                continue
            gain = np.asarray(accs) - evals[start]["heldout"]["accuracy"]
            ax.bar(x, gain.mean(), color=_COLORS[o], alpha=0.35 if start == "base" else 0.75)
            ax.scatter([x] * len(gain), gain, color="k", s=12, zorder=3)
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xticks(range(len(grpo_rows)),
                      [f"{NAMES[o]}\n{'SFT' if s == 'sft' else 'base'}" for o, s in grpo_rows],
                      fontsize=7)
        ax.set_ylabel("held-out greedy accuracy change (points)")
        ax.set_title("change over the starting model (dots: seeds)")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("4x4 Sudoku, tiny LLaDA on CPU")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
