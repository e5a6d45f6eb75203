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

SIGTERM or Ctrl-C goes to every running demo (each runs in its own session, so a terminal's
Ctrl-C reaches it once, through this process) and no other run starts: each stops at its first
safe point (examples/demo/run.py), and this command exits with the same code (75 for SIGTERM,
130 for Ctrl-C) in one line; rerunning it resumes every unfinished run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
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


class Children:
    """The running demos: a signal to this process goes to each of them, and none starts after
    it (``start`` returns None)."""

    def __init__(self):
        self.signum = 0  # the first SIGTERM or SIGINT received
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._forward)

    def _forward(self, signum, frame) -> None:
        del frame
        if not self.signum:
            self.signum = signum
            print(f"[seeds] {signal.Signals(signum).name}: passed to the running demos, "
                  "starting no other", file=sys.stderr, flush=True)
        for p in list(self._live):  # a second Ctrl-C too: the demos then exit at once
            p.send_signal(signum)

    def run(self, cmd: list[str], out) -> int | None:
        """``cmd``'s exit code, or None when a signal came before it started."""
        with self._lock:
            if self.signum:
                return None
            # Its own session: a terminal's Ctrl-C reaches it once, forwarded by _forward.
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 cwd=Path(__file__).resolve().parents[2])
            self._live.add(p)
        if self.signum:  # came between the check and the add
            p.send_signal(self.signum)
        rc = p.wait()
        self._live.discard(p)
        return rc


def demo_command(config: str, seed: int, variant: str, wd: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "examples.demo", f"--config={config}", f"--workdir={wd}",
            f"--config.demo.seed={seed}", *VARIANTS[variant], *extra]


def _one_run(config: str, seed: int, variant: str, wd: Path, extra: list[str], log,
             children: Children) -> bool:
    """The demo in ``wd`` unless it finished before; True when its results.json exists."""
    if (wd / "results.json").exists():
        log(f"[seeds] {wd.name}: done before, kept")
        return True
    if children.signum:
        return False
    wd.mkdir(parents=True, exist_ok=True)
    cmd = demo_command(config, seed, variant, wd, extra)
    log(f"[seeds] {wd.name}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    with open(wd / "demo.log", "a") as out:
        rc = children.run(cmd, out)
    if rc is None:
        return False
    ok = rc == 0 and (wd / "results.json").exists()
    status = ("done" if ok else f"stopped (exit {rc}), resumable" if children.signum else
              f"FAILED (exit {rc}, see {wd / 'demo.log'})")
    log(f"[seeds] {wd.name}: {status} in {time.perf_counter() - t0:.0f} s")
    return ok


def collect(workdir: Path, seeds: list[int], variants: list[str], meta: dict,
            earlier: dict | None = None) -> dict:
    """The aggregate of every finished run (``meta`` plus the names of the missing ones).
    ``earlier``: an earlier aggregate (its results.json), whose summary of a run stands in
    for that run when its workdir here has no results.json."""
    runs, missing = {}, []
    for seed in seeds:
        for variant in variants:
            wd = workdir / run_name(seed, variant)
            if (wd / "results.json").exists():
                s = aggregate.run_summary(json.loads((wd / "results.json").read_text()), wd)
                runs[wd.name] = {"pretrain_seed": seed, "variant": variant, **s}
            elif wd.name in (earlier or {}).get("runs", {}):
                runs[wd.name] = earlier["runs"][wd.name]
            else:
                missing.append(wd.name)
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
    parser.add_argument("--include", type=Path, default=None,
                        help="an earlier aggregate's results.json (docs/demo_*seeds_results.json):"
                             " its summary of a run stands in for a run not in --workdir")
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
        children = Children()
        children.install()
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(lambda sv: _one_run(args.config, *sv, args.workdir /
                                              run_name(*sv), extra, log, children), todo))
        if children.signum:
            name = "Ctrl-C" if children.signum == signal.SIGINT else "SIGTERM"
            print(f"[seeds] {name}: stopped; rerun the same command to resume the unfinished "
                  "runs", file=sys.stderr, flush=True)
            raise SystemExit(130 if children.signum == signal.SIGINT else 75)
    meta = {"config": args.config, "pretrain_seeds": seeds, "variants": variants,
            "overrides": extra, **({"devices": args.devices} if args.devices else {}),
            "command": "python -m examples.demo.seeds " + " ".join(
                [f"--config={args.config}", f"--pretrain_seeds={args.pretrain_seeds}",
                 f"--variants={args.variants}", *extra]
                + ([f"--include={args.include}"] if args.include else []))}
    try:
        if args.include and not args.include.is_file():
            raise ValueError(f"--include={args.include}: no such file")
        earlier = json.loads(args.include.read_text()) if args.include else None
        res = collect(args.workdir, seeds, variants, meta, earlier)
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
