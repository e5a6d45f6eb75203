"""One-step estimator, per-rollout old/ref pass and diffu-GRPO update on the bench-tiny workload (docs/benchmarks.md).

    python bench/update.py --model bench-tiny
    python bench/update.py --model bench-tiny --lora-rank 128 --mus 1 4 12 --repeats 7
    python bench/update.py --reference-json ref.json   # ref.json: bench/reference/run.py, same sitting

Workload (docs/benchmarks.md, bench-tiny): random weights (seed 0), float32, batch 8, prompt 64 random
tokens, completion 128 (sequence 192); estimator input [mu, 8, 192]; GRPO update with mu = 1
(forward + backward + AdamW with clipping) on 8 x 192. Every measured function is jitted
and compiled first; each round runs every measurement once (side by side under the same
load) and the JSON reports the best and median of --repeats rounds, the compiled peak
scratch memory (XLA's temp allocation) per mu and forward GFLOP/s (analytic matmul count).
With --reference-json (what ``bench/reference/run.py`` printed in this sitting: d1's code on
the HF model, torch CPU) it adds the speed-up over the reference's medians; a reference
timed on another machine or day says nothing about this one. ``bench/compare.py`` runs both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


# Run as a script (python bench/x.py): the repository root holds ``bench``.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import d1jax  # noqa: E402
from d1jax.model import LoraConfig  # noqa: E402
from d1jax.objectives import logprob  # noqa: E402
from d1jax.objectives import table  # noqa: E402
from d1jax.objectives.batch import GRPOBatch  # noqa: E402
from d1jax.plan import flops  # noqa: E402
from d1jax.run import optim  # noqa: E402
from d1jax.train import jit_steps as steps_lib  # noqa: E402
from bench import common  # noqa: E402


def workload(c, batch: int, prompt: int, completion: int, mu: int, seed: int = 0) -> GRPOBatch:
    rs = np.random.RandomState(seed)
    return GRPOBatch(prompt_ids=rs.randint(0, c.vocab_size - 2, (batch, prompt)).astype(np.int32),
                prompt_mask=np.ones((batch, prompt), np.int32),
                completion_ids=rs.randint(0, c.vocab_size - 2,
                                          (batch, completion)).astype(np.int32),
                completion_mask=np.ones((batch, completion), np.int32),
                advantages=rs.normal(size=batch).astype(np.float32),
                mask_seeds=rs.randint(0, 4096, mu).astype(np.int32))


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def build_measurements(args) -> tuple[dict, dict]:
    """name -> zero-argument callable returning device arrays; plus static facts."""
    c = d1jax.preset(args.model)
    lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank, dropout=0.0) \
        if args.lora_rank else None
    model = d1jax.LLaDA(c, lora=lora)
    params = d1jax.init_params(model, jax.random.key(0))
    b, p, cl = args.batch, args.prompt, args.completion
    facts: dict = {"compile_s": {}, "peak_temp_mb": {}}
    runs: dict = {}
    for mu in args.mus:
        batch = workload(c, b, p, cl, mu)
        est = jax.jit(lambda prm, x: logprob.per_token_logps(
            model, prm, x["prompt_ids"], x["completion_ids"], x["mask_seeds"],
            p_mask_prompt=0.15, attention_mask_bl=None))
        x = {k: jnp.asarray(getattr(batch, k)) for k in ("prompt_ids", "completion_ids",
                                                          "mask_seeds")}
        t0 = time.perf_counter()
        compiled = est.lower(params, x).compile()
        facts["compile_s"][f"estimator_mu{mu}"] = time.perf_counter() - t0
        facts["peak_temp_mb"][f"estimator_mu{mu}"] = \
            compiled.memory_analysis().temp_size_in_bytes / 2**20
        runs[f"estimator_mu{mu}"] = (lambda f, x: lambda: f(params, x))(compiled, x)

        opt = optim.make_optimizer(optim.OptimConfig(learning_rate=3e-6))
        cfg = table.GRPOConfig(num_iterations=mu, beta=0.04, epsilon=0.5,
                                use_attention_mask=False)
        # The same jitted programs the training loop runs (d1jax.train.jit_steps).
        steps = steps_lib.make_jitted_steps(model, None, opt, lora=lora is not None,
                                            keep_reference=lora is None, grpo=cfg)
        state = steps.init(params)
        t0 = time.perf_counter()
        jax.block_until_ready(steps.rollout_logps(state, batch))
        facts["compile_s"][f"rollout_old_ref_mu{mu}"] = time.perf_counter() - t0
        runs[f"rollout_old_ref_mu{mu}"] = (lambda s, st, bt: lambda: s.rollout_logps(st, bt))(
            steps, state, batch)
        if mu == 1:
            batch = batch.replace(**jax.device_get(steps.rollout_logps(state, batch)))
            holder = {"state": state}

            def one_update(steps=steps, batch=batch, holder=holder):
                holder["state"], m = steps.grpo_update(holder["state"], batch, jax.random.key(0))
                return m
            t0 = time.perf_counter()
            jax.block_until_ready(one_update())
            facts["compile_s"]["update_mu1"] = time.perf_counter() - t0
            runs["update_mu1"] = one_update
    facts["estimator_gflop"] = flops.estimator(c, b, p, cl).total / 1e9
    return runs, facts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bench-tiny", help="model preset (d1jax.model.PRESETS)")
    ap.add_argument("--mus", type=int, nargs="+", default=[1, 4], help="inner iterations mu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reference-json", help="bench/reference/run.py's JSON from this sitting: adds "
                    "speedup_vs_reference (on the bench-tiny workload only)")
    args = ap.parse_args()
    reference = common.reference_seconds(common.load_reference(args.reference_json)) \
        if args.reference_json else {}
    if 1 not in args.mus:
        args.mus = [1] + args.mus
    runs, facts = build_measurements(args)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    out = {"model": args.model, "device": str(jax.devices()[0].platform),
           "workload": {"batch": args.batch, "prompt": args.prompt,
                        "completion": args.completion, "mus": args.mus,
                        "lora_rank": args.lora_rank, "repeats": args.repeats},
           "load_average_1m": round(os.getloadavg()[0], 2), "seconds": {}}
    same_workload = (args.model, args.batch, args.prompt, args.completion, args.lora_rank) \
        == ("bench-tiny", 8, 64, 128, 0)  # the reference's fixed workload
    for name, ts in times.items():
        out["seconds"][name] = {"best": round(min(ts), 4),
                                "median": round(statistics.median(ts), 4)}
        if name in reference and same_workload:
            out.setdefault("reference_median_s", {})[name] = round(
                statistics.median(reference[name]), 4)
            out.setdefault("speedup_vs_reference", {})[name] = round(
                common.speedup(reference[name], ts), 2)
    for mu in args.mus:
        out.setdefault("estimator_gflop_per_s", {})[f"mu{mu}"] = round(
            mu * facts["estimator_gflop"] / min(times[f"estimator_mu{mu}"]), 1)
    out["peak_temp_mb"] = {k: round(v, 1) for k, v in facts["peak_temp_mb"].items()}
    out["compile_s"] = {k: round(v, 2) for k, v in facts["compile_s"].items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
