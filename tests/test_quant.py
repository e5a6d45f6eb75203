"""The quantised frozen base (d1jax/model/quant.py) against a float64 numpy implementation of
the same schemes: int8 per-output-channel absmax, bitsandbytes' NF4 (its published 16-value
codebook, blocks of 64 inputs, even input in the high nibble). Then tiny LLaDA and Dream
models on a quantised base, the config knob, gradients, a GRPO run and its export."""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

import d1jax
from d1jax import config as config_lib, sharding
from d1jax.config import ConfigError
from d1jax.metrics import read_jsonl
from d1jax.model import LoraConfig, lora as lora_lib, quant
from d1jax.model.llada import weights
from d1jax.model.dream import Dream
from d1jax.model.dream import preset as dream_preset
from d1jax.run import build, spec as spec_lib
from d1jax.train.state import init_train_state
from tests import learnable

# The commands it starts compile optimized (tests/conftest.py): tests/learnable.py's run on an
# int8 base must learn.
COMMANDS_OPTIMIZED = True

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
# bitsandbytes' NF4 table as published (bitsandbytes/functional.py, get_4bit_type("nf4")),
# typed in here rather than read from the module under test.
BNB_NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0])


def int8_ref(w_io: np.ndarray):
    """(codes, scale, dequantised) in float64: s_o = max_i |w_io| / 127, q = round(w / s)."""
    s = np.abs(w_io).max(axis=-2) / 127.0
    q = np.clip(np.round(w_io / s[..., None, :]), -127, 127)
    return q, s, q * s[..., None, :]


def nf4_ref(w_io: np.ndarray, block: int = 64):
    """(codes [in, out], absmax [in/64, out], dequantised) in float64: the nearest NF4 value
    of each input scaled by its block's absmax (blocks of 64 inputs of one output column,
    i.e. 64 consecutive entries of a row of the torch [out, in] weight)."""
    d_in, d_out = w_io.shape
    b = w_io.reshape(d_in // block, block, d_out)
    absmax = np.abs(b).max(axis=1)
    x = b / absmax[:, None, :]
    codes = np.abs(x[..., None] - BNB_NF4).argmin(axis=-1)
    return codes.reshape(d_in, d_out), absmax, (BNB_NF4[codes] * absmax[:, None, :]).reshape(
        d_in, d_out)


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _weights(seed=0, shape=(256, 96)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_int8_matches_the_float64_reference_within_half_a_step():
    w = _weights()
    got = quant.quantize(w, "int8")
    q, s, deq = int8_ref(w.astype(np.float64))
    np.testing.assert_allclose(np.asarray(got["kernel_scale"]), s, rtol=1e-6)
    codes = np.asarray(got["kernel_int8"]).astype(np.float64)
    assert got["kernel_int8"].dtype == jnp.int8 and np.abs(codes - q).max() <= 1
    assert np.mean(codes != q) < 1e-3  # float32 vs float64 division at exact .5 ties
    back = np.asarray(quant.dequantize(got)).astype(np.float64)
    # Round to nearest: every weight within half a step of its channel, plus float32 rounding.
    assert np.all(np.abs(back - w) <= s / 2 * (1 + 1e-5) + 1e-7)
    rel = np.linalg.norm(back - w) / np.linalg.norm(w)
    ref_rel = np.linalg.norm(deq - w) / np.linalg.norm(w)
    assert rel == pytest.approx(ref_rel, rel=1e-3) and rel < 0.01  # measured: 0.0077


def test_nf4_matches_the_float64_bitsandbytes_scheme():
    np.testing.assert_array_equal(np.asarray(quant.NF4), BNB_NF4)
    w = _weights(1)
    got = quant.quantize(w, "nf4")
    codes, absmax, deq = nf4_ref(w.astype(np.float64))
    assert got["kernel_nf4"].shape == (128, 96) and got["kernel_nf4"].dtype == jnp.uint8
    np.testing.assert_allclose(np.asarray(got["kernel_absmax"]), absmax.ravel(), rtol=1e-6)
    mine = np.asarray(quant.nf4_codes(got["kernel_nf4"]))
    assert np.mean(mine != codes) < 1e-3 and np.abs(mine.astype(int) - codes).max() <= 1
    back = np.asarray(quant.dequantize(got)).astype(np.float64)
    # Nearest code: at most half the widest gap between adjacent codes (0.277 / 2) of absmax.
    half_gap = np.diff(BNB_NF4).max() / 2
    bound = np.repeat(absmax, 64, axis=0) * half_gap
    assert np.all(np.abs(back - w) <= bound * (1 + 1e-5))
    rel = np.linalg.norm(back - w) / np.linalg.norm(w)
    ref_rel = np.linalg.norm(deq - w) / np.linalg.norm(w)
    assert rel == pytest.approx(ref_rel, rel=1e-3) and rel < 0.11  # measured: 0.0936


def test_nf4_packs_the_even_input_in_the_high_nibble_and_keeps_layer_axes():
    w = np.zeros((2, 64, 3), np.float32)
    w[:, 0], w[:, 1] = 1.0, -1.0  # codes 15 and 0 (absmax 1); the rest 0 -> code 7
    got = quant.quantize(w, "nf4")
    assert got["kernel_nf4"].shape == (2, 32, 3) and got["kernel_absmax"].shape == (2, 3)
    assert np.all(np.asarray(got["kernel_nf4"])[:, 0] == 0xF0)
    assert np.all(np.asarray(got["kernel_nf4"])[:, 1] == 0x77)
    np.testing.assert_array_equal(np.asarray(quant.dequantize(got)), w)
    with pytest.raises(ValueError, match="multiple of 64"):
        quant.quantize(np.ones((32, 4), np.float32), "nf4")


def _models(family, scheme):
    lo = dict(rank=4, alpha=8.0, dropout=0.0)
    if family == "llada":
        cfg = d1jax.preset("test-tiny", d_model=64, mlp_hidden_size=192)
        return (d1jax.LLaDA(cfg, lora=LoraConfig(**lo)),
                d1jax.LLaDA(cfg, lora=LoraConfig(**lo, base_quant=scheme)))
    cfg = dream_preset("dream-test-tiny", hidden_size=64, intermediate_size=192)
    return Dream(cfg, lora=LoraConfig(**lo, targets=("q_proj", "down_proj"))), \
        Dream(cfg, lora=LoraConfig(**lo, targets=("q_proj", "down_proj"), base_quant=scheme))


def _float_params(model):
    """Random params with non-zero adapters (lora_b is zero at init)."""
    params = d1jax.init_params(model, jax.random.key(0))
    flat = traverse_util.flatten_dict(params)
    for i, k in enumerate(sorted(flat)):
        if k[-1] == "lora_b":
            flat[k] = 0.05 * jax.random.normal(jax.random.key(i), flat[k].shape)
    return traverse_util.unflatten_dict(flat)


def _numpy_dequantized(params, scheme):
    """The block kernels replaced by the float64 reference's dequantised values."""
    ref = int8_ref if scheme == "int8" else nf4_ref
    flat, errs = dict(traverse_util.flatten_dict(params)), []
    for k, v in list(flat.items()):
        if quant.is_base_kernel(k):
            w = np.asarray(v, np.float64)
            deq = np.stack([ref(layer)[-1] for layer in w])
            errs.append(np.linalg.norm(deq - w, axis=(1, 2)) / np.linalg.norm(w, axis=(1, 2)))
            flat[k] = jnp.asarray(deq, jnp.float32)
    return traverse_util.unflatten_dict(flat), np.concatenate(errs)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("scheme", ["int8", "nf4"])
def test_tiny_model_on_a_quantised_base(family, scheme):
    float_model, quant_model = _models(family, scheme)
    params = _float_params(float_model)
    qparams = quant.quantize_base(params, scheme)
    abstract = jax.eval_shape(lambda: d1jax.init_params(quant_model, jax.random.key(1)))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), abstract) == \
        jax.tree.map(lambda a: (a.shape, a.dtype), qparams)  # the model declares these leaves
    head = "ff_out" if family == "llada" else "lm_head"
    assert "kernel" in qparams[head]  # the output head stays unquantised, as in bitsandbytes
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 100, (2, 16)))
    run_q, run_f = (jax.jit(lambda p, use_lora, m=m: m.apply({"params": p}, ids, use_lora=use_lora),
                            static_argnums=1) for m in (quant_model, float_model))
    logits_q = run_q(qparams, True)
    # Exact: the float model on the numpy reference's dequantised kernels (float32 rounding).
    deq_params, errs = _numpy_dequantized(params, scheme)
    logits_deq = run_f(deq_params, True)
    np.testing.assert_allclose(logits_q, logits_deq, atol=2e-5, rtol=1e-5)
    # Against the float32 base: to first order each projection adds at most its relative
    # weight error (float64 reference, per layer) to the output's, and the rounding errors of
    # different kernels are independent, so they add in quadrature (the worst case, their
    # sum, is 12x larger). Measured: int8 0.0068 / 0.0059 (LLaDA / Dream) of 0.023, nf4
    # 0.086 / 0.098 of 0.34.
    logits_f = run_f(params, True)
    rel = float(jnp.linalg.norm(logits_q - logits_f) / jnp.linalg.norm(logits_f))
    assert 0 < rel <= np.sqrt(np.sum(errs ** 2)), (rel, errs)
    # Adapters off (d1's reference policy) runs the same quantised base.
    base_q, base_deq = run_q(qparams, False), run_f(deq_params, False)
    np.testing.assert_allclose(base_q, base_deq, atol=2e-5, rtol=1e-5)


def test_sharded_nf4_base_where_the_blocks_do_not_divide_the_mesh():
    """ff_out's input (192) is 3 blocks of 64, over a tensor axis of 4: the flattened absmax
    still divides; the sharded forward equals the unsharded one."""
    float_model, quant_model = _models("llada", "nf4")
    mesh = sharding.make_mesh((1, 2, 4))
    params = d1jax.init_params(float_model, jax.random.key(0), mesh)
    qparams = quant.quantize_base(params, "nf4", sharding.param_shardings(quant_model, mesh))
    ids = jnp.arange(64).reshape(4, 16) % 100
    run = jax.jit(lambda p: quant_model.apply({"params": p}, ids))
    with sharding.activate(mesh):
        got = run(qparams)
    want = run(jax.device_put(qparams, jax.devices()[0]))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert qparams["blocks"]["ff_out"]["kernel_absmax"].shape == (2, 3 * 64)


def test_bytes_and_gradients_reach_only_the_adapters():
    float_model, quant_model = _models("llada", "nf4")
    params = _float_params(float_model)
    nbytes = {s: quant.nbytes(quant.quantize_base(params, s)) for s in ("none", "int8", "nf4")}
    shapes = [v.shape for k, v in traverse_util.flatten_dict(params).items()
              if quant.is_base_kernel(k)]  # [layers, in, out], float32
    n = sum(np.prod(s) for s in shapes)
    columns = sum(s[0] * s[2] for s in shapes)
    assert nbytes["none"] - nbytes["int8"] == 3 * n - 4 * columns  # 1 byte + a scale a column
    assert nbytes["none"] - nbytes["nf4"] == 4 * n - n // 2 - 4 * (n // 64)  # 4 bits + absmax
    qparams = quant.quantize_base(params, "nf4")
    state = init_train_state(qparams, optax.adamw(1e-2), lora=True)
    trainable = traverse_util.flatten_dict(state.params)
    assert trainable and all(lora_lib.is_adapter(k) for k in trainable)
    frozen = traverse_util.flatten_dict(state.frozen)
    assert {k[-1] for k in frozen if quant.is_base_kernel(k[:-1] + ("kernel",))} >= {
        "kernel_nf4", "kernel_absmax"}
    ids = jnp.arange(32).reshape(2, 16) % 100

    def loss(adapters):
        return jnp.mean(quant_model.apply({"params": lora_lib.join(state.frozen, adapters)},
                                          ids) ** 2)
    grads = traverse_util.flatten_dict(jax.jit(jax.grad(loss))(state.params))
    assert set(grads) == set(trainable)
    assert all(np.isfinite(g).all() and np.abs(g).max() > 0 for g in grads.values())


def test_config_knob_needs_lora_and_a_known_scheme():
    c = config_lib.grpo("sudoku", "tiny")
    c.model.base_quant = "nf4"
    assert spec_lib.from_config(c).model.lora.base_quant == "nf4"
    assert dict(spec_lib.from_config(c).identity)["model.base_quant"] == "nf4"
    c.lora.enabled = False
    with pytest.raises(ConfigError, match="lora.enabled=True or --config.model.base_quant=none"):
        spec_lib.from_config(c)
    c.lora.enabled, c.model.base_quant = True, "int4"
    with pytest.raises(ConfigError, match="model.base_quant='int4': choose one of none, int8"):
        spec_lib.from_config(c)


def test_export_writes_the_dequantised_base_with_adapters_merged(tmp_path):
    float_model, quant_model = _models("llada", "int8")
    params = _float_params(float_model)
    qparams = quant.quantize_base(params, "int8")
    weights.save_hf_checkpoint(tmp_path, quant_model.config,
                               lora_lib.merge(qparams, quant_model.lora))
    _, loaded = weights.load_hf_checkpoint(tmp_path)
    deq, _ = _numpy_dequantized(params, "int8")
    flat, got = traverse_util.flatten_dict(deq), traverse_util.flatten_dict(loaded)
    for k, v in got.items():
        want = np.asarray(flat[k], np.float64)
        a = flat.get(k[:-1] + ("lora_a",))
        if a is not None:  # dequant(W) + (alpha / r) A B
            want = want + 2.0 * np.einsum("lir,lro->lio", np.asarray(a, np.float64),
                                          np.asarray(flat[k[:-1] + ("lora_b",)], np.float64))
        np.testing.assert_allclose(np.asarray(v), want, atol=1e-6, rtol=1e-5)
    assert np.asarray(got[("blocks", "q_proj", "kernel")]).dtype == np.float32


def test_grpo_run_on_an_int8_base(tmp_path):
    """Two optimizer steps of the install check on an int8 base; it saves, exports, the
    export loads as a plain model, and loads again onto an nf4 base."""
    flags = [*learnable.MAIN_FLAGS, f"--workdir={tmp_path}", "--config.model.base_quant=int8",
             "--config.train.num_steps=2"]
    r = subprocess.run([sys.executable, "-m", "d1jax.main", *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 2 and all(np.isfinite(row["reward"]) for row in rows)
    _, loaded = weights.load_hf_checkpoint(tmp_path / "hf")
    assert "kernel" in loaded["blocks"]["q_proj"] and "lora_a" not in loaded["blocks"]["q_proj"]
    # Loading it with the knob on quantises as it loads (run.build: load, quantise, join).
    c = learnable.config(**{"model.path": str(tmp_path / "hf"), "model.random_init": "",
                            "model.base_quant": "nf4"})
    spec = spec_lib.from_config(c)
    setup = build.build(spec, tmp_path / "load", spec.mesh.build())
    want = quant.quantize_base(loaded, "nf4")
    for k, v in traverse_util.flatten_dict(setup.params).items():
        if k[-1] in ("lora_a", "lora_b"):
            assert k[1] in c.lora.targets
        else:
            np.testing.assert_array_equal(np.asarray(v), np.asarray(_get(want, k)))
    assert "kernel_nf4" in setup.params["blocks"]["ff_out"]  # frozen too, as bitsandbytes'
