"""One LLaDA2 MoE layer's feed-forward beside a dense SwiGLU of equal active FLOPs, forward and
gradient (issue 58).

    python bench/moe.py --forward_only                  # LLaDA2.0-mini's layer, bf16, CPU: T=16
    python bench/moe.py --num_experts 128 --dtype float32   # grads too on a CPU: half the experts
    python bench/moe.py --repeats 10                    # on a GPU (T=2048 there)
    XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python bench/moe.py --preset llada2-tiny --dtype float32 --expert_shards 4

Cases, each jitted twice, ``forward`` (the sum of its output against a fixed random cotangent)
and ``grad`` (``jax.value_and_grad`` of that sum w.r.t. the case's params and its input), each
round running every function once side by side under the same load:

- ``moe``: the MoE feed-forward exactly as a MoE layer of ``d1jax.model.llada2.LLaDA2`` runs it
  (``LLaDA2Block._moe`` on post-attention-norm hidden states [1, T, D]: the sigmoid router with
  group-limited top-k, the routed experts through ``jax.lax.ragged_dot``, dropless, the shared
  expert), random params at the preset's shape (init std ``initializer_range``);
- ``dense``: a SwiGLU (the shared expert's module, ``model.SwiGLU``) of width
  F = num_experts_per_tok * moe_intermediate_size + shared_intermediate_size: the FLOPs of the
  routed and shared experts a token runs through, without the router's;
- ``router``: ``moe.route`` alone (logits, sigmoid, group-limited top-k, gate weights);
  ``grad`` w.r.t. the router kernel and the input through the gate weights;
- ``experts``: ``moe.experts_forward`` alone on the ids and weights the router chose for the
  same input (sort, three ragged_dots, unsort, weighted sum); ``grad`` w.r.t. the expert
  weights, the input and the gate weights.

Analytic matmul FLOPs of one forward (``grad``: 3x, the backward's two matmuls per matmul):
router 2 T D E, routed experts 6 T K D I, shared expert 6 T D S, dense 6 T D F with
F = K I + S. XLA's own count of each compiled program (``cost_analysis``) is reported beside
it. On a CPU, JAX lowers ``ragged_dot`` to a dense dot over every expert of the rows masked to
their expert (``_ragged_dot_general_impl``; GPU and TPU have their own lowerings): E times the
routed FLOPs, and an [E, T K, D] operand in memory. In bfloat16, XLA:CPU upcasts those
expert weights to float32 for the dots (the dense SwiGLU's bf16 dots stay bf16, on a much
slower path on CPUs without bf16 units: compare the two at ``--dtype float32``), and the grad
holds float32 copies of the weights and of their gradients: about 9.4 GiB at the mini shape
with T = 16. ``--max_gib`` (default 8 on a CPU) stops a program that would need more before
it runs, saying so; ``--num_experts`` shrinks E (per-token shape unchanged) to fit,
``--forward_only`` skips the gradients.

``--expert_shards n``: the same cases with the experts sharded over an ``expert`` mesh axis of
n devices (``moe.experts_forward``'s shard_map and its float32 psum; n fake CPU devices via
XLA_FLAGS), so expert parallelism's overhead can be read on one host.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
from flax import traverse_util  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench import common  # noqa: E402
from d1jax import sharding as shd  # noqa: E402
from d1jax.model.llada2 import config as llada2_config  # noqa: E402
from d1jax.model.llada2 import model as llada2_model  # noqa: E402
from d1jax.model.llada2 import moe  # noqa: E402

F32 = jnp.float32
KW = dict(use_lora=False, deterministic=True)
EP_RULES = shd.DEFAULT_RULES + ((shd.EXPERT, shd.EXPERT_AXIS),)


class MoEFeedForward(llada2_model.LLaDA2Block):
    """A MoE layer's feed-forward alone, through the block's own ``_moe`` (params: ``gate``,
    ``experts``, ``shared_experts``, the names under the model's ``moe_layers``)."""

    @nn.compact
    def __call__(self, xn_bld):
        return self._moe(xn_bld, KW)


def dense_width(c: llada2_config.LLaDA2Config) -> tuple[int, str]:
    """(F, how it is computed): the dense SwiGLU width of the MoE's active expert FLOPs."""
    k, i, s = c.num_experts_per_tok, c.moe_intermediate_size, c.shared_intermediate_size
    return k * i + s, (f"num_experts_per_tok * moe_intermediate_size + moe_intermediate_size * "
                       f"num_shared_experts = {k} * {i} + {i} * {c.num_shared_experts}")


def forward_flops(c: llada2_config.LLaDA2Config, tokens: int) -> dict[str, int]:
    """Analytic matmul FLOPs of one forward of each case on T tokens (module docstring)."""
    t, d, e = tokens, c.hidden_size, c.num_experts
    k, i, s = c.num_experts_per_tok, c.moe_intermediate_size, c.shared_intermediate_size
    router, routed, shared = 2 * t * d * e, 6 * t * k * d * i, 6 * t * d * s
    return {"moe": router + routed + shared, "dense": 6 * t * d * dense_width(c)[0],
            "router": router, "experts": routed, "shared": shared}


def _init(module: nn.Module, args: tuple, std: float, mesh, rules) -> Any:
    """``module``'s random params (seed 0), born sharded by their logical axes over ``mesh``:
    the shapes from its init (traced, not run), each leaf drawn as the module's initialisers
    draw it (kernels N(0, std), the router's ``expert_bias`` 0), a stacked [E, ...] leaf 16
    experts at a time, so that init holds little beyond the params (the module's own init
    held float32 draws of all three expert stacks: 10 GiB at the mini shape in bf16)."""
    boxed = jax.eval_shape(lambda key: module.init(key, *args)["params"], jax.random.key(0))
    unbox = lambda tree: jax.tree.map(  # noqa: E731 - the values, no sharding constraint
        lambda b: b.value, tree, is_leaf=lambda b: isinstance(b, nn.Partitioned))
    flat = traverse_util.flatten_dict(unbox(boxed))
    sharding = None if mesh is None else shd.logical_to_sharding(boxed, mesh, rules)

    def draw(key):
        out = {}
        for n, (path, leaf) in enumerate(sorted(flat.items())):
            shape, dtype, k = leaf.shape, leaf.dtype, jax.random.fold_in(key, n)
            one = lambda k, shape=shape, dtype=dtype: (  # noqa: E731
                std * jax.random.normal(k, shape, F32)).astype(dtype)
            if path[-1] == "expert_bias":
                out[path] = jnp.zeros(shape, dtype)
            elif len(shape) == 3:
                out[path] = jax.lax.map(functools.partial(one, shape=shape[1:]),
                                        jax.random.split(k, shape[0]), batch_size=16)
            else:
                out[path] = one(k)
        return traverse_util.unflatten_dict(out)
    return jax.block_until_ready(jax.jit(draw, out_shardings=sharding)(jax.random.key(0)))


def cases(c: llada2_config.LLaDA2Config, tokens: int, dtype, mesh=None, rules=EP_RULES):
    """name -> (function of (weights, inputs) -> output, weights, inputs)."""
    x = jax.random.normal(jax.random.key(1), (1, tokens, c.hidden_size), dtype)
    ffn = MoEFeedForward(c, dtype, dtype, None, True)
    dense = llada2_model.SwiGLU(c, dtype, dtype, None, dense_width(c)[0])
    w_moe = _init(ffn, (x,), c.initializer_range, mesh, rules)
    w_dense = _init(dense, (x, KW), c.initializer_range, None, rules)
    route = lambda w, x_td: moe.route(  # noqa: E731
        x_td, w["kernel"], w["expert_bias"], top_k=c.num_experts_per_tok, n_group=c.n_group,
        topk_group=c.topk_group, scaling=c.routed_scaling_factor)
    x_td = x.reshape(tokens, c.hidden_size)
    ids, gates, _ = jax.jit(route)(w_moe["gate"], x_td)
    ex = w_moe["experts"]

    def experts(w, inputs):
        return moe.experts_forward(inputs[0], ids, inputs[1], w["gate_proj"], w["up_proj"],
                                   w["down_proj"])
    return {
        "moe": (lambda w, x: ffn.apply({"params": w}, x), w_moe, x),
        "dense": (lambda w, x: dense.apply({"params": w}, x, KW), w_dense, x),
        "router": (lambda w, x: route(w, x)[1], w_moe["gate"], x_td),
        "experts": (experts, ex, (x_td, gates)),
    }


def _xla_flops(compiled) -> float | None:
    """XLA's FLOP count of a compiled program (None where the backend gives none)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - optional: some backends have no cost model
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def _gib(compiled) -> float | None:
    """GiB a compiled program holds while it runs: arguments, outputs, XLA's temporaries."""
    try:
        m = compiled.memory_analysis()
        return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes) / 2**30
    except Exception:  # noqa: BLE001 - optional: some backends do not report it
        return None


def compile_case(name: str, fn: Callable, w, x, kinds: tuple[str, ...],
                 max_gib: float | None) -> dict[str, tuple[Callable, float | None, float | None]]:
    """kind -> (the case's compiled, warmed-up call, XLA's FLOPs, its GiB over the devices
    its params are on); SystemExit before running a program over ``max_gib``."""
    out = jax.eval_shape(fn, w, x)
    cot = jax.random.normal(jax.random.key(3), out.shape, F32)
    loss = lambda w, x: jnp.sum(fn(w, x).astype(F32) * cot)  # noqa: E731
    funcs = {"forward": loss, "grad": jax.value_and_grad(loss, argnums=(0, 1))}
    res = {}
    devices = max(len(leaf.sharding.device_set) for leaf in jax.tree.leaves(w))
    for kind in kinds:  # every kind checked before any runs
        compiled = jax.jit(funcs[kind]).lower(w, x).compile()
        gib = _gib(compiled)
        gib = None if gib is None else gib * devices  # per device; fake devices share a host
        if max_gib and gib and gib > max_gib:
            raise SystemExit(f"{name}/{kind} needs {gib:.1f} GiB (arguments, outputs, XLA "
                             f"temporaries) over --max_gib {max_gib}: lower --tokens or "
                             f"--num_experts, or pass --forward_only")
        res[kind] = (lambda compiled=compiled: compiled(w, x), _xla_flops(compiled), gib)
    for call, _, _ in res.values():
        jax.block_until_ready(call())  # warm-up
    return res


def run(c: llada2_config.LLaDA2Config, tokens: int, dtype, repeats: int,
        expert_shards: int = 1, kinds: tuple[str, ...] = ("forward", "grad"),
        max_gib: float | None = None) -> dict[str, Any]:
    """Every case timed (median ms of ``repeats`` rounds), with FLOPs and memory."""
    mesh = None
    if expert_shards > 1:
        mesh = shd.make_mesh((1, 1, 1, expert_shards), devices=jax.devices()[:expert_shards])
    with shd.activate(mesh, EP_RULES):
        fns = {name: compile_case(name, *case, kinds, max_gib)
               for name, case in cases(c, tokens, dtype, mesh).items()}
        times = {(n, k): [] for n in fns for k in kinds}
        for _ in range(repeats):
            for (name, kind) in times:
                times[name, kind].append(common.seconds(fns[name][kind][0], 1)["best"])
    flops = forward_flops(c, tokens)
    out: dict[str, Any] = {}
    for name, f in fns.items():
        row = {}
        for kind in kinds:
            mult, (_, xla, gib) = 3 if kind == "grad" else 1, f[kind]
            sec = statistics.median(times[name, kind])
            row[f"{kind}_ms"] = round(sec * 1e3, 3)
            row[f"{kind}_gflop_per_s"] = round(mult * flops[name] / sec / 1e9, 3)
            row[f"{kind}_xla_flops"] = xla
            row[f"{kind}_xla_over_analytic"] = None if not xla else round(
                xla / (mult * flops[name]), 2)
            row[f"{kind}_gib"] = None if gib is None else round(gib, 3)
        out[name] = row
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    on_cpu = jax.devices()[0].platform == "cpu"
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llada2-mini",
                    help=f"LLaDA2 preset, one of {sorted(llada2_config.PRESETS)}")
    ap.add_argument("--tokens", type=int, default=16 if on_cpu else 2048,
                    help="T, tokens through the layer (default 16 on a CPU, else 2048)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="params and compute dtype (runs use bfloat16)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds after the warm-up")
    ap.add_argument("--num_experts", type=int, default=None,
                    help="override the preset's E (a multiple of n_group)")
    ap.add_argument("--forward_only", action="store_true", help="skip the gradients")
    ap.add_argument("--expert_shards", type=int, default=1,
                    help="experts over an expert mesh axis of this many devices")
    ap.add_argument("--max_gib", type=float, default=8.0 if on_cpu else None,
                    help="stop before a program that needs more memory (default 8 on a CPU)")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.repeats < 1:
        ap.error(f"--tokens {args.tokens} and --repeats {args.repeats} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    try:
        c = llada2_config.preset(args.preset, **(
            {} if args.num_experts is None else {"num_experts": args.num_experts}))
    except ValueError as e:  # unknown preset, or an E the router cannot group
        raise SystemExit(str(e)) from None
    n = args.expert_shards
    if n < 1 or c.num_experts % n or n > jax.device_count():
        raise SystemExit(
            f"--expert_shards {n} must divide num_experts={c.num_experts} and be at most the "
            f"{jax.device_count()} devices (fake CPU devices: XLA_FLAGS="
            f"--xla_force_host_platform_device_count={max(n, 1)})")
    kinds = ("forward",) if args.forward_only else ("forward", "grad")
    width, how = dense_width(c)
    res = run(c, args.tokens, jnp.dtype(args.dtype), args.repeats, n, kinds, args.max_gib)
    out = {
        "preset": args.preset, "dtype": args.dtype, "repeats": args.repeats,
        "expert_shards": n, "device_kind": jax.devices()[0].device_kind,
        "machine": common.machine(),
        "shape": {"tokens": args.tokens, "hidden_size": c.hidden_size,
                  "num_experts": c.num_experts, "num_experts_per_tok": c.num_experts_per_tok,
                  "moe_intermediate_size": c.moe_intermediate_size,
                  "shared_intermediate_size": c.shared_intermediate_size,
                  "n_group": c.n_group, "topk_group": c.topk_group,
                  "dense_intermediate_size": width, "dense_intermediate_how": how},
        "forward_flops": forward_flops(c, args.tokens),
        "flops_how": "matmuls only, analytic: router 2 T D E, experts 6 T K D I, shared "
                     "6 T D S, moe = their sum, dense 6 T D F; grad = 3 x forward",
        "cases": res,
        "moe_over_dense": {k: round(res["moe"][f"{k}_ms"] / res["dense"][f"{k}_ms"], 2)
                           for k in kinds},
        "router_share_of_moe": {k: round(res["router"][f"{k}_ms"] / res["moe"][f"{k}_ms"], 4)
                                for k in kinds},
    }
    common.emit(out)
    return out


if __name__ == "__main__":
    main()
