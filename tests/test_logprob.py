"""The one-step estimator against brute force (full logits, float64 numpy)."""

import functools
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.objectives import logprob

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def _inputs(c, b=3, lp=6, lc=5, seed=0):
    rs = np.random.RandomState(seed)
    return (rs.randint(0, c.vocab_size - 4, (b, lp)).astype(np.int32),
            rs.randint(0, c.vocab_size - 4, (b, lc)).astype(np.int32))


def log_softmax64(logits):
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@functools.lru_cache(maxsize=None)
def forward(model):
    """The full [B, L, V] logits, jitted once per model."""
    return jax.jit(lambda params, ids, attn: model.apply({"params": params}, ids, attn))


def brute_force(model, params, prompt, comp, attn=None):
    """log p(comp) from the full [B, L, V] logits of one forward with the completion masked."""
    ids = np.concatenate([prompt, np.full_like(comp, model.config.mask_token_id)], 1)
    lsm = log_softmax64(forward(model)(params, ids, attn))[:, prompt.shape[1]:]
    return np.take_along_axis(lsm, comp[..., None], -1)[..., 0]


def test_p0_equals_brute_force(tiny_model, tiny_params, tiny_config):
    prompt, comp = _inputs(tiny_config)
    attn = np.ones((3, 11), np.int32)
    attn[0, :2] = 0  # left padding of row 0 is not attended
    for mask in (None, attn):
        got = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([3, 9]),
                                      p_mask_prompt=0.0, attention_mask_bl=mask)
        want = brute_force(tiny_model, tiny_params, prompt, comp, mask)
        assert got.shape == (2, 3, 5) and got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), np.stack([want, want]), atol=1e-5)


def test_completion_only_head_equals_full_logits(tiny_model, tiny_params, tiny_config):
    """With p > 0: the prompt the estimator masked (mask_prompt of the seed's key), through a
    full forward and a full log-softmax, gives the same numbers as the sliced, chunked head
    (automatic chunk, no chunking, chunks of 2)."""
    c = tiny_config
    prompt, comp = _inputs(c, lc=8)
    seeds = np.array([1, 5])
    want = []
    for s in seeds:
        noisy = np.asarray(logprob.mask_prompt(logprob.mask_key(s), prompt, 0.3, c.mask_token_id))
        assert (noisy != prompt).any()
        want.append(brute_force(tiny_model, tiny_params, noisy, comp))
    for seq_chunk in (None, 0, 2):
        got = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, seeds,
                                      p_mask_prompt=0.3, seq_chunk=seq_chunk)
        np.testing.assert_allclose(np.asarray(got), np.stack(want), atol=1e-5)


def test_chunked_head_gradient_equals_unchunked():
    """Chunks are rematerialised for the backward pass; the gradient must not change."""
    rs = np.random.RandomState(0)
    h, w = jnp.array(rs.normal(size=(2, 8, 16)), jnp.float32), jnp.array(rs.normal(size=(16, 50)))
    t = jnp.array(rs.randint(0, 50, (2, 8)))

    def f(h, w, chunk):
        return (logprob.head_logps(h, w, t, scale=0.5, seq_chunk=chunk) ** 2).sum()
    g0 = jax.grad(f, argnums=(0, 1))(h, w, 0)
    g2 = jax.grad(f, argnums=(0, 1))(h, w, 2)
    for a, b in zip(g0, g2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [0, 5, 2])  # one block; 4 and 10 rematerialised chunks
def test_chunked_head_gradient_matches_float64_closed_form(chunk):
    """d log p(t) / d logits = onehot(t) - softmax: the head's gradient, whole and chunked,
    against numpy in float64, for the hidden states and the head weight."""
    rs = np.random.RandomState(1)
    h, w = rs.normal(size=(2, 20, 6)), rs.normal(size=(6, 11))
    t, cot, scale = rs.randint(0, 11, (2, 20)), rs.normal(size=(2, 20)), 0.7

    logits = h @ w * scale
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    want_logp = np.take_along_axis(logits, t[..., None], -1)[..., 0] - lse
    dlogits = cot[..., None] * (np.eye(11)[t] - np.exp(logits - lse[..., None])) * scale
    want_dh, want_dw = dlogits @ w.T, np.einsum("bcd,bcv->dv", h, dlogits)

    def f(h, w):
        return logprob.head_logps(h, w, jnp.asarray(t), scale=scale, seq_chunk=chunk)
    logp, vjp = jax.vjp(f, jnp.asarray(h, jnp.float32), jnp.asarray(w, jnp.float32))
    dh, dw = vjp(jnp.asarray(cot, jnp.float32))
    np.testing.assert_allclose(np.asarray(logp), want_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dh), want_dh, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), want_dw, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("upto", [0, 7, 8, 13, 20])
def test_head_skips_chunks_past_what_is_read(upto):
    """``upto``: chunks starting at or past it give 0 and no gradient; every position a
    chunk computes, and the gradient of a loss that reads only positions < upto, are the
    float64 closed form's (chunks of 4: upto 7 computes 8 positions, 8 computes 8)."""
    rs = np.random.RandomState(2)
    h, w = rs.normal(size=(2, 20, 6)), rs.normal(size=(6, 11))
    t, cot = rs.randint(0, 11, (2, 20)), rs.normal(size=(2, 20))
    read = np.arange(20) < upto
    cot = cot * read  # a loss that reads positions < upto only
    logits = h @ w
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    full = np.take_along_axis(logits, t[..., None], -1)[..., 0] - lse
    computed = np.arange(20) < -(-upto // 4) * 4
    dlogits = cot[..., None] * (np.eye(11)[t] - np.exp(logits - lse[..., None]))

    def f(h, w):
        return logprob.head_logps(h, w, jnp.asarray(t), seq_chunk=4, upto=jnp.int32(upto))
    logp, vjp = jax.jit(lambda h, w: jax.vjp(f, h, w))(jnp.asarray(h, jnp.float32),
                                                        jnp.asarray(w, jnp.float32))
    dh, dw = vjp(jnp.asarray(cot, jnp.float32))
    np.testing.assert_allclose(np.asarray(logp), np.where(computed, full, 0.0), atol=1e-5)
    np.testing.assert_allclose(np.asarray(dh), dlogits @ w.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), np.einsum("bcd,bcv->dv", h, dlogits),
                               rtol=1e-4, atol=1e-5)


def test_read_mask_keeps_every_read_log_prob(tiny_model, tiny_params, tiny_config):
    """``read_mask_bc`` (d1's completion mask, ragged over rows): the read positions equal
    the estimator without it, bitwise; chunks wholly past the last read one are 0."""
    prompt, comp = _inputs(tiny_config, lc=8)
    read = np.zeros((3, 8), np.int32)
    read[0, :3], read[1, :1], read[2, :2] = 1, 1, 1  # last read position 2: chunks of 2
    assert int(logprob.read_upto(jnp.asarray(read))) == 3
    args = (tiny_model, tiny_params, prompt, comp, np.array([1, 5]))
    want = logprob.per_token_logps(*args, p_mask_prompt=0.3, seq_chunk=2)
    got = logprob.per_token_logps(*args, p_mask_prompt=0.3, seq_chunk=2, read_mask_bc=read)
    np.testing.assert_array_equal(np.asarray(got)[..., :4], np.asarray(want)[..., :4])
    assert not np.asarray(got)[..., 4:].any() and np.asarray(want)[..., 4:].all()
    assert int(logprob.read_upto(jnp.zeros((3, 8)))) == 0


@functools.lru_cache(maxsize=None)
def narrowed(model):
    """(hidden(keep_last=8, read_upto=u), the estimator's gradient on a read mask with or
    without the narrowed last layer), jitted once per model: u and the mask are traced."""
    hid = jax.jit(lambda p, ids, u: model.apply({"params": p}, ids, method=type(model).hidden,
                                                keep_last=8, read_upto=u))

    def loss(p, prompt, comp, read, narrow):
        lp = logprob.per_token_logps(model, p, prompt, comp, np.array([3]), p_mask_prompt=0.3,
                                     seq_chunk=2, read_mask_bc=read, narrow_last_layer=narrow)
        return jnp.sum(lp * read)
    return hid, jax.jit(jax.grad(loss), static_argnums=4)


@pytest.mark.parametrize("upto,width", [(0, 2), (2, 2), (3, 4), (5, 8)])
def test_narrow_last_layer_runs_the_covering_width(tiny_model, tiny_params, tiny_config, upto,
                                                   width):
    """``hidden(keep_last=8, read_upto=u)`` under jit (u traced): the last layer runs the
    narrowest of widths 2, 4, 8 covering u; those rows equal the full forward's, the rest
    are 0. The estimator's gradient with it equals the one without."""
    assert tiny_model.config.n_layers > 1
    prompt, comp = _inputs(tiny_config, lc=8)
    ids = np.concatenate([prompt, np.full_like(comp, tiny_config.mask_token_id)], 1)
    hid, grad = narrowed(tiny_model)
    full = np.asarray(tiny_model.apply({"params": tiny_params}, ids,
                                       method=type(tiny_model).hidden, keep_last=8))
    got = np.asarray(hid(tiny_params, ids, jnp.int32(upto)))
    np.testing.assert_allclose(got[:, :width], full[:, :width], rtol=1e-6, atol=1e-6)
    assert not got[:, width:].any() and (width == 8 or np.abs(full[:, width:]).min() > 0)

    read = (np.arange(8)[None] < np.array([[upto], [max(upto - 1, 0)], [0]])).astype(np.int32)
    want = grad(tiny_params, prompt, comp, read, False)
    for a, b in zip(jax.tree.leaves(grad(tiny_params, prompt, comp, read, True)),
                    jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_prompt_mask_rate_is_p_and_fixed_by_the_seed():
    prompt = jnp.zeros((64, 200), jnp.int32)
    rates = [float((logprob.mask_prompt(logprob.mask_key(s), prompt, 0.15, 7) == 7).mean())
             for s in range(20)]
    # 20 x 12,800 Bernoulli(0.15) draws: std of the mean ~ 0.0007; 5 sigma.
    assert abs(np.mean(rates) - 0.15) < 0.0035
    # each seed alone: 12,800 draws, std ~ 0.0032.
    assert max(abs(r - 0.15) for r in rates) < 0.016
    a = logprob.mask_prompt(logprob.mask_key(5), prompt, 0.15, 7)
    b = logprob.mask_prompt(logprob.mask_key(5), prompt, 0.15, 7)
    d = logprob.mask_prompt(logprob.mask_key(6), prompt, 0.15, 7)
    assert (a == b).all() and (a != d).any()


def test_seeds_fix_the_estimate(tiny_model, tiny_params, tiny_config):
    prompt, comp = _inputs(tiny_config, lp=12)
    out = np.asarray(logprob.per_token_logps(tiny_model, tiny_params, prompt, comp,
                                             jnp.array([1, 1, 2]), p_mask_prompt=0.5))
    np.testing.assert_array_equal(out[0], out[1])
    assert np.abs(out[0] - out[2]).max() > 0
    one = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([2]),
                                  p_mask_prompt=0.5)
    np.testing.assert_allclose(np.asarray(one[0]), out[2], atol=1e-6)  # batching seeds is exact


def test_cfg_matches_brute_force(tiny_model, tiny_params, tiny_config):
    """d1's get_logits: un + (s + 1) (cond - un), uncond = prompt fully masked."""
    c = tiny_config
    prompt, comp = _inputs(c)
    s = 0.7
    got = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([0]),
                                  p_mask_prompt=0.0, cfg_scale=s)[0]
    m = c.mask_token_id
    ids = np.concatenate([prompt, np.full_like(comp, m)], 1)
    un = np.full_like(ids, m)
    lc, lu = (np.asarray(forward(tiny_model)(tiny_params, x, None), np.float64)[:, 6:]
              for x in (ids, un))
    lsm = log_softmax64(lu + (s + 1) * (lc - lu))
    want = np.take_along_axis(lsm, comp[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)


def _shapes(jaxpr):
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            yield tuple(getattr(v.aval, "shape", ()))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _shapes(sub)


def test_no_full_sequence_logits_and_memory_flat_in_mu(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    prompt, comp = jnp.zeros((4, 24), jnp.int32), jnp.zeros((4, 8), jnp.int32)

    def f(p, seeds):
        return logprob.per_token_logps(tiny_model, p, prompt, comp, seeds, p_mask_prompt=0.15)
    jaxpr = jax.make_jaxpr(f)(tiny_params, jnp.arange(4)).jaxpr
    vocab_arrays = [s for s in _shapes(jaxpr) if len(s) >= 3 and s[-1] == c.embedding_size]
    assert vocab_arrays and all(s[-2] <= 8 for s in vocab_arrays), vocab_arrays
    temp = [jax.jit(f).lower(tiny_params, jnp.arange(s)).compile().memory_analysis()
            .temp_size_in_bytes for s in (1, 4, 12)]
    assert max(temp) <= 1.1 * min(temp), temp


@pytest.mark.parametrize("upto", [None, 100])
def test_head_gradient_keeps_at_most_two_chunks_of_logits(upto):
    """The head's gradient, whole-sequence logits [4, 256, 32000] (125 MiB) in chunks of 32:
    its compiled scratch stays under two chunks of logits (16 MiB each) plus the inputs'
    size, three with the skip of ``upto`` (its cond's output and branch; a cond outside the
    checkpoint kept every chunk's logits for the backward: 102 MiB)."""
    b, c, d, v, k = 4, 256, 64, 32000, 32
    args = (jax.ShapeDtypeStruct((b, c, d), jnp.float32), jax.ShapeDtypeStruct((d, v), jnp.float32),
            jax.ShapeDtypeStruct((b, c), jnp.int32))

    def f(h, w, t):
        return logprob.head_logps(h, w, t, seq_chunk=k,
                                  upto=None if upto is None else jnp.int32(upto)).sum()
    temp = jax.jit(jax.grad(f, argnums=(0, 1))).lower(*args).compile().memory_analysis()
    chunk_logits, inputs = b * k * v * 4, (b * c * d + d * v) * 4
    chunks = 2 if upto is None else 3
    assert temp.temp_size_in_bytes < chunks * chunk_logits + inputs, temp.temp_size_in_bytes


def test_sequence_logps_sums_over_mask():
    per_token = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]])
    np.testing.assert_allclose(np.asarray(logprob.sequence_logps(per_token, mask)), [-3.0, -1.5])


def test_clear_errors(tiny_model, tiny_params, tiny_config):
    prompt, comp = _inputs(tiny_config)
    with pytest.raises(ValueError, match="batch mismatch"):
        logprob.per_token_logps(tiny_model, tiny_params, prompt[:2], comp, jnp.array([0]),
                                p_mask_prompt=0.1)
    with pytest.raises(ValueError, match="1-D"):
        logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.int32(0),
                                p_mask_prompt=0.1)
    with pytest.raises(ValueError, match="must divide"):
        logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([0]),
                                p_mask_prompt=0.1, seq_chunk=2)
