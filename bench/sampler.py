"""Sampler throughput on the bench-tiny workload (docs/benchmarks.md), and the precision of Gumbel-max sampling.

    python bench/sampler.py --model bench-tiny
    python bench/sampler.py --model bench-tiny --modes exact --gen-lengths 128
    python bench/sampler.py --reference-json ref.json   # ref.json: bench/reference/run.py, same sitting

Workload (docs/benchmarks.md, bench-tiny): random weights (seed 0), batch 8, prompt 64 random tokens,
block 32, steps = gen_length / 2, temperature 0, low_confidence remasking. Prints one JSON
object with, per gen_length and mode: generated tokens/s (batch * gen_length / wall time;
best and median of --repeats rounds after compiling, each round running every mode once so
that modes are compared side by side under the same machine load), model evaluations and
forward FLOPs (analytic matmul count) per generated token, compile time, and the fraction of
tokens equal to the exact sampler's. ``reference_proxy`` redoes the PyTorch reference's work
in JAX in the same rounds (full-sequence head and softmax, host top-k after every step);
``speedup_vs_proxy`` is the ratio to it. With --reference-json (what
``bench/reference/run.py`` printed in this sitting) each mode at gen_length 128 also gets
``speedup_vs_reference``, the ratio to the reference's median generate() time;
``bench/compare.py`` runs the reference and this side by side.
Random weights predict near-uniformly (confidence ~1/V), so threshold decoding only acts
with --head-scale (e.g. 200), which sharpens the output head like a trained model's.
The ``gumbel`` section samples a 126k-token distribution with a heavy low-probability tail
with float64 (LLaDA), ``jax.random.gumbel`` float32 and ``sampler.gumbel_noise`` float32.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import NamedTuple


# Run as a script (python bench/x.py): the repository root holds ``bench``.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import d1jax  # noqa: E402
from bench import common  # noqa: E402
from d1jax import sampling as smp  # noqa: E402

MODES = {  # name -> SamplerConfig overrides
    "reference_proxy": {},  # not d1jax's sampler: see reference_proxy()
    "exact": {},
    "prefix_cache": dict(kv_cache="prefix"),
    "dual_cache": dict(kv_cache="dual"),
    "prefix_cache+parallel": dict(kv_cache="prefix", threshold=0.9),
    "dual_cache+parallel": dict(kv_cache="dual", threshold=0.9),
    "dual_cache_masked+parallel": dict(kv_cache="dual", recompute="masked", threshold=0.9),
    "fast_default": smp.FAST_DEFAULTS,  # SamplerConfig.fast(): dual, refresh 8, tau 0.99
}


def forward_flops(c, q_tokens: int, kv_len: int, head_tokens: int) -> float:
    """Matmul FLOPs of one sequence's forward: q_tokens queries over kv_len keys."""
    d, h, n, k, f = c.d_model, c.head_dim, c.n_heads, c.n_kv_heads, c.mlp_hidden_size
    linear = 2 * (2 * d * n * h + 2 * d * k * h + 3 * d * f)
    attention = 2 * 2 * kv_len * n * h
    return c.n_layers * q_tokens * (linear + attention) + 2 * head_tokens * d * c.embedding_size


def flops_per_token(c, cfg: smp.SamplerConfig, prompt_len: int, block_steps) -> float:
    """Forward FLOPs per generated token given the evaluations each block took."""
    total, blk, out = prompt_len + cfg.gen_length, cfg.block_length, 0.0
    full = forward_flops(c, total, total, blk) * (2 if cfg.cfg_scale > 0 else 1)
    for b, n in enumerate(block_steps):
        if cfg.kv_cache == "none":
            out += n * full
            continue
        q = [blk if cfg.kv_cache == "dual" else total - (prompt_len + b * blk)] * n
        if cfg.recompute == "masked":  # the static width of each step's recomputed set
            rw, rsizes = smp.recompute_sizes(cfg)
            q = [rsizes[w] for w in rw]
        which, sizes = smp.head_sizes(cfg)  # cached steps: head on the masked positions
        budget = smp.num_transfer_tokens(blk, cfg.steps_per_block)
        out, since = out + full, budget[0]
        for i in range(1, n):  # refreshes counted as if each step unmasked its budget
            if cfg.cache_refresh and since >= cfg.cache_refresh:
                out, since = out + full, 0
            else:
                out += forward_flops(c, q[i], total, sizes[which[i]])
            since += budget[i]
    return out / cfg.gen_length


class ProxyOutput(NamedTuple):
    ids: np.ndarray  # [B, L]
    block_steps: np.ndarray  # [num_blocks]


def reference_proxy(model, cfg: smp.SamplerConfig):
    """LLaDA generate.py's work per step, in JAX, as a side-by-side baseline under the same
    load: a forward with the head on every position, a softmax over all of [B, L, V]
    (float32 here, float64 there), and the per-row top-k on the host after every step."""
    @jax.jit
    def propose(params, x, end):
        logits = model.apply({"params": params}, x)
        x0 = jnp.argmax(logits, -1)
        x0_p = jnp.take_along_axis(jax.nn.softmax(logits, -1), x0[..., None], -1)[..., 0]
        x0_p = jnp.where(jnp.arange(x.shape[1]) >= end, -jnp.inf, x0_p)
        return x0, jnp.where(x == cfg.mask_id, x0_p, -jnp.inf)

    def run(params, prompt_ids, prompt_mask, rng):
        del prompt_mask, rng  # no padding in the workload; temperature 0
        b, lp = prompt_ids.shape
        x = np.concatenate([np.asarray(prompt_ids),
                            np.full((b, cfg.gen_length), cfg.mask_id, np.int32)], 1)
        budget = smp.num_transfer_tokens(cfg.block_length, cfg.steps_per_block)
        for nb in range(cfg.num_blocks):
            for k in budget:
                x0, conf = jax.device_get(propose(params, x, lp + (nb + 1) * cfg.block_length))
                for j in range(b):
                    sel = np.argsort(-conf[j], kind="stable")[:k]
                    x[j, sel] = x0[j, sel]
        return ProxyOutput(x, np.full(cfg.num_blocks, cfg.steps_per_block))
    return run, propose


def compile_mode(fns, params, ids, mask, cfg):
    """(compiled generate, compile seconds, warm-up output) of one sampler configuration;
    ``mask``: the prompts' attention mask, or None (no padding)."""
    gen = smp.make_generate_fn(fns, cfg)
    rng = jax.random.key(0)
    t0 = time.perf_counter()
    compiled = gen.lower(params, ids, mask, rng).compile()
    compile_s = time.perf_counter() - t0
    return compiled, compile_s, jax.block_until_ready(compiled(params, ids, mask, rng))


def compile_proxy(model, params, ids, cfg):
    run, propose = reference_proxy(model, cfg)
    x = jnp.pad(ids, ((0, 0), (0, cfg.gen_length)), constant_values=cfg.mask_id)
    t0 = time.perf_counter()
    jax.block_until_ready(propose(params, x, ids.shape[1]))  # compile (+ one step)
    compile_s = time.perf_counter() - t0
    return run, compile_s, run(params, ids, None, None)


def bench_gen_length(model, params, ids, cfgs: dict, repeats: int) -> dict:
    """Modes timed side by side: rounds interleave them, so load changes hit all alike."""
    fns = smp.model_fns(model)
    compiled = {m: compile_proxy(model, params, ids, cfg) if m == "reference_proxy"
                else compile_mode(fns, params, ids, None, cfg) for m, cfg in cfgs.items()}
    times = {m: [] for m in cfgs}
    rng = jax.random.key(0)
    for _ in range(repeats):
        for m, (fn, _, _) in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params, ids, None, rng))
            times[m].append(time.perf_counter() - t0)
    rows = {}
    for m, cfg in cfgs.items():
        _, compile_s, out = compiled[m]
        best, med = min(times[m]), statistics.median(times[m])
        steps = np.asarray(out.block_steps)
        rows[m] = {
            "tokens_per_s": round(ids.shape[0] * cfg.gen_length / best, 1),
            "tokens_per_s_median": round(ids.shape[0] * cfg.gen_length / med, 1),
            "wall_s": round(best, 3),
            "wall_s_all": times[m],
            "compile_s": round(compile_s, 2),
            "forwards_per_token": round(float(steps.sum()) * (2 if cfg.cfg_scale > 0 else 1)
                                        / cfg.gen_length, 4),
            "block_steps": steps.tolist(),
            "ids": np.asarray(out.ids),
        }
    return rows


def gumbel_check(samples: int, vocab: int = 126464, rel_tail_prob: float = 1e-6) -> dict:
    """Frequency of sampling a low-probability tail token, per noise implementation.

    One head token with logit 0 and vocab-1 tail tokens with logit log(rel_tail_prob); the
    exact tail mass is (V-1) r / (1 + (V-1) r). Temperature 1.
    """
    logits = np.full(vocab, np.log(rel_tail_prob))
    logits[0] = 0.0
    exact = (vocab - 1) * rel_tail_prob / (1 + (vocab - 1) * rel_tail_prob)
    chunk = 200
    rs = np.random.default_rng(0)
    lj = jnp.asarray(logits, jnp.float32)
    draws = {
        "float64_llada": lambda i: np.argmax(  # exp(l) / (-log u)^T, u float64, as LLaDA
            np.exp(logits) / -np.log(rs.random((chunk, vocab))), -1),
        "float32_jax_random_gumbel": lambda i: np.asarray(jnp.argmax(
            lj + jax.random.gumbel(jax.random.key(i), (chunk, vocab), jnp.float32), -1)),
        "float32_d1jax_gumbel_noise": lambda i: np.asarray(jnp.argmax(
            lj + smp.gumbel_noise(jax.random.key(i), (chunk, vocab)), -1)),
    }
    n = (samples // chunk) * chunk
    out = {"vocab": vocab, "rel_tail_prob": rel_tail_prob, "samples": n,
           "exact_tail_mass": round(exact, 4),
           "std_error": round(float(np.sqrt(exact * (1 - exact) / n)), 4)}
    for name, draw in draws.items():
        hits = sum(int((draw(i) != 0).sum()) for i in range(n // chunk))
        out[name] = round(hits / n, 4)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="bench-tiny", help="d1jax model preset")
    p.add_argument("--gen-lengths", type=int, nargs="+", default=[128, 256])
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-length", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--gumbel-samples", type=int, default=3000, help="0 skips the check")
    p.add_argument("--reference-json", help="bench/reference/run.py's JSON from this sitting: adds "
                   "speedup_vs_reference on the reference's workload")
    p.add_argument("--head-scale", type=float, default=1.0,
                   help="multiply the output head (e.g. 40: confident, non-uniform predictions, "
                        "so that threshold decoding has something to act on)")
    args = p.parse_args(argv)

    c = d1jax.preset(args.model)
    model = d1jax.LLaDA(c)
    params = d1jax.init_params(model, jax.random.key(0))
    if args.head_scale != 1.0:
        params = {**params, "ff_out": {"kernel": params["ff_out"]["kernel"] * args.head_scale}}
    ids = jnp.asarray(np.random.RandomState(0).randint(
        0, c.vocab_size - 2, (args.batch, args.prompt_length)), jnp.int32)
    result = {"model": args.model, "device": jax.devices()[0].device_kind,
              "load_average_1m_at_start": round(os.getloadavg()[0], 2),
              "batch": args.batch, "prompt_length": args.prompt_length,
              "block_length": args.block_length, "head_scale": args.head_scale,
              "runs": {}}
    ref = common.load_reference(args.reference_json) if args.reference_json else None
    if ref:
        result["reference_tokens_per_s"] = ref["sampler"]["generated_tokens_per_s"]
    for gl in args.gen_lengths:
        cfgs = {mode: smp.SamplerConfig(gen_length=gl, block_length=args.block_length,
                                        steps=gl // 2, mask_id=c.mask_token_id,
                                        eos_id=c.eos_token_id, **MODES[mode])
                for mode in args.modes}
        rows = bench_gen_length(model, params, ids, cfgs, args.repeats)
        exact_ids = rows["exact"]["ids"][:, args.prompt_length:] if "exact" in rows else None
        for mode, row in rows.items():
            total = args.prompt_length + gl
            flops = (sum(row["block_steps"]) * forward_flops(c, total, total, total) / gl
                     if mode == "reference_proxy" else
                     flops_per_token(c, cfgs[mode], args.prompt_length, row["block_steps"]))
            row["gflops_per_token"] = round(flops / 1e9, 4)
            comp = row.pop("ids")[:, args.prompt_length:]
            if exact_ids is not None and mode != "exact":
                row["tokens_equal_to_exact"] = round(float((comp == exact_ids).mean()), 4)
            wall_s = row.pop("wall_s_all")
            if ref and (args.batch, args.prompt_length, gl, args.block_length) == tuple(
                    ref["sampler"][k] for k in ("batch", "prompt_len", "gen_length",
                                                "block_length")):
                row["speedup_vs_reference"] = round(
                    common.speedup(ref["sampler"]["times_s"], wall_s), 2)
            if "reference_proxy" in rows:
                row["speedup_vs_proxy"] = round(
                    rows["reference_proxy"]["wall_s"] / row["wall_s"], 2)
            print(f"gen {gl} {mode}: {row}", file=sys.stderr, flush=True)
        result["runs"][f"gen{gl}"] = rows
    if args.gumbel_samples:
        result["gumbel"] = [gumbel_check(args.gumbel_samples, rel_tail_prob=r)
                            for r in (1e-6, 1e-7)]
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
