"""LLaDA forward against an independent numpy implementation of the Hugging Face equations.

The reference (``np_llada_logits``) is written from ``modeling_llada.py`` (LLaDALlamaBlock,
RMSLayerNorm, RotaryEmbedding, the attention-mask handling of LLaDAModel.forward). It reads
the weights by their Hugging Face names, in torch layout ([out, in]), from the safetensors
file that ``save_hf_checkpoint`` writes, and the architecture from the config.json written
beside it, so the key map, the transposes and ``to_hf_dict`` are checked along the way.
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import d1jax
from d1jax import sharding
from d1jax.model.llada import weights

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

HF = "model.transformer."


# --------------------------------------------------------------------------- numpy reference

def np_rms_norm(x, weight, eps):
    """RMSLayerNorm: x * rsqrt(mean(x^2) + eps), then times the weight."""
    return weight * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def np_rope(x_bnlh, theta):
    """RotaryEmbedding: positions 0..L-1, cat(freqs, freqs), rotate_half."""
    hd, seq_len = x_bnlh.shape[-1], x_bnlh.shape[-2]
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    freqs = np.arange(seq_len)[:, None] * inv_freq[None]
    pos = np.concatenate([freqs, freqs], -1)
    x1, x2 = x_bnlh[..., :hd // 2], x_bnlh[..., hd // 2:]
    return x_bnlh * np.cos(pos) + np.concatenate([-x2, x1], -1) * np.sin(pos)


def np_llada_logits(sd, cfg, ids, attention_mask=None):
    """LLaDAModel.forward (block_type llama) in float64; sd holds torch-layout weights."""
    b, seq_len = ids.shape
    nh, d = cfg["n_heads"], cfg["d_model"]
    nkv, hd, eps = cfg["n_kv_heads"], d // nh, cfg["rms_norm_eps"]
    bias = 0.0
    if attention_mask is not None and (attention_mask == 0).any():
        # (1 - mask) * finfo(float32).min added to the scores of padding keys.
        bias = (1.0 - attention_mask[:, None, None, :]) * np.finfo(np.float32).min
    x = sd[HF + "wte.weight"][ids]
    for i in range(cfg["n_layers"]):
        w = lambda name: sd[f"{HF}blocks.{i}.{name}.weight"]  # noqa: E731
        h = np_rms_norm(x, w("attn_norm"), eps)
        q = (h @ w("q_proj").T).reshape(b, seq_len, nh, hd).transpose(0, 2, 1, 3)
        k = (h @ w("k_proj").T).reshape(b, seq_len, nkv, hd).transpose(0, 2, 1, 3)
        v = (h @ w("v_proj").T).reshape(b, seq_len, nkv, hd).transpose(0, 2, 1, 3)
        q, k = np_rope(q, cfg["rope_theta"]), np_rope(k, cfg["rope_theta"])
        # torch repeat_interleave over heads: query head n reads kv head n // (nh // nkv).
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        p = np.exp(scores - scores.max(-1, keepdims=True))
        att = (p / p.sum(-1, keepdims=True)) @ v
        x = x + att.transpose(0, 2, 1, 3).reshape(b, seq_len, d) @ w("attn_out").T
        h = np_rms_norm(x, w("ff_norm"), eps)
        gate, up = h @ w("ff_proj").T, h @ w("up_proj").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w("ff_out").T
    x = np_rms_norm(x, sd[HF + "ln_f.weight"], eps)
    head = sd[HF + "wte.weight"] if cfg["weight_tying"] else sd[HF + "ff_out.weight"]
    logits = x @ head.T
    return logits / np.sqrt(d) if cfg["scale_logits"] else logits


# --------------------------------------------------------------------------- helpers

def random_params(config, seed):
    """Random params of the config's shapes: norm weights ~1 +- 0.3, the rest ~N(0, 0.15^2).

    The init has all-ones norms and tiny kernels, which would hide a missing norm weight
    and give near-uniform attention. Built in numpy from the abstract shapes (no compile).
    """
    leaves, treedef = jax.tree.flatten_with_path(sharding.abstract_params(d1jax.LLaDA(config)))
    rs = np.random.RandomState(seed)
    out = []
    for path, x in leaves:
        noise = rs.randn(*x.shape).astype(np.float32)
        out.append(jnp.asarray(1.0 + 0.3 * noise if path[-1].key == "weight" else 0.15 * noise))
    return jax.tree.unflatten(treedef, out)


def left_padded(rs, lengths, total, vocab):
    """Random ids [B, total] whose row i has lengths[i] real tokens after random padding."""
    ids = rs.randint(0, vocab, (len(lengths), total))
    mask = np.zeros((len(lengths), total), np.int32)
    for i, n in enumerate(lengths):
        mask[i, total - n:] = 1
    return ids, mask


def forward(model, params, ids, mask=None):
    fn = jax.jit(lambda p, x, m: model.apply({"params": p}, x, m))
    return np.asarray(fn(params, ids, mask))


# Architectures for the parity test: GQA with an RMSNorm eps large enough to matter, and
# multi-query attention with the tied, scaled output head.
PARITY_CONFIGS = {
    "gqa": dict(n_kv_heads=2, rms_norm_eps=1e-2),
    "mqa_tied_scaled_head": dict(n_kv_heads=1, weight_tying=True, scale_logits=True),
}


@pytest.fixture(scope="module", params=list(PARITY_CONFIGS))
def parity_case(request, tmp_path_factory):
    """(model, params, HF state dict in float64, HF config dict) of one architecture."""
    c = d1jax.preset("test-tiny", **PARITY_CONFIGS[request.param])
    assert c.n_kv_heads < c.n_heads
    model = d1jax.LLaDA(c)
    params = random_params(c, seed=1)
    path = tmp_path_factory.mktemp(request.param)
    weights.save_hf_checkpoint(path, c, params)
    sd = {k: v.astype(np.float64) for k, v in load_file(str(path / "model.safetensors")).items()}
    return model, params, sd, json.loads((path / "config.json").read_text())


# --------------------------------------------------------------------------- tests

def test_forward_matches_numpy_reference(parity_case):
    model, params, sd, cfg = parity_case
    ids = np.random.RandomState(0).randint(0, cfg["vocab_size"], (3, 16))
    want = np_llada_logits(sd, cfg, ids)
    got = forward(model, params, ids)
    assert want.std() > 0.05  # logits spread well beyond float32 noise
    assert np.abs(got - want).max() <= 1e-4


def test_forward_with_left_padding_matches_numpy_reference(parity_case):
    model, params, sd, cfg = parity_case
    ids, mask = left_padded(np.random.RandomState(1), [16, 12, 5], 16, cfg["vocab_size"])
    want = np_llada_logits(sd, cfg, ids, mask)
    got = forward(model, params, ids, mask)
    assert np.abs(got - want).max() <= 1e-4
    # The mask matters: attending to the padding would change the logits.
    assert np.abs(np_llada_logits(sd, cfg, ids) - want)[1:].max() > 1e-2


def test_left_padding_does_not_change_a_sequences_logits(tiny_config, tiny_model):
    params = random_params(tiny_config, seed=2)
    ids, mask = left_padded(np.random.RandomState(2), [9, 4], 14, tiny_config.vocab_size)
    padded = forward(tiny_model, params, ids, mask)
    for row, n in enumerate([9, 4]):
        alone = forward(tiny_model, params, ids[row:row + 1, -n:])
        np.testing.assert_allclose(padded[row, -n:], alone[0], atol=1e-5)


def test_sliced_logits_equal_the_full_logits(tiny_model, tiny_params):
    ids = np.random.RandomState(3).randint(0, 128, (2, 12))
    full = forward(tiny_model, tiny_params, ids)
    sliced = jax.jit(lambda p, x, s: tiny_model.apply({"params": p}, x, slice_start=s, slice_len=5))
    np.testing.assert_allclose(np.asarray(sliced(tiny_params, ids, jnp.int32(4))), full[:, 4:9],
                               atol=1e-6)


def test_remat_gives_the_same_gradients(tiny_config, tiny_params):
    ids, targets = np.random.RandomState(4).randint(0, 128, (2, 2, 8))

    def grads(model):
        def cross_entropy(p):
            logp = jax.nn.log_softmax(model.apply({"params": p}, ids))
            return -jnp.take_along_axis(logp, targets[..., None], -1).mean()
        return jax.jit(jax.grad(cross_entropy))(tiny_params)
    plain, remat = grads(d1jax.LLaDA(tiny_config)), grads(d1jax.LLaDA(tiny_config, remat=True))
    for path, a in jax.tree.flatten_with_path(plain)[0]:
        assert np.abs(np.asarray(a)).max() > 0, f"no gradient reaches {jax.tree_util.keystr(path)}"
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), plain, remat)


def test_attention_matches_a_float64_softmax_and_its_gradient():
    """Grouped-query attention with padding keys against numpy in float64, and its gradient
    against ``jax.nn.dot_product_attention``'s."""
    from d1jax.model.attention import attention
    rs = np.random.RandomState(7)
    b, q, n, k, h = 2, 5, 4, 2, 8
    qx, kx, vx = (rs.normal(size=s).astype(np.float32)
                  for s in [(b, q, n, h), (b, q, k, h), (b, q, k, h)])
    mask = np.ones((b, q), np.int32)
    mask[1, :2] = 0  # left padding in row 1
    got = np.asarray(attention(qx, kx, vx, mask, h ** -0.5))
    kr, vr = np.repeat(kx, n // k, axis=2), np.repeat(vx, n // k, axis=2)  # head i uses kv i // 2
    s = np.einsum("bqnh,blnh->bnql", qx.astype(np.float64), kr) * h ** -0.5
    s = np.where(mask[:, None, None, :] > 0, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bnql,blnh->bqnh", p / p.sum(-1, keepdims=True), vr)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    w = rs.normal(size=(b, q, n, h)).astype(np.float32)
    mine = jax.grad(lambda *a: (attention(*a, mask, h ** -0.5) * w).sum(), (0, 1, 2))
    theirs = jax.grad(lambda *a: (jax.nn.dot_product_attention(
        *a, mask=mask[:, None, None, :] > 0, scale=h ** -0.5) * w).sum(), (0, 1, 2))
    for a, c in zip(mine(qx, kx, vx), theirs(qx, kx, vx)):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layers", [1, 3, 5])
def test_unrolled_layers_equal_the_scanned_ones(tiny_config, layers):
    """unroll_layers changes how the layers are compiled, not what they compute: the
    full forward (first and last layer as own code, the middle ones unrolled or one
    lax.scan) equals, in values and gradients, the nn.scan that prefill runs."""
    cfg = dataclasses.replace(tiny_config, n_layers=layers)
    params = jax.tree.map(lambda a: a + 0.01, d1jax.init_params(d1jax.LLaDA(cfg),
                                                                 jax.random.key(5)))
    ids = np.random.RandomState(8).randint(0, 128, (2, 10))

    def loss_and_grads(model, method):
        def f(p):
            out = model.apply({"params": p}, ids, method=method)
            return (out[0] if isinstance(out, tuple) else out).astype(jnp.float32).std()
        return jax.jit(jax.value_and_grad(f))(params)
    runs = [loss_and_grads(d1jax.LLaDA(cfg, unroll_layers=u, layers_per_loop=k),
                           d1jax.LLaDA.__call__)
            for u, k in ((False, 1), (True, 1), (False, 2))]  # 2: 3 middle layers, 2 a turn
    runs.append(loss_and_grads(d1jax.LLaDA(cfg), d1jax.LLaDA.prefill))  # nn.scan's path
    (l1, g1) = runs[0]
    for l2, g2 in runs[1:]:
        np.testing.assert_allclose(l1, l2, rtol=1e-6)
        jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-7),
                     g1, g2)


def test_layer_loop_keeps_no_copy_of_the_weights_for_the_backward(tiny_config):
    """Without remat the loop keeps every layer's activations for the backward, but not the
    slices of the stacked weights it reads (``loop_residuals``): a stacked residual of a
    weight's shape would be a second copy of the middle layers (13 GB at 8B). The LoRA
    adapters' residuals stay (rank-sized)."""
    import contextlib
    import io

    import jax.ad_checkpoint
    cfg = dataclasses.replace(tiny_config, n_layers=5)  # first, 3 middle, last
    lora = d1jax.LoraConfig(rank=4, alpha=8.0, dropout=0.0)
    model = d1jax.LLaDA(cfg, lora=lora, unroll_layers=False, remat=False)
    params = d1jax.init_params(model, jax.random.key(0))
    ids = np.random.RandomState(1).randint(0, cfg.vocab_size, (2, 10))
    is_lora = ["lora" in jax.tree_util.keystr(k)
               for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    leaves, tree = jax.tree.flatten(params)

    def loss(adapters):  # gradients of the adapters only, as under LoRA
        it = iter(adapters)
        p = jax.tree.unflatten(tree, [next(it) if a else w for a, w in zip(is_lora, leaves)])
        return model.apply({"params": p}, ids).astype(jnp.float32).sum()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(
            loss, [w for a, w in zip(is_lora, leaves) if a])
    saved = out.getvalue()
    middle = [f"[3,{','.join(map(str, w.shape[1:]))}]"
              for a, w in zip(is_lora, leaves) if not a and w.ndim == 3]
    assert middle and "output of scan" in saved  # the loop ran and kept activations
    assert not [m for m in middle if m in saved], saved


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("unroll", [False, True])
def test_rows_of_the_last_layer_equal_the_full_forward(tiny_config, unroll, remat):
    """``hidden(keep_last=C)`` and sliced logits run the last layer on C rows only
    (middle layers unrolled or looped): the same values and gradients as slicing the full forward, with LoRA and
    padding."""
    lora = d1jax.LoraConfig(rank=4, alpha=8.0, dropout=0.0)
    tiny_config = dataclasses.replace(tiny_config, n_layers=4)  # first, 2 middle, last
    model = d1jax.LLaDA(tiny_config, lora=lora, unroll_layers=unroll, remat=remat)
    full_model = d1jax.LLaDA(tiny_config, lora=lora, unroll_layers=True)
    params = jax.tree.map(lambda a: a + 0.01, d1jax.init_params(model, jax.random.key(3)))
    rs = np.random.RandomState(9)
    ids = rs.randint(0, tiny_config.vocab_size, (3, 12))
    mask = np.ones((3, 12), np.int32)
    mask[0, :3] = 0

    def hidden(p, m, keep):
        h = m.apply({"params": p}, ids, mask, method=d1jax.LLaDA.hidden, keep_last=keep)
        return h[:, -5:]
    np.testing.assert_allclose(jax.jit(hidden, static_argnums=(1, 2))(params, model, 5),
                               jax.jit(hidden, static_argnums=(1, 2))(params, full_model, None),
                               rtol=1e-5, atol=1e-6)
    sliced = jax.jit(lambda p, s: model.apply({"params": p}, ids, mask, slice_start=s,
                                              slice_len=3))(params, jnp.int32(4))
    full = jax.jit(lambda p: full_model.apply({"params": p}, ids, mask))(params)
    np.testing.assert_allclose(sliced, full[:, 4:7], rtol=1e-5, atol=1e-5)
    w = rs.normal(size=(3, 5, tiny_config.d_model)).astype(np.float32)
    grads = [jax.jit(jax.grad(lambda p, m=m, k=k: (hidden(p, m, k) * w).sum()))(params)
             for m, k in ((model, 5), (full_model, None))]
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5), *grads)


def test_lora_dropout_draws_per_layer_masks_from_the_dropout_rng(tiny_config):
    """Training-mode LoRA dropout: a fixed rng gives a fixed output, another rng another
    one, rate 0 is the deterministic forward, and layer i's masks come from
    fold_in(rng, i) whether the middle layers are unrolled or looped (equal outputs)."""
    ids = np.random.RandomState(10).randint(0, tiny_config.vocab_size, (2, 9))
    lora = d1jax.LoraConfig(rank=4, alpha=8.0, dropout=0.5)
    cfg = dataclasses.replace(tiny_config, n_layers=4)
    params = jax.tree.map(lambda a: a + 0.05,
                          d1jax.init_params(d1jax.LLaDA(cfg, lora=lora), jax.random.key(4)))

    @functools.partial(jax.jit, static_argnums=(0, 1))
    def run(rate, unroll, rng):
        m = d1jax.LLaDA(cfg, lora=dataclasses.replace(lora, dropout=rate),
                        unroll_layers=unroll)
        kw = {} if rng is None else {"deterministic": False, "rngs": {"dropout": rng}}
        return m.apply({"params": params}, ids, method=d1jax.LLaDA.hidden, keep_last=4, **kw)
    a, b = run(0.5, False, jax.random.key(1)), run(0.5, False, jax.random.key(2))
    np.testing.assert_array_equal(a, run(0.5, False, jax.random.key(1)))
    assert np.abs(a - b).max() > 1e-3
    np.testing.assert_allclose(a, run(0.5, True, jax.random.key(1)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run(0.0, False, jax.random.key(1)), run(0.0, False, None),
                               rtol=1e-6, atol=1e-6)


def test_remat_model_decodes_like_the_plain_one(tiny_config, tiny_model, tiny_params):
    """The cached modes run through the same scanned (here rematerialised) blocks."""
    ids = np.random.RandomState(6).randint(0, 128, (2, 12))
    full = forward(tiny_model, tiny_params, ids)
    model = d1jax.LLaDA(tiny_config, remat=True)
    apply = lambda *a, **kw: model.apply({"params": tiny_params}, *a, **kw)  # noqa: E731
    logits, cache = jax.jit(lambda x: apply(x, method=model.prefill))(ids)
    np.testing.assert_allclose(logits, full, atol=2e-5)
    sliced = jax.jit(lambda x, c: apply(x, c, 4, method=model.decode_slice))(ids[:, 4:8], cache)
    np.testing.assert_allclose(sliced, full[:, 4:8], atol=2e-5)


def test_bfloat16_compute_is_close_to_float32(tiny_config):
    params = random_params(tiny_config, seed=5)
    ids = np.random.RandomState(5).randint(0, 128, (2, 10))
    f32 = forward(d1jax.LLaDA(tiny_config), params, ids)
    bf16 = jax.jit(lambda p: d1jax.LLaDA(tiny_config, dtype=jnp.bfloat16).apply({"params": p}, ids))(params)
    assert bf16.dtype == jnp.bfloat16
    err = np.abs(np.asarray(bf16, np.float32) - f32)
    # bfloat16 keeps 8 mantissa bits; errors stay a small fraction of the logits' spread.
    assert err.mean() <= 0.02 * f32.std() and err.max() <= 0.15 * f32.std()


def test_config_round_trips_through_the_hf_dict():
    for name in ("test-tiny", "bench-tiny", "llada-8b"):
        c = d1jax.preset(name)
        assert d1jax.LLaDAConfig.from_hf_dict(c.to_hf_dict()) == c


def test_hf_dict_defaults_follow_the_hf_code():
    d = d1jax.preset("test-tiny").to_hf_dict()
    d.update(n_kv_heads=None, multi_query_attention=True, mlp_hidden_size=None, mlp_ratio=3,
             embedding_size=None)
    c = d1jax.LLaDAConfig.from_hf_dict(d)
    assert c.n_kv_heads == 1  # effective_n_kv_heads with multi_query_attention
    assert c.mlp_hidden_size == 3 * c.d_model  # mlp_ratio * d_model
    assert c.embedding_size == c.vocab_size  # embedding_size or vocab_size


def test_num_params_counts_the_initialised_params():
    for overrides in ({}, dict(weight_tying=True)):
        c = d1jax.preset("test-tiny", **overrides)
        shapes = sharding.abstract_params(d1jax.LLaDA(c))
        assert c.num_params() == sum(x.size for x in jax.tree.leaves(shapes))


def test_inconsistent_head_counts_are_refused():
    refused = d1jax.model.UnsupportedConfigError
    with pytest.raises(refused, match="n_heads=4 is not a multiple of n_kv_heads=3"):
        d1jax.preset("test-tiny", n_kv_heads=3)
    with pytest.raises(refused, match="d_model=32 is not divisible by n_heads=5"):
        d1jax.preset("test-tiny", n_heads=5, n_kv_heads=5)
