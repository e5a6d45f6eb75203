"""Sandbox throughput: completions and test programs per second through d1jax.tasks.sandbox.

    python -m bench.sandbox [--completions 96] [--workers 2]

Runs the toy code task's published solutions (3 asserts each, as the GRPO reward does) in
three setups and prints one JSON object:

* ``before``: the child-reported path in a plain process (this repository before issue 56:
  ``run_many_programs``, ``D1JAX_SANDBOX=process``);
* ``process_judged``: the trusted judge in a plain process (the fallback);
* ``after``: the trusted judge with its worker inside bubblewrap (the default).

Every completion must pass (a benchmark of a broken sandbox is no benchmark). Figures in
docs/evaluation.md ("The code sandbox").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

from d1jax.tasks import code, sandbox


def measure(run, jobs, limits, workers) -> dict:
    t0 = time.perf_counter()
    outcomes = run(jobs, limits, workers=workers)
    wall = time.perf_counter() - t0
    assert all(o.all_passed for o in outcomes), [o.errors for o in outcomes if not o.all_passed]
    programs = sum(len(o.passed) for o in outcomes)
    return {"seconds": round(wall, 3), "completions_per_s": round(len(jobs) / wall, 2),
            "programs_per_s": round(programs / wall, 2)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--completions", type=int, default=96)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    rows = code.toy_rows(args.completions)
    calls = [(r["solution"], r["tests"]) for r in rows]
    programs = [[f"{r['solution']}\n{t}" for t in r["tests"]] for r in rows]
    limits = code.REWARD_LIMITS
    process = dataclasses.replace(limits, isolation="process")
    measure(sandbox.run_many_programs, programs[:4], process, args.workers)  # warm the caches
    out = {"completions": args.completions, "tests_each": len(rows[0]["tests"]),
           "workers": args.workers, "cpus": os.cpu_count(), "python": platform.python_version(),
           "before": measure(sandbox.run_many_programs, programs, process, args.workers),
           "process_judged": measure(sandbox.run_many_calls, calls, process, args.workers)}
    try:
        bwrap = dataclasses.replace(limits, isolation="bwrap")
        out["after"] = measure(sandbox.run_many_calls, calls, bwrap, args.workers)
        out["after_child_reported"] = measure(sandbox.run_many_programs, programs, bwrap,
                                              args.workers)
    except sandbox.SandboxUnavailable as e:
        out["after"] = {"unavailable": str(e)}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
