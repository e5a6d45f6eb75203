"""d1's GSM8K GRPO cycle at the released sizes: LLaDA-8B-Instruct and Dream-v0-Instruct-7B.

    python bench/scale.py --model llada-8b --out scale_llada.json     # one GPU (docs/benchmarks.md)
    python bench/scale.py --model dream-7b --out scale_dream.json
    python bench/scale.py --model bench-tiny --tiny                  # CPU, seconds (CI runs it)

The programs are the training loop's own: ``configs/grpo_gsm8k.py`` (d1's knobs: bf16
weights and matmuls, LoRA r 128 / alpha 64 on d1's targets, gen 256 in blocks of 32 with 128
steps, mu 12, beta 0.04, epsilon 0.5, G 6) translated by ``d1jax.run.spec`` and jitted by
``d1jax.train.jit_steps.for_run``, on one device, with one prompt's group of G completions
per update as d1's GPU micro-batch holds (``per_device_train_batch_size`` 6 = G, so
``grad_accum`` 1 here). Weights are random (their values do not change the exact sampler's
or the updates' cost); the architecture is the released config.json's (``--model``: a
LLaDA or Dream preset). ``--tiny`` shrinks the workload for a CPU (what CI runs).

A cycle is one rollout of d1's Algorithm 1: ``generate`` (the exact sampler, or
``SamplerConfig.fast()``), the old and reference log-probs for all mu mask seeds
(``rollout_logps``), then mu updates (``grpo_update``). Per program: compile seconds with a
fresh persistent compilation cache (cold) and again after ``jax.clear_caches()`` with that
cache filled (warm), the median seconds of ``--rounds`` calls after a warm-up call, XLA's
memory analysis and the device's peak bytes in use, the planner's analytic FLOPs
(``d1jax.plan.flops``: model FLOPs, no recomputation) and MFU against the chip's dense bf16
peak (``PEAK_BF16``; on a CPU, a matmul measured in this run). ``fast_dllm`` also runs
Fast-dLLM's own settings (dual cache, threshold 0.9, its per-step rule, no step budget), for
tokens/s beside ``bench/reference/scale.py``'s run of Fast-dLLM's code.

``--hashed-weights`` (LLaDA) fills every weight from a counter hash that
``bench/reference/scale.py`` computes identically in torch, so both sides hold the same
bf16 weights without a 16 GB file; ``--numerics DIR`` then saves d1jax's bf16 and float32
logits of a fixed input there for the reference to compare (``numerics`` in its JSON).

Prints one JSON object (also written to --out, after every program, so a run cut short
keeps what it measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench import common, scale_pair  # noqa: E402
from d1jax import config as config_lib  # noqa: E402
from d1jax import sampling as smp  # noqa: E402
from d1jax.model import family as family_lib, predictor  # noqa: E402
from d1jax.model.llada import weights as llada_weights  # noqa: E402
from d1jax.model import init_params  # noqa: E402
from d1jax.objectives.batch import GRPOBatch  # noqa: E402
from d1jax.plan import flops as fl  # noqa: E402
from d1jax.plan import programs as plan_programs  # noqa: E402
from d1jax.run import build as setup  # noqa: E402
from d1jax.run import spec as spec_lib  # noqa: E402
from d1jax.train import jit_steps as steps_lib  # noqa: E402

# Dense bf16 matmul peak of one chip (vendor datasheets, SXM parts), by device_kind prefix.
PEAK_BF16 = {"NVIDIA H100": 989.4e12, "NVIDIA H200": 989.4e12, "NVIDIA A100": 312e12,
             "NVIDIA B200": 2250e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12,
             "TPU v6 lite": 918e12, "TPU v4": 275e12}
# Fast-dLLM's own LLaDA settings (its generate_with_dual_cache, threshold 0.9).
FAST_DLLM = dict(kv_cache="dual", threshold=0.9, parallel_rule="fast_dllm", cache_refresh=0)
TINY = dict(prompt=16, gen_length=32, block_length=16, steps=16, mu=2, G=2, rank=8)
HASH_STD = 0.02  # hashed weights: uniform with LLaDA's init std


# ----------------------------------------------------------------------------- the run
def family_of(preset: str) -> family_lib.Family:
    """The family whose presets name ``preset``."""
    for fam in family_lib.FAMILIES.values():
        if preset in fam.presets:
            return fam
    names = sorted(n for f in family_lib.FAMILIES.values() for n in f.presets)
    raise SystemExit(f"--model {preset!r}: not a preset of any family ({', '.join(names)})")


def run_config(args):
    """``configs/grpo_gsm8k.py``'s config for the family, on one prompt's group per step."""
    fam = family_of(args.model)
    c = config_lib.grpo("gsm8k", None, checkpoint=fam.name)
    with c.unlocked():
        c.model.path, c.model.random_init = "", ""
        c.grpo.prompts_per_step, c.optim.grad_accum = 1, 1
        c.mesh.shape = (1, 1, 1)
        c.model.base_quant = args.base_quant
        if args.pair:  # dropout masks neither side can share (scale_pair)
            c.lora.dropout = 0.0
        if args.layers != "config":
            c.model.unroll_layers = args.layers == "unroll"
        if args.tiny:
            t = TINY
            c.max_prompt_length = t["prompt"]
            s = c.sampler
            s.gen_length, s.block_length, s.steps = t["gen_length"], t["block_length"], t["steps"]
            c.grpo.num_iterations, c.grpo.num_generations = t["mu"], t["G"]
            c.lora.rank, c.lora.alpha = t["rank"], 2.0 * t["rank"]
            c.model.unroll_layers = None if args.layers == "config" else c.model.unroll_layers
    return c


def build(args):
    c = run_config(args)
    spec = spec_lib.from_config(c, weights=False)
    fam = family_lib.get(spec.model.family)
    mcfg = fam.make_config(args.model)
    model = setup.make_model(spec.model, mcfg)
    mesh = spec.mesh.build(jax.devices()[:1])
    ids = {"mask": mcfg.mask_token_id, "eos": mcfg.eos_token_id, "eot": mcfg.eos_token_id}
    steps = steps_lib.for_run(spec, model, mesh, ids, total_steps=1000)
    return c, spec, mcfg, model, mesh, steps


def hashed(shape, seeds, scale: float = HASH_STD * 12 ** 0.5):
    """Uniform weights from a counter hash of (element index, seed), computed in uint32 and
    float32 steps that torch reproduces bit for bit (bench/reference/scale.py ``hashed``):
    ``seeds`` [n] gives each of n stacked tensors its own seed (``shape`` [n, ...])."""
    n = jnp.arange(int(np.prod(shape[1:])), dtype=jnp.uint32).reshape(1, *shape[1:])
    s = jnp.asarray(seeds, jnp.uint32).reshape(-1, *[1] * (len(shape) - 1))
    h = n * jnp.uint32(2654435761) + s * jnp.uint32(97531)
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x45D9F3B)
    h = h ^ (h >> 16)
    u = (h >> 8).astype(jnp.float32) / jnp.float32(2 ** 24) - jnp.float32(0.5)
    return u * jnp.float32(scale)


def hashed_llada_params(mcfg, params, dtype):
    """``params`` with every LLaDA base weight replaced by ``hashed`` values of its HF
    tensor (seed: crc32 of the HF key; norms 1), in ``dtype``; adapters kept."""
    by_path: dict[tuple, list] = {}
    for key, (path, layer, transposed) in llada_weights.key_map(mcfg).items():
        by_path.setdefault(path, []).append((layer, zlib.crc32(key.encode()), transposed))
    out = jax.tree.map(lambda x: x, params)  # adapters (or abstract leaves) kept
    for path, entries in by_path.items():
        node = out
        for p in path[:-1]:
            node = node[p]
        old = node[path[-1]]
        entries.sort(key=lambda e: -1 if e[0] is None else e[0])
        seeds, transposed = [e[1] for e in entries], entries[0][2]
        stacked = entries[0][0] is not None
        if path[-1] == "weight":  # RMSNorm scales: ones, as HF's init
            node[path[-1]] = jnp.ones(old.shape, dtype)
            continue
        shape = old.shape if stacked else (1, *old.shape)
        hf = shape[:-2] + (shape[-1], shape[-2]) if transposed else shape

        @jax.jit
        def make(seeds=tuple(seeds), hf=hf, transposed=transposed):
            w = hashed(hf, np.asarray(seeds, np.uint32))
            w = jnp.swapaxes(w, -1, -2) if transposed else w
            return w.astype(dtype)
        w = make()
        node[path[-1]] = w if stacked else w[0]
    return out


def leafwise_params(model, std: float = 0.02):
    """Random params of ``model``'s shapes drawn leaf by leaf (normal, ``std``; norms 1)."""
    shapes = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    flat, tree = jax.tree_util.tree_flatten_with_path(shapes)
    out = []
    for i, (path, leaf) in enumerate(flat):
        name = jax.tree_util.keystr(path)
        if "norm" in name and "kernel" not in name:
            out.append(jnp.ones(leaf.shape, leaf.dtype))
            continue
        draw = jax.jit(lambda k, shape=leaf.shape, dtype=leaf.dtype:
                       (std * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
        out.append(draw(jax.random.key(i)))
    return jax.tree_util.tree_unflatten(tree, out)


def rollout_batch(out_ids, prompt_len: int, mu: int, eos: int, seed: int = 0) -> GRPOBatch:
    """The old/ref pass's batch from generated ids: d1's completion mask (up to and with the
    first EOS), random advantages, mu mask seeds."""
    ids = np.asarray(out_ids)
    comp = ids[:, prompt_len:]
    is_eos = comp == eos
    first = np.where(is_eos.any(1), is_eos.argmax(1), comp.shape[1])
    rs = np.random.RandomState(seed)
    return GRPOBatch(prompt_ids=ids[:, :prompt_len], prompt_mask=np.ones_like(ids[:, :prompt_len]),
                     completion_ids=comp,
                     completion_mask=(np.arange(comp.shape[1])[None] <= first[:, None]).astype(np.int32),
                     advantages=rs.normal(size=ids.shape[0]).astype(np.float32),
                     mask_seeds=rs.randint(0, 2 ** 16, mu).astype(np.int32))


# ----------------------------------------------------------------------------- measuring
def peak_flops(dtype=jnp.bfloat16) -> tuple[float, str]:
    kind = jax.devices()[0].device_kind
    for prefix, peak in PEAK_BF16.items():
        if kind.startswith(prefix):
            return peak, f"{prefix} dense bf16 datasheet peak"
    m = common.matmul_peak(dtype, 1024, 5)
    return m["flops_per_s"], m["how"]


def memory(compiled) -> dict:
    """XLA's memory analysis of a compiled program, GiB."""
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend reports it
        return {}
    if ma is None:
        return {}
    g = 2 ** 30
    return {"argument_gib": round(ma.argument_size_in_bytes / g, 3),
            "output_gib": round(ma.output_size_in_bytes / g, 3),
            "temp_gib": round(ma.temp_size_in_bytes / g, 3),
            "alias_gib": round(ma.alias_size_in_bytes / g, 3)}


def device_peak_gib() -> float | None:
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else round(peak / 2 ** 30, 3)


class Recorder:
    """The JSON being built, rewritten to --out after every addition."""

    def __init__(self, path: str | None, head: dict):
        self.path, self.data = path, head

    def put(self, key: str, value) -> None:
        self.data[key] = value
        print(f"[scale] {key}: {json.dumps(value)}", file=sys.stderr, flush=True)
        if self.path:
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.data, f, indent=1)
            os.replace(self.path + ".tmp", self.path)


def compile_timed(lower, rec: "Recorder | None" = None, name: str = "") -> tuple[object, float]:
    t0 = time.perf_counter()
    compiled = lower().compile()
    seconds = time.perf_counter() - t0
    if rec is not None:  # recorded at once: a run cut short keeps it
        rec.put(f"compile_cold_s.{name}", round(seconds, 2))
    return compiled, seconds


def timed(fn) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llada-8b", help="a LLaDA or Dream preset")
    p.add_argument("--tiny", action="store_true", help="a CPU-sized workload (CI)")
    p.add_argument("--rounds", type=int, default=2, help="timed cycles per sampler")
    p.add_argument("--samplers", default="exact,fast",
                   help="exact,fast (comma-separated); none: the updates alone, on a "
                        "generated batch (scale_pair.pair_batch)")
    p.add_argument("--fast-dllm", action="store_true",
                   help="also time the sampler at Fast-dLLM's own settings")
    p.add_argument("--hashed-weights", action="store_true",
                   help="LLaDA: weights from the counter hash bench/reference/scale.py shares")
    p.add_argument("--numerics", metavar="DIR", help="save bf16/float32 logits of a fixed "
                   "input to DIR (with --hashed-weights) and stop")
    p.add_argument("--layers", choices=("config", "loop", "unroll"), default="config",
                   help="the layer loop: the config's (grpo_gsm8k: unrolled), a compiled loop "
                        "over the middle layers, or unrolled")
    p.add_argument("--init", choices=("model", "leaves"), default="model",
                   help="random weights from the model's init (d1jax.model.init_params), or "
                        "drawn leaf by leaf (leafwise_params)")
    p.add_argument("--base-quant", choices=("none", "int8", "nf4"), default="none",
                   help="the frozen base under LoRA stored quantised (config.model.base_quant); "
                        "with --numerics, also its logits against the float32 forward")
    p.add_argument("--profile", metavar="DIR", help="trace two updates with jax.profiler into "
                   "DIR and report the device time by op (update_profile)")
    p.add_argument("--pair", metavar="DIR", help="LLaDA: one update's loss and gradient norm "
                   "on hashed weights and adapters, its inputs saved to DIR for "
                   "bench/reference/scale.py (scale_pair), and stop")
    p.add_argument("--cache-dir", help="persistent compilation cache (default: a fresh one)")
    p.add_argument("--out", help="JSON written after every program")
    args = p.parse_args(argv)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="d1jax-scale-cache-")
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    c, spec, mcfg, model, mesh, steps = build(args)
    g, scfg = c.grpo, steps.sampler
    rows, prompt, mu = g.prompts_per_step * g.num_generations, c.max_prompt_length, g.num_iterations
    rec = Recorder(args.out, {
        "model": args.model, "family": spec.model.family, "machine": common.machine(),
        "workload": {"rows": rows, "prompt": prompt, "gen_length": scfg.gen_length,
                     "block_length": scfg.block_length, "steps": scfg.steps, "mu": mu,
                     "lora_rank": spec.model.lora.rank, "lora_targets": list(spec.model.lora.targets),
                     "dtype": jnp.dtype(spec.model.dtype).name,
                     "param_dtype": jnp.dtype(spec.model.param_dtype).name,
                     "remat": spec.model.remat, "unroll_layers": spec.model.unroll_layers,
                     "hashed_weights": args.hashed_weights, "base_quant": args.base_quant},
        "compile_cache": "fresh" if not args.cache_dir else "given"})

    args.hashed_weights = args.hashed_weights or bool(args.pair)
    if (args.hashed_weights or args.numerics) and spec.model.family != "llada":
        p.error("--hashed-weights, --numerics, --pair: LLaDA presets only")
    if args.init == "leaves" and args.base_quant != "none":
        p.error("--init leaves draws float weights: a quantised base needs --init model")
    if args.numerics:
        return numerics(args, rec, mcfg)
    t0 = time.perf_counter()
    if args.pair:  # every leaf is hashed: shapes only
        params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    elif args.init == "model":
        params = init_params(model, jax.random.key(0), mesh, spec.mesh.rules)
    else:  # one small jitted draw per leaf (Dream-7B's model init took 173 s on an H100)
        params = leafwise_params(model)
    if args.hashed_weights:
        params = hashed_llada_params(mcfg, params, spec.model.param_dtype)
    if args.pair:
        params = scale_pair.hashed_adapters(params, hashed, mcfg.n_layers)
    state = steps.init(params)
    del params
    jax.block_until_ready(state)
    rec.put("init_s", round(time.perf_counter() - t0, 2))
    rec.put("state_gib", round(sum(x.nbytes for x in jax.tree.leaves(state)) / 2 ** 30, 3))
    synthetic = scale_pair.pair_batch(rows, prompt, scfg.gen_length, mu,
                                      min(mcfg.mask_token_id, mcfg.eos_token_id) - 1,
                                      mcfg.eos_token_id)
    if args.pair:
        rec.put("pair", scale_pair.run(args.pair, steps, state, synthetic,
                                       c.grpo.p_mask_prompt, mcfg.mask_token_id))
        return rec.data

    peak, peak_how = peak_flops()
    rec.put("peak_flops", {"bf16_per_s": peak, "how": peak_how})
    plan = {pr.name: pr for pr in plan_programs.build_programs(
        plan_programs.PlanSpec(spec, mcfg), mesh)}
    lora, peeled = model.lora, family_lib.of(model).peeled_ends
    shifted = predictor.is_shifted(model)

    samplers = {name: scfg if name == "exact" else dataclasses.replace(
        scfg, **(smp.FAST_DEFAULTS if name == "fast" else FAST_DLLM))
        for name in [n for n in args.samplers.split(",") if n != "none"]
        + (["fast_dllm"] if args.fast_dllm else [])}
    rng = jax.random.key(1)
    prompt_ids = jnp.asarray(np.random.RandomState(0).randint(
        0, min(mcfg.mask_token_id, mcfg.eos_token_id) - 1, (rows, prompt)), jnp.int32)
    prompt_mask = jnp.ones_like(prompt_ids)
    policy = state.policy_params()
    gens, programs = {}, {}
    # Fast-dLLM's loop is written for one prompt: its settings run on one row here too.
    prompts = {name: (prompt_ids[:1], prompt_mask[:1]) if name == "fast_dllm"
               else (prompt_ids, prompt_mask) for name in samplers}
    for name, cfg in samplers.items():
        fn = smp.make_generate_fn(smp.model_fns(model), cfg, mcfg.max_sequence_length)
        lower = (lambda fn=fn, x=prompts[name]: fn.lower(policy, *x, rng))
        compiled, cold = compile_timed(lower, rec, f"generate_{name}")
        gens[name] = compiled
        n = prompts[name][0].shape[0]
        flops = fl.sampler(mcfg, cfg, n, prompt, lora, peeled=peeled, shifted=shifted).total
        programs[f"generate_{name}"] = {"compile_cold_s": round(cold, 2), "lower": lower,
                                        "memory": memory(compiled), "flops": flops, "rows": n}
    if gens:
        out = jax.block_until_ready(gens["exact" if "exact" in gens else next(iter(gens))](
            policy, prompt_ids, prompt_mask, rng))
        batch = rollout_batch(out.ids, prompt, mu, mcfg.eos_token_id)
    else:  # --samplers none: the updates alone
        batch = synthetic
    logps_prog = steps.program("rollout_logps", batch)
    lower = (lambda: logps_prog.lower(state, batch))
    compiled, cold = compile_timed(lower, rec, "rollout_logps")
    programs["rollout_logps"] = {"compile_cold_s": round(cold, 2), "lower": lower,
                                 "memory": memory(compiled),
                                 "flops": plan["rollout_logps"].flops_model}
    logps = jax.device_get(steps.rollout_logps(state, batch))
    ubatch = batch.replace(**logps, iteration=np.int32(0))
    upd_prog = steps.program("grpo_update", ubatch)
    lower = (lambda: upd_prog.lower(state, ubatch, rng))
    compiled, cold = compile_timed(lower, rec, "grpo_update")
    programs["grpo_update"] = {"compile_cold_s": round(cold, 2), "lower": lower,
                               "memory": memory(compiled),
                               "flops": plan["grpo_update"].flops_model}
    for k in [k for k in rec.data if k.startswith("compile_cold_s.")]:
        del rec.data[k]
    rec.put("compile_cold_s", {k: v["compile_cold_s"] for k, v in programs.items()})

    # Warm: the same programs after clearing the in-memory caches, from the persistent one.
    jax.clear_caches()
    for name, prog in programs.items():
        prog["compile_warm_s"] = round(compile_timed(prog["lower"])[1], 2)
    rec.put("compile_warm_s", {k: v["compile_warm_s"] for k, v in programs.items()})

    times: dict[str, list[float]] = {k: [] for k in programs}
    cycles: dict[str, list[dict]] = {name: [] for name in samplers}
    holder, forwards = {"state": state}, {"fast_dllm": []}
    for r in range(args.rounds + 1):  # round 0: warm-up, not counted
        for name, gen in (gens or {"none": None}).items():
            if gen is None:  # the generated batch: no rollout
                out, t_gen = None, 0.0
            else:
                out, t_gen = timed(lambda gen=gen, x=prompts[name]: gen(
                    holder["state"].policy_params(), *x, jax.random.key(2 + r)))
            if name == "fast_dllm":  # not a training sampler: tokens/s only
                if r:
                    times[f"generate_{name}"].append(t_gen)
                    forwards["fast_dllm"].append(int(np.asarray(out.block_steps).sum()))
                continue
            b = (synthetic if out is None
                 else rollout_batch(out.ids, prompt, mu, mcfg.eos_token_id, seed=r))
            lp, t_lp = timed(lambda b=b: holder["state"] and steps.rollout_logps(holder["state"], b))
            b = b.replace(**jax.device_get(lp))
            t_up = []
            for it in range(mu):
                def one(it=it, b=b):
                    holder["state"], m = steps.grpo_update(
                        holder["state"], b.replace(iteration=np.int32(it)), jax.random.key(it))
                    return m
                metrics, t = timed(one)
                t_up.append(t)
            if r and out is None:
                times["rollout_logps"].append(t_lp)
                times["grpo_update"].extend(t_up)
            elif r:
                times[f"generate_{name}"].append(t_gen)
                times["rollout_logps"].append(t_lp)
                times["grpo_update"].extend(t_up)
                cycles[name].append({"generate_s": t_gen, "rollout_logps_s": t_lp,
                                     "updates_s": sum(t_up), "total_s": t_gen + t_lp + sum(t_up),
                                     "forwards": int(np.asarray(out.block_steps).sum())})
        if r == 0:
            rec.put("peak_gib_after_warmup", device_peak_gib())
            rec.put("last_update_metrics", {k: float(v) for k, v in jax.device_get(metrics).items()
                                            if np.ndim(v) == 0})

    if args.profile:  # where an update's time goes (after the timed rounds)
        holder["state"], summary = profile_update(steps, holder["state"], ubatch, args.profile)
        rec.put("update_profile", summary)

    table = {}
    for name, prog in programs.items():
        if not times[name]:
            continue
        med = statistics.median(times[name])
        row = {"median_s": round(med, 6), "calls": len(times[name]),
               "compile_cold_s": prog["compile_cold_s"], "compile_warm_s": prog["compile_warm_s"],
               "flops_model": prog["flops"], "tflops_model": round(prog["flops"] / 1e12, 3),
               "mfu": round(prog["flops"] / med / peak, 4), "memory": prog["memory"]}
        if name.startswith("generate_"):
            row["tokens_per_s"] = round(prog["rows"] * scfg.gen_length / med, 1)
            row["rows"] = prog["rows"]
        if name == "generate_fast_dllm":
            row["forwards"] = forwards["fast_dllm"]
        table[name] = row
    rec.put("programs", table)
    rec.put("cycles", {name: {"rounds": cs, "median_total_s": round(statistics.median(
        c["total_s"] for c in cs), 4)} for name, cs in cycles.items() if cs})
    rec.put("peak_gib", device_peak_gib())
    text = json.dumps(rec.data, indent=1)
    print(text)
    return rec.data


# ----------------------------------------------------------------------------- profile
def profile_update(steps, state, batch, directory: str, calls: int = 2) -> tuple[object, dict]:
    """``calls`` GRPO updates under ``jax.profiler``; (the state after them, the device time
    by op name, largest first, from the trace's Perfetto JSON)."""
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    for it in range(calls):
        state, m = steps.grpo_update(state, batch.replace(iteration=np.int32(it)),
                                     jax.random.key(it))
    jax.block_until_ready(m)
    jax.profiler.stop_trace()
    return state, trace_summary(directory)


def trace_summary(directory: str, top: int = 20) -> dict:
    """Microseconds by event name in the newest ``*.trace.json.gz`` under ``directory``, on
    the device's streams (on a CPU, every thread's), with the share of the total."""
    import glob
    import gzip
    path = max(glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True),
               key=os.path.getmtime)
    with gzip.open(path, "rt") as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = {pid for pid, n in names.items() if "GPU" in n or "TPU" in n}
    totals: dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X" and (not device or e.get("pid") in device):
            totals[e["name"]] = totals.get(e["name"], 0.0) + float(e.get("dur", 0))
    whole = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return {"trace": os.path.relpath(path, directory), "device_streams": bool(device),
            "total_us": round(whole), "top": [{"name": n[:120], "us": round(us),
                                                "share": round(us / whole, 4)}
                                               for n, us in ranked]}


# ----------------------------------------------------------------------------- numerics
NUMERICS_IDS = dict(batch=1, length=128, seed=3)


def numerics_ids(vocab: int):
    n = NUMERICS_IDS
    return np.random.RandomState(n["seed"]).randint(0, vocab - 2, (n["batch"], n["length"]))


def numerics(args, rec, mcfg) -> dict:
    """bf16 and float32 logits of ``numerics_ids`` on the same hashed bf16 weights (no
    adapters): the float32 forward (weights upcast, float32 matmuls at highest precision)
    is the truth. Only the base weights are ever on the device (bf16, then float32)."""
    llada = family_lib.get("llada")
    bf16 = llada.model(mcfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    f32 = llada.model(mcfg, dtype=jnp.float32, param_dtype=jnp.float32)
    ids = jnp.asarray(numerics_ids(mcfg.vocab_size), jnp.int32)
    shapes = jax.eval_shape(lambda: init_params(bf16, jax.random.key(0)))
    params = hashed_llada_params(mcfg, shapes, jnp.bfloat16)
    logits_bf16 = np.asarray(jax.jit(lambda p, x: bf16.apply({"params": p}, x))(params, ids),
                             np.float32)
    quantised = {}
    if args.base_quant != "none":  # the same weights quantised: d1's NF4 base, or int8
        from d1jax.model import LoraConfig, quant
        qmodel = llada.model(mcfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                             lora=LoraConfig(rank=1, targets=(), base_quant=args.base_quant))
        qparams = quant.quantize_base(params, args.base_quant)
        quantised = {"scheme": args.base_quant, "params_gib": quant.nbytes(qparams) / 2 ** 30,
                     "bf16_params_gib": quant.nbytes(params) / 2 ** 30,
                     "logits": np.asarray(jax.jit(lambda p, x: qmodel.apply({"params": p}, x))(
                         qparams, ids), np.float32)}
        del qparams
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    with jax.default_matmul_precision("highest"):
        logits_f32 = np.asarray(jax.jit(lambda p, x: f32.apply({"params": p}, x))(params, ids),
                                np.float32)
    os.makedirs(args.numerics, exist_ok=True)
    np.save(os.path.join(args.numerics, "d1jax_bf16.npy"), logits_bf16)
    np.save(os.path.join(args.numerics, "d1jax_f32.npy"), logits_f32)
    err = np.abs(logits_bf16 - logits_f32)
    rec.put("numerics", {"ids": NUMERICS_IDS, "bf16_vs_f32": {
        "max_abs": float(err.max()), "mean_abs": float(err.mean()),
        "argmax_agree": float((logits_bf16.argmax(-1) == logits_f32.argmax(-1)).mean()),
        "f32_logit_std": float(logits_f32.std())}})
    if quantised:
        q = quantised.pop("logits")
        err = np.abs(q - logits_f32)
        rec.put("numerics_quantised", {**quantised, "vs_f32": {
            "max_abs": float(err.max()), "mean_abs": float(err.mean()),
            "argmax_agree": float((q.argmax(-1) == logits_f32.argmax(-1)).mean())}})
    return rec.data


if __name__ == "__main__":
    main()
