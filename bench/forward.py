"""Forward and gradient throughput and model FLOP utilisation of LLaDA with random weights.

    python bench/forward.py                                  # bench-tiny, float32, batch 8 x 192
    python bench/forward.py --repeats 9                      # the grad/forward ratio, 9 rounds
    python bench/forward.py --model llada-8b --layers 4      # 8B-shaped, 4 layers, bf16 (GPU)

Prints one JSON object: compile seconds, step seconds (best / median of --repeats),
tokens/s (batch * seq / median step), the model's FLOPs counted analytically, and the model
FLOP utilisation (MFU) against a peak measured in the same run by timing a large matmul in
the compute dtype on the same device (on a known GPU, also against its nominal dense peak).

``grad`` times ``jax.grad`` (all params) of the token-mean cross-entropy of targets (the ids shifted by one),
the log-probs taken as training takes them (``objectives.logprob.head_logps`` on the final
hidden states), against ``forward``: the same loss without the gradient. Each round runs
both, side by side under the same load; ``grad_over_forward`` is the median of the rounds'
grad / forward ratios. By matmul FLOPs it is about 3.4 on bench-tiny: forward 1, backward
2, and the output head (35% of the forward) recomputed chunk by chunk in the backward.

FLOPs per token of one forward (matmuls only; norms, RoPE, softmax are not counted):
  2 * (matmul weights per layer * n_layers + d_model * vocab)   weights: q, k, v, attn_out,
                                                                 ff_proj, up_proj, ff_out
  + 4 * seq * d_model * n_layers                                attention: Q K^T and P V
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import d1jax  # noqa: E402
from bench import common  # noqa: E402
from d1jax.objectives import logprob  # noqa: E402

# Dense bf16 peak of GPUs we may be lent (vendor datasheets, SXM parts), FLOP/s.
NOMINAL_BF16_PEAK = {"H100 80GB HBM3": 989.4e12, "H200": 989.4e12}


def forward_flops_per_token(c: d1jax.LLaDAConfig, seq: int) -> dict[str, float]:
    """Analytic matmul FLOPs of one token's forward in a sequence of ``seq`` tokens."""
    d, hd = c.d_model, c.head_dim
    per_layer = d * c.n_heads * hd * 2 + 2 * d * c.n_kv_heads * hd + 3 * d * c.mlp_hidden_size
    dense = 2 * (per_layer * c.n_layers + d * c.embedding_size)
    attention = 4 * seq * c.n_heads * hd * c.n_layers
    return {"dense": float(dense), "attention": float(attention), "total": float(dense + attention)}


def cross_entropy(model: d1jax.LLaDA, params, ids_bl: jax.Array, targets_bl: jax.Array):
    """Token-mean -log p(target) through ``head_logps``, the training path to log-probs."""
    h_bld = model.apply({"params": params}, ids_bl, method=d1jax.LLaDA.hidden)
    head, scale = logprob.model_head(model, params)
    return -logprob.head_logps(h_bld, head, targets_bl, scale=scale).mean()


def grad_vs_forward(model: d1jax.LLaDA, params, ids_bl: jax.Array,
                    repeats: int) -> dict[str, Any]:
    """Seconds (best / median) of the loss and of its gradient, one of each per round, and
    the median over rounds of their ratio (robust to load that drifts between rounds)."""
    targets = jnp.roll(ids_bl, 1, axis=1)
    loss = lambda p: cross_entropy(model, p, ids_bl, targets)  # noqa: E731
    fns = {"forward": jax.jit(loss), "grad": jax.jit(jax.grad(loss))}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        jax.block_until_ready(f(params))  # compile and warm up
    for _ in range(repeats):
        for name, f in fns.items():
            times[name].append(common.seconds(lambda f=f: f(params), 1)["best"])
    out: dict[str, Any] = {k: {"best": round(min(v), 5), "median": round(statistics.median(v), 5)}
                           for k, v in times.items()}
    ratios = [g / f for g, f in zip(times["grad"], times["forward"])]
    out["ratio"] = round(statistics.median(ratios), 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bench-tiny", help="model preset (d1jax.model.PRESETS)")
    ap.add_argument("--layers", type=int, default=None, help="override n_layers (e.g. 4 for llada-8b)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                    help="params and compute dtype; default float32 for bench-tiny, else bfloat16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--peak-size", type=int, default=None,
                    help="matmul side for the peak (default 2048 on CPU, 8192 on GPU)")
    args = ap.parse_args()

    c = common.model_config(args.model, args.layers)
    dtype = jnp.dtype(args.dtype or ("float32" if args.model == "bench-tiny" else "bfloat16"))
    on_cpu = jax.devices()[0].platform == "cpu"
    model = d1jax.LLaDA(c, dtype=dtype, param_dtype=dtype)
    params = d1jax.init_params(model, jax.random.key(0))  # random weights, seed 0
    ids = jax.device_put(np.random.RandomState(0).randint(0, c.vocab_size, (args.batch, args.seq)))

    forward = jax.jit(lambda p, x: model.apply({"params": p}, x))
    t0 = time.perf_counter()
    compiled = forward.lower(params, ids).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(params, ids))  # warm-up
    step = common.seconds(lambda: compiled(params, ids), args.repeats)
    grad = grad_vs_forward(model, params, ids, args.repeats)
    peak = common.matmul_peak(dtype, args.peak_size or (2048 if on_cpu else 8192),
                              repeats=5 if on_cpu else 20)

    tokens = args.batch * args.seq
    flops = forward_flops_per_token(c, args.seq)
    achieved = flops["total"] * tokens / step["median"]
    out = {
        "model": args.model, "n_layers": c.n_layers, "dtype": dtype.name,
        "batch": args.batch, "seq": args.seq, "params": c.num_params(),
        "device": common.device_name(),
        "compile_s": round(compile_s, 3),
        "step_s": {k: round(v, 5) for k, v in step.items()},
        "tokens_per_s": round(tokens / step["median"], 1),
        "tokens_per_s_best": round(tokens / step["best"], 1),
        "model_flops_per_token": flops,
        "loss_forward_s": grad["forward"], "loss_grad_s": grad["grad"],
        "grad_over_forward": grad["ratio"],
        "model_gflop_per_s": round(achieved / 1e9, 2),
        "peak_gflop_per_s": round(peak["flops_per_s"] / 1e9, 2),
        "peak_how": peak["how"],
        "mfu": round(achieved / peak["flops_per_s"], 4),  # model FLOP/s / measured peak
    }
    kind = jax.devices()[0].device_kind
    nominal = next((v for k, v in NOMINAL_BF16_PEAK.items() if k in kind), None)
    if nominal and dtype == jnp.bfloat16:
        out["mfu_vs_nominal_bf16_peak"] = {"peak_gflop_per_s": nominal / 1e9,
                                           "mfu": round(achieved / nominal, 4)}
    common.emit(out)


if __name__ == "__main__":
    main()
