"""The rollout's sampler against the evaluation's, on one exported model of a demo run.

  python -m examples.demo.sampler_gap --config=configs/demo_sudoku.py:d1like \\
      --workdir=runs/fast/p2_loop --stage=sft --samples=4 --variant=loop --rollout=fast

The GRPO stages roll out with ``demo.sampler`` (the default demo's: the fast sampler, dual KV
cache, confidence threshold 0.9; ``:d1like`` rolls out exactly, so ``--rollout=fast`` scores
the default's fast sampler instead); the evaluation decodes exactly (no cache, one token per
step per block, d1's protocol). This scores the held-out puzzles with both at the rollout
temperature, the same seeds, ``--samples`` completions per puzzle, plus greedy exact decoding
(the table's number), and prints the reward and accuracy of each and the difference fast -
exact with its standard error over puzzles (paired: the same puzzles under both). Written to
``<workdir>/sampler_gap_<stage>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from d1jax.eval import evaluate as eval_lib
from d1jax.eval.score import score_records
from d1jax.run import spec as spec_lib
from d1jax.run.build import build
from examples.demo import config as demo_config
from examples.demo import evaluation
from examples.demo.data import prepare_data
from examples.demo.seeds import VARIANTS


def _scores(task, examples, texts) -> tuple[np.ndarray, np.ndarray]:
    """Per completion: the GRPO reward and d1's accuracy (correct empty cells / empty cells)."""
    records = [task.record(ex, t) for ex, t in zip(examples, texts)]
    items = score_records(records, task, details=True)["items"]
    acc = np.asarray([i["hits"] / max(i["total"], 1) for i in items])
    return np.asarray(task.total_reward(texts, examples), float), acc


def measure(demo, data: dict, model_dir: Path, samples: int) -> dict:
    sets = evaluation.eval_sets(demo, data)
    examples = sets["heldout"]
    spec = spec_lib.from_config(demo_config.eval_config(demo, model_dir))
    s = build(spec, model_dir, spec.mesh.build())
    task = spec.task.build()
    exact = spec_lib.with_tokens(spec.eval.samplers[0], s.ids)
    rollout = spec_lib.with_tokens(spec_lib.sampler_config(
        demo.sampler, "demo.sampler.", demo.sampler.gen_length, demo.sampler.steps), s.ids)
    samplers = {"rollout (fast)": rollout,
                "exact, sampled": dataclasses.replace(exact, temperature=rollout.temperature),
                "exact, greedy (evaluation)": exact}
    out, per_puzzle = {}, {}
    for name, scfg in samplers.items():
        k = 1 if scfg.temperature == 0 else samples
        texts = [t for j in range(k) for t in eval_lib.generate_texts(
            s, task, examples, scfg, demo.eval.batch_size, data["prompt_length"],
            seed=1000 * (j + 1))]
        reward, acc = _scores(task, examples * k, texts)
        n = len(examples)
        per_puzzle[name] = (reward.reshape(k, n).mean(0), acc.reshape(k, n).mean(0))
        out[name] = {"reward": float(reward.mean()), "accuracy": 100 * float(acc.mean()),
                     "completions": len(texts), "sampler": str(scfg)}
    for metric, i in (("reward", 0), ("accuracy", 1)):
        d = per_puzzle["rollout (fast)"][i] - per_puzzle["exact, sampled"][i]
        scale = 100 if metric == "accuracy" else 1
        out[f"fast - exact, {metric}"] = {"mean": scale * float(d.mean()),
                                          "se": scale * float(d.std(ddof=1) / np.sqrt(len(d)))}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo_sudoku.py:d1like",
                        help="the run's demo config (configs/demo_sudoku.py[:variant])")
    parser.add_argument("--workdir", required=True, type=Path, help="a demo run's workdir")
    parser.add_argument("--stage", default="sft", help="its stage whose export is scored")
    parser.add_argument("--samples", type=int, default=4, help="completions per puzzle")
    parser.add_argument("--variant", default="", help=f"the run's rounding variant {sorted(VARIANTS)}")
    parser.add_argument("--rollout", choices=("config", "fast"), default="config",
                        help="the rollout sampler scored: the config's demo.sampler, or the "
                             "default demo's fast one")
    args = parser.parse_args(argv)
    demo = demo_config.get_config(args.config.partition(":")[2] or None).demo
    if args.rollout == "fast":
        fast = demo_config.get_config(None).demo.sampler
        demo.sampler.kv_cache, demo.sampler.threshold = fast.kv_cache, fast.threshold
    if demo.sampler.kv_cache == "none" and demo.sampler.threshold >= 1.0:  # decodes exactly
        print("[sampler_gap] the rollout sampler is the exact one: the gap is zero by "
              "construction (--rollout=fast scores the default demo's)")
    if args.variant:  # the model program the run trained with (examples/demo/seeds.py)
        demo.model.unroll_layers = args.variant == "unrolled"
    model_dir = args.workdir / args.stage / "hf"
    if not model_dir.is_dir():
        raise SystemExit(f"error: {model_dir} is absent: --stage names a finished stage")
    data = prepare_data(demo, args.workdir)  # the run's own (kept when present)
    res = measure(demo, data, model_dir, args.samples)
    (args.workdir / f"sampler_gap_{args.stage}.json").write_text(json.dumps(res, indent=1))
    for name, r in res.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in r.items() if k != "sampler"))


if __name__ == "__main__":
    main()
