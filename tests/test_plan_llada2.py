"""d1jax.plan on the mixture-of-experts family (LLaDA2): its tiny block-SFT and EBPO runs compiled
for a TPU v5p-8 slice with the experts on a mesh axis of 4 (skipped without libtpu), the
analytic FLOPs of a forward (the ACTIVE experts: top-k routed, shared, router) against a hand
count, and the four-entry mesh (data, fsdp, tensor, expert) accepted for LLaDA2 and refused in
one line for a family without experts."""

import math

import pytest

from d1jax.config import ConfigError
from d1jax.model import llada2
from d1jax.plan import flops, grid
from tests.test_plan import needs_tpu  # the compile-only TPU topology check

# Compile-bound: compiled unoptimized (tests/conftest.py).
COMPILE_UNOPTIMIZED = True

EXPERT_MESH = (1, 1, 1, 4)  # v5p-8: 4 chips, all on the expert axis


# Known defect: libtpu's compile of these MoE programs crashed the process (SIGSEGV inside
# backend_compile_and_load) twice: once in a helper's runs of this file, once in the suite's clean-clone run
# (2026-11-29); the plans themselves compile from the command line. Skipped until the crash
# is understood: a segfault takes the whole pytest worker down.
@pytest.mark.skip(reason="libtpu compile of the tiny MoE plans segfaulted twice (a helper run, the clean-clone suite; two other runs passed)")
@needs_tpu
@pytest.mark.parametrize("config", ["configs/llada2/sft_gsm8k.py:tiny",
                                    "configs/llada2/ebpo_math.py:tiny"])
def test_tiny_plans_compile_on_v5p8_with_the_experts_on_4_chips(config):
    from d1jax.plan import compile as plan_lib, report
    estimates = plan_lib.plan(grid.load_config(config), "v5p-8", EXPERT_MESH, cache_dir="")
    assert estimates
    for e in estimates:
        assert e.mesh == {"data": 1, "fsdp": 1, "tensor": 1, "expert": 4}, e.program
        assert math.isfinite(e.total_bytes) and 0 < e.total_bytes <= e.capacity_bytes
        assert e.fits and e.flops_model > 0, e.program
    assert "| 1,1,1,4 |" in report.table(estimates)


def test_forward_flops_count_the_active_experts():
    """llada2-tiny: D 32, dense F 64, 3 layers (1 dense, 2 MoE), N 4 / K 2 heads of H 16, E 8
    experts of I 16, k 2 a token, 1 shared expert, V 128; batch 2 x 8 positions, the head on
    all 8, every key attended."""
    cfg = llada2.preset("llada2-tiny")
    b, length = 2, 8
    qkv = 2 * 32 * (4 * 16 + 2 * 2 * 16)  # fused query_key_value [D, (N + 2K) H]
    out = 2 * (4 * 16) * 32  # dense [N H, D]
    dense_mlp = 3 * 2 * 32 * 64  # gate, up, down of width F
    shared = 3 * 2 * 32 * 16  # one shared expert of width I
    router = 2 * 32 * 8  # [D, E] logits
    routed = 2 * 3 * 2 * 32 * 16  # k = 2 experts, gate/up/down of width I each
    per_token = 3 * (qkv + out) + dense_mlp + 2 * (shared + router + routed)
    assert per_token == 68608
    head = 2 * b * length * 32 * 128
    attention = 4 * b * length * 3 * length * 4 * 16  # scores and weighted sum, every layer
    fwd = flops.forward(cfg, b, length, length, length)
    assert fwd.base == b * length * per_token + head == 1_228_800
    assert fwd.head == head and fwd.attention == attention == 98_304 and fwd.lora == 0


def test_a_four_entry_mesh_is_llada2s_and_refused_for_llada():
    from d1jax.plan import chips, compile as plan_lib
    from d1jax.plan.programs import PlanSpec
    run = plan_lib.with_mesh(plan_lib.as_spec(grid.load_config("configs/llada2/sft_gsm8k.py:tiny")),
                             EXPERT_MESH)
    assert dict(run.mesh.rules)["expert"] == "expert"  # the experts shard on the expert axis
    plan_lib.check_expert_mesh(PlanSpec.of(run))
    _, devices = chips.topology_devices("v5p-8")
    assert dict(run.mesh.build(devices).shape) == {"data": 1, "fsdp": 1, "tensor": 1, "expert": 4}
    with pytest.raises(ConfigError) as refused:
        plan_lib.plan(grid.load_config("configs/sft_s1k.py:tiny"), "v5p-8", EXPERT_MESH,
                      cache_dir="")
    assert "\n" not in str(refused.value)
    assert "expert axis" in str(refused.value) and "llada has no experts" in str(refused.value)


def test_a_plan_needs_the_checkpoints_config_and_tokenizer_not_its_weights(tmp_path):
    """A LLaDA2 folder with config.json and its tokenizer but no weight files (what one
    fetches to plan LLaDA2.0-flash before paying for 200 GB): the planner's checks
    (``check_inputs(weights=False)``) accept it and plan its architecture; a training run's
    refuse it in one line naming the missing files."""
    from d1jax.config import check_inputs
    from d1jax.plan import compile as plan_lib, programs
    from tests import published
    src = published.write_llada2(tmp_path / "replica", "hub")
    for f in src.iterdir():
        if f.name.endswith(".safetensors") or f.name.endswith(".index.json"):
            f.unlink()
    c = grid.load_config("configs/llada2/sft_gsm8k.py")
    c.model.path = str(src)
    check_inputs(c, data=False, weights=False)
    cfg = programs.architecture(plan_lib.as_spec(c).model)
    assert (cfg.num_experts, cfg.hidden_size) == (8, 32)  # the folder's, not mini's default
    with pytest.raises(ConfigError, match="neither model.safetensors"):
        check_inputs(c, data=False)
