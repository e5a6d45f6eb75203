"""LLaDA2 MoE (d1jax/model/llada2): logits against a float64 numpy port of inclusionAI's
``modeling_llada2_moe.py`` equations on a tiny replica checkpoint written here in the Hub's
per-expert layout, routing cases where the expert bias and the group limit change the chosen
experts, both published layouts loaded / exported / reloaded, and the config's refusals.

The port below is written from their equations (LLaDA2MoeGate.forward and group_limited_topk,
LLaDA2MoeSparseMoeBlock.moe_infer, LLaDA2MoeAttention with apply_rotary_pos_emb over the first
rotary_dim features, LLaDA2MoeRMSNorm), reading the checkpoint's own tensors by their HF names,
so it checks the key map too.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.model import hf_checkpoint as hf
from d1jax.model.llada2 import LLaDA2, preset
from d1jax.model.llada2 import moe
from d1jax.model.llada2.config import LLaDA2Config
from d1jax.model.llada2.weights import load_hf_checkpoint, save_hf_checkpoint
from d1jax.model.predictor import init_params
from tests import published

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

# LLaDA2.0-mini's config.json (dFactory configs/model_configs/llada2_mini) with the sizes of
# the tiny preset: 3 layers (1 dense), 8 experts in 4 groups of which 2 kept, 2 per token.
TINY_JSON = {
    "architectures": ["LLaDA2MoeModelLM"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                 "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                 "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
    "num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 64,
    "first_k_dense_replace": 1, "hidden_act": "silu", "max_position_embeddings": 256,
    "model_type": "llada2_moe", "moe_intermediate_size": 16, "norm_topk_prob": True,
    "num_experts_per_tok": 2, "norm_head": False, "num_attention_heads": 4, "num_experts": 8,
    "num_key_value_heads": 2, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_bias": False,
    "use_rmsnorm": True, "rms_norm_eps": 1e-06, "head_dim": 16, "num_shared_experts": 1,
    "use_cache": False, "use_qkv_bias": False, "embedding_dropout": 0.0, "norm_softmax": False,
    "output_dropout": 0.0, "vocab_size": 128, "rotary_dim": 8,
    "using_split_qkv_in_self_attention": False, "router_dtype": "fp32",
    "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5, "n_group": 4,
    "topk_group": 2, "score_function": "sigmoid", "initializer_range": 0.02,
    "max_window_layers": 28, "output_router_logits": False, "pad_token_id": 126,
    "partial_rotary_factor": 0.5, "use_sliding_window": False, "mask_token_id": 127,
    "eos_token_id": 126,
}
PROJ = ("gate_proj", "up_proj", "down_proj")


def hub_state(cfg: dict, seed: int = 0, bias_scale: float = 0.3) -> dict[str, np.ndarray]:
    """A random state dict in the Hub's names and torch shapes ([out, in])."""
    rng = np.random.default_rng(seed)
    d, h, n, k = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], \
        cfg["num_key_value_heads"]
    e, i, f, v = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"], \
        cfg["vocab_size"]

    def w(*shape, s=0.2):
        return (rng.standard_normal(shape) * s).astype(np.float32)
    sd = {"model.word_embeddings.weight": w(v, d, s=1.0)}
    for j in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{j}."
        sd[p + "attention.query_key_value.weight"] = w((n + 2 * k) * h, d)
        sd[p + "attention.query_layernorm.weight"] = 1 + w(h, s=0.1)
        sd[p + "attention.key_layernorm.weight"] = 1 + w(h, s=0.1)
        sd[p + "attention.dense.weight"] = w(d, n * h)
        if j < cfg["first_k_dense_replace"]:
            for q, shape in zip(PROJ, ((f, d), (f, d), (d, f))):
                sd[p + f"mlp.{q}.weight"] = w(*shape)
        else:
            sd[p + "mlp.gate.weight"] = w(e, d, s=0.5)
            sd[p + "mlp.gate.expert_bias"] = w(e, s=bias_scale)
            for x in range(e):
                for q, shape in zip(PROJ, ((i, d), (i, d), (d, i))):
                    sd[p + f"mlp.experts.{x}.{q}.weight"] = w(*shape)
            si = i * cfg["num_shared_experts"]
            for q, shape in zip(PROJ, ((si, d), (si, d), (d, si))):
                sd[p + f"mlp.shared_experts.{q}.weight"] = w(*shape)
        sd[p + "input_layernorm.weight"] = 1 + w(d, s=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + w(d, s=0.1)
    sd["model.norm.weight"] = 1 + w(d, s=0.1)
    sd["lm_head.weight"] = w(v, d)
    return sd


def write_dir(path, cfg: dict, sd: dict) -> None:
    published.write_checkpoint(path, cfg, sd)


def merge_experts(sd: dict, cfg: dict) -> dict:
    """dFactory's moe_convertor merge: per-expert [out, in] stacked to [E, out, in], key
    without ``.weight``."""
    out = {k: a for k, a in sd.items() if ".mlp.experts." not in k}
    for j in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        for q in PROJ:
            out[f"model.layers.{j}.mlp.experts.{q}"] = np.stack(
                [sd[f"model.layers.{j}.mlp.experts.{x}.{q}.weight"]
                 for x in range(cfg["num_experts"])])
    return out


# ------------------------------------------------------------------ the float64 numpy port

def np_rms(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps))


def np_route(x, sd, p, cfg):
    """(ids [T, K], weights [T, K]) by their gate: sigmoid scores, biased group-limited
    selection, unbiased weights renormalised and scaled."""
    s = 1 / (1 + np.exp(-(x @ sd[p + "mlp.gate.weight"].astype(np.float64).T)))
    biased = s + sd[p + "mlp.gate.expert_bias"]
    e, g, k = cfg["num_experts"], cfg["n_group"], cfg["num_experts_per_tok"]
    ids = []
    for row in biased:
        groups = row.reshape(g, e // g)
        gscore = np.sort(groups, -1)[:, -2:].sum(-1)
        kept = np.argsort(-gscore, kind="stable")[:cfg["topk_group"]]
        cand = [x for x in range(e) if x // (e // g) in kept]
        ids.append(sorted(cand, key=lambda x: -row[x])[:k])
    ids = np.array(ids)
    w = np.take_along_axis(s, ids, 1)
    w = w / (w.sum(-1, keepdims=True) + 1e-20) * cfg["routed_scaling_factor"]
    return ids, w


def np_swiglu(x, g, u, dn):
    a = x @ g.T
    return ((a / (1 + np.exp(-a))) * (x @ u.T)) @ dn.T


def np_attention(x, sd, p, cfg, pos, block):
    n, k, h = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rd = int(h * cfg["partial_rotary_factor"])
    L = x.shape[0]
    qkv = (x @ sd[p + "attention.query_key_value.weight"].T).reshape(L, n + 2 * k, h)
    eps = cfg["rms_norm_eps"]
    q = np_rms(qkv[:, :n], sd[p + "attention.query_layernorm.weight"], eps)
    kk = np_rms(qkv[:, n:n + k], sd[p + "attention.key_layernorm.weight"], eps)
    v = qkv[:, n + k:]
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, rd, 2) / rd)
    fr = pos[:, None] * inv
    cos, sin = np.cos(np.concatenate([fr, fr], -1)), np.sin(np.concatenate([fr, fr], -1))

    def rope(t):
        r = t[..., :rd]
        half = np.concatenate([-r[..., rd // 2:], r[..., :rd // 2]], -1)
        return np.concatenate([r * cos[:, None] + half * sin[:, None], t[..., rd:]], -1)
    q, kk = rope(q), rope(kk)
    blk = np.arange(L) // block
    allowed = blk[None, :] <= blk[:, None]
    out = np.zeros((L, n, h))
    for head in range(n):
        kv = head // (n // k)
        sc = q[:, head] @ kk[:, kv].T / np.sqrt(h)
        sc = np.where(allowed, sc, -np.inf)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        out[:, head] = (pr / pr.sum(-1, keepdims=True)) @ v[:, kv]
    return out.reshape(L, n * h) @ sd[p + "attention.dense.weight"].T


def np_logits(sd, cfg, ids, block, routes=None):
    """Logits [L, V] of one row in float64 from the HF state dict; ``routes``: a list that
    gets (layer, router input [L, D], chosen experts [L, K]) of each MoE layer."""
    sd = {k: a.astype(np.float64) for k, a in sd.items()}
    eps, L = cfg["rms_norm_eps"], len(ids)
    x = sd["model.word_embeddings.weight"][ids]
    for j in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{j}."
        x = x + np_attention(np_rms(x, sd[p + "input_layernorm.weight"], eps), sd, p, cfg,
                             np.arange(L, dtype=np.float64), block)
        xn = np_rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        if j < cfg["first_k_dense_replace"]:
            x = x + np_swiglu(xn, *(sd[p + f"mlp.{q}.weight"] for q in PROJ))
            continue
        eids, w = np_route(xn, sd, p, cfg)
        if routes is not None:
            routes.append((j, xn, eids))
        y = np.zeros_like(xn)
        for t in range(L):
            for slot in range(eids.shape[1]):
                e = eids[t, slot]
                y[t] += w[t, slot] * np_swiglu(
                    xn[t], *(sd[p + f"mlp.experts.{e}.{q}.weight"] for q in PROJ))
        x = x + y + np_swiglu(xn, *(sd[p + f"mlp.shared_experts.{q}.weight"] for q in PROJ))
    return np_rms(x, sd["model.norm.weight"], eps) @ sd["lm_head.weight"].T


# ------------------------------------------------------------------ tests

@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    """The tiny Hub-layout replica: (directory, state dict)."""
    path = tmp_path_factory.mktemp("llada2") / "hub"
    sd = hub_state(TINY_JSON)
    write_dir(path, TINY_JSON, sd)
    return path, sd


IDS = np.array([[5, 17, 99, 3, 64, 127, 127, 127, 127, 127, 8, 1]])


def test_logits_match_numpy_port(replica):
    path, sd = replica
    config, params = load_hf_checkpoint(path)
    assert config == preset("llada2-tiny", block_size=32)  # block_size: d1jax's, default 32
    config = dataclasses.replace(config, block_size=4)  # 3 blocks in the 12 tokens
    got = np.asarray(LLaDA2(config).apply({"params": params}, jnp.asarray(IDS)))[0]
    want = np_logits(sd, TINY_JSON, IDS[0], config.block_size)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_routing_bias_and_group_limit_change_the_choice(replica):
    """On the replica's first MoE layer input, the bias and the group limit each change some
    token's experts (so the logits test above exercises both), and d1jax's router picks the
    port's experts and weights."""
    _, sd = replica
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 32))
    p = "model.layers.1."
    ids, w = np_route(x, sd, p, TINY_JSON)
    no_bias = dict(sd, **{p + "mlp.gate.expert_bias": np.zeros(8, np.float32)})
    no_group = dict(TINY_JSON, topk_group=TINY_JSON["n_group"])
    for other in (np_route(x, no_bias, p, TINY_JSON)[0], np_route(x, sd, p, no_group)[0]):
        changed = (np.sort(other, -1) != np.sort(ids, -1)).any(-1)
        assert 0 < changed.sum() < len(x)
    got_ids, got_w, _ = moe.route(jnp.asarray(x, jnp.float32),
                                  jnp.asarray(sd[p + "mlp.gate.weight"].T),
                                  jnp.asarray(sd[p + "mlp.gate.expert_bias"]), top_k=2, n_group=4,
                                  topk_group=2, scaling=2.5)
    np.testing.assert_array_equal(np.asarray(got_ids), ids)
    np.testing.assert_allclose(np.asarray(got_w), w, rtol=1e-5)


def test_grouped_experts_match_a_loop():
    """The ragged_dot path against a per-token loop, experts 0..E-1 and a shard's slice."""
    rng = np.random.default_rng(2)
    t, d, i, e, k = 10, 8, 6, 4, 2
    x = rng.standard_normal((t, d)).astype(np.float32)
    ids = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int32)
    w = rng.random((t, k)).astype(np.float32)
    g, u = rng.standard_normal((2, e, d, i)).astype(np.float32)
    dn = rng.standard_normal((e, i, d)).astype(np.float32)
    silu = lambda a: a / (1 + np.exp(-a))  # noqa: E731
    want = np.zeros((t, d))
    part = np.zeros((t, d))  # experts 2, 3 only
    for r in range(t):
        for s in range(k):
            y = w[r, s] * ((silu(x[r] @ g[ids[r, s]]) * (x[r] @ u[ids[r, s]])) @ dn[ids[r, s]])
            want[r] += y
            part[r] += y if ids[r, s] >= 2 else 0
    got = moe.grouped_experts(*map(jnp.asarray, (x, ids, w, g, u, dn)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    got = moe.grouped_experts(*map(jnp.asarray, (x, ids, w, g[2:], u[2:], dn[2:])), first=2)
    np.testing.assert_allclose(np.asarray(got), part, rtol=1e-4, atol=1e-5)


def test_router_metrics_are_sown(replica):
    path, _ = replica
    config, params = load_hf_checkpoint(path)
    _, state = LLaDA2(config).apply({"params": params}, jnp.asarray(IDS),
                                    mutable=["intermediates"])
    inter = state["intermediates"]["moe_layers"]
    (load,), (entropy,) = inter["router_load"], inter["router_entropy"]
    assert load.shape == (config.n_moe, config.num_experts)
    np.testing.assert_allclose(np.asarray(load).sum(-1), 1.0, rtol=1e-6)
    assert entropy.shape == (config.n_moe,)
    assert np.all((np.asarray(entropy) > 0) & (np.asarray(entropy) <= np.log(8) + 1e-6))


def test_step_metrics_match_numpy(replica):
    """The train step's router summary (``LLaDA2.step_metrics``: max/min load share over MoE
    layers and experts, mean score entropy) against the numpy port's routing of the row."""
    path, sd = replica
    config, params = load_hf_checkpoint(path)
    config = dataclasses.replace(config, block_size=4)
    _, state = LLaDA2(config).apply({"params": params}, jnp.asarray(IDS),
                                    mutable=["intermediates"])
    got = LLaDA2.step_metrics(state["intermediates"])
    routes = []
    np_logits(sd, TINY_JSON, IDS[0], 4, routes)
    e = TINY_JSON["num_experts"]
    loads, entropies = [], []
    for j, xn, eids in routes:
        loads.append(np.bincount(eids.ravel(), minlength=e) / eids.size)
        s = 1 / (1 + np.exp(-(xn @ sd[f"model.layers.{j}.mlp.gate.weight"].astype(np.float64).T)))
        q = s / s.sum(-1, keepdims=True)
        entropies.append(-(q * np.log(q)).sum(-1).mean())
    assert len(routes) == config.n_moe == 2
    assert float(got["router_load_max"]) == pytest.approx(np.max(loads), abs=1e-7)
    assert float(got["router_load_min"]) == pytest.approx(np.min(loads), abs=1e-7)
    assert float(got["router_entropy"]) == pytest.approx(np.mean(entropies), rel=1e-5)
    assert LLaDA2.step_metrics({}) == {}  # a forward that sowed nothing


def test_block_sft_loss_reports_the_router(replica):
    """Block SFT (the family's SFT loss, whose metrics the train step logs) returns the router
    summary of its own forward: the clean row (the plain forward's routes) and its noised copy,
    whose block b sees the clean blocks before it and itself noised (the port run on that
    prefix), 2 x 12 tokens of 2 experts each. The anchor is position 0 (no prompt): a copy
    block before the anchor's attends to nothing, which the port does not model."""
    from d1jax.objectives import blockwise
    path, sd = replica
    config, params = load_hf_checkpoint(path)
    model = LLaDA2(dataclasses.replace(config, block_size=4))
    key, ids, prompt = jax.random.key(0), IDS[0], 0
    loss, metrics = blockwise.sft_stage_loss(
        model, params, jnp.asarray(IDS), jnp.asarray([prompt]), key, lower=0.3, upper=0.8,
        post_num=None, pad_id=config.pad_token_id)
    pmask = np.asarray(blockwise.random_noise(key, IDS.shape, 0.3, 0.8))[0]
    noised = np.where(pmask & (np.arange(12) >= prompt), TINY_JSON["mask_token_id"], ids)
    counts = {}  # MoE layer -> expert counts
    clean = []
    np_logits(sd, TINY_JSON, ids, 4, clean)
    for j, _, eids in clean:
        counts[j] = np.bincount(eids.ravel(), minlength=8)
    for b in range(3):
        routes = []
        np_logits(sd, TINY_JSON, np.concatenate([ids[:4 * b], noised[4 * b:4 * b + 4]]), 4,
                  routes)
        for j, _, eids in routes:
            counts[j] += np.bincount(eids[4 * b:].ravel(), minlength=8)
    shares = np.stack([c / c.sum() for c in counts.values()])
    assert np.isfinite(float(loss)) and shares.sum() == pytest.approx(2.0)
    assert float(metrics["router_load_max"]) == pytest.approx(shares.max(), abs=1e-7)
    assert float(metrics["router_load_min"]) == pytest.approx(shares.min(), abs=1e-7)
    assert 0 < float(metrics["router_entropy"]) <= np.log(8)


def _hub_keys(cfg) -> set[str]:
    return set(hub_state(cfg))


@pytest.mark.parametrize("layout", ["hub", "merged"])
def test_export_and_reload_each_layout(replica, tmp_path, layout):
    """Hub replica -> load -> export in ``layout`` (exactly the published key set, shapes,
    model_type) -> reload: the same params; and a merged replica made as dFactory's
    convertor does loads to the same params as the Hub one."""
    path, sd = replica
    config, params = load_hf_checkpoint(path)
    out = tmp_path / layout
    save_hf_checkpoint(out, config, params, layout=layout)
    want_sd = sd if layout == "hub" else merge_experts(sd, TINY_JSON)
    where = hf.open_checkpoint(out)
    assert set(where) == set(want_sd)
    for key, a in want_sd.items():
        assert where[key].shape(key) == a.shape, key
        np.testing.assert_array_equal(where[key].array(key), a, err_msg=key)
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == {"hub": "llada2_moe", "merged": "llada2_moe_veomni"}[layout]
    for field in ("num_experts", "n_group", "topk_group", "routed_scaling_factor",
                  "first_k_dense_replace", "partial_rotary_factor", "rotary_dim", "head_dim"):
        assert written[field] == TINY_JSON[field], field
    config2, params2 = load_hf_checkpoint(out)
    assert config2 == config
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    if layout == "merged":
        made = tmp_path / "dfactory"
        write_dir(made, dict(TINY_JSON, model_type="llada2_moe_veomni"), want_sd)
        jax.tree.map(np.testing.assert_array_equal, load_hf_checkpoint(made)[1], params)


def test_key_set_and_shapes_are_checked(replica, tmp_path):
    _, sd = replica
    missing = dict(sd)
    del missing["model.layers.2.mlp.experts.7.down_proj.weight"]
    write_dir(tmp_path / "a", TINY_JSON, missing)
    with pytest.raises(hf.CheckpointError, match="experts.7.down_proj"):
        load_hf_checkpoint(tmp_path / "a")
    bad = dict(sd, **{"model.layers.1.mlp.gate.weight": np.zeros((8, 31), np.float32)})
    write_dir(tmp_path / "b", TINY_JSON, bad)
    with pytest.raises(hf.CheckpointError, match=r"gate.weight: shape \(8, 31\)"):
        load_hf_checkpoint(tmp_path / "b")


@pytest.mark.parametrize("field,value", [("score_function", "softmax"), ("norm_head", True),
                                         ("rotary_dim", 16), ("n_group", 3),
                                         ("model_type", "llada")])
def test_config_refuses_what_is_not_implemented(field, value):
    from d1jax.model.hf_checkpoint import UnsupportedConfigError
    with pytest.raises(UnsupportedConfigError, match=field if field != "n_group" else "n_group"):
        LLaDA2Config.from_hf_dict(dict(TINY_JSON, **{field: value}))


def test_published_configs_read():
    """The mini and flash presets are their config.json's shapes (sizes as published)."""
    mini, flash = preset("llada2-mini"), preset("llada2-flash")
    assert (mini.num_experts, mini.num_experts_per_tok, mini.rotary_dim, mini.n_moe) == \
        (256, 8, 64, 19)
    assert 15e9 < mini.num_params() < 17.5e9  # "16B total"
    assert 95e9 < flash.num_params() < 105e9  # "100B"


def test_cache_entry_points_equal_the_block_causal_forward(replica):
    """prefill's logits are the full forward's; decode_hidden of one block against a cache
    whose later blocks are unset gives the full forward's rows there; decode_at over that
    block's window writes the keys/values prefill computed (the dense and the MoE stack
    both: the cache is their layers' keys/values in checkpoint order)."""
    bs = 4
    config, params = load_hf_checkpoint(replica[0])
    config = dataclasses.replace(config, block_size=bs)
    model = LLaDA2(config)
    ids = jnp.asarray(np.stack([IDS[0], IDS[0][::-1]]))
    # A row left-padded by one block: positions count real tokens, so the grid stays aligned.
    mask = jnp.asarray([[1] * 12, [0] * bs + [1] * (12 - bs)])
    apply = lambda *a, **k: model.apply({"params": params}, *a, **k)  # noqa: E731
    full = np.asarray(apply(ids, mask))
    logits, cache = apply(ids, mask, method=model.prefill)
    assert cache.k.shape == (3, 2, 12, 2, 16)
    np.testing.assert_allclose(logits, full, atol=1e-5)
    at = 4  # the second block (blocks from position 0)
    stale = jax.tree.map(lambda c: c.at[:, :, at:].set(0.0), cache)
    h = apply(ids, stale, at, mask, slice_len=bs, method=model.decode_hidden)
    np.testing.assert_allclose(apply(h, method=model.logits), full[:, at:at + bs], atol=1e-5)
    window = jax.tree.map(lambda c: c[:, :, at:at + bs], stale)
    idx = jnp.broadcast_to(jnp.arange(bs)[None], (2, bs))
    h, window = apply(ids, idx, stale, window, at, mask, method=model.decode_at)
    np.testing.assert_allclose(apply(h, method=model.logits), full[:, at:at + bs], atol=1e-5)
    for w, c in zip(window, cache):
        np.testing.assert_allclose(w, c[:, :, at:at + bs], atol=1e-5)


def test_the_expert_bias_is_neither_decayed_nor_updated():
    """d1jax.run.optim: AdamW with weight decay leaves the router's expert_bias exactly as it
    was (its gradient is zero, selection only: tests/test_llada2_ep.py), while the router
    kernel beside it, with the same zero gradient, decays."""
    from d1jax.run import optim
    params = {"moe_layers": {"gate": {"kernel": jnp.ones((2, 4, 8)),
                                      "expert_bias": jnp.full((2, 8), 0.3)}}}
    grads = jax.tree.map(jnp.zeros_like, params)
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2, weight_decay=0.1))
    state = opt.init(params)
    step = jax.jit(lambda p, s: optim.apply_gradients(opt, p, s, grads)[:2])
    new = params
    for _ in range(3):
        new, state = step(new, state)
    np.testing.assert_array_equal(new["moe_layers"]["gate"]["expert_bias"],
                                  params["moe_layers"]["gate"]["expert_bias"])
    assert np.all(new["moe_layers"]["gate"]["kernel"] < 1)
