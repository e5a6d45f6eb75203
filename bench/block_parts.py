"""Where a layer's gradient time goes: one LLaDA block and its parts, forward and gradient.

    python bench/block_parts.py                      # bench-tiny's block on [8, 192], float32
    python bench/block_parts.py --repeats 41

Each part runs as d1jax runs it (``model.llada.model.Block``, ``model.attention.attention``,
``model.layers.token_matmul``) with random inputs, jitted twice: ``forward`` (the sum of
its output against a fixed random cotangent) and ``grad`` (``jax.value_and_grad`` of that
sum over the part's inputs and weights). Each round runs every function once, side by side
under the same load. The JSON gives the median seconds, matmul GFLOP/s (FLOPs counted
analytically: forward F, gradient 3F) and ``backward_over_forward`` = (grad - forward) /
forward, next to the GFLOP/s of one large float32 matmul measured in the same run: the
ceiling a matmul-bound part could reach on this device.

Parts: ``block`` (norms, q/k/v/out projections, RoPE, attention, SwiGLU MLP, residuals),
``mlp`` (ff_proj and up_proj, SiLU gate, ff_out), ``attention`` (the softmax attention of
q, k, v already projected), ``projection`` (one [tokens, d_model] x [d_model, d_model]
matmul).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench import common  # noqa: E402
from d1jax.model import attention, layers  # noqa: E402
from d1jax.model.llada import model as llada  # noqa: E402


def parts(c, batch: int, seq: int):
    """name -> (function of (weights, x), weights, x, forward matmul FLOPs)."""
    keys = iter(jax.random.split(jax.random.key(0), 16))
    d, f, n, k, h = c.d_model, c.mlp_hidden_size, c.n_heads, c.n_kv_heads, c.head_dim
    t = batch * seq
    x = jax.random.normal(next(keys), (batch, seq, d))
    rope = layers.rope_tables(jnp.arange(seq)[None], h, c.rope_theta)
    block = llada.Block(c, jnp.float32, jnp.float32)
    block_w = nn.unbox(block.init(next(keys), x, rope, None, False, True)["params"])

    def run_block(w, x):
        return block.apply({"params": w}, x, rope, None, False, True)[0]

    def mlp(w, x):
        gate = layers.token_matmul(x, w["ff_proj"]["kernel"])
        up = layers.token_matmul(x, w["up_proj"]["kernel"])
        return layers.token_matmul(nn.silu(gate) * up, w["ff_out"]["kernel"])

    def attend(w, qkv):
        q, kk, v = qkv
        return attention.attention(q, kk, v, None, h ** -0.5)

    qkv = tuple(jax.random.normal(next(keys), (batch, seq, heads, h)) for heads in (n, k, k))
    attn_flops = 4 * batch * seq * seq * n * h
    proj_flops = 2 * t * d * (2 * n * h + 2 * k * h)
    mlp_flops = 6 * t * d * f
    return {
        "block": (run_block, block_w, x, proj_flops + attn_flops + mlp_flops),
        "mlp": (mlp, block_w, x, mlp_flops),
        "attention": (attend, {}, qkv, attn_flops),
        "projection": (lambda w, x: layers.token_matmul(x, w), block_w["q_proj"]["kernel"], x,
                       2 * t * d * n * h),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bench-tiny", help="model preset (d1jax.model.PRESETS)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    c = common.model_config(args.model)
    fns, flops = {}, {}
    for name, (fn, w, x, fl) in parts(c, args.batch, args.seq).items():
        out = jax.eval_shape(fn, w, x)
        cot = jax.random.normal(jax.random.key(1), out.shape, out.dtype)
        loss = lambda w, x, fn=fn, cot=cot: jnp.sum(fn(w, x) * cot)  # noqa: E731
        fwd, grad = jax.jit(loss), jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        fns[f"{name}/forward"] = lambda fwd=fwd, w=w, x=x: fwd(w, x)
        fns[f"{name}/grad"] = lambda grad=grad, w=w, x=x: grad(w, x)
        flops[name] = fl
    for fn in fns.values():
        jax.block_until_ready(fn())
    times = {k: [] for k in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            times[name].append(common.seconds(fn, 1)["best"])
    peak = common.matmul_peak(jnp.float32, 2048, 5)
    out = {"model": args.model, "batch": args.batch, "seq": args.seq, "repeats": args.repeats,
           "machine": common.machine(),
           "matmul_peak_gflop_per_s": round(peak["flops_per_s"] / 1e9, 1),
           "matmul_peak_how": peak["how"], "parts": {}}
    for name, fl in flops.items():
        f, g = (statistics.median(times[f"{name}/{k}"]) for k in ("forward", "grad"))
        out["parts"][name] = {
            "forward_ms": round(f * 1e3, 2), "grad_ms": round(g * 1e3, 2),
            "forward_gflop_per_s": round(fl / f / 1e9, 1),
            "grad_gflop_per_s": round(3 * fl / g / 1e9, 1),
            "backward_over_forward": round((g - f) / f, 2)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
