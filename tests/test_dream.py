"""Dream (Dream-v0-7B, DiffuCoder-7B): model, HF checkpoints and diffusion_generate.

Independent references: a float64 numpy forward written from HKUNLP's modeling_dream.py
equations on the HF-keyed tensors the test writes itself (so the key map, the transposes,
the q/k/v biases, GQA, RoPE positions from the padding mask and the logit shift are all
checked), and a numpy port of generation_utils._sample.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from d1jax import sharding as shd
from d1jax.model import predictor
from d1jax.model.config import UnsupportedConfigError
from d1jax.model.dream import Dream, dream_positions, init_dream_params
from d1jax.model.dream_config import DreamConfig, dream_preset
from d1jax.model.dream_weights import (CheckpointError, dream_key_map, load_dream_checkpoint,
                                       save_dream_checkpoint)

CFG = dream_preset("dream-test-tiny")


# --------------------------------------------------------------------------- references

def hf_state(cfg: DreamConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors under Dream's HF names and torch shapes ([out, in])."""
    rng = np.random.default_rng(seed)
    d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nk = cfg.num_attention_heads * h, cfg.num_key_value_heads * h

    def w(*shape, std=0.2):
        return (rng.standard_normal(shape) * std).astype(np.float32)
    sd = {"model.embed_tokens.weight": w(cfg.vocab_size, d, std=1.0),
          "model.norm.weight": 1 + w(d)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": w(nq, d), p + "self_attn.q_proj.bias": w(nq),
            p + "self_attn.k_proj.weight": w(nk, d), p + "self_attn.k_proj.bias": w(nk),
            p + "self_attn.v_proj.weight": w(nk, d), p + "self_attn.v_proj.bias": w(nk),
            p + "self_attn.o_proj.weight": w(d, nq),
            p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
            p + "mlp.down_proj.weight": w(d, f),
            p + "input_layernorm.weight": 1 + w(d), p + "post_attention_layernorm.weight": 1 + w(d),
        })
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = w(cfg.vocab_size, d)
    return sd


def write_hf_dir(path, cfg: DreamConfig, sd) -> str:
    path.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return path


def np_raw_logits(sd, cfg: DreamConfig, ids, mask=None, positions=None):
    """modeling_dream.DreamModel forward in float64: raw logits [B, L, V] (row i -> i+1)."""
    g = {k: v.astype(np.float64) for k, v in sd.items()}
    b, l = ids.shape
    n, k, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pos = np.broadcast_to(np.arange(l) if positions is None else positions, (b, l))
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, h, 2) / h)
    ang = (pos[..., None] / cfg.rope_factor) * inv
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [B, heads, L, H], rotate_half
        rot = np.concatenate([-x[..., h // 2:], x[..., :h // 2]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    def rms(x, wgt):
        return wgt * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_norm_eps)

    x = g["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        xn = rms(x, g[p + "input_layernorm.weight"])
        proj = {t: xn @ g[p + f"self_attn.{t}_proj.weight"].T + g[p + f"self_attn.{t}_proj.bias"]
                for t in "qkv"}
        q = rope(proj["q"].reshape(b, l, n, h).transpose(0, 2, 1, 3))
        kk = rope(proj["k"].reshape(b, l, k, h).transpose(0, 2, 1, 3))
        v = proj["v"].reshape(b, l, k, h).transpose(0, 2, 1, 3)
        kk, v = np.repeat(kk, n // k, axis=1), np.repeat(v, n // k, axis=1)  # repeat_kv
        s = q @ kk.transpose(0, 1, 3, 2) / np.sqrt(h)
        if mask is not None:
            s = np.where(mask[:, None, None, :] > 0, s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        att = (pr / pr.sum(-1, keepdims=True)) @ v
        x = x + att.transpose(0, 2, 1, 3).reshape(b, l, n * h) @ g[p + "self_attn.o_proj.weight"].T
        xn = rms(x, g[p + "post_attention_layernorm.weight"])
        gate, up = xn @ g[p + "mlp.gate_proj.weight"].T, xn @ g[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ g[p + "mlp.down_proj.weight"].T
    x = rms(x, g["model.norm.weight"])
    head = g["model.embed_tokens.weight"] if cfg.tie_word_embeddings else g["lm_head.weight"]
    return x @ head.T


def np_tok_idx(mask):
    """generation_utils._sample's tok_idx."""
    t = np.cumsum(mask, -1) - 1
    return np.where(mask == 0, 1, t)


def np_predict(sd, cfg, ids, mask):
    """The model as _sample reads it: positions tok_idx, logits shifted right by one."""
    raw = np_raw_logits(sd, cfg, ids, mask, np_tok_idx(mask))
    return np.concatenate([raw[:, :1], raw[:, :-1]], axis=1)


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def sd():
    return hf_state(CFG)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, sd):
    return write_hf_dir(tmp_path_factory.mktemp("dream") / "ckpt", CFG, sd)


@pytest.fixture(scope="module")
def loaded(hf_dir):
    return load_dream_checkpoint(hf_dir)


IDS = np.array([[5, 17, 3, 99, 42, 8, 127, 127, 127, 127],
                [126, 126, 126, 11, 64, 2, 127, 127, 127, 127]], np.int32)
MASK = np.array([[1] * 10, [0, 0, 0] + [1] * 7], np.int32)


# --------------------------------------------------------------------------- config

def test_dream_7b_config_json_gives_the_preset():
    d = dict(architectures=["DreamModel"], attention_dropout=0.0, bos_token_id=151643,
             eos_token_id=151643, hidden_act="silu", hidden_size=3584, initializer_range=0.02,
             intermediate_size=18944, mask_token_id=151666, max_position_embeddings=131072,
             max_window_layers=28, model_type="Dream", num_attention_heads=28,
             num_hidden_layers=28, num_key_value_heads=4, pad_token_id=151643,
             rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000.0, sliding_window=None,
             tie_word_embeddings=False, torch_dtype="bfloat16", use_cache=False,
             use_sliding_window=False, vocab_size=152064)
    cfg = DreamConfig.from_hf_dict(d)
    assert cfg == dream_preset("dream-7b") and cfg.head_dim == 128
    assert 7.5e9 < cfg.num_params() < 7.7e9  # Dream-v0-7B: 7.6B
    assert DreamConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


@pytest.mark.parametrize("field,value,match", [
    ("use_sliding_window", True, "use_sliding_window"),
    ("hidden_act", "gelu", "hidden_act"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "yarn"),
])
def test_unsupported_config_is_refused_by_name(field, value, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        DreamConfig.from_hf_dict({**CFG.to_hf_dict(), field: value})


def test_linear_rope_scaling_is_hashable_and_divides_positions():
    cfg = DreamConfig.from_hf_dict({**CFG.to_hf_dict(), "rope_scaling": {"type": "linear",
                                                                         "factor": 2.0}})
    assert cfg.rope_factor == 2.0 and hash(cfg)
    assert cfg.to_hf_dict()["rope_scaling"] == {"type": "linear", "factor": 2.0}


# --------------------------------------------------------------------------- model

def test_predict_logits_match_the_float64_equations_with_shift_and_padding(loaded, sd):
    cfg, params = loaded
    got = predictor.predict_logits(Dream(cfg), params, jnp.asarray(IDS), jnp.asarray(MASK))
    want = np_predict(sd, cfg, IDS, MASK)
    real = np.concatenate([[True] * 10, [False] * 3 + [True] * 7]).reshape(2, 10)
    # padding rows attend differently (HF: all keys masked); nothing reads them
    np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=2e-4, rtol=1e-4)
    # the shift: row i of predict_logits is raw row i-1 (row 0 repeats raw row 0)
    raw = np_raw_logits(sd, cfg, IDS[:1])
    np.testing.assert_allclose(np.asarray(got)[0, 1:], raw[0, :-1], atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(got)[0, 0], raw[0, 0], atol=2e-4, rtol=1e-4)


def test_left_padding_does_not_change_a_rows_predictions(loaded):
    cfg, params = loaded
    model = Dream(cfg)
    row = IDS[1:, 3:]
    alone = predictor.predict_logits(model, params, jnp.asarray(row), jnp.ones_like(row))
    padded = predictor.predict_logits(model, params, jnp.asarray(IDS), jnp.asarray(MASK))
    # row 3 (the first real token) is shifted from a padding row: only rows 4: predict
    np.testing.assert_allclose(np.asarray(padded)[1, 4:], np.asarray(alone)[0, 1:], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(dream_positions(MASK))[1], [1, 1, 1, 0, 1, 2, 3, 4, 5, 6])


def test_raw_call_is_the_hf_forward_with_default_positions(loaded, sd):
    cfg, params = loaded
    got = Dream(cfg).apply({"params": params}, jnp.asarray(IDS))
    np.testing.assert_allclose(np.asarray(got), np_raw_logits(sd, cfg, IDS), atol=2e-4, rtol=1e-4)


def test_tied_embeddings_and_llada_satisfy_the_interface(tmp_path, tiny_model, tiny_params):
    cfg = dream_preset("dream-test-tiny", tie_word_embeddings=True)
    sd = hf_state(cfg, seed=1)
    _, params = load_dream_checkpoint(write_hf_dir(tmp_path / "tied", cfg, sd))
    assert "lm_head" not in params
    got = predictor.predict_logits(Dream(cfg), params, jnp.asarray(IDS), jnp.asarray(MASK))
    np.testing.assert_allclose(np.asarray(got)[0], np_predict(sd, cfg, IDS, MASK)[0],
                               atol=2e-4, rtol=1e-4)
    ids = jnp.asarray(IDS) % 120  # LLaDA: row i already predicts token i, no shift
    want = tiny_model.apply({"params": tiny_params}, ids, jnp.asarray(MASK))
    got = predictor.predict_logits(tiny_model, tiny_params, ids, jnp.asarray(MASK))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert predictor.is_shifted(Dream(cfg)) and not predictor.is_shifted(tiny_model)
    with pytest.raises(NotImplementedError, match="predict_logits"):
        predictor.require_unshifted(Dream(cfg), "the sampler's block slice")


def test_random_init_is_born_sharded_with_layer_stacked_params():
    mesh = shd.make_mesh((2, 2, 2))
    params = init_dream_params(Dream(CFG), jax.random.key(0), mesh)
    q = params["layers"]["q_proj"]
    assert q["kernel"].shape == (2, 32, 32) and q["bias"].shape == (2, 32)
    assert q["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert "bias" not in params["layers"]["o_proj"]


# --------------------------------------------------------------------------- weights

def test_load_places_every_tensor(loaded, sd):
    cfg, params = loaded
    for key, (path, layer, transposed) in dream_key_map(cfg).items():
        a = params
        for p in path:
            a = a[p]
        a = np.asarray(a if layer is None else a[layer])
        np.testing.assert_array_equal(a.T if transposed else a, sd[key], err_msg=key)


def test_save_round_trip_is_bitwise_in_several_files(tmp_path, loaded, sd, hf_dir):
    cfg, params = loaded
    (hf_dir / "generation_config.json").write_text('{"mask_token_id": 127}')
    save_dream_checkpoint(tmp_path / "out", cfg, params, max_shard_size=20_000,
                          source_dir=hf_dir)
    out = tmp_path / "out"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    back = {}
    for name in set(index["weight_map"].values()):
        back.update(load_file(str(out / name)))
    assert back.keys() == sd.keys()
    for key in sd:
        np.testing.assert_array_equal(back[key], sd[key], err_msg=key)
    assert (out / "generation_config.json").exists()
    cfg2, params2 = load_dream_checkpoint(out)
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))


def test_sharded_load_onto_a_mesh(hf_dir, sd):
    mesh = shd.make_mesh((2, 2, 2))
    cfg, params = load_dream_checkpoint(hf_dir, mesh=mesh)
    k = params["layers"]["k_proj"]["kernel"]
    assert k.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    np.testing.assert_array_equal(np.asarray(k[1]).T, sd["model.layers.1.self_attn.k_proj.weight"])


def test_mismatched_checkpoint_is_refused_by_key(tmp_path, sd):
    bad = {k: v for k, v in sd.items() if "layers.1.self_attn.q_proj.bias" not in k}
    with pytest.raises(CheckpointError, match="q_proj.bias"):
        load_dream_checkpoint(write_hf_dir(tmp_path / "bad", CFG, bad))
