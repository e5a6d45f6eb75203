"""Small helpers shared by the benchmarks: model by preset name, timing, matmul peak, the
machine, the PyTorch reference's JSON, JSON output."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
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


def machine() -> dict[str, Any]:
    """CPU model, core count, date (UTC) and load: timings mean little without them."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"model name\s*:\s*(.*)", f.read()).group(1).strip()
    except (OSError, AttributeError):
        cpu = platform.processor() or "unknown"
    return {"cpu": cpu, "cores": os.cpu_count(), "jax_device": device_name(),
            "jax": jax.__version__,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "load_average_1m": round(os.getloadavg()[0], 2)}


def load_reference(path: str) -> dict[str, Any]:
    """The JSON that ``bench/reference/run.py`` (the PyTorch reference) printed in this
    sitting."""
    with open(path) as f:
        ref = json.load(f)
    missing = [k for k in ("sampler", "estimator", "grpo_update") if k not in ref]
    if missing:
        raise ValueError(f"{path} has no {missing} sections: pass the JSON that "
                         "bench/reference/run.py prints (docs/benchmarks.md)")
    return ref


def reference_seconds(ref: dict[str, Any]) -> dict[str, list[float]]:
    """One reference run's timed calls in seconds, by measure: ``sampler`` (one generate()
    of the whole batch), ``estimator_mu{k}``, ``update_mu1``."""
    out = {"sampler": ref["sampler"]["times_s"], "update_mu1": ref["grpo_update"]["times_s"]}
    out.update({f"estimator_{k}": v["times_s"] for k, v in ref["estimator"].items()
                if re.fullmatch(r"mu\d+", k)})
    return out


def speedup(reference_s: list[float], ours_s: list[float]) -> float:
    """Reference median seconds over ours (> 1: d1jax is faster)."""
    return statistics.median(reference_s) / statistics.median(ours_s)


def emit(result: dict[str, Any]) -> None:
    """Prints the benchmark's JSON, with the machine load (other jobs skew CPU timings)."""
    result = {**result, "load_average_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(result, indent=1))
