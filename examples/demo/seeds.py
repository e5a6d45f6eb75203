"""The multi-seed table: the whole demo per (pretraining seed, rounding variant), aggregated.

  python -m examples.demo.seeds --config=configs/demo_sudoku.py:seeds \\
      --pretrain_seeds=0,1,2 --variants=unrolled,loop --workdir=runs/demo_seeds --jobs=2

(``:seeds``: the harder toy whose supervised stages converge below the ceiling, at the
budgets examples/demo/plateau.py measured, 8,000 pretraining and 1,000 SFT steps, and GRPO
seeds 0 and 1; on this 2-core CPU 52-61 minutes a run, two at a time, 38-45 of them
pretraining. docs/demo.md's table ran the supervised stages on one GPU and the rest on the
CPU, resuming each run's workdir there; ``--devices`` names both in its caption.)

Each run is ``python -m examples.demo`` in ``<workdir>/p{seed}_{variant}`` with
``--config.demo.seed={seed}`` (data order, base init, SFT) and the variant's model switches
(``VARIANTS``: the same model as another XLA program, so other float rounding), its log in
``demo.log`` there. A run with a ``results.json`` is kept; an unfinished one resumes (the
demo resumes its stages). Then ``<workdir>/results.json`` (examples/demo/aggregate.py) and
``results.md``: per row, mean ± std (min..max) over the runs, and which claims held in
every run; ``python -m examples.demo.table <workdir>/results.json --write`` publishes them
(docs/demo.md, README.md). Arguments after the known ones (``--config.x=...``) go to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from examples.demo import aggregate

# Rounding variants: flags of each run. Same parameters and math; the layer loop is another
# XLA program, whose gradients differ in the last bits (docs/demo.md, multi-seed table).
VARIANTS = {
    "unrolled": ("--config.demo.model.unroll_layers=True",),
    "loop": ("--config.demo.model.unroll_layers=False",),
}


def run_name(seed: int, variant: str) -> str:
    return f"p{seed}_{variant}"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: --pretrain_seeds={text!r}: comma-separated integers") from None


def _one_run(config: str, seed: int, variant: str, wd: Path, extra: list[str], log) -> bool:
    """The demo in ``wd`` unless it finished before; True when its results.json exists."""
    if (wd / "results.json").exists():
        log(f"[seeds] {wd.name}: done before, kept")
        return True
    wd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "examples.demo", f"--config={config}", f"--workdir={wd}",
           f"--config.demo.seed={seed}", *VARIANTS[variant], *extra]
    log(f"[seeds] {wd.name}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    with open(wd / "demo.log", "a") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                            cwd=Path(__file__).resolve().parents[2]).returncode
    ok = rc == 0 and (wd / "results.json").exists()
    status = "done" if ok else f"FAILED (exit {rc}, see {wd / 'demo.log'})"
    log(f"[seeds] {wd.name}: {status} in {time.perf_counter() - t0:.0f} s")
    return ok


def collect(workdir: Path, seeds: list[int], variants: list[str], meta: dict) -> dict:
    """The aggregate of every finished run (``meta`` plus the names of the missing ones)."""
    runs, missing = {}, []
    for seed in seeds:
        for variant in variants:
            wd = workdir / run_name(seed, variant)
            if not (wd / "results.json").exists():
                missing.append(wd.name)
                continue
            s = aggregate.run_summary(json.loads((wd / "results.json").read_text()), wd)
            runs[wd.name] = {"pretrain_seed": seed, "variant": variant, **s}
    return aggregate.aggregate(runs, {**meta, "missing": missing})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo_sudoku.py:seeds",
                        help="the demo config of every run")
    parser.add_argument("--pretrain_seeds", default="0,1,2", help="demo.seed of the runs")
    parser.add_argument("--variants", default="unrolled,loop",
                        help=f"rounding variants, from {sorted(VARIANTS)}")
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--aggregate_only", action="store_true",
                        help="aggregate the finished runs, start none")
    parser.add_argument("--devices", default="",
                        help="where the runs ran, for the table's caption, when their "
                             "results.json do not say it all: each records the machine of its "
                             "last invocation only (a run resumed on another machine)")
    args, extra = parser.parse_known_args(argv)
    if bad := [a for a in extra if not a.startswith("--config.")]:
        raise SystemExit(f"error: unknown arguments {bad}: only --config.x=... pass to the runs")
    seeds = _ints(args.pretrain_seeds)
    variants = [v for v in args.variants.split(",") if v]
    if not seeds or not variants or set(variants) - set(VARIANTS):
        raise SystemExit(f"error: --pretrain_seeds={args.pretrain_seeds!r} --variants="
                         f"{args.variants!r}: at least one seed, variants from {sorted(VARIANTS)}")
    log = lambda msg: print(msg, flush=True)
    if not args.aggregate_only:
        todo = [(s, v) for s in seeds for v in variants]
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(lambda sv: _one_run(args.config, *sv, args.workdir /
                                              run_name(*sv), extra, log), todo))
    meta = {"config": args.config, "pretrain_seeds": seeds, "variants": variants,
            "overrides": extra, **({"devices": args.devices} if args.devices else {}),
            "command": "python -m examples.demo.seeds " + " ".join(
                [f"--config={args.config}", f"--pretrain_seeds={args.pretrain_seeds}",
                 f"--variants={args.variants}", *extra])}
    try:
        res = collect(args.workdir, seeds, variants, meta)
    except ValueError as e:
        raise SystemExit(f"error: {e} in {args.workdir}") from None
    (args.workdir / "results.json").write_text(json.dumps(res, indent=1))
    text = "\n\n".join([aggregate.seeds_table(res), aggregate.claims_list(res),
                        aggregate.loss_table(res), aggregate.runs_table(res)]
                       + ([aggregate.mechanism_table(res)] if any(
                           "mechanism" in r for r in res["rows"].values()) else []))
    (args.workdir / "results.md").write_text(text + "\n")
    log(text)
    if res["missing"]:
        log(f"[seeds] unfinished runs, left out: {', '.join(res['missing'])}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
