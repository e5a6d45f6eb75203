"""Where the `:d1like` base and SFT models land on box-needed puzzles, before any RL (issue 60).

  python -m examples.demo.box_measure train --seed=0 --workdir=/work/runs60/p0
  python -m examples.demo.box_measure eval --seed=0 --workdir=/work/runs60/p0 --empty=8,10,11 \
      --spread=box8,box10,box11,heldout --puzzles=64 --group=8

``train``: the data stage, pretraining (the base) and SFT on Latin squares of ``:d1like`` with
``demo.seed`` = ``--seed`` and the ``unrolled`` variant (the first two stages of
``examples.demo.seeds``' ``p{seed}_unrolled`` run; no GRPO). ``eval``: greedy cell accuracy
(d1's protocol, the demo's evaluation) of both models on box-needed held-out puzzles at each
``--empty`` count (the held-out set ``demo.data.box_needed=True`` with ``box_num_empty=(k, k)``
makes), the plain held-out set and d1's test set; and for the SFT model the within-group reward
spread GRPO would see: ``--group`` completions for each of the first ``--puzzles`` puzzles of
each ``--spread`` set, sampled at the rollout temperature with the evaluation's exact sampler,
scored by the GRPO reward. Results go to ``<workdir>/box_eval.json``; ``table
--workdir=DIR,DIR,...`` prints docs/demo.md's tables ("Toward issue 60"), ``reference`` the
sets' row-and-column share and the accuracy of a uniformly drawn Latin completion.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np

from d1jax.eval import evaluate as eval_lib
from d1jax.run import spec as spec_lib
from d1jax.run.build import build
from d1jax.tasks import sudoku
from d1jax.train import sft
from examples.demo import config as demo_config
from examples.demo import data as demo_data
from examples.demo import difficulty, evaluation, latin
from examples.demo import run as demo_run


def d1like(seed: int, **data_fields):
    """``:d1like`` with ``demo.seed=seed``, the ``unrolled`` variant and ``demo.data`` fields."""
    c = demo_config.get_config("d1like")
    c.demo.seed = seed
    c.demo.model.unroll_layers = True
    for k, v in data_fields.items():
        c.demo.data[k] = v
    return c.demo


def train(demo, wd: Path) -> dict:
    """Data, base and SFT stages as ``examples/demo/run.py`` runs them; their wall times."""
    data = demo_data.prepare_data(demo, wd)
    log = lambda msg: print(msg, flush=True)
    times = {"base": demo_run._run_stage(
        "pretrain (base model)",
        lambda cfg, d: sft.run(cfg, d, data=demo_data.pretraining_corpus(demo, data)),
        demo_config.pretrain_config(demo, data), wd / "base", log)}
    times["sft"] = demo_run._run_stage(
        "SFT", lambda cfg, d: sft.run(cfg, d, data=demo_data.sft_corpus(demo, data)),
        demo_config.sft_config(demo, data, wd / "base"), wd / "sft", log)
    return times


def group_spread(demo, data: dict, model_dir: Path, examples: list[dict], group: int,
                 seed: int = 0) -> dict:
    """``group`` completions per puzzle at ``demo.sampler.temperature`` with the evaluation's
    sampler (exact decoding, d1's steps), each puzzle's completions side by side as in a GRPO
    rollout; share of groups whose rewards are all equal and mean within-group std."""
    spec = spec_lib.from_config(demo_config.eval_config(demo, model_dir))
    s = build(spec, model_dir, spec.mesh.build())
    task = spec.task.build()
    greedy = spec_lib.with_tokens(spec.eval.samplers[0], s.ids)
    scfg = dataclasses.replace(greedy, temperature=demo.sampler.temperature)
    rep = [ex for ex in examples for _ in range(group)]
    texts = eval_lib.generate_texts(s, task, rep, scfg, spec.eval.batch_size,
                                    data["prompt_length"], seed=seed)
    r = np.asarray(task.total_reward(texts, rep), np.float64).reshape(len(examples), group)
    std = r.std(1, ddof=1)  # as GRPO logs it (d1jax/train/rollout.py reward_metrics)
    return {"puzzles": len(examples), "group": group, "mean_reward": float(r.mean()),
            "all_equal": float((std < 1e-6).mean()), "std": float(std.mean())}


def evaluate(args) -> dict:
    wd = Path(args.workdir)
    out_path = wd / "box_eval.json"
    out = json.loads(out_path.read_text()) if out_path.exists() else {}
    demo = d1like(args.seed)
    demo.eval.num_examples = args.examples
    data = demo_data.prepare_data(demo, wd)
    sets = evaluation.eval_sets(demo, data)  # plain held-out, d1's test set
    for k in args.empty:
        box = demo_data.prepare_data(d1like(args.seed, box_needed=True, box_num_empty=(k, k)), wd)
        sets[f"box{k}"] = sudoku.load_test(box["heldout"], subsample=None)[:demo.eval.num_examples]
    demo.eval.sampled_sets = ()  # greedy only (d1's protocol)
    for stage in ("base", "sft"):
        todo = {name: ex for name, ex in sets.items() if f"{stage}/{name}" not in out}
        if not todo:
            continue
        t0 = time.perf_counter()
        res = evaluation.evaluate_model(demo, data, wd / stage / "hf", todo)
        dt = time.perf_counter() - t0
        for name, r in res.items():
            out[f"{stage}/{name}"] = {**r, "stage_eval_time_s": dt}
            print(f"{stage}/{name}", f"{r['accuracy']:.1f}", flush=True)
        print(f"{stage}: {dt:.0f} s for {len(todo)} sets", flush=True)
        out_path.write_text(json.dumps(out, indent=1))
    if args.temperature is not None:  # another rollout temperature than the config's
        demo.sampler.temperature = args.temperature
    for name in args.spread:
        key = f"sft/spread_{name}" + (f"_T{args.temperature:g}" if args.temperature else "")
        if key in out:
            continue
        t0 = time.perf_counter()
        r = group_spread(demo, data, wd / "sft" / "hf", sets[name][:args.puzzles], args.group)
        r["time_s"] = time.perf_counter() - t0
        out[key] = r
        print(key, r, flush=True)
        out_path.write_text(json.dumps(out, indent=1))
    return out


def latin_pick_accuracy(rows: list[dict]) -> float:
    """Expected cell accuracy (%) of a writer who answers a uniformly drawn Latin completion of
    each puzzle: perfect row-and-column reasoning, no box rule (the Latin SFT's ceiling)."""
    squares = latin.latin_squares().astype(np.int8)
    acc = []
    for r in rows:
        p, sol = difficulty.as_array([r["puzzle"], r["solution"]])
        given = p != 0
        comp = squares[(squares[:, given] == p[given]).all(1)]
        acc.append((comp[:, ~given] == sol[~given]).mean())
    return 100 * float(np.mean(acc))


def reference(args) -> str:
    """Markdown: per evaluation set of ``eval``, the share of empty cells row-and-column
    singles fill (``difficulty.row_column_share``) and ``latin_pick_accuracy``."""
    wd = Path(args.workdir)
    demo = d1like(args.seed)
    sets = evaluation.eval_sets(demo, demo_data.prepare_data(demo, wd))
    for k in args.empty:
        box = demo_data.prepare_data(d1like(args.seed, box_needed=True, box_num_empty=(k, k)), wd)
        sets[f"box{k}"] = sudoku.load_test(box["heldout"], subsample=None)[:demo.eval.num_examples]
    out = ["| set | puzzles | row/column singles fill | uniform Latin completion: accuracy |",
           "|---|---|---|---|"]
    for name, rows in sets.items():
        share = difficulty.row_column_share([r["puzzle"] for r in rows])["row_column_share"]
        out.append(f"| {name} | {len(rows)} | {share:.1%} | {latin_pick_accuracy(rows):.1f} |")
    return "\n".join(out)


def table(workdirs: list[str]) -> str:
    """Markdown: greedy accuracy per (seed, model) and set; then the SFT models' reward spread
    (all-equal groups, mean within-group std, mean reward) per set."""
    res = {Path(w).name: json.loads((Path(w) / "box_eval.json").read_text()) for w in workdirs}
    sets = list(dict.fromkeys(k.split("/")[1] for r in res.values() for k in r
                              if k.startswith("base/")))
    out = ["| run | model | " + " | ".join(sets) + " |", "|---|---" + "|---" * len(sets) + "|"]
    for run, r in res.items():
        for stage in ("base", "sft"):
            cells = [f"{r[f'{stage}/{s}']['accuracy']:.1f}" if f"{stage}/{s}" in r else ""
                     for s in sets]
            out.append(f"| {run} | {stage} | " + " | ".join(cells) + " |")
    temps = sorted({k.partition("_T")[2] for r in res.values() for k in r if "/spread_" in k},
                   key=lambda t: float(t or 0))
    names = list(dict.fromkeys(k.split("/spread_")[1].partition("_T")[0]
                               for r in res.values() for k in r if "/spread_" in k))
    out += ["", "| run | set | " + " | ".join(
        f"T={t or d1like(0).sampler.temperature}: all equal / std / reward" for t in temps)
        + " |",
        "|---|---" + "|---" * len(temps) + "|"]
    for run, r in res.items():
        for name in names:
            keys = [f"sft/spread_{name}" + (f"_T{t}" if t else "") for t in temps]
            cells = [f"{r[k]['all_equal']:.0%} / {r[k]['std']:.3f} / {r[k]['mean_reward']:.3f}"
                     if k in r else "" for k in keys]
            out.append(f"| {run} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("train", "eval", "table", "reference"))
    ap.add_argument("--seed", type=int, default=0, help="demo.seed (pretraining seed)")
    ap.add_argument("--workdir", required=True, help="run folder (table: comma-separated)")
    ap.add_argument("--empty", default="8,10,11", help="box-needed held-out empty-cell counts")
    ap.add_argument("--spread", default="box8,box10,box11,heldout",
                    help="sets of the reward spread (boxK: box-needed at K empty cells)")
    ap.add_argument("--puzzles", type=int, default=64, help="puzzles for the reward spread")
    ap.add_argument("--temperature", type=float, default=None,
                    help="the spread's sampling temperature (default: demo.sampler's, 0.9)")
    ap.add_argument("--examples", type=int, default=256, help="puzzles per greedy set")
    ap.add_argument("--group", type=int, default=8, help="completions per puzzle (G)")
    a = ap.parse_args(argv)
    a.empty = [int(x) for x in a.empty.split(",") if x]
    a.spread = [x for x in a.spread.split(",") if x]
    if a.what in ("table", "reference"):
        print(table(a.workdir.split(",")) if a.what == "table" else reference(a))
        return
    wd = Path(a.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(wd.parent / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    t0 = time.perf_counter()
    if a.what == "train":
        times = train(d1like(a.seed), wd)
        (wd / "train_times.json").write_text(json.dumps(times))
    else:
        evaluate(a)
    print(f"[box_measure] {a.what} seed {a.seed}: {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
