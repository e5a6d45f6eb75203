"""LLaDA-MoE (d1jax/model/lladamoe): logits against a float64 numpy port of their
``modeling_lladamoe.py`` equations on a tiny checkpoint in the Hub's per-expert layout (every
option on: a dense layer then MoE layers, the expert bias, a shared expert, GQA, partial
RoPE, q/k/v/o biases, clip_qkv), routing where the bias changes the chosen experts, the
key map out and back, the same numerics with the experts on 1 and 4 fake devices, their own
torch file (vendored in tests/reference/lladamoe/), and a tiny published replica through
``python -m d1jax.main`` (SFT step, export, reload on the expert mesh).

The port is written from their equations (LLaDAMoEAttention: per-head q/k RMSNorm on
reshape(-1, head_dim), clamp, apply_rotary_pos_emb over the first rotary_dim features, no
mask; LLaDAMoESparseMoeBlock: softmax, + expert_bias, top-k values as weights, no
renormalisation; the layer's shared_expert), reading the checkpoint's tensors by their HF
names, so it checks the key map too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sharding as shd
from d1jax.model import hf_checkpoint as hf
from d1jax.model.hf_checkpoint import UnsupportedConfigError
from d1jax.model.lladamoe import LLaDAMoE, load_hf_checkpoint, preset, save_hf_checkpoint
from d1jax.model.lladamoe.config import LLaDAMoEConfig
from d1jax.model.lladamoe.model import route
from d1jax.model.predictor import init_params
from tests import published

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
# Their config.json fields, the tiny sizes, every option on.
TINY_JSON = {
    "architectures": ["LLaDAMoEModelLM"], "model_type": "llada", "vocab_size": 128,
    "hidden_size": 32, "dense_intermediate_size": 64, "expert_intermediate_size": 16,
    "shared_expert_intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 256,
    "initializer_range": 0.02, "rms_norm_eps": 1e-05, "use_cache": False, "pad_token_id": 126,
    "eos_token_id": 126, "mask_token_id": 127, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_scaling": None,
    "attention_bias": True, "attention_dropout": 0.0, "clip_qkv": 2.5,
    "num_experts_per_tok": 2, "num_experts": 8, "router_aux_loss_coef": 0.01,
    "norm_topk_prob": True,  # their block ignores it (never renormalises)
    "qk_layernorm": True, "moe_layer_freq": [0, 1, 1], "moe_router_enable_expert_bias": True,
    "moe_router_score_function": "softmax", "routed_scaling_factor": 1,
    "router_num_group": None, "router_topk_group": None, "torch_dtype": "bfloat16"}
PROJ = ("gate_proj", "up_proj", "down_proj")
IDS = np.array([[5, 17, 99, 3, 64, 127, 127, 127, 127, 127, 8, 1]])


def hub_state(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """A random state dict in the Hub's names and torch shapes ([out, in])."""
    rng = np.random.default_rng(seed)
    d, n, k = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    h, e, v = d // n, cfg["num_experts"], cfg["vocab_size"]

    def w(*shape, s=0.3):
        return (rng.standard_normal(shape) * s).astype(np.float32)
    sd = {"model.embed_tokens.weight": w(v, d, s=1.0)}
    for j, moe in enumerate(cfg["moe_layer_freq"]):
        p = f"model.layers.{j}."
        for name, out in (("q_proj", n * h), ("k_proj", k * h), ("v_proj", k * h),
                          ("o_proj", d)):
            sd[p + f"self_attn.{name}.weight"] = w(out, d)
            if cfg["attention_bias"]:
                sd[p + f"self_attn.{name}.bias"] = w(out, s=0.1)
        sd[p + "self_attn.q_norm.weight"] = 1 + w(h, s=0.1)
        sd[p + "self_attn.k_norm.weight"] = 1 + w(h, s=0.1)
        if not moe:
            f = cfg["dense_intermediate_size"]
            for q, shape in zip(PROJ, ((f, d), (f, d), (d, f))):
                sd[p + f"mlp.{q}.weight"] = w(*shape)
        else:
            i, s = cfg["expert_intermediate_size"], cfg["shared_expert_intermediate_size"]
            sd[p + "mlp.gate.weight"] = w(e, d, s=0.5)
            sd[p + "mlp.expert_bias"] = w(e, s=0.05)
            for x in range(e):
                for q, shape in zip(PROJ, ((i, d), (i, d), (d, i))):
                    sd[p + f"mlp.experts.{x}.{q}.weight"] = w(*shape)
            for q, shape in zip(PROJ, ((s, d), (s, d), (d, s))):
                sd[p + f"shared_expert.{q}.weight"] = w(*shape)
        sd[p + "input_layernorm.weight"] = 1 + w(d, s=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + w(d, s=0.1)
    sd["model.norm.weight"] = 1 + w(d, s=0.1)
    sd["lm_head.weight"] = w(v, d)
    return sd


# ------------------------------------------------------------------ the float64 numpy port

def np_rms(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps))


def np_swiglu(x, g, u, dn):
    a = x @ g.T
    return ((a / (1 + np.exp(-a))) * (x @ u.T)) @ dn.T


def np_route(x, sd, p, cfg):
    """(ids [T, K], weights [T, K]): softmax, plus the bias, the top-k of that (values)."""
    lg = x @ sd[p + "mlp.gate.weight"].astype(np.float64).T
    pr = np.exp(lg - lg.max(-1, keepdims=True))
    pr = pr / pr.sum(-1, keepdims=True) + sd.get(p + "mlp.expert_bias", 0.0)
    ids = np.argsort(-pr, -1, kind="stable")[:, :cfg["num_experts_per_tok"]]
    return ids, np.take_along_axis(pr, ids, 1)


def np_attention(x, sd, p, cfg, key_mask):
    n, k = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    h = cfg["hidden_size"] // n
    rd, L, eps, c = int(h * cfg["partial_rotary_factor"]), x.shape[0], cfg["rms_norm_eps"], \
        cfg["clip_qkv"]

    def proj(name):
        y = x @ sd[p + f"self_attn.{name}.weight"].T
        return y + sd[p + f"self_attn.{name}.bias"] if cfg["attention_bias"] else y
    q = np_rms(proj("q_proj").reshape(L, n, h), sd[p + "self_attn.q_norm.weight"], eps)
    kk = np_rms(proj("k_proj").reshape(L, k, h), sd[p + "self_attn.k_norm.weight"], eps)
    v = proj("v_proj").reshape(L, k, h)
    if c is not None:
        q, kk, v = np.clip(q, -c, c), np.clip(kk, -c, c), np.clip(v, -c, c)
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, rd, 2) / rd)
    fr = np.arange(L)[:, None] * inv
    cos, sin = np.cos(np.concatenate([fr, fr], -1)), np.sin(np.concatenate([fr, fr], -1))

    def rope(t):
        r = t[..., :rd]
        half = np.concatenate([-r[..., rd // 2:], r[..., :rd // 2]], -1)
        return np.concatenate([r * cos[:, None] + half * sin[:, None], t[..., rd:]], -1)
    q, kk = rope(q), rope(kk)
    out = np.zeros((L, n, h))
    for head in range(n):
        kv = head // (n // k)
        sc = np.where(key_mask[None], q[:, head] @ kk[:, kv].T / np.sqrt(h), -np.inf)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        out[:, head] = (pr / pr.sum(-1, keepdims=True)) @ v[:, kv]
    y = out.reshape(L, n * h) @ sd[p + "self_attn.o_proj.weight"].T
    return y + sd[p + "self_attn.o_proj.bias"] if cfg["attention_bias"] else y


def np_logits(sd, cfg, ids, key_mask=None, routes=None):
    """Logits [L, V] of one row in float64; ``key_mask`` [L] (None: all keys, theirs);
    ``routes`` gets (layer, router input, chosen experts) of each MoE layer."""
    sd = {k: a.astype(np.float64) for k, a in sd.items()}
    eps, L = cfg["rms_norm_eps"], len(ids)
    key_mask = np.ones(L, bool) if key_mask is None else np.asarray(key_mask, bool)
    x = sd["model.embed_tokens.weight"][ids]
    for j, moe in enumerate(cfg["moe_layer_freq"]):
        p = f"model.layers.{j}."
        x = x + np_attention(np_rms(x, sd[p + "input_layernorm.weight"], eps), sd, p, cfg,
                             key_mask)
        xn = np_rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        if not moe:
            x = x + np_swiglu(xn, *(sd[p + f"mlp.{q}.weight"] for q in PROJ))
            continue
        eids, w = np_route(xn, sd, p, cfg)
        if routes is not None:
            routes.append((j, xn, eids))
        y = np.zeros_like(xn)
        for t in range(L):
            for slot in range(eids.shape[1]):
                y[t] += w[t, slot] * np_swiglu(
                    xn[t], *(sd[p + f"mlp.experts.{eids[t, slot]}.{q}.weight"] for q in PROJ))
        if p + "shared_expert.gate_proj.weight" in sd:
            y = y + np_swiglu(xn, *(sd[p + f"shared_expert.{q}.weight"] for q in PROJ))
        x = x + y
    return np_rms(x, sd["model.norm.weight"], eps) @ sd["lm_head.weight"].T


# ------------------------------------------------------------------ tests

@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    """(directory, state dict) of the every-option checkpoint."""
    path = tmp_path_factory.mktemp("lladamoe") / "hub"
    sd = hub_state(TINY_JSON)
    published.write_checkpoint(path, TINY_JSON, sd)
    return path, sd


def test_logits_match_numpy_port(replica):
    """Unpadded (their forward exactly) and a left-padded row (padding keys hidden, d1jax's
    choice: their forward attends to them)."""
    path, sd = replica
    config, params = load_hf_checkpoint(path)
    assert config == preset("lladamoe-tiny", attention_bias=True, clip_qkv=2.5,
                            norm_topk_prob=True, moe_router_score_function="softmax")
    ids = jnp.asarray(np.concatenate([IDS, IDS[:, ::-1]]))
    mask = np.array([[1] * 12, [0] * 3 + [1] * 9])
    got = np.asarray(LLaDAMoE(config).apply({"params": params}, ids, jnp.asarray(mask)))
    np.testing.assert_allclose(got[0], np_logits(sd, TINY_JSON, IDS[0]), rtol=2e-4, atol=2e-4)
    want = np_logits(sd, TINY_JSON, IDS[0, ::-1], mask[1])
    np.testing.assert_allclose(got[1, 3:], want[3:], rtol=2e-4, atol=2e-4)


def test_routing_uses_the_biased_probabilities(replica):
    """On the first MoE layer's input the bias changes some token's experts, and d1jax's
    router picks the port's experts with the port's (biased, unnormalised) weights."""
    _, sd = replica
    x = np.random.default_rng(1).standard_normal((64, 32))
    p = "model.layers.1."
    ids, w = np_route(x, sd, p, TINY_JSON)
    no_bias = {k: a for k, a in sd.items() if k != p + "mlp.expert_bias"}
    changed = (np.sort(np_route(x, no_bias, p, TINY_JSON)[0], -1) != np.sort(ids, -1)).any(-1)
    assert 0 < changed.sum() < len(x)
    got_ids, got_w, probs = route(jnp.asarray(x, jnp.float32),
                                  jnp.asarray(sd[p + "mlp.gate.weight"].T),
                                  jnp.asarray(sd[p + "mlp.expert_bias"]), 2)
    np.testing.assert_array_equal(np.asarray(got_ids), ids)
    np.testing.assert_allclose(np.asarray(got_w), w, rtol=1e-5)
    assert np.abs(np.asarray(got_w).sum(-1) - 1).max() > 1e-3  # not renormalised
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1, rtol=1e-6)


def test_export_and_reload(replica, tmp_path):
    """Load -> export (exactly the published key set and shapes, model_type kept) -> reload:
    the same params; a key missing or a shape off is refused naming it."""
    path, sd = replica
    config, params = load_hf_checkpoint(path)
    save_hf_checkpoint(tmp_path / "out", config, params, source_dir=path)
    where = hf.open_checkpoint(tmp_path / "out")
    assert set(where) == set(sd)
    for key, a in sd.items():
        np.testing.assert_array_equal(where[key].array(key), a, err_msg=key)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "llada"
    for field in ("moe_layer_freq", "shared_expert_intermediate_size", "clip_qkv",
                  "partial_rotary_factor", "moe_router_enable_expert_bias", "norm_topk_prob"):
        assert written[field] == TINY_JSON[field], field
    config2, params2 = load_hf_checkpoint(tmp_path / "out")
    assert config2 == config
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    missing = {k: a for k, a in sd.items() if k != "model.layers.2.mlp.experts.7.down_proj.weight"}
    published.write_checkpoint(tmp_path / "a", TINY_JSON, missing)
    with pytest.raises(hf.CheckpointError, match="experts.7.down_proj"):
        load_hf_checkpoint(tmp_path / "a")
    bad = dict(sd, **{"model.layers.1.mlp.gate.weight": np.zeros((8, 31), np.float32)})
    published.write_checkpoint(tmp_path / "b", TINY_JSON, bad)
    with pytest.raises(hf.CheckpointError, match=r"gate.weight: shape \(8, 31\)"):
        load_hf_checkpoint(tmp_path / "b")


@pytest.mark.parametrize("field,value", [("hidden_act", "gelu"), ("moe_layer_freq", [1, 0, 1]),
                                         ("model_type", "llada2_moe"),
                                         ("rope_scaling", {"type": "linear", "factor": 2.0})])
def test_config_refuses_what_is_not_implemented(field, value):
    with pytest.raises(UnsupportedConfigError, match=field):
        LLaDAMoEConfig.from_hf_dict(dict(TINY_JSON, **{field: value}))


def test_llada_8b_config_is_not_read_as_moe(tmp_path):
    """LLaDA-8B's config.json shares model_type "llada": it is refused by what it lacks, and
    the registry tells the two apart by LLaDA-MoE's ``num_experts`` (``Family.marks``)."""
    from d1jax.model import family
    llada = {"model_type": "llada", "d_model": 4096, "n_layers": 32, "vocab_size": 126464}
    with pytest.raises(UnsupportedConfigError, match="num_experts"):
        LLaDAMoEConfig.from_hf_dict(llada)
    for name, cfg in [("llada", llada), ("lladamoe", TINY_JSON),
                      ("lladamoe", dict(TINY_JSON, model_type="lladamoe"))]:
        d = tmp_path / name / cfg["model_type"]
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg))
        assert family.detect(d) == name, cfg["model_type"]


def test_the_7b_preset():
    """LLaDA-MoE-7B-A1B: ~7B total, ~1.4B active ("A1B"), 16 MoE layers of 64 experts."""
    c = preset("lladamoe-7b-a1b")
    assert (c.n_moe, c.num_experts, c.num_experts_per_tok, c.head_dim) == (16, 64, 8, 128)
    assert 7.0e9 < c.num_params() < 7.6e9 and 1.2e9 < c.active_params() < 1.6e9


def test_cache_entry_points_equal_the_full_forward(replica):
    """prefill is the full forward; decode_hidden of a slice against the full cache gives the
    full forward's rows; decode_at over a window rewrites the keys/values prefill made."""
    config, params = load_hf_checkpoint(replica[0])
    model = LLaDAMoE(config)
    ids, mask = jnp.asarray(IDS), jnp.ones((1, 12), jnp.int32)
    apply = lambda *a, **k: model.apply({"params": params}, *a, **k)  # noqa: E731
    apply = jax.jit(apply, static_argnames=("method", "slice_len"))
    full = np.asarray(apply(ids, mask))
    logits, cache = apply(ids, mask, method=model.prefill)
    assert cache.k.shape == (3, 1, 12, 2, 8)
    np.testing.assert_allclose(logits, full, atol=1e-5)
    h = apply(ids, cache, 4, mask, slice_len=4, method=model.decode_hidden)
    np.testing.assert_allclose(apply(h, method=model.logits), full[:, 4:8], atol=1e-5)
    window = jax.tree.map(lambda c: jnp.zeros_like(c[:, :, 4:8]), cache)
    h, window = apply(ids, jnp.arange(4)[None], cache, window, 4, mask, method=model.decode_at)
    np.testing.assert_allclose(apply(h, method=model.logits), full[:, 4:8], atol=1e-5)
    np.testing.assert_allclose(window.k, cache.k[:, :, 4:8], atol=1e-5)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_expert_shards_do_not_change_numerics():
    """Logits and every gradient equal with the experts on 1 and on 4 shards of an expert
    mesh axis (tests/test_llada2_ep.py's check, on this family's router)."""
    rules = shd.DEFAULT_RULES + ((shd.EXPERT, "expert"),)
    config = preset("lladamoe-tiny", num_hidden_layers=1, moe_layer_freq=(1,))
    model = LLaDAMoE(config)
    params = init_params(model, jax.random.key(0))
    params["moe_layers"]["gate"]["expert_bias"] = 0.05 * jax.random.normal(
        jax.random.key(1), (1, 8))
    ids = jax.random.randint(jax.random.key(2), (8, 8), 0, config.vocab_size)

    def loss(p):
        out = model.apply({"params": p}, ids)
        return jnp.sum(jnp.sin(out)), out
    runs = {}
    for n in (1, 4):
        mesh = shd.make_mesh((8 // n, 1, 1, n), ("data", "fsdp", "tensor", "expert"))
        with shd.activate(mesh, rules):
            placed = jax.device_put(params, shd.param_shardings(model, mesh, rules))
            (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(placed)
            local = placed["moe_layers"]["experts"]["gate_proj"].addressable_shards[0].data
            assert local.shape[1] == 8 // n
        runs[n] = np.asarray(out), jax.tree.map(np.asarray, grads)
    np.testing.assert_allclose(runs[4][0], runs[1][0], rtol=1e-5, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(
        a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max()), runs[4][1], runs[1][1])
    g = runs[1][1]["moe_layers"]
    assert np.abs(g["experts"]["down_proj"]).max() > 0 and np.abs(g["gate"]["kernel"]).max() > 0
    assert np.abs(g["gate"]["expert_bias"]).max() == 0  # a buffer


# Their modeling file (plain torch): ZHZisZZ/dllm's copy of the Hub's remote code, vendored
# unchanged in tests/reference/lladamoe/ (SOURCE.md there), or $D1JAX_LLADAMOE_MODELING's
# folder holding configuration_lladamoe.py and modeling_lladamoe.py.
THEIRS = os.environ.get("D1JAX_LLADAMOE_MODELING") or str(
    Path(__file__).parent / "reference" / "lladamoe")


def test_logits_match_their_torch_file(replica):
    """Their LLaDAMoEModelLM (eager attention, no mask: full attention) on CPU in float32,
    loaded with the replica's state dict: logits equal d1jax's."""
    torch = pytest.importorskip("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def default_rope(config, device=None, *_, **__):  # transformers 4.x's, gone from 5.x
        h = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(h * config.partial_rotary_factor)
        return 1.0 / config.rope_theta ** (torch.arange(0, dim, 2).float() / dim), 1.0
    ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)
    folder = Path(THEIRS)
    pkg = type(sys)("lladamoe_ref")
    pkg.__path__ = [str(folder)]
    sys.modules["lladamoe_ref"] = pkg
    mods = {}
    for name in ("configuration_lladamoe", "modeling_lladamoe"):
        spec = importlib.util.spec_from_file_location(f"lladamoe_ref.{name}", folder / f"{name}.py")
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mods[name]
        spec.loader.exec_module(mods[name])
    cfg_cls = next(v for k, v in vars(mods["configuration_lladamoe"]).items()
                   if k.endswith("Config") and k != "PretrainedConfig")
    cfg = cfg_cls(**{k: v for k, v in TINY_JSON.items() if k not in ("model_type",
                                                                      "architectures")})
    cfg._attn_implementation = "eager"
    model = mods["modeling_lladamoe"].LLaDAMoEModelLM(cfg).eval()
    path, sd = replica
    state = {k: torch.from_numpy(a) for k, a in sd.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("inv_freq" in m for m in missing), (missing, unexpected)
    with torch.no_grad():
        theirs = model(torch.from_numpy(IDS)).logits.numpy()
    config, params = load_hf_checkpoint(path)
    ours = np.asarray(LLaDAMoE(config).apply({"params": params}, jnp.asarray(IDS)))
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-4)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_sft_exports_and_reloads(tmp_path):
    """The published replica (model_type "llada", as LLaDA-8B's: found by its experts) trains
    an SFT step through
    ``python -m d1jax.main`` on 8 fake devices with the experts on a mesh axis of 4 (full
    fine-tuning in bfloat16: LoRA leaves the stacked experts alone), exports, and the export reloads with
    the experts sharded 4 ways and trained, the router's bias buffer as the source had it."""
    from tests.learnable import MAIN
    src = published.write_lladamoe(tmp_path / "src")
    wd = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-c", MAIN, "--config=configs/sft_s1k.py:tiny", f"--workdir={wd}",
         "--config.model.family=lladamoe", f"--config.model.path={src}",
         "--config.model.random_init=", "--config.train.num_steps=1",
         "--config.sft.batch_size=2", "--config.train.export_hf=True",
         "--config.lora.enabled=False", "--config.optim.learning_rate=1e-3",
         "--config.optim.warmup_ratio=0", "--config.model.dtype=bfloat16",
         "--config.model.param_dtype=bfloat16",  # as users run the 7B (float32 masters)
         "--config.mesh.shape=(2,1,1,4)", "--config.sft.max_length=720"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = wd / "hf"
    assert json.loads((out / "config.json").read_text())["model_type"] == "llada"  # kept
    assert set(hf.open_checkpoint(out)) == set(hf.open_checkpoint(src))
    mesh = shd.make_mesh((2, 1, 1, 4))
    rules = shd.DEFAULT_RULES + ((shd.EXPERT, shd.EXPERT_AXIS),)
    config, params = load_hf_checkpoint(out, mesh, rules=rules)
    _, before = load_hf_checkpoint(src)
    experts = params["moe_layers"]["experts"]["gate_proj"]
    assert experts.addressable_shards[0].data.shape[1] == config.num_experts // 4
    assert np.abs(np.asarray(experts, np.float32)
                  - np.asarray(before["moe_layers"]["experts"]["gate_proj"], np.float32)).max() > 0
    bias = lambda p: np.asarray(p["moe_layers"]["gate"]["expert_bias"], np.float32)  # noqa: E731
    np.testing.assert_array_equal(bias(params), bias(before))
