"""A forward pass of a random tiny LLaDA: checks an install end to end in seconds."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import d1jax
from d1jax import sharding


def run(config, workdir: str) -> dict:
    model_cfg = d1jax.preset(config.model.preset)
    mesh = sharding.make_mesh(tuple(config.mesh_shape))
    model = d1jax.LLaDA(model_cfg)
    params = d1jax.init_params(model, jax.random.key(config.seed), mesh)
    ids = jax.random.randint(jax.random.key(1), (config.batch_size, config.seq_len), 0,
                             model_cfg.vocab_size)
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
    with sharding.activate(mesh):
        t0 = time.perf_counter()
        logits = apply(params, ids).block_until_ready()
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        logits = apply(params, ids).block_until_ready()
        run_s = time.perf_counter() - t0
    out = {"logits_shape": list(logits.shape), "finite": bool(jnp.isfinite(logits).all()),
           "devices": jax.device_count(), "first_call_s": compile_s, "step_s": run_s}
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "forward_demo.json").write_text(json.dumps(out))
    print(json.dumps(out))
    return out
