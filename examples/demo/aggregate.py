"""The multi-seed table: demo runs over pretraining seeds and rounding variants, aggregated.

Each run (``examples/demo/seeds.py``) is a whole demo in its own workdir, with its own
``results.json``; here they become one results dict (``aggregate``), its table
(``seeds_table``) and the claims that hold in every run (``claims``). Each run contributes
one number per row: its row mean (over its GRPO seeds for the GRPO rows), so the spread of a
row is the spread over pretraining seeds and rounding variants.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from examples.demo import report
from examples.demo.report import ROWS

SET_TITLES = {"heldout": "held-out", "d1_test": "d1 test"}
ROW_TITLES = dict(ROWS)
CLAIM_TITLES = {"d1": "d1 (SFT + diffu-GRPO)", "grpo_base": "diffu-GRPO from the base"}
_START = {"grpo_base": "base", "d1": "sft"}  # every other GRPO row is "{objective}_{start}"
STAGES = ("base", "sft")  # the supervised stages whose loss curves show convergence
PARTS = 5  # loss curve summary: mean loss over each fifth of a stage's steps


def start_of(kind: str) -> str:
    """The starting model of a GRPO row (``d1`` -> ``sft``)."""
    return _START.get(kind) or kind.rsplit("_", 1)[1]


def spread(values) -> dict:
    v = np.asarray(values, float)
    return {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()),
            "max": float(v.max()), "values": [float(x) for x in v]}


def loss_parts(stage_dir: Path, parts: int = PARTS) -> list[float] | None:
    """Mean training loss over each of ``parts`` equal spans of a stage's steps."""
    path = stage_dir / "metrics.jsonl"
    if not path.exists():
        return None
    loss = [json.loads(line)["loss"] for line in path.read_text().splitlines()
            if line.strip() and "loss" in json.loads(line)]
    if len(loss) < parts:
        return None
    return [float(np.mean(x)) for x in np.array_split(np.asarray(loss, float), parts)]


def run_summary(results: dict, wd: Path | None = None) -> dict:
    """One demo run's row means (per set, and its GRPO rows' reward rise) and loss curves."""
    rows = {}
    for kind, r in results["rows"].items():
        rows[kind] = {s: {"greedy": r[s]["mean"], "reward": r[s].get("reward_mean"),
                          "sampled": r[s].get("sampled_mean"),
                          "greedy_se": _se(r[s].get("values", []))} for s in results["sets"]}
        if "reward_rise" in r:
            rows[kind]["reward_rise"] = {k: r["reward_rise"][k] for k in ("mean", "se")}
        if "mechanism" in r:  # the GRPO metrics' summary, mean over the run's GRPO seeds
            rows[kind]["mechanism"] = {name: {k: v for k, v in m.items() if k != "values"}
                                       for name, m in r["mechanism"].items()}
    out = {"rows": rows, "sets": list(results["sets"]),
           "rollout_temperature": report.rollout_temperature(results)}
    for k in ("commit", "date", "device", "jax", "wall_time_s"):
        out[k] = results.get(k)
    if wd is not None:
        out["loss"] = {s: loss_parts(wd / s) for s in STAGES}
    return out


def _rows(runs: dict[str, dict], sets: list[str]) -> dict:
    """Mean and spread over runs of each row's greedy, reward and sampled scores; for GRPO
    rows also the change over the starting model and the rollout reward rise."""
    rows = {}
    for kind, _ in ROWS:
        have = [r["rows"][kind] for r in runs.values() if kind in r["rows"]]
        if len(have) < len(runs):  # a row some run left out has no spread over all runs
            continue
        rows[kind] = {}
        for s in sets:
            rows[kind][s] = {m: spread([h[s][m] for h in have])
                             for m in ("greedy", "reward", "sampled")
                             if all(h[s].get(m) is not None for h in have)}
            if kind not in STAGES:
                gain = [r["rows"][kind][s]["greedy"] - r["rows"][start_of(kind)][s]["greedy"]
                        for r in runs.values()]
                rows[kind][s]["gain"] = spread(gain)
        if kind not in STAGES and all("mechanism" in h for h in have):
            rows[kind]["mechanism"] = {
                name: {k: spread([h["mechanism"][name][k] for h in have]) for k in stats}
                for name, stats in have[0]["mechanism"].items()
                if all(name in h["mechanism"] for h in have)}
        if kind not in STAGES:
            rise = [h["reward_rise"] for h in have]
            rows[kind]["reward_rise"] = spread([x["mean"] for x in rise])
            rows[kind]["reward_rise"]["above_2se"] = sum(x["mean"] > 2 * x["se"] for x in rise)
    return rows


def _greedy(run: dict, kind: str) -> dict[str, float]:
    return {s: run["rows"][kind][s]["greedy"] for s in run["sets"]}


def _beats(run: dict, a: str, b: str) -> bool | None:
    """Row ``a`` above row ``b`` by greedy accuracy on every evaluation set (None: a row the
    run does not have)."""
    if a not in run["rows"] or b not in run["rows"]:
        return None
    ga, gb = _greedy(run, a), _greedy(run, b)
    return all(ga[s] > gb[s] for s in run["sets"])


def _se(values: list[float]) -> float | None:
    """The standard error of a row's mean over its GRPO seeds (None for one value)."""
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None


def _beats_2se(run: dict, a: str, b: str, set_name: str = "heldout") -> bool | None:
    """Row ``a`` above row ``b`` on ``set_name`` by more than two standard errors of their
    difference over the GRPO seeds (a supervised row, one model, adds none); None where a
    row, the set or a GRPO row's second seed is missing."""
    if a not in run["rows"] or b not in run["rows"] or set_name not in run["sets"]:
        return None
    ra, rb = run["rows"][a][set_name], run["rows"][b][set_name]
    ses = [r.get("greedy_se") for r, k in ((ra, a), (rb, b)) if k not in STAGES]
    if not ses or any(x is None for x in ses):
        return None
    return ra["greedy"] - rb["greedy"] > 2.0 * float(np.sqrt(sum(x * x for x in ses)))


def _rises(run: dict, kind: str, se: float) -> bool | None:
    r = run["rows"].get(kind, {}).get("reward_rise")
    return None if r is None else r["mean"] > se * r["se"]


def _claim_checks(kinds: list[str]) -> list[tuple[str, object]]:
    """(statement, run -> bool or None) for every claim the demo's README could make."""
    checks = [
        ("d1's ordering: d1 (SFT + diffu-GRPO) > SFT > base",
         lambda r: None if _beats(r, "d1", "sft") is None
         else _beats(r, "d1", "sft") and _beats(r, "sft", "base")),
        ("SFT > base", lambda r: _beats(r, "sft", "base")),
        ("d1 > SFT (diffu-GRPO gains over SFT)", lambda r: _beats(r, "d1", "sft")),
        ("SFT > d1 (diffu-GRPO loses accuracy from SFT)", lambda r: _beats(r, "sft", "d1")),
        ("diffu-GRPO from the base > SFT (RL from the base beats SFT)",
         lambda r: _beats(r, "grpo_base", "sft")),
        ("SFT > diffu-GRPO from the base (SFT beats RL from the base)",
         lambda r: _beats(r, "sft", "grpo_base")),
        ("diffu-GRPO from the base > base", lambda r: _beats(r, "grpo_base", "base")),
        # Issue 60's three claims: by more than 2 s.e. of the GRPO seeds, held-out set.
        ("d1 > SFT by more than 2 s.e. of the GRPO seeds (held-out)",
         lambda r: _beats_2se(r, "d1", "sft")),
        ("diffu-GRPO from the base > base by more than 2 s.e. (held-out)",
         lambda r: _beats_2se(r, "grpo_base", "base")),
        ("d1 > diffu-GRPO from the base by more than 2 s.e. (held-out)",
         lambda r: _beats_2se(r, "d1", "grpo_base")),
        ("all three by more than 2 s.e. (held-out)",
         lambda r: None if _beats_2se(r, "d1", "sft") is None else all(
             _beats_2se(r, a, b) for a, b in (("d1", "sft"), ("grpo_base", "base"),
                                               ("d1", "grpo_base")))),
    ]
    for kind in ("d1", "grpo_base"):
        t = CLAIM_TITLES[kind]
        checks.append((f"{t}: rollout reward rises (last quarter > first)",
                       lambda r, k=kind: _rises(r, k, 0.0)))
        checks.append((f"{t}: rollout reward rises by more than 2 s.e.",
                       lambda r, k=kind: _rises(r, k, 2.0)))
    for kind in kinds:  # the other objectives (':compare')
        if kind in ("base", "sft", "d1", "grpo_base"):
            continue
        start = start_of(kind)
        checks.append((f"{ROW_TITLES[kind]} > {'SFT' if start == 'sft' else 'base'}",
                       lambda r, k=kind, s=start: _beats(r, k, s)))
        checks.append((f"{ROW_TITLES[kind]}: rollout reward rises (last quarter > first)",
                       lambda r, k=kind: _rises(r, k, 0.0)))
    return checks


def claims(runs: dict[str, dict]) -> list[dict]:
    """Each claim with whether it held in each run (by greedy accuracy on every evaluation
    set); ``all``: it held in every run. Claims about rows some run lacks are left out."""
    kinds = [k for k, _ in ROWS if all(k in r["rows"] for r in runs.values())]
    out = []
    for text, check in _claim_checks(kinds):
        held = [check(r) for r in runs.values()]
        if any(h is None for h in held):
            continue
        out.append({"claim": text, "held": [bool(h) for h in held], "all": all(held),
                    "count": int(sum(held))})
    return out


def _one(values: list[str | None], what: str) -> str:
    vals = sorted({v for v in values if v})
    return vals[0] if len(vals) == 1 else (" / ".join(vals) if vals else f"unknown {what}")


def aggregate(runs: dict[str, dict], meta: dict) -> dict:
    """The multi-seed results: ``runs`` are run_summary() by run name, ``meta`` the command's
    settings (config, pretrain_seeds, variants, missing)."""
    if not runs:
        raise ValueError("no finished demo run to aggregate")
    sets = sorted({s for r in runs.values() for s in r["sets"]},
                  key=["heldout", "d1_test"].index)
    if any(r["sets"] != sets for r in runs.values()):
        raise ValueError(f"runs evaluated different sets: {[r['sets'] for r in runs.values()]}")
    loss = {s: np.asarray([r["loss"][s] for r in runs.values() if r.get("loss", {}).get(s)])
            for s in STAGES}
    return {"kind": "multi_seed", **meta, "sets": sets, "runs": runs,
            "rows": _rows(runs, sets), "claims": claims(runs),
            "loss": {s: l.mean(0).tolist() for s, l in loss.items() if len(l)},
            "commit": _one([r.get("commit") for r in runs.values()], "commit"),
            "date": _one([r.get("date") for r in runs.values()], "date"),
            "device": _one([r.get("device") for r in runs.values()], "device"),
            "jax": _one([r.get("jax") for r in runs.values()], "jax")}


def caption(res: dict) -> str:
    return (f"<!-- generated by: python -m examples.demo.table RESULTS.json; commit "
            f"{res['commit']}, {res['date']}; {len(res['runs'])} runs on "
            f"{res.get('devices') or res['device'] + ', jax ' + res['jax']} -->")


def _cell(r: dict, sign: bool = False, digits: int = 1) -> str:
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return (f"{f.format(r['mean'])} ± {r['std']:.{digits}f} "
            f"({f.format(r['min'])}..{f.format(r['max'])})")


def seeds_table(res: dict) -> str:
    """Per row, mean ± std (min..max) over the runs of each run's row mean."""
    sets, rows = res["sets"], res["rows"]
    cols = [(s, "greedy", f"{SET_TITLES[s]}: greedy") for s in sets]
    if "sampled" in rows["base"].get("heldout", {}):
        temps = sorted({report.rollout_temperature(r) for r in res["runs"].values()})
        cols.insert(1, ("heldout", "sampled",
                        f"held-out: sampled, T={'/'.join(str(t) for t in temps)}"))
    head = [t for *_, t in cols] + [f"change over start, {SET_TITLES[s]}" for s in sets] + [
        "rollout reward rise (runs > 2 s.e.)"]
    lines = ["| model | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    n = len(res["runs"])
    for kind, title in ROWS:
        if kind not in rows:
            continue
        r = rows[kind]
        cells = [_cell(r[s][m]) if m in r[s] else "" for s, m, _ in cols]
        cells += [_cell(r[s]["gain"], sign=True) if "gain" in r[s] else "" for s in sets]
        rise = r.get("reward_rise")
        cells.append(f"{_cell(rise, sign=True, digits=3)} ({rise['above_2se']} of {n})"
                     if rise else "")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join([caption(res)] + lines)


def mechanism_table(res: dict) -> str:
    """Per GRPO row, mean (min..max) over the runs of each run's mechanism statistics
    (report.mechanism: equal-reward groups and within-group reward std in the first and
    last quarter of the rollouts, KL and clipped tokens over the steps)."""
    head = ["groups with all rewards equal, first -> last quarter",
            "within-group reward std, first -> last quarter", "KL per token, mean (max)",
            "clipped tokens, mean (max)"]
    lines = ["| model | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for kind, title in ROWS:
        m = res["rows"].get(kind, {}).get("mechanism")
        if m is None:
            continue
        cells = []
        for name, f in (("zero_std_ratio", lambda x: f"{100 * x:.0f}%"),
                        ("reward_std", lambda x: f"{x:.3f}")):
            r = m.get(name)
            cells.append(f"{f(r['first']['mean'])} -> {f(r['last']['mean'])} "
                         f"({f(r['last']['min'])}..{f(r['last']['max'])})" if r else "")
        for name in ("kl", "clip_ratio"):
            r = m.get(name)
            cells.append(f"{r['mean']['mean']:.4f} ({r['max']['max']:.4f})" if r else "")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join([caption(res)] + lines)


def loss_table(res: dict) -> str:
    """Training loss of the supervised stages by fifth of their steps, mean over runs."""
    parts = [f"steps {i * 20}-{(i + 1) * 20}%" for i in range(PARTS)]
    lines = ["| stage | " + " | ".join(parts) + " | last fifth vs fourth |",
             "|---" * (PARTS + 2) + "|"]
    for stage, title in (("base", "pretraining (base)"), ("sft", "SFT")):
        loss = res.get("loss", {}).get(stage)
        if loss:
            change = 100.0 * (loss[-1] - loss[-2]) / loss[-2]
            lines.append(f"| {title} | " + " | ".join(f"{x:.3f}" for x in loss)
                         + f" | {change:+.1f}% |")
    return "\n".join(lines)


def claims_list(res: dict, held_only: bool = False) -> str:
    """The claims that held in every run, then those that did not, with their count
    (``held_only``: the first list alone, its items only)."""
    n = len(res["runs"])
    held = [c for c in res["claims"] if c["all"]]
    not_held = [c for c in res["claims"] if not c["all"]]
    items = [f"- {c['claim']}" for c in held] or ["- none"]
    if held_only:
        return "\n".join(items)
    out = [f"Held in all {n} runs (greedy accuracy, on every evaluation set):", *items]
    out += ["", f"Not in all {n} (held in how many):"]
    out += [f"- {c['claim']}: {c['count']} of {n}" for c in not_held] or ["- none"]
    return "\n".join(out)


def runs_table(res: dict) -> str:
    """Per run: held-out greedy of each row (the numbers behind the spread)."""
    kinds = [k for k, _ in ROWS if k in res["rows"]]
    lines = ["| run | " + " | ".join(ROW_TITLES[k] for k in kinds) + " |",
             "|---" * (len(kinds) + 1) + "|"]
    for name, r in res["runs"].items():
        lines.append(f"| {name} | " + " | ".join(
            " / ".join(f"{r['rows'][k][s]['greedy']:.1f}" for s in res["sets"])
            for k in kinds) + " |")
    return "\n".join(lines)

