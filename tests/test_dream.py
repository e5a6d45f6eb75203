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
from safetensors.numpy import load_file

from d1jax import sharding as shd
from d1jax.model import predictor
from d1jax.model.hf_checkpoint import UnsupportedConfigError
from d1jax.model import init_params
from d1jax.model.dream import Dream, dream_positions
from d1jax.model.dream import DreamConfig, preset as dream_preset
from d1jax.model.dream.weights import (CheckpointError, key_map as dream_key_map,
                                      load_hf_checkpoint as load_dream_checkpoint,
                                      save_hf_checkpoint as save_dream_checkpoint)
from tests import published

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

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
    return published.write_checkpoint(path, cfg.to_hf_dict(), sd)


def np_raw_logits(sd, cfg: DreamConfig, ids, mask=None, positions=None, *, cache=None,
                  q_start=0, kv=None):
    """modeling_dream.DreamModel forward in float64: raw logits [B, L, V] (row i -> i+1).

    ``kv``: a list that receives each layer's keys (after RoPE) and values [B, K, L, H] of
    the rows. With ``cache`` (such a list of a whole sequence) ``ids`` [B, Q] are positions
    q_start:+Q, attending to their own keys/values there and to the cache's elsewhere
    (``mask`` [B, L] masks the whole sequence's keys): Fast-dLLM's cached forward.
    """
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
        if kv is not None:
            kv.append((kk, v))
        if cache is not None:  # the rows' keys/values in place of the cache's
            kk, v = (np.concatenate([c[:, :, :q_start], a, c[:, :, q_start + l:]], axis=2)
                     for c, a in zip(cache[i], (kk, v)))
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
    np.testing.assert_array_equal(np.asarray(dream_positions(MASK))[1],
                                  [1, 1, 1, 0, 1, 2, 3, 4, 5, 6])


def test_raw_logits_are_the_hf_forward_with_default_positions(loaded, sd):
    cfg, params = loaded
    got = Dream(cfg).apply({"params": params}, jnp.asarray(IDS), method=Dream.raw_logits)
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


def test_random_init_is_born_sharded_with_layer_stacked_params():
    mesh = shd.make_mesh((2, 2, 2))
    params = init_params(Dream(CFG), jax.random.key(0), mesh)
    q = params["layers"]["q_proj"]
    assert q["kernel"].shape == (2, 32, 32) and q["bias"].shape == (2, 32)
    assert q["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert "bias" not in params["layers"]["o_proj"]


def test_lora_adapters_attach_by_dream_names_and_start_as_the_base_model(loaded):
    from d1jax.model.lora import LoraConfig
    cfg, params = loaded
    model = Dream(cfg, lora=LoraConfig(rank=4, targets=("q_proj", "v_proj", "down_proj")))
    fresh = init_params(model, jax.random.key(1))
    q = fresh["layers"]["q_proj"]
    assert set(q) == {"kernel", "bias", "lora_a", "lora_b"} and q["lora_a"].shape == (2, 32, 4)
    assert "lora_a" not in fresh["layers"]["k_proj"]
    merged = jax.tree.map(lambda a: a, fresh)
    for name in ("q_proj", "v_proj", "down_proj"):
        merged["layers"][name].update({k: v for k, v in params["layers"][name].items()})
    for name in ("embed_tokens", "norm", "lm_head"):
        merged[name] = params[name]
    for name in set(params["layers"]) - {"q_proj", "v_proj", "down_proj"}:
        merged["layers"][name] = params["layers"][name]
    ids = jnp.asarray(IDS)
    np.testing.assert_allclose(np.asarray(predictor.predict_logits(model, merged, ids)),
                               np.asarray(predictor.predict_logits(Dream(cfg), params, ids)),
                               atol=1e-6)


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


# --------------------------------------------------------------------------- diffusion_generate

def np_linspace(steps, eps):
    """torch.linspace(1, eps, steps + 1) in float32: two halves, each an FMA."""
    n = steps + 1
    step = np.float32((np.float32(eps) - np.float32(1)) / np.float32(n - 1))
    out = []
    for i in range(n):
        if i < n // 2:
            out.append(np.float32(1.0 + float(step) * i))
        else:
            out.append(np.float32(float(np.float32(eps)) - float(step) * (n - 1 - i)))
    return np.array(out, np.float32)


def test_generation_defaults_are_a_diffusion_generate_call_under_transformers_4():
    from d1jax.sampling.dream import DreamGenerationConfig
    g = DreamGenerationConfig()
    assert (g.temperature, g.top_p, g.top_k, g.eps, g.steps, g.alg, g.alg_temp) == (
        1.0, 1.0, 50, 1e-3, 512, "origin", None)


def np_sample_tokens(logits, temperature, top_p, top_k, margin=False, neg_entropy=False):
    """generation_utils.sample_tokens at temperature 0, float64."""
    assert temperature == 0
    low = np.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        idx = np.argsort(-logits, axis=-1, kind="stable")
        srt = np.take_along_axis(logits, idx, -1)
        e = np.exp(srt - srt[:, :1])
        cum = np.cumsum(e / e.sum(-1, keepdims=True), -1)
        remove = cum > top_p
        remove[:, 1:] = remove[:, :-1].copy()
        remove[:, 0] = False
        mask = np.zeros_like(remove)
        np.put_along_axis(mask, idx, remove, -1)
        logits = np.where(mask, low, logits)
    if top_k is not None:
        kth = np.sort(logits, -1)[:, -min(top_k, logits.shape[-1])][:, None]
        logits = np.where(logits < kth, low, logits)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    confidence, x0 = probs.max(-1), probs.argmax(-1)
    if margin:
        srt = -np.sort(-probs, -1)
        confidence = srt[:, 0] - srt[:, 1]
    if neg_entropy:
        confidence = np.sum(probs * np.log(probs + 1e-10), -1)
    return confidence, x0


def np_sample(predict, input_ids, attention_mask, cfg, uniforms, history=None):
    """generation_utils._sample (temperature 0, alg_temp None) on numpy arrays; ``predict``
    gives the model's raw float64 logits, ``uniforms[i]`` [B, L] the draws of step i;
    ``history`` (a list) receives x after each step (``output_history``)."""
    b, lp = input_ids.shape
    x = np.concatenate([input_ids, np.full((b, cfg.max_new_tokens), cfg.mask_token_id)], 1)
    tok_idx = None
    if attention_mask is not None and np.any(attention_mask == 0):
        attention_mask = np.concatenate([attention_mask, np.ones((b, cfg.max_new_tokens), int)], 1)
        tok_idx = np_tok_idx(attention_mask)
    else:
        attention_mask = None
    ts = np_linspace(cfg.steps, cfg.eps)
    kw = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
    for i in range(cfg.steps):
        mask_index = x == cfg.mask_token_id
        logits = predict(x, attention_mask, tok_idx)
        logits = np.concatenate([logits[:, :1], logits[:, :-1]], 1)
        mask_logits = logits[mask_index]
        t, s = ts[i], ts[i + 1]
        if cfg.alg == "origin":
            p_transfer = np.float32(1) - s / t if i < cfg.steps - 1 else 1
            x0 = np.full(mask_index.sum(), cfg.mask_token_id)
            transfer = uniforms[i][mask_index] < p_transfer
            if transfer.any():
                _, x0[transfer] = np_sample_tokens(mask_logits[transfer], **kw)
            x[mask_index] = x0
        else:
            confidence, x0 = np_sample_tokens(mask_logits, **kw, margin=cfg.alg == "topk_margin",
                                              neg_entropy=cfg.alg == "entropy")
            num_mask_token = np.float32(mask_index.sum()) / np.float32(b)
            n = (int(num_mask_token * (np.float32(1) - s / t)) if i < cfg.steps - 1
                 else int(num_mask_token))
            full_confidence = np.full(x.shape, -np.inf)
            full_confidence[mask_index] = confidence
            if n > 0:
                transfer_index = np.argsort(-full_confidence, -1, kind="stable")[:, :n]
                x_ = np.full_like(x, cfg.mask_token_id)
                x_[mask_index] = x0
                rows = np.arange(b)[:, None]
                x[rows, transfer_index] = x_[rows, transfer_index]
        if history is not None:
            history.append(x.copy())
    return x


def denoise_step_map(history, mask_id):
    """dLLM-RL sample/dream_rl_rollout.py's denoise_step_map on a numpy history [B, L] per
    step: the step at which each position left the mask (-1: never masked, or never left)."""
    out = np.full(history[0].shape, -1)
    prev = np.full(history[0].shape, mask_id)
    for t, cur in enumerate(history):
        out[(prev == mask_id) & (cur != mask_id)] = t
        prev = cur
    return out


@pytest.fixture(scope="module")
def generate_case(loaded, sd):
    cfg, params = loaded
    prompt = np.array([[5, 17, 3, 99, 42, 8], [126, 126, 11, 64, 2, 9]], np.int32)
    mask = np.array([[1] * 6, [0, 0, 1, 1, 1, 1]], np.int32)

    def predict(x, attn, tok_idx):
        return np_raw_logits(sd, cfg, x, attn, tok_idx)
    return cfg, params, prompt, mask, predict


def test_timesteps_are_torch_linspace_bit_for_bit():
    torch = pytest.importorskip("torch")
    from d1jax.sampling.dream import timesteps
    for steps in list(range(1, 260)) + [512, 768, 1024]:
        for eps in (1e-3, 1e-4, 1e-2, 0.1):
            want = torch.linspace(1, eps, steps + 1).numpy()
            np.testing.assert_array_equal(timesteps(steps, eps), want, err_msg=f"{steps} {eps}")
            if steps < 40:
                np.testing.assert_array_equal(np_linspace(steps, eps), want)


GEN_CASES = [  # top_k defaults to 50 (of 128), as a diffusion_generate call under 4.46
    dict(alg="origin", steps=10), dict(alg="origin", steps=4, eps=0.05, top_k=None),
    dict(alg="maskgit_plus", steps=10), dict(alg="maskgit_plus", steps=3, top_k=5),
    dict(alg="topk_margin", steps=10, top_k=None), dict(alg="topk_margin", steps=4, top_p=0.9),
    dict(alg="entropy", steps=10), dict(alg="entropy", steps=5, top_p=0.8, top_k=20),
    dict(alg="entropy", steps=6, top_k=None),
]


def no_mask_hook(logits, mask_id):
    """The reference's generation_logits_hook_func use of keeping <|mask|> out of the
    proposals: the tiny random model predicts it often, and a row that re-masks has more
    masks than the other rows, where the reference's batch-mean count overwrites decoded
    tokens with the mask id (a departure: ``test_rows_with_fewer_masks_keep_their_tokens``)."""
    return logits.at[..., mask_id].set(-1e4) if isinstance(logits, jax.Array) else \
        np.where(np.arange(logits.shape[-1]) == mask_id, -1e4, logits)


@pytest.mark.parametrize("case", GEN_CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_each_alg_matches_the_numpy_port_token_for_token(generate_case, case):
    from d1jax.sampling.dream import (DreamGenerationConfig, diffusion_generate, dream_step_keys,
                                      predict_fn_of)
    cfg, params, prompt, mask, predict = generate_case
    gen = DreamGenerationConfig(max_new_tokens=10, mask_token_id=cfg.mask_token_id,
                                temperature=0.0, **case)
    model_fn = predict_fn_of(Dream(cfg))
    rng = jax.random.key(7)
    run = jax.jit(lambda p, x, m, r: diffusion_generate(
        lambda *a: no_mask_hook(model_fn(*a), cfg.mask_token_id), p, x, m, r, gen, trace=True))
    got, decoded_at = map(np.asarray, run(params, jnp.asarray(prompt), jnp.asarray(mask), rng))
    uniforms = [np.asarray(jax.random.uniform(dream_step_keys(rng, i)[0], (2, 16)))
                for i in range(gen.steps)]
    # the hook on raw rows is the hook on shifted rows (the shift only moves rows)
    history = []
    want = np_sample(lambda *a: no_mask_hook(predict(*a), cfg.mask_token_id), prompt, mask, gen,
                     uniforms, history)
    np.testing.assert_array_equal(got, want)
    assert not np.any(got == cfg.mask_token_id)
    # the trace (TraceRL's step map) is their denoise_step_map of the history
    lp = prompt.shape[1]
    np.testing.assert_array_equal(decoded_at,
                                  denoise_step_map(history, cfg.mask_token_id)[:, lp:])


def test_rows_with_fewer_masks_keep_their_tokens(generate_case):
    from d1jax.sampling.dream import DreamGenerationConfig, make_diffusion_generate
    cfg, params, prompt, mask, _ = generate_case
    gen = DreamGenerationConfig(max_new_tokens=10, steps=10, alg="maskgit_plus",
                                mask_token_id=cfg.mask_token_id, temperature=0.0)
    got = np.asarray(make_diffusion_generate(Dream(cfg), gen)(
        params, jnp.asarray(prompt), jnp.asarray(mask), jax.random.key(7)))
    # row 1 proposes <|mask|> (re-masked, decoded again later); row 0's prompt stays
    np.testing.assert_array_equal(got[:, :6], prompt)


@pytest.mark.parametrize("alg", ["maskgit_plus", "entropy"])
def test_sampled_paths_reduce_to_the_deterministic_ones(generate_case, alg):
    """alg_temp -> 0 is top-k by confidence; temperature > 0 with top_k=1 is the argmax."""
    from d1jax.sampling.dream import DreamGenerationConfig, make_diffusion_generate
    cfg, params, prompt, mask, _ = generate_case
    base = dict(max_new_tokens=10, steps=5, alg=alg, mask_token_id=cfg.mask_token_id,
                temperature=0.0)

    def run(**kw):
        gen = DreamGenerationConfig(**{**base, **kw})
        return np.asarray(make_diffusion_generate(Dream(cfg), gen)(
            params, jnp.asarray(prompt), jnp.asarray(mask), jax.random.key(3)))
    np.testing.assert_array_equal(run(alg_temp=1e-9), run())
    np.testing.assert_array_equal(run(temperature=0.7, top_k=1), run(top_k=1))
    assert not np.array_equal(run(alg_temp=1.0), run())  # the draw does act


@pytest.mark.parametrize("kw,match", [
    (dict(alg="confidence_threshold"), "not ported"), (dict(alg="foo"), "alg="),
    (dict(eps=0.0), "eps"), (dict(top_p=1.5), "top_p"), (dict(steps=0), "steps"),
])
def test_generation_config_refuses_bad_values(kw, match):
    from d1jax.sampling.dream import DreamGenerationConfig
    with pytest.raises(ValueError, match=match):
        DreamGenerationConfig(**kw)


def test_generation_on_a_mesh_matches_one_device(generate_case, hf_dir):
    from d1jax.sampling.dream import DreamGenerationConfig, make_diffusion_generate
    cfg, params, prompt, mask, _ = generate_case
    mesh = shd.make_mesh((2, 2, 2))
    _, sharded = load_dream_checkpoint(hf_dir, mesh=mesh)
    gen = DreamGenerationConfig(max_new_tokens=10, steps=4, alg="entropy", temperature=0.0,
                                mask_token_id=cfg.mask_token_id)
    fn = make_diffusion_generate(Dream(cfg), gen)
    prompt, mask = jnp.asarray(np.tile(prompt, (2, 1))), jnp.asarray(np.tile(mask, (2, 1)))
    want = fn(params, prompt, mask, jax.random.key(0))
    batch = shd.batch_sharding(mesh)
    with shd.activate(mesh):
        got = fn(sharded, jax.device_put(prompt, batch), jax.device_put(mask, batch),
                 jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
