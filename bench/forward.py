"""Forward throughput and model FLOP utilisation of LLaDA.

    python bench/forward.py                            # bench-tiny, batch 8 x 192, CPU
    python bench/forward.py --model llada-8b --layers 4 --dtype bfloat16   # 8B-shaped stack (GPU)

FLOPs are counted analytically (matmuls: 2 x params-in-matmuls per token, plus attention
4 x L x d per token per layer). The peak they are divided by is measured in the same run:
the best FLOP/s of a large float32 (or --dtype) matmul on the same device. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import d1jax  # noqa: E402


def model_flops_per_token(c, seq_len: int) -> float:
    d, h = c.d_model, c.head_dim
    per_layer = 2 * (2 * d * c.n_heads * h + 2 * d * c.n_kv_heads * h + 3 * d * c.mlp_hidden_size)
    attention = 2 * 2 * seq_len * c.n_heads * h
    return c.n_layers * (per_layer + attention) + 2 * d * c.embedding_size


def best_time(fn, *args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def peak_matmul_flops(dtype, n: int, repeats: int) -> float:
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    return 2 * n ** 3 / best_time(f, a, repeats=repeats)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bench-tiny")
    ap.add_argument("--layers", type=int, default=0, help="override n_layers (0: preset's)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--peak-n", type=int, default=2048)
    a = ap.parse_args()
    dtype = jnp.dtype(a.dtype)
    over = {"n_layers": a.layers} if a.layers else {}
    c = d1jax.preset(a.model, **over)
    model = d1jax.LLaDA(c, dtype=dtype, param_dtype=dtype)
    params = d1jax.init_params(model, jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (a.batch, a.seq), 0, c.vocab_size)
    fwd = jax.jit(lambda p, x: model.apply({"params": p}, x))
    t0 = time.perf_counter()
    jax.block_until_ready(fwd(params, ids))
    compile_s = time.perf_counter() - t0
    step_s = best_time(fwd, params, ids, repeats=a.repeats)
    tokens = a.batch * a.seq
    flops = tokens * model_flops_per_token(c, a.seq)
    peak = peak_matmul_flops(dtype, a.peak_n, a.repeats)
    print(json.dumps({
        "model": a.model, "n_layers": c.n_layers, "params": c.num_params(), "dtype": a.dtype,
        "device": jax.devices()[0].device_kind, "batch": a.batch, "seq_len": a.seq,
        "compile_s": round(compile_s, 3), "step_s": round(step_s, 5),
        "tokens_per_s": round(tokens / step_s, 1), "model_tflops_per_s": flops / step_s / 1e12,
        "peak_tflops_per_s": peak / 1e12,
        "peak_is": f"best {a.peak_n}x{a.peak_n} {a.dtype} matmul on this device, same run",
        "mfu": flops / step_s / peak}, indent=1))


if __name__ == "__main__":
    main()
