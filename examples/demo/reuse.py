"""A new demo workdir that starts from a finished run's base and SFT models: only the RL
stages (and their evaluations) then run, under other GRPO settings.

  python -m examples.demo.reuse runs/demo_d1like_seeds/p2_loop runs/alt_fast/p2_loop
  python -m examples.demo --config=configs/demo_sudoku.py:d1like --workdir=runs/alt_fast/p2_loop \\
      --config.demo.seed=2 --config.demo.model.unroll_layers=False \\
      --config.demo.sampler.kv_cache=dual --config.demo.sampler.threshold=0.9

Copies ``data/``, ``base/`` and ``sft/`` (the demo skips a stage whose export exists,
examples/demo/run.py), the compiled-program cache, and the evaluations of the base and SFT
models (kept by the demo only when its evaluation settings are the same). The demo command
must name the source run's config, ``demo.seed`` and model variant: the copied stages were
trained with them, and the demo does not check.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from examples.demo.run import finished

COPIED = ("data", "base", "sft")


def reuse(source: Path, target: Path) -> list[str]:
    """Copies the supervised stages of ``source`` into ``target``; returns what was copied."""
    for name in ("base", "sft"):
        if not finished(source / name):
            raise ValueError(f"{source / name} has not finished (no hf export): run the demo "
                             f"in {source} first")
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"{target} is not empty: name a new workdir")
    target.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        # Without the lock files of the source's runs (held by no process here).
        shutil.copytree(source / name, target / name, ignore=shutil.ignore_patterns("*.lock"))
    copied = list(COPIED)
    if (source / ".jax_cache").is_dir():
        shutil.copytree(source / ".jax_cache", target / ".jax_cache")
        copied.append(".jax_cache")
    cache = source / "eval_cache.json"
    if cache.exists():
        c = json.loads(cache.read_text())
        c["models"] = {k: v for k, v in c.get("models", {}).items() if k in ("base", "sft")}
        (target / "eval_cache.json").write_text(json.dumps(c, indent=1))
        copied.append("eval_cache.json (base, sft)")
    return copied


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a demo workdir whose base and SFT finished")
    parser.add_argument("target", type=Path, help="a new workdir")
    args = parser.parse_args(argv)
    try:
        copied = reuse(args.source, args.target)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"[reuse] {args.source} -> {args.target}: {', '.join(copied)}")


if __name__ == "__main__":
    main()
