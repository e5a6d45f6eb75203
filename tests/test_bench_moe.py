"""The MoE layer benchmark (bench/moe.py) at LLaDA2's tiny shape: the JSON it reports, its
analytic FLOPs against a hand count, the layer it times being the model's own, and its errors
(nothing here is timed)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import traverse_util

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import moe as bench_moe  # noqa: E402
from d1jax import sharding as shd  # noqa: E402
from d1jax.model.llada2 import LLaDA2, preset  # noqa: E402

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

TINY = ["--preset", "llada2-tiny", "--tokens", "8", "--repeats", "1", "--dtype", "float32"]


def _hand_flops(tokens: int) -> dict[str, int]:
    """llada2-tiny (D 32, E 8, K 2, I 16, one shared expert of 16): 2 * in * out per matmul a
    token runs through, listed one by one."""
    swiglu = lambda d, i: [(d, i), (d, i), (i, d)]  # noqa: E731 - gate, up, down
    router = [(32, 8)]
    routed = [m for _ in range(2) for m in swiglu(32, 16)]  # K = 2 chosen experts
    shared = swiglu(32, 16)
    dense = swiglu(32, 2 * 16 + 16)  # width K * I + shared
    count = lambda mats: sum(2 * a * b for a, b in mats) * tokens  # noqa: E731
    return {"router": count(router), "experts": count(routed), "shared": count(shared),
            "moe": count(router + routed + shared), "dense": count(dense)}


def test_tiny_report_fields_and_flops():
    out = bench_moe.main(TINY)
    assert out["forward_flops"] == _hand_flops(8)
    shape = out["shape"]
    assert (shape["tokens"], shape["num_experts"], shape["dense_intermediate_size"]) == (8, 8, 48)
    assert "2 * 16 + 16 * 1" in shape["dense_intermediate_how"]
    assert out["device_kind"] == jax.devices()[0].device_kind and out["expert_shards"] == 1
    assert set(out["cases"]) == {"moe", "dense", "router", "experts"}
    for name, row in out["cases"].items():
        for kind, mult in (("forward", 1), ("grad", 3)):
            ms = row[f"{kind}_ms"]
            assert ms > 0, (name, kind)
            assert row[f"{kind}_gflop_per_s"] == pytest.approx(
                mult * out["forward_flops"][name] / ms / 1e6, rel=1e-2, abs=2e-3)
    moe, dense = out["cases"]["moe"], out["cases"]["dense"]
    assert out["moe_over_dense"]["grad"] == round(moe["grad_ms"] / dense["grad_ms"], 2)
    assert out["router_share_of_moe"]["forward"] == round(
        out["cases"]["router"]["forward_ms"] / moe["forward_ms"], 4)
    # The analytic count is XLA's for the dense SwiGLU (XLA adds the elementwise ops)...
    for kind in ("forward", "grad"):
        assert 1.0 <= dense[f"{kind}_xla_over_analytic"] < 1.1, dense
    # ...while on a CPU ragged_dot runs as a dense dot over all E experts (docs/benchmarks.md).
    if jax.devices()[0].platform == "cpu":
        assert out["cases"]["experts"]["forward_xla_over_analytic"] > 0.8 * 8


def test_times_the_models_own_moe_layer():
    """The benchmarked block has exactly the params of the model's MoE layers (one layer's)."""
    c = preset("llada2-tiny")
    x = jnp.zeros((1, 4, c.hidden_size))
    ffn = bench_moe.MoEFeedForward(c, jnp.float32, jnp.float32, None, True)
    ours = traverse_util.flatten_dict(bench_moe._init(ffn, (x,), 0.02, None, ()))
    model = traverse_util.flatten_dict(shd.abstract_params(LLaDA2(c))["moe_layers"])
    ffn_names = ("gate", "experts", "shared_experts")
    want = {k: v.shape[1:] for k, v in model.items() if k[0] in ffn_names}  # one layer
    assert {k: v.shape for k, v in ours.items()} == want
    assert not jnp.any(ours["gate", "expert_bias"]) and jnp.std(ours["experts", "up_proj"]) > 0


@pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 (fake) devices")
def test_expert_shards_run_each_shards_experts():
    out = bench_moe.main(TINY + ["--expert_shards", "2", "--forward_only"])
    assert out["expert_shards"] == 2 and set(out["moe_over_dense"]) == {"forward"}
    # Each shard's program multiplies its rows by its E/2 experts only (CPU: densely).
    if jax.devices()[0].platform == "cpu":
        assert out["cases"]["experts"]["forward_xla_over_analytic"] < 0.7 * 8


@pytest.mark.parametrize("extra, message", [
    (["--expert_shards", "3"], "must divide num_experts=8"),
    (["--num_experts", "6"], "n_group=4 equal groups"),
    (["--max_gib", "1e-9"], "moe/forward needs"),
])
def test_bad_flags_stop_with_one_line(extra, message):
    with pytest.raises(SystemExit, match=message):
        bench_moe.main(TINY + extra)


def test_bf16_expert_shards_run():
    """bfloat16 on an expert axis (XLA:CPU aborted on the bfloat16 psum this summed in before
    moe.experts_forward's float32 boundary)."""
    out = bench_moe.main(TINY[:-2] + ["--expert_shards", "2", "--forward_only"])
    assert out["dtype"] == "bfloat16" and out["expert_shards"] == 2
