"""How many steps each supervised stage needs: its loss at a growing budget, measured.

  python -m examples.demo.plateau --stage=base --budgets=2000,6000 --workdir=runs/plateau
  python -m examples.demo.plateau --stage=sft --budgets=500,1500,4500 --workdir=runs/plateau \\
      --base=runs/plateau/base_6000

Each budget is a whole run of the stage (``examples/demo/run.py``'s pretraining or SFT, the
default demo config's schedule: linear warmup then linear decay to 0 over that budget) in
``<workdir>/<stage>_<steps>[_lr<rate>][_s<seed>][_from_<base>]`` (``run_name``); finished
runs are kept, an interrupted one resumes.
Printed as JSON per budget: the mean training loss over each fifth of its steps, its last
fifth's change from the previous budget's last fifth, and the export's greedy cell accuracy
(d1's protocol) on the demo's held-out puzzles and d1's test set. A stage is at its plateau
where a larger budget no longer lowers the final loss, nor raises the accuracy, by more than
the noise between runs. docs/demo.md has the measured curves and the budgets chosen from them
(the ``:seeds`` config).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import jax

from d1jax.train import sft
from examples.demo import aggregate
from examples.demo import config as demo_config
from examples.demo import data as demo_data
from examples.demo import evaluation
from examples.demo import run as demo_run


def run_name(stage: str, steps: int, learning_rate: float = 0.0, seed: int = 0,
             base: Path | None = None) -> str:
    """The run's folder: every setting that changes the run is in its name (the demo
    config's, ``--variant``, names the workdir)."""
    return (f"{stage}_{steps}" + (f"_lr{learning_rate:g}" if learning_rate else "")
            + (f"_s{seed}" if seed else "") + (f"_from_{base.name}" if stage == "sft" else ""))


def run_budget(demo, data: dict, stage: str, steps: int, stage_dir: Path, base: Path | None,
               learning_rate: float | None = None):
    """One run of ``stage`` at ``steps`` optimizer steps (kept when its export exists); the
    rest of the stage's settings are ``demo``'s."""
    if demo_run.finished(stage_dir):
        return
    demo = demo.copy_and_resolve_references()
    p = demo.pretrain if stage == "base" else demo.sft
    p.steps = steps
    p.save_every = max(steps // 4, 1)
    if learning_rate:
        p.learning_rate = learning_rate
    if stage == "base":
        cfg = demo_config.pretrain_config(demo, data)
        corpus = demo_data.pretraining_corpus(demo, data)
    else:
        cfg = demo_config.sft_config(demo, data, base)
        corpus = demo_data.sft_corpus(demo, data)
    sft.run(cfg, str(stage_dir), data=corpus)


def greedy_accuracy(demo, data: dict, stage_dir: Path) -> dict[str, float]:
    """Cell accuracy % of the run's export, greedy with d1's protocol, on the demo's held-out
    puzzles and d1's test set (``evaluation.evaluate_model``; kept in the run's folder)."""
    path = stage_dir / "plateau_eval.json"
    if not path.exists():
        demo = demo.copy_and_resolve_references()
        demo.eval.samples = 0
        ev = evaluation.evaluate_model(demo, data, stage_dir / "hf",
                                       evaluation.eval_sets(demo, data))
        path.write_text(json.dumps({name: r["accuracy"] for name, r in ev.items()}))
    return json.loads(path.read_text())


def summary(stage_dirs: dict[int, Path], accuracy: dict[int, dict]) -> list[dict]:
    out, prev = [], None
    for steps, d in sorted(stage_dirs.items()):
        parts = aggregate.loss_parts(d)
        if parts is None:
            continue
        row = {"steps": steps, "loss_by_fifth": [round(x, 4) for x in parts],
               "last_fifth": round(parts[-1], 4), "greedy_accuracy": accuracy.get(steps)}
        if prev is not None:
            row["last_fifth_vs_previous_budget"] = f"{100 * (parts[-1] / prev - 1):+.1f}%"
        out.append(row)
        prev = parts[-1]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("base", "sft"), required=True)
    parser.add_argument("--budgets", required=True, help="comma-separated optimizer steps")
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--base", type=Path, help="the base run SFT starts from (--stage=sft)")
    parser.add_argument("--seed", type=int, default=0, help="demo.seed")
    parser.add_argument("--learning_rate", type=float, default=0.0,
                        help="the stage's peak learning rate (0: the demo config's)")
    parser.add_argument("--variant", default="", choices=("", "seeds"),
                        help="the demo config's variant (configs/demo_sudoku.py:<variant>): "
                             "its data and corpora; one workdir per variant")
    args = parser.parse_args(argv)
    try:
        budgets = sorted({int(x) for x in args.budgets.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"error: --budgets={args.budgets!r}: comma-separated integers") from None
    if not budgets or budgets[0] < 5:
        raise SystemExit(f"error: --budgets={args.budgets!r}: at least one budget of 5+ steps")
    if args.stage == "sft" and not (args.base and (args.base / "hf").is_dir()):
        raise SystemExit(f"error: --stage=sft needs --base=<a finished base run>, got {args.base}")
    demo = demo_config.get_config(args.variant).demo.copy_and_resolve_references()
    demo.seed = args.seed
    args.workdir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(args.workdir / ".jax_cache"))
    logging.getLogger("absl").setLevel(logging.WARNING)
    data = demo_data.prepare_data(demo, args.workdir)
    dirs, accuracy = {}, {}
    for steps in budgets:
        dirs[steps] = args.workdir / run_name(args.stage, steps, args.learning_rate, args.seed,
                                              args.base)
        run_budget(demo, data, args.stage, steps, dirs[steps], args.base, args.learning_rate)
        accuracy[steps] = greedy_accuracy(demo, data, dirs[steps])
        print(json.dumps(summary(dirs, accuracy)[-1]), flush=True)
    print(json.dumps({"stage": args.stage, "seed": args.seed,
                      "learning_rate": args.learning_rate or None,
                      "variant": args.variant or None,
                      "budgets": summary(dirs, accuracy)}, indent=1))


if __name__ == "__main__":
    main()
