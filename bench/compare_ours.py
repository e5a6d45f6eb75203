"""d1jax's side of ``bench/compare.py``: every measure compiled once, then timed per round.

The samplers, forward and backward run on the reference's own bench-tiny weights and
prompts (what ``bench/reference/run.py`` wrote next to its checkpoint); the estimator and the GRPO
update are ``bench/update.py``'s measurements (seeded random weights and inputs: their
cost does not depend on the values).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bench import sampler as bench_sampler
from bench import update as bench_update
from d1jax import sampling as smp
from d1jax.model import LLaDA
from d1jax.model.llada import weights


class Ours(NamedTuple):
    runs: dict[str, Callable[[], Any]]  # measure -> zero-argument call returning device arrays
    facts: dict[str, Any]  # compile seconds, scratch memory, token identity


def reference_files(ref: dict) -> tuple[str, dict[str, np.ndarray]]:
    """The reference run's checkpoint directory and its ``ref_generate.npz`` arrays."""
    ckpt = ref["checkpoint"]["dir"]
    npz = os.path.join(os.path.dirname(ckpt), "ref_generate.npz")
    if not (os.path.isdir(ckpt) and os.path.isfile(npz)):
        raise SystemExit(f"the reference run's files are gone ({ckpt}, {npz}): rerun "
                         "bench/reference/run.py, or compare.py with --ref-dir")
    with np.load(npz) as f:
        return ckpt, dict(f)


def sampler_measures(model: LLaDA, params, ref: dict, gen: dict) -> Ours:
    """Exact and fast() samplers on the reference's prompts [B, P]; the exact one's
    generated tokens are compared with the reference's."""
    s = ref["sampler"]
    base = dict(gen_length=s["gen_length"], block_length=s["block_length"], steps=s["steps"],
                temperature=s["temperature"], remasking=s["remasking"],
                mask_id=int(gen["mask_id"]), eos_id=model.config.eos_token_id)
    prompt_bp = jnp.asarray(gen["prompt"], jnp.int32)
    fns, rng, p_len = smp.model_fns(model), jax.random.key(0), gen["prompt"].shape[1]
    runs, facts, out_ids = {}, {"compile_s": {}}, {}
    for key, cfg in (("sampler_exact", smp.SamplerConfig(**base)),
                     ("sampler_fast", smp.SamplerConfig.fast(**base))):
        fn, facts["compile_s"][key], out = bench_sampler.compile_mode(fns, params, prompt_bp,
                                                                      None, cfg)
        runs[key] = (lambda f: lambda: f(params, prompt_bp, None, rng))(fn)
        out_ids[key] = np.asarray(out.ids)[:, p_len:]
    facts["tokens_equal_to_reference"] = float(
        (out_ids["sampler_exact"] == gen["output"][:, p_len:]).mean())
    facts["fast_tokens_equal_to_exact"] = float(
        (out_ids["sampler_fast"] == out_ids["sampler_exact"]).mean())
    return Ours(runs, facts)


def model_measures(model: LLaDA, params, ids_bl: jax.Array) -> Ours:
    """Forward, and forward + backward of the mean log-likelihood of ``ids_bl`` [B, L]."""
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x))

    def nll(p, x):
        logp_blv = jax.nn.log_softmax(model.apply({"params": p}, x).astype(jnp.float32), -1)
        return -jnp.take_along_axis(logp_blv, x[..., None], -1).mean()

    grad = jax.jit(jax.value_and_grad(nll))
    facts = {"compile_s": {}}
    for key, f in (("forward", forward), ("forward_backward", grad)):
        t0 = time.perf_counter()
        jax.block_until_ready(f(params, ids_bl))
        facts["compile_s"][key] = time.perf_counter() - t0
    return Ours({"forward": lambda: forward(params, ids_bl),
                 "forward_backward": lambda: grad(params, ids_bl)}, facts)


def training_measures() -> Ours:
    """Estimator at mu 1 and 4 and the GRPO update at mu 1, as ``bench/update.py`` runs them."""
    args = argparse.Namespace(model="bench-tiny", mus=[1, 4], batch=8, prompt=64,
                              completion=128, lora_rank=0)
    runs, facts = bench_update.build_measurements(args)
    keep = ("estimator_mu1", "estimator_mu4", "update_mu1")
    return Ours({k: runs[k] for k in keep},
                {"compile_s": {k: facts["compile_s"][k] for k in keep},
                 "peak_temp_mb": facts["peak_temp_mb"]})


def build(ref: dict) -> Ours:
    """All of d1jax's measures, compiled and warmed up."""
    ckpt, gen = reference_files(ref)
    config, params = weights.load_hf_checkpoint(ckpt)
    model = LLaDA(config)
    parts = [sampler_measures(model, params, ref, gen),
             model_measures(model, params, jnp.asarray(gen["output"], jnp.int32)),
             training_measures()]
    runs, facts = {}, {"compile_s": {}}
    for part in parts:
        runs.update(part.runs)
        facts["compile_s"].update(part.facts.pop("compile_s"))
        facts.update(part.facts)
    facts["compile_s"] = {k: round(v, 2) for k, v in facts["compile_s"].items()}
    return Ours(runs, facts)


def time_round(ours: Ours, repeats: int) -> dict[str, list[float]]:
    """Seconds of each call, measures interleaved so that load changes hit all alike."""
    times = {k: [] for k in ours.runs}
    for _ in range(repeats):
        for k, fn in ours.runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[k].append(round(time.perf_counter() - t0, 4))
    return times
