"""Small helpers shared by the benchmarks: model by preset name, timing, matmul peak, JSON."""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

import d1jax


def model_config(name: str, layers: int | None = None) -> d1jax.LLaDAConfig:
    """The named preset (``bench-tiny``, ``llada-8b``, ...), optionally with fewer layers."""
    return d1jax.preset(name, **({} if layers is None else {"n_layers": layers}))


def seconds(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Best and median wall seconds of ``fn()`` (its result is waited for) over repeats."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return {"best": min(times), "median": statistics.median(times)}


def matmul_peak(dtype: Any, n: int, repeats: int) -> dict[str, Any]:
    """FLOP/s of a jitted [n, n] @ [n, n] matmul on the default device (best of repeats)."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    mm = jax.jit(jnp.matmul)
    jax.block_until_ready(mm(a, b))
    best = seconds(lambda: mm(a, b), repeats)["best"]
    return {"flops_per_s": 2 * n ** 3 / best,
            "how": f"measured in this run: best of {repeats} jitted {jnp.dtype(dtype).name} "
                   f"{n}x{n}x{n} matmuls on {device_name()}"}


def device_name() -> str:
    d = jax.devices()[0]
    return f"{len(jax.devices())} x {d.device_kind} ({d.platform})"


def emit(result: dict[str, Any]) -> None:
    """Prints the benchmark's JSON, with the machine load (other jobs skew CPU timings)."""
    result = {**result, "load_average_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(result, indent=1))
