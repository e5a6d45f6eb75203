"""SDAR / TraDo (block diffusion): model, block-causal mask, HF checkpoints, a tiny replica.

Independent references: a float64 numpy forward written from Gen-Verse/dLLM-RL
``models/sdar/modeling_sdar.py``'s equations on HF-keyed tensors the test writes itself
(key map, transposes, per-head q/k RMSNorm, GQA, RoPE at ``tok_idx`` positions), under masks
built as the authors' callers build them: ``dllm_rl_mask`` ports dLLM-RL's
``make_basic_block_attention`` + ``process_pad`` (train/sft_sdar.py), ``generate_mask``
JetAstra/SDAR generate.py's ``block_diffusion_generate`` mask, row by row.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from d1jax.model import family, hf_checkpoint, predictor, sdar
from d1jax.model.hf_checkpoint import UnsupportedConfigError
from tests import published

CFG = sdar.preset("sdar-tiny")
BS = CFG.block_size

# JetAstra/SDAR training/model/SDAR-4B-Chat/config.json: every field, sizes shrunk below.
SDAR_4B_CONFIG = {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig",
                 "AutoModel": "modeling_sdar.SDARModel",
                 "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention",
    "bos_token_id": 151643, "debug": False, "eos_token_id": 151643, "block_size": 4,
    "mask_token_id": 151669, "ep_size": 1, "fuse_cross_entropy": True, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2560, "initializer_range": 0.02,
    "intermediate_size": 9728, "max_position_embeddings": 32768, "max_window_layers": 36,
    "micro_forward": False, "model_type": "sdar", "num_attention_heads": 32,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "skip_checkpoint": False,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.52.4", "use_cache": False, "use_deepep": False,
    "use_sliding_window": False, "vocab_size": 151936}
GENERATION_CONFIG = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
                     "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                     "transformers_version": "4.51.0"}
TINY_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=151680)


# --------------------------------------------------------------------------- references

def hf_state(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 tensors under SDAR's HF names and torch shapes ([out, in])."""
    rng = np.random.default_rng(seed)
    d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nk = cfg.num_attention_heads * h, cfg.num_key_value_heads * h

    def w(*shape, std=0.2):
        return (rng.standard_normal(shape) * std).astype(np.float32)
    sd = {"model.embed_tokens.weight": w(cfg.vocab_size, d, std=1.0)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        sd.update({
            p + "input_layernorm.weight": 1 + w(d), p + "mlp.down_proj.weight": w(d, f),
            p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
            p + "post_attention_layernorm.weight": 1 + w(d),
            p + "self_attn.k_norm.weight": 1 + w(h), p + "self_attn.k_proj.weight": w(nk, d),
            p + "self_attn.o_proj.weight": w(d, nq), p + "self_attn.q_norm.weight": 1 + w(h),
            p + "self_attn.q_proj.weight": w(nq, d), p + "self_attn.v_proj.weight": w(nk, d)})
    sd["model.norm.weight"] = 1 + w(d)
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = w(cfg.vocab_size, d)
    return sd


def tok_idx(mask):
    """dLLM-RL's tok_idx: cumsum(valid) - 1, padding set to 1."""
    return np.where(mask == 0, 1, np.cumsum(mask, -1) - 1)


def dllm_rl_mask(mask, l0, bs):
    """[B, L, L] 0/1: dLLM-RL's make_basic_block_attention (no extended copy: L = L0 + L1)
    then process_pad (padding keys of the prompt dropped; an emptied row sees itself)."""
    b, l = mask.shape
    l1 = l - l0
    bias = np.zeros((l, l), int)
    for bi in range((l1 + bs - 1) // bs):
        rows = np.arange(l0 + bi * bs, l0 + min((bi + 1) * bs, l1))
        bias[rows[:, None], np.arange(l0 + min((bi + 1) * bs, l1))] = 1
    for bi in range((l0 + bs - 1) // bs):
        row_end, row_start = max(l0 - bi * bs, 0), max(l0 - (bi + 1) * bs, 0)
        bias[row_start:row_end, :row_end] = 1
    out = np.repeat(bias[None], b, 0) * (mask[:, None, :] | (np.arange(l) >= l0))
    for bb, r in zip(*np.nonzero(out.sum(-1) == 0)):
        out[bb, r, r] = 1
    return out


def generate_mask(mask, bs):
    """[B, L, L] 0/1: generate.py's tril(blocks).repeat_interleave(bs) over each row's real
    tokens (its prompt unpadded), padding rows seeing themselves."""
    b, l = mask.shape
    out = np.zeros((b, l, l), int)
    for bb in range(b):
        real = np.nonzero(mask[bb])[0]
        n = len(real)
        nb = (n + bs - 1) // bs
        full = np.tril(np.ones((nb, nb), int)).repeat(bs, 0).repeat(bs, 1)[:n, :n]
        out[bb][np.ix_(real, real)] = full
        for r in np.nonzero(mask[bb] == 0)[0]:
            out[bb, r, r] = 1
    return out


def np_logits(sd, cfg, ids, attn_bll, positions):
    """modeling_sdar.SDARForCausalLM forward in float64 under a 4-D 0/1 mask [B, L, L]."""
    g = {k: v.astype(np.float64) for k, v in sd.items()}
    b, l = ids.shape
    n, k, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, h, 2) / h)
    ang = positions[..., None] * inv
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
        proj = {t: xn @ g[p + f"self_attn.{t}_proj.weight"].T for t in "qkv"}
        q = rope(rms(proj["q"].reshape(b, l, n, h), g[p + "self_attn.q_norm.weight"])
                 .transpose(0, 2, 1, 3))
        kk = rope(rms(proj["k"].reshape(b, l, k, h), g[p + "self_attn.k_norm.weight"])
                  .transpose(0, 2, 1, 3))
        v = proj["v"].reshape(b, l, k, h).transpose(0, 2, 1, 3)
        kk, v = np.repeat(kk, n // k, axis=1), np.repeat(v, n // k, axis=1)  # repeat_kv
        s = np.where(attn_bll[:, None] > 0, q @ kk.transpose(0, 1, 3, 2) / np.sqrt(h), -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        att = (pr / pr.sum(-1, keepdims=True)) @ v
        x = x + att.transpose(0, 2, 1, 3).reshape(b, l, n * h) @ g[p + "self_attn.o_proj.weight"].T
        xn = rms(x, g[p + "post_attention_layernorm.weight"])
        gate, up = xn @ g[p + "mlp.gate_proj.weight"].T, xn @ g[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ g[p + "mlp.down_proj.weight"].T
    x = rms(x, g["model.norm.weight"])
    head = g["model.embed_tokens.weight"] if cfg.tie_word_embeddings else g["lm_head.weight"]
    return x @ head.T


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def sd():
    return hf_state(CFG)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, sd):
    d = published.write_checkpoint(tmp_path_factory.mktemp("sdar") / "ckpt", CFG.to_hf_dict(), sd)
    return sdar.load_hf_checkpoint(d)


def batch(l0=7, l1=8, pads=(0, 3), seed=1):
    """Left-padded prompts of length l0 (pads[b] padding tokens) and l1 completion tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CFG.vocab_size - 2, (len(pads), l0 + l1))
    mask = np.ones_like(ids)
    for bb, p in enumerate(pads):
        ids[bb, :p], mask[bb, :p] = CFG.pad_token_id, 0
    return ids, mask


# --------------------------------------------------------------------------- tests

def test_config_reads_their_config_json():
    cfg = sdar.SDARConfig.from_hf_dict(SDAR_4B_CONFIG)
    assert cfg == sdar.preset("sdar-4b")
    assert (cfg.block_size, cfg.mask_token_id, cfg.head_dim, cfg.rope_theta) == (4, 151669, 128, 1e6)
    assert cfg.num_params() == 8_822_848_512 // 2  # its index.json's total_size, bfloat16
    for bad in ({"use_sliding_window": True}, {"attention_bias": True}, {"hidden_act": "gelu"},
                {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}):
        with pytest.raises(UnsupportedConfigError, match=next(iter(bad))):  # names the field
            sdar.SDARConfig.from_hf_dict({**SDAR_4B_CONFIG, **bad})
    back = sdar.SDARConfig.from_hf_dict(cfg.to_hf_dict())
    assert back == cfg and "block_align" not in cfg.to_hf_dict()


@pytest.mark.parametrize("pads", [(0, 0), (0, 3), (2, 5)])
def test_logits_match_numpy_under_dllm_rl_block_mask(loaded, sd, pads):
    """Default grid ("end"): dLLM-RL's training mask, prompt of 7 (not a block multiple)."""
    config, params = loaded
    ids, mask = batch(pads=pads)
    got = np.asarray(sdar.SDAR(config).apply({"params": params}, jnp.asarray(ids),
                                             jnp.asarray(mask)), np.float64)
    want = np_logits(sd, CFG, ids, dllm_rl_mask(mask, 7, BS), tok_idx(mask))
    real = mask.astype(bool)
    err = np.abs(got - want)[real].max()
    print(f"sdar end-aligned pads={pads}: max abs err {err:.2e} (logit scale "
          f"{np.abs(want[real]).max():.1f})")
    assert err < 1e-5


def test_logits_match_numpy_under_generate_block_mask(sd, loaded):
    """``block_align="start"``: JetAstra generate.py's grid from each row's first token."""
    config, params = loaded
    ids, mask = batch(pads=(0, 3))
    cfg = sdar.preset("sdar-tiny", block_align="start")
    got = np.asarray(sdar.SDAR(cfg).apply({"params": params}, jnp.asarray(ids),
                                          jnp.asarray(mask)), np.float64)
    want = np_logits(sd, CFG, ids, generate_mask(mask, BS), tok_idx(mask))
    err = np.abs(got - want)[mask.astype(bool)].max()
    print(f"sdar start-aligned: max abs err {err:.2e}")
    assert err < 1e-5


def test_block_causal_mask_shape():
    """Bidirectional inside a block, causal across, padding keys never seen."""
    m = np.asarray(sdar.block_causal_mask(jnp.array([[0, 1, 1, 1, 1, 1]]), 6, 4, "end"))[0]
    # grid from the end: blocks {0, 1} and {2..5}; key 0 is padding
    want = np.array([[0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]] + [[0, 1, 1, 1, 1, 1]] * 4)
    np.testing.assert_array_equal(m, want.astype(bool))
    s = np.asarray(sdar.block_causal_mask(jnp.array([[0, 1, 1, 1, 1, 1]]), 6, 4, "start"))[0]
    assert s[1].tolist() == [0, 1, 1, 1, 1, 0] and s[5].tolist() == [0, 1, 1, 1, 1, 1]


def test_later_blocks_do_not_change_earlier_ones(loaded):
    config, params = loaded
    ids, mask = batch(pads=(0, 3))
    ids2 = ids.copy()
    ids2[:, -BS:] = CFG.mask_token_id  # the last block only
    f = lambda x: np.asarray(sdar.SDAR(config).apply({"params": params}, jnp.asarray(x),  # noqa
                                                     jnp.asarray(mask)))
    a, b = f(ids), f(ids2)
    np.testing.assert_allclose(a[:, :-BS], b[:, :-BS], atol=1e-5)
    assert np.abs(a[:, -BS:] - b[:, -BS:]).max() > 1e-3


def test_bfloat16_forward_close_to_float32(loaded):
    config, params = loaded
    ids, mask = batch(pads=(0, 3))
    f32 = np.asarray(sdar.SDAR(config).apply({"params": params}, ids, mask))
    # float32 master weights, bfloat16 compute (the released files are bfloat16)
    b16 = np.asarray(sdar.SDAR(config, dtype=jnp.bfloat16).apply({"params": params}, ids, mask),
                     np.float32)
    real = mask.astype(bool)
    assert np.isfinite(b16).all()
    assert np.abs(b16 - f32)[real].max() < 0.1 * np.abs(f32[real]).max()


def test_hf_save_load_round_trip(tmp_path, loaded, sd):
    config, params = loaded
    sdar.save_hf_checkpoint(tmp_path / "out", config, params)
    keys = set(hf_checkpoint.open_checkpoint(tmp_path / "out"))
    assert keys == set(sd) == set(sdar.key_map(config))
    config2, params2 = sdar.load_hf_checkpoint(tmp_path / "out")
    assert config2 == config
    written = {}
    for f in sorted((tmp_path / "out").glob("*.safetensors")):
        written.update(load_file(str(f)))
    for k, v in sd.items():
        np.testing.assert_array_equal(written[k].astype(np.float32), v, err_msg=k)
    cfg_json = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg_json["model_type"] == "sdar" and cfg_json["block_size"] == BS


def write_replica(d, seed=0):
    """A tiny SDAR-4B-Chat: its config.json fields and generation_config.json, its weight
    names in two shards with model.safetensors.index.json; only the sizes shrink."""
    cfg_json = {**SDAR_4B_CONFIG, **TINY_SIZES, "max_window_layers": 2}
    sd = hf_state(sdar.SDARConfig.from_hf_dict(cfg_json), seed)
    last = ["lm_head.weight", "model.norm.weight"]
    published.write_checkpoint(d, cfg_json, sd, [[k for k in sd if k not in last], last],
                               total_size=sum(v.nbytes for v in sd.values()) // 2)  # bfloat16
    (d / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=4))
    return sd


def test_tiny_replica_loads_as_its_family(tmp_path):
    sd = write_replica(tmp_path / "SDAR-4B-Chat")
    assert family.detect(tmp_path / "SDAR-4B-Chat") == "sdar"
    fam = family.get("sdar")
    config, params = fam.load(tmp_path / "SDAR-4B-Chat")
    assert (config.block_size, config.mask_token_id, config.eos_token_id) == (4, 151669, 151643)
    assert set(sd) == set(sdar.key_map(config)) and len(sd) == 2 * 11 + 3
    ids = jnp.asarray([[151644, 872, 198, 151669, 151669, 151669, 151669, 151669]])
    assert np.isfinite(np.asarray(fam.model(config).apply({"params": params}, ids))).all()


def test_family_record_and_interface():
    fam = family.get("sdar")
    predictor.check_module(fam.module)
    assert fam.model_types == ("sdar",) and not predictor.is_shifted(sdar.SDAR(CFG))
    assert set(fam.lora_targets) == set(CFG.projections)
    small = fam.sized_config("sdar-tiny", vocab=300, mask=299, eos=298, pad=298, width=16)
    assert (small.vocab_size, small.hidden_size, small.intermediate_size) == (300, 16, 48)
    # the cache entry points (the committed-block cache): tests/test_block_diffusion.py
