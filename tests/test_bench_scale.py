"""The scale benchmark (bench/scale.py) at a tiny shape, the weights it shares with the
PyTorch reference, and the docs tables generated from a GPU run's JSON."""

import importlib.util
import json
import sys
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import scale, scale_table  # noqa: E402

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def _reference_scale():
    """bench/reference/scale.py (torch side), imported from its folder as its script does."""
    spec = importlib.util.spec_from_file_location(
        "reference_scale", ROOT / "bench" / "reference" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_cycle_runs_the_training_programs_and_reports_them(tmp_path):
    out = tmp_path / "scale.json"
    res = scale.main(["--model", "test-tiny", "--tiny", "--rounds", "1", "--samplers", "exact",
                      "--out", str(out)])
    assert json.loads(out.read_text())["programs"] == res["programs"]
    w = res["workload"]
    assert (w["rows"], w["gen_length"], w["mu"]) == (scale.TINY["G"], scale.TINY["gen_length"],
                                                     scale.TINY["mu"])
    # d1's LoRA targets as they land on LLaDA (configs/grpo_gsm8k.py), bf16 as runs use.
    assert w["lora_targets"] == ["q_proj", "k_proj", "v_proj", "up_proj"]
    assert (w["dtype"], w["param_dtype"]) == ("bfloat16", "bfloat16")
    progs = res["programs"]
    assert set(progs) == {"generate_exact", "rollout_logps", "grpo_update"}
    assert progs["grpo_update"]["calls"] == w["mu"]  # every update of the timed cycle
    peak = res["peak_flops"]["bf16_per_s"]
    for p in progs.values():
        assert p["median_s"] > 0 and 0 < p["mfu"] == pytest.approx(
            p["flops_model"] / p["median_s"] / peak, rel=0.02, abs=1e-4)
    # The persistent cache works: a recompile after clearing the in-memory caches is faster.
    assert progs["grpo_update"]["compile_warm_s"] < progs["grpo_update"]["compile_cold_s"]
    (cycle,) = res["cycles"]["exact"]["rounds"]
    assert cycle["total_s"] == pytest.approx(cycle["generate_s"] + cycle["rollout_logps_s"]
                                             + cycle["updates_s"])
    # The exact sampler evaluates the model once per step on random weights.
    assert cycle["forwards"] == scale.TINY["steps"]
    assert progs["generate_exact"]["median_s"] == pytest.approx(cycle["generate_s"], abs=1e-4)


def test_hashed_weights_are_bit_identical_in_jax_and_torch():
    torch = pytest.importorskip("torch")
    ref = _reference_scale()
    for shape, key in [((3, 70, 50), "model.transformer.blocks.{}.q_proj.weight"),
                       ((1, 1 << 20), "model.transformer.wte.weight")]:
        seeds = [zlib.crc32(key.format(i).encode()) for i in range(shape[0])]
        ours = np.asarray(jax.jit(lambda: scale.hashed(shape, np.asarray(seeds, np.uint32))
                                  .astype(jnp.bfloat16))().astype(jnp.float32))
        theirs = np.stack([ref.hashed(shape[1:], s, "cpu").to(torch.bfloat16).float().numpy()
                           for s in seeds])
        np.testing.assert_array_equal(ours, theirs)
        # A spread of distinct values with LLaDA's init std, not a constant or a ramp.
        assert abs(ours.std() - scale.HASH_STD) < 0.1 * scale.HASH_STD
        assert len(np.unique(ours)) > 100


def test_hashed_llada_params_follow_the_hf_layout():
    """Each d1jax kernel is its HF tensor transposed: the torch side fills HF tensors."""
    from d1jax.model import init_params, preset, LLaDA
    cfg = preset("test-tiny")
    model = LLaDA(cfg)
    params = scale.hashed_llada_params(cfg, init_params(model, jax.random.key(0)), jnp.float32)
    ref = _reference_scale()
    key = "model.transformer.blocks.1.ff_out.weight"
    hf = ref.hashed((cfg.d_model, cfg.mlp_hidden_size), zlib.crc32(key.encode()), "cpu").numpy()
    np.testing.assert_array_equal(np.asarray(params["blocks"]["ff_out"]["kernel"][1]), hf.T)
    assert np.all(np.asarray(params["ln_f"]["weight"]) == 1.0)


def test_docs_tables_come_from_the_stored_gpu_run():
    run = json.loads((ROOT / "docs" / "scale" / "h100_llada8b.json").read_text())
    text = scale_table.render(run)
    ref_total = run["reference"]["cycle"]["median_s"]["total_s"]
    ours = run["d1jax"]["cycles"]
    exact, fast = (ours[n]["rounds"][0]["total_s"] for n in ("exact", "fast"))
    row = next(line for line in text.splitlines() if line.startswith("| **cycle**"))
    assert f"{ref_total / exact:.2f}x" in row and f"{ref_total / fast:.2f}x" in row
    assert run["commit"] in text and "H100" in text
    # Every figure the docs quote is in the generated text.
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    for line in text.splitlines():
        if line.startswith("| **cycle**") or line.startswith("| grpo_update"):
            assert line in docs, line


def test_updates_alone_time_every_update_on_a_generated_batch(tmp_path):
    res = scale.main(["--model", "test-tiny", "--tiny", "--rounds", "1", "--samplers", "none",
                      "--out", str(tmp_path / "u.json")])
    progs = res["programs"]
    assert set(progs) == {"rollout_logps", "grpo_update"}
    assert not res.get("cycles")  # no sampler: no cycle timed
    assert progs["grpo_update"]["calls"] == scale.TINY["mu"]
    assert np.isfinite(res["last_update_metrics"]["loss"])


def test_pair_adapters_follow_peft_layout_and_inputs_are_saved(tmp_path):
    """The adapters d1jax holds are PEFT's A [r, in] / B [out, r] transposed, and the pair's
    saved batch is what d1's compute_loss reads (a completion mask up to the first EOS)."""
    from bench import scale_pair
    torch = pytest.importorskip("torch")
    shapes = {"blocks": {"q_proj": {"kernel": jnp.zeros((2, 8, 8)),
                                    "lora_a": jnp.zeros((2, 8, 4)),
                                    "lora_b": jnp.zeros((2, 4, 6))}}}
    out = scale_pair.hashed_adapters(shapes, scale.hashed, 2)["blocks"]["q_proj"]
    ref = _reference_scale()
    for which, name, shape in (("A", "lora_a", (4, 8)), ("B", "lora_b", (6, 4))):
        seed = zlib.crc32(scale_pair.adapter_key(1, "q_proj", which).encode())
        theirs = ref.hashed(shape, seed, "cpu").to(torch.float32).numpy()
        np.testing.assert_array_equal(np.asarray(out[name][1]), theirs.T)
    assert np.all(np.asarray(out["kernel"]) == 0)  # the base is left to hashed_llada_params
    res = scale.main(["--model", "bench-tiny", "--tiny", "--pair", str(tmp_path / "pair")])
    z = np.load(tmp_path / "pair" / "pair.npz")
    comp, cm = z["completion_ids"], z["completion_mask"]
    eos = scale.family_of("bench-tiny").make_config("bench-tiny").eos_token_id
    for row, mask in zip(comp, cm):
        first = int(np.argmax(row == eos))
        assert (row == eos).any() and mask.sum() == first + 1 and mask[first] == 1
    assert z["prompt_masked"].shape == z["prompt_ids"].shape and z["prompt_masked"].any()
    assert float(z["loss"]) == pytest.approx(res["pair"]["loss"])
    assert res["pair"]["grad_norm"] > 0 and res["pair"]["kl"] > 0  # the adapters are live
