"""The one-step estimator and the ELBO against brute force on a tiny model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import logprob


def _inputs(c, b=3, lp=6, lc=5, seed=0):
    rs = np.random.RandomState(seed)
    return (rs.randint(0, c.vocab_size - 4, (b, lp)).astype(np.int32),
            rs.randint(0, c.vocab_size - 4, (b, lc)).astype(np.int32))


def brute_force(model, params, prompt, comp, mask_id, attn=None):
    """log-softmax of one full forward with the completion masked (all V, all positions)."""
    ids = np.concatenate([prompt, np.full_like(comp, mask_id)], 1)
    logits = np.asarray(model.apply({"params": params}, ids, attn), np.float64)
    lsm = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    lp = prompt.shape[1]
    return np.take_along_axis(lsm[:, lp:], comp[..., None], -1)[..., 0]


def test_p0_equals_brute_force(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    prompt, comp = _inputs(c)
    got = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([3, 9]),
                                  p_mask_prompt=0.0, mask_id=c.mask_token_id)
    want = brute_force(tiny_model, tiny_params, prompt, comp, c.mask_token_id)
    assert got.shape == (2, 3, 5)
    np.testing.assert_allclose(np.asarray(got[0]), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), want, atol=1e-5)


def test_chunked_head_equals_full(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    prompt, comp = _inputs(c, lc=8)
    kw = dict(p_mask_prompt=0.3, mask_id=c.mask_token_id)
    full = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([1]), **kw)
    chunked = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([1]),
                                      seq_chunk=2, **kw)
    np.testing.assert_allclose(np.asarray(full), np.asarray(chunked), atol=1e-6)


def test_prompt_mask_rate_is_p_and_fixed_by_the_seed():
    prompt = jnp.zeros((64, 200), jnp.int32)
    rates = [float((logprob.mask_prompt(logprob.mask_key(s), prompt, 0.15, 7) == 7).mean())
             for s in range(20)]
    # 20 x 12,800 Bernoulli(0.15) draws: std of the mean ~ 0.0007.
    assert abs(np.mean(rates) - 0.15) < 0.004
    a = logprob.mask_prompt(logprob.mask_key(5), prompt, 0.15, 7)
    b = logprob.mask_prompt(logprob.mask_key(5), prompt, 0.15, 7)
    d = logprob.mask_prompt(logprob.mask_key(6), prompt, 0.15, 7)
    assert (a == b).all() and (a != d).any()


def test_masked_prompt_changes_estimate_with_seed(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    prompt, comp = _inputs(c, lp=12)
    out = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([1, 1, 2]),
                                  p_mask_prompt=0.5, mask_id=c.mask_token_id)
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(out[1]))
    assert np.abs(np.asarray(out[0] - out[2])).max() > 0


def test_cfg_matches_brute_force(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    prompt, comp = _inputs(c)
    s = 0.7
    got = logprob.per_token_logps(tiny_model, tiny_params, prompt, comp, jnp.array([0]),
                                  p_mask_prompt=0.0, mask_id=c.mask_token_id, cfg_scale=s)[0]
    m = c.mask_token_id
    ids = np.concatenate([prompt, np.full_like(comp, m)], 1)
    un = np.full_like(ids, m)
    lc, lu = (np.asarray(tiny_model.apply({"params": tiny_params}, x), np.float64)[:, 6:]
              for x in (ids, un))
    mix = lu + (s + 1) * (lc - lu)
    mix = mix - np.log(np.exp(mix).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(got), np.take_along_axis(mix, comp[..., None], -1)[..., 0],
                               atol=1e-4)


def test_sequence_logps_sums_over_mask():
    per_token = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]])
    np.testing.assert_allclose(np.asarray(logprob.sequence_logps(per_token, mask)), [-3.0, -1.5])


def test_elbo_masks_are_stratified_and_bound_is_consistent(tiny_model, tiny_params, tiny_config):
    is_mask, t = logprob.elbo_mask(jax.random.key(0), 8, 16)
    counts = np.asarray(is_mask.sum(1))
    np.testing.assert_array_equal(counts, np.asarray(t * 16).astype(int))
    assert counts.min() >= 1 and counts.max() <= 16 and len(set(counts)) == 8
    c = tiny_config
    prompt, comp = _inputs(c, b=2)
    e = logprob.elbo_logps(tiny_model, tiny_params, prompt, comp, jax.random.key(1),
                           mask_id=c.mask_token_id, mc_num=32, mc_batch=8)
    assert e.shape == (2,) and bool(jnp.all(e < 0))
    # Brute force with the same masks: mean over groups of sum_masked log p / t / mc_batch.
    want = np.zeros(2)
    fwd = jax.jit(lambda x: tiny_model.apply({"params": tiny_params}, x))
    for gkey in jax.random.split(jax.random.key(1), 4):
        for r, rkey in enumerate(jax.random.split(gkey, 2)):
            m, t = (np.asarray(a) for a in logprob.elbo_mask(rkey, 8, comp.shape[1]))
            for j in range(8):
                ids = np.concatenate([prompt[r], np.where(m[j], c.mask_token_id, comp[r])])[None]
                lg = np.asarray(fwd(ids), np.float64)[0, 6:]
                lsm = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
                lp = lsm[np.arange(comp.shape[1]), comp[r]]
                want[r] += (lp * m[j]).sum() / t[j] / 8 / 4
    np.testing.assert_allclose(np.asarray(e), want, rtol=1e-4)
    with pytest.raises(ValueError, match="multiple of mc_batch"):
        logprob.elbo_logps(tiny_model, tiny_params, prompt, comp, jax.random.key(1),
                           mask_id=c.mask_token_id, mc_num=10, mc_batch=4)
