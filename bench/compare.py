"""d1jax against the PyTorch reference on bench-tiny, measured side by side in one run.

    bench/reference/setup.sh                        # once: the reference's sources and venv
    python bench/compare.py --rounds 2 --out compare.json
    python bench/compare.py --reference-json ref.json --rounds 2   # a reference run from
                                                                  # this sitting, not rerun

The reference is ``bench/reference/run.py`` (LLaDA's ``generate.py`` and d1's estimator and
loss at pinned commits, unmodified, on the Hugging Face LLaDA model, torch CPU) in the venv
that ``bench/reference/setup.sh [REF_DIR]`` builds (--ref-dir; default $TMPDIR/d1jax-ref).
Each round runs the reference in a child process, then d1jax's measurements here, so that
both sides share the machine's load; a ratio is the reference's median seconds over ours
across all rounds (> 1: d1jax is faster). d1jax's samplers run on the reference's own
weights and prompts (its ``bench_tiny_hf`` checkpoint and ``ref_generate.npz``), and the
exact sampler's tokens are compared with the reference's. Prints a markdown table and one
JSON object (the machine, date and every round's timings). Workload (docs/benchmarks.md):
batch 8, prompt 64, gen 128, block 32, 64 steps, temperature 0; estimator input
[mu, 8, 192]; GRPO update mu = 1 on 8 x 192. ``bench/cycle.py`` measures a whole GRPO cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

# (key, label, unit): "tok/s" rows show batch * gen_length / seconds; ratios are speed-ups.
ROWS = [
    ("sampler_exact", "exact sampler, generated tokens/s", "tok/s"),
    ("sampler_fast", "fast() sampler, generated tokens/s (reference: exact)", "tok/s"),
    ("estimator_mu1", "estimator mu = 1, s", "s"),
    ("estimator_mu4", "estimator mu = 4, s", "s"),
    ("update_mu1", "GRPO update mu = 1 (fwd + bwd + AdamW), s", "s"),
    ("forward", "forward [8, 192], s", "s"),
    ("forward_backward", "forward + backward (jax.value_and_grad) [8, 192], s", "s"),
]
# Which reference measure each row is compared with (None: the reference has no such run).
REFERENCE_OF = {"sampler_exact": "sampler", "sampler_fast": "sampler",
                "estimator_mu1": "estimator_mu1", "estimator_mu4": "estimator_mu4",
                "update_mu1": "update_mu1", "forward": None, "forward_backward": None}


def reference_paths(ref_dir: str) -> dict[str, str]:
    """The reference's python and script; exits with what to do when it is not built."""
    paths = {"python": os.path.join(ref_dir, "venv", "bin", "python"),
             "script": os.path.join(HERE, "reference", "run.py"), "ref_dir": ref_dir}
    missing = [f for f in (paths["python"], os.path.join(ref_dir, "sources.json"))
               if not os.path.exists(f)]
    if missing:
        raise SystemExit(f"the PyTorch reference is not built in --ref-dir {ref_dir!r} "
                         f"(missing {missing}): run bench/reference/setup.sh {ref_dir} first "
                         "(docs/benchmarks.md)")
    return paths


def run_reference(paths: dict[str, str], gen_runs: int, est_runs: int, grpo_runs: int) -> dict:
    """One run of bench/reference/run.py in the reference's venv; its printed JSON."""
    cmd = [paths["python"], paths["script"], "--ref-dir", paths["ref_dir"],
           "--sections", "sampler,estimator,update", "--mus", "1,4",
           "--gen-runs", str(gen_runs), "--est-runs", str(est_runs),
           "--update-runs", str(grpo_runs)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the reference failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def summarize(reference_rounds: list[dict[str, list[float]]],
              ours_rounds: list[dict[str, list[float]]], tokens_per_call: int) -> dict:
    """Per row: every round's median seconds on each side, and the medians and speed-up over
    all timed calls. ``*_rounds``: one {measure: seconds of each timed call} per round."""
    rows = {}
    for key, label, unit in ROWS:
        ours = [t for r in ours_rounds for t in r.get(key, [])]
        if not ours:
            continue
        ref_key = REFERENCE_OF[key]
        ref = [t for r in reference_rounds for t in r.get(ref_key, [])] if ref_key else []
        row = {"label": label, "unit": unit,
               "ours_s": round(statistics.median(ours), 4),
               "ours_round_medians_s": [round(statistics.median(r[key]), 4)
                                        for r in ours_rounds if key in r]}
        if ref:
            row.update(reference_s=round(statistics.median(ref), 4),
                       reference_round_medians_s=[round(statistics.median(r[ref_key]), 4)
                                                  for r in reference_rounds if ref_key in r],
                       speedup=round(statistics.median(ref) / statistics.median(ours), 2))
        if unit == "tok/s":
            row["tokens_per_call"] = tokens_per_call
        rows[key] = row
    return rows


def _shown(row: dict, side: str) -> str:
    """A side's figure in the row's unit: the range of round medians when rounds differ."""
    meds = row.get(f"{side}_round_medians_s")
    if not meds:
        return "n/a"
    vals = [row["tokens_per_call"] / s for s in meds] if row["unit"] == "tok/s" else meds
    fmt = "{:.0f}" if row["unit"] == "tok/s" else "{:.3g}"
    lo, hi = fmt.format(min(vals)), fmt.format(max(vals))
    return lo if lo == hi else f"{lo}-{hi}"


def format_table(rows: dict, extra: list[str] = ()) -> str:
    """Markdown table: measure | PyTorch reference | d1jax | speed-up (reference / ours)."""
    lines = ["| measure | PyTorch reference | d1jax | ratio |", "|---|---|---|---|"]
    for row in rows.values():
        ratio = f"{row['speedup']:.2f}x" if "speedup" in row else "n/a"
        lines.append(f"| {row['label']} | {_shown(row, 'reference')} | {_shown(row, 'ours')} "
                     f"| {ratio} |")
    return "\n".join([*lines, *extra])


def notes(rows: dict, facts: dict) -> list[str]:
    """Lines under the table: token identity, backward/forward ratio, memory in mu."""
    out = []
    if "tokens_equal_to_reference" in facts:
        out.append(f"exact sampler tokens equal to the reference's: "
                   f"{100 * facts['tokens_equal_to_reference']:.2f}%")
    if "fast_tokens_equal_to_exact" in facts:  # below 100%: the KV cache approximates
        out.append(f"fast() sampler tokens equal to the exact sampler's: "
                   f"{100 * facts['fast_tokens_equal_to_exact']:.2f}%")
    if {"forward", "forward_backward"} <= set(rows):
        fwd, both = rows["forward"]["ours_s"], rows["forward_backward"]["ours_s"]
        out.append(f"d1jax backward / forward: {(both - fwd) / fwd:.2f}")
    mem = facts.get("peak_temp_mb", {})
    if {"estimator_mu1", "estimator_mu4"} <= set(mem):
        out.append(f"d1jax estimator scratch memory (XLA temp), mu 1 -> 4: "
                   f"{mem['estimator_mu1']:.1f} -> {mem['estimator_mu4']:.1f} MiB")
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref-dir", default=os.path.join(tempfile.gettempdir(), "d1jax-ref"),
                   help="what bench/reference/setup.sh built (default: $TMPDIR/d1jax-ref)")
    p.add_argument("--reference-json", nargs="+", default=[],
                   help="bench/reference/run.py outputs from this sitting, used instead of "
                        "running it")
    p.add_argument("--rounds", type=int, default=2, help="alternating reference/d1jax rounds")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per d1jax measure a round")
    p.add_argument("--gen-runs", type=int, default=2, help="reference generate() runs a round")
    p.add_argument("--est-runs", type=int, default=3, help="reference estimator runs a round")
    p.add_argument("--grpo-runs", type=int, default=3, help="reference update runs a round")
    p.add_argument("--out", help="also write the JSON here")
    a = p.parse_args(argv)
    paths = None if a.reference_json else reference_paths(a.ref_dir)

    from bench import common, compare_ours  # jax loads only once the arguments are good

    ref_jsons = [common.load_reference(f) for f in a.reference_json]
    ref_rounds, our_rounds, ours, loads = [], [], None, []
    for i in range(a.rounds):
        if paths:
            ref_jsons.append(run_reference(paths, a.gen_runs, a.est_runs, a.grpo_runs))
        if i < len(ref_jsons):
            ref_rounds.append(common.reference_seconds(ref_jsons[i]))
        ours = ours or compare_ours.build(ref_jsons[-1])
        our_rounds.append(compare_ours.time_round(ours, a.repeats))
        loads.append(round(os.getloadavg()[1], 2))  # 5-minute: spans the round's two halves
        print(f"round {i + 1}/{a.rounds} done, load {loads[-1]}", file=sys.stderr, flush=True)
    sampler = ref_jsons[-1]["sampler"]
    rows = summarize(ref_rounds, our_rounds, sampler["batch"] * sampler["gen_length"])
    table = format_table(rows, notes(rows, ours.facts))
    result = {"machine": common.machine(), "rounds": a.rounds, "load_average_5m_rounds": loads,
              "command": "python bench/compare.py " + " ".join(argv or sys.argv[1:]),
              "reference_env": ref_jsons[-1].get("env", {}), "rows": rows,
              "facts": ours.facts, "reference_rounds": ref_rounds, "ours_rounds": our_rounds,
              "table": table}
    print(table)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
