"""LLaDA forward against an independent numpy implementation of the Hugging Face equations.

The reference reads the weights by their Hugging Face names from the safetensors file that
``save_hf_checkpoint`` writes (torch layout, [out, in]), so the key map and transposes are
checked too.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import d1jax
from d1jax import weights

P = "model.transformer."


def np_rms(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def np_rope(x, theta):  # x [B, H, L, hd]; HF: cat(freqs, freqs), rotate_half
    hd, L = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    f = np.arange(L)[:, None] * inv[None]
    pos = np.concatenate([f, f], -1)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * np.cos(pos) + np.concatenate([-x2, x1], -1) * np.sin(pos)


def np_llada(sd, c, ids, mask=None):
    """modeling_llada.LLaDAModel.forward with LLaDALlamaBlock, in float64 numpy."""
    x = sd[P + "wte.weight"][ids]
    B, L = ids.shape
    nh, nkv, hd = c.n_heads, c.n_kv_heads, c.d_model // c.n_heads
    bias = 0.0
    if mask is not None and (mask == 0).any():
        bias = (1.0 - mask[:, None, None, :]) * np.finfo(np.float64).min
    for i in range(c.n_layers):
        w = lambda n: sd[f"{P}blocks.{i}.{n}.weight"]
        h = np_rms(x, w("attn_norm"), c.rms_norm_eps)
        q = (h @ w("q_proj").T).reshape(B, L, nh, hd).transpose(0, 2, 1, 3)
        k = (h @ w("k_proj").T).reshape(B, L, nkv, hd).transpose(0, 2, 1, 3)
        v = (h @ w("v_proj").T).reshape(B, L, nkv, hd).transpose(0, 2, 1, 3)
        q, k = np_rope(q, c.rope_theta), np_rope(k, c.rope_theta)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)  # repeat_interleave
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(0, 2, 1, 3).reshape(B, L, -1) @ w("attn_out").T
        h = np_rms(x, w("ff_norm"), c.rms_norm_eps)
        g, u = h @ w("ff_proj").T, h @ w("up_proj").T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w("ff_out").T
    x = np_rms(x, sd[P + "ln_f.weight"], c.rms_norm_eps)
    head = sd[P + "wte.weight"] if c.weight_tying else sd[P + "ff_out.weight"]
    logits = x @ head.T
    return logits / np.sqrt(c.d_model) if c.scale_logits else logits


def hf_state(tmp_path, c, params):
    weights.save_hf_checkpoint(tmp_path, c, params)
    return {k: v.astype(np.float64) for k, v in load_file(str(tmp_path / "model.safetensors")).items()}


CONFIGS = {
    "gqa": {},
    "mha_tied_scaled": dict(n_kv_heads=4, weight_tying=True, scale_logits=True),
    "mqa": dict(n_kv_heads=1),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_numpy_reference(name, tmp_path):
    c = d1jax.preset("test-tiny", **CONFIGS[name])
    model = d1jax.LLaDA(c)
    params = d1jax.init_params(model, jax.random.key(1))
    # Larger weights than the init so the test is not dominated by near-zero logits.
    params = jax.tree.map(lambda x: x * 5.0, params)
    sd = hf_state(tmp_path, c, params)
    ids = np.random.RandomState(0).randint(0, c.vocab_size, (3, 11))
    mask = np.ones((3, 11), np.int64)
    mask[1, :4] = 0
    mask[2, :7] = 0
    for m in (None, mask):
        got = np.asarray(model.apply({"params": params}, ids, m))
        want = np_llada(sd, c, ids, m)
        assert want.std() > 0.1  # logits spread well beyond float noise
        assert np.abs(got - want).max() <= 1e-4


def test_left_padding_does_not_change_a_sequence(tiny_model, tiny_params, tiny_config):
    ids = np.random.RandomState(2).randint(0, 100, (1, 9))
    alone = np.asarray(tiny_model.apply({"params": tiny_params}, ids))
    padded = np.concatenate([np.full((1, 5), tiny_config.pad_token_id), ids], 1)
    mask = np.concatenate([np.zeros((1, 5)), np.ones((1, 9))], 1)
    got = np.asarray(tiny_model.apply({"params": tiny_params}, padded, mask))[:, 5:]
    np.testing.assert_allclose(got, alone, atol=1e-5)


def test_slice_equals_full_logits(tiny_model, tiny_params):
    ids = np.random.RandomState(3).randint(0, 100, (2, 12))
    full = np.asarray(tiny_model.apply({"params": tiny_params}, ids))
    part = np.asarray(tiny_model.apply({"params": tiny_params}, ids, slice_start=jnp.int32(4),
                                       slice_len=5))
    np.testing.assert_allclose(part, full[:, 4:9], atol=1e-6)


def test_remat_gradients_equal_and_bf16_close(tiny_config, tiny_params):
    ids = np.random.RandomState(4).randint(0, 100, (2, 8))
    loss = lambda m: (lambda p: m.apply({"params": p}, ids).astype(jnp.float32).std())
    g0 = jax.grad(loss(d1jax.LLaDA(tiny_config)))(tiny_params)
    g1 = jax.grad(loss(d1jax.LLaDA(tiny_config, remat=True)))(tiny_params)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    f32 = np.asarray(d1jax.LLaDA(tiny_config).apply({"params": tiny_params}, ids))
    bf16 = d1jax.LLaDA(tiny_config, dtype=jnp.bfloat16).apply({"params": tiny_params}, ids)
    assert bf16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(bf16, np.float32), f32, atol=0.05)


@pytest.mark.parametrize("field,value,message", [
    ("alibi", True, "alibi=True"),
    ("layer_norm_type", "default", "layer_norm_type='default'"),
    ("attention_layer_norm", True, "attention_layer_norm=True"),
    ("residual_dropout", 0.1, "residual_dropout=0.1"),
    ("block_type", "sequential", "block_type='sequential'"),
])
def test_unsupported_config_is_refused(field, value, message):
    d = d1jax.preset("test-tiny").to_hf_dict()
    d[field] = value
    with pytest.raises(d1jax.model.UnsupportedConfigError, match=message.replace("(", r"\(")):
        d1jax.LLaDAConfig.from_hf_dict(d)
    d = d1jax.preset("test-tiny").to_hf_dict()
    d["include_bias"] = True
    with pytest.raises(d1jax.model.UnsupportedConfigError, match="include_bias"):
        d1jax.LLaDAConfig.from_hf_dict(d)


def test_config_round_trips_through_hf_dict():
    c = d1jax.preset("test-tiny")
    assert d1jax.LLaDAConfig.from_hf_dict(c.to_hf_dict()) == c
    assert dataclasses.replace(c, n_kv_heads=None).n_kv_heads == c.n_heads
