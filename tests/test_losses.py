"""GRPO and SFT losses against independent numpy implementations of d1's formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import d1jax
from d1jax import losses


def np_grpo(logps, old, ref, adv, mask, eps, beta):
    """d1 compute_loss, in numpy."""
    ratio = np.exp(logps - old)
    l1 = ratio * adv[:, None]
    l2 = np.clip(ratio, 1 - eps, 1 + eps) * adv[:, None]
    per = -np.minimum(l1, l2)
    kl = np.exp(ref - logps) - (ref - logps) - 1
    per = per + beta * kl
    n = mask.sum()
    return (per * mask).sum() / n, (kl * mask).sum() / n, ((l1 < l2) * mask).sum() / n


def _random(seed=0, b=4, lc=6):
    rs = np.random.RandomState(seed)
    logps = rs.uniform(-3, -0.1, (b, lc))
    old = logps + rs.normal(0, 0.5, (b, lc))
    ref = logps + rs.normal(0, 0.3, (b, lc))
    adv = rs.normal(0, 1, b)
    mask = (rs.uniform(size=(b, lc)) < 0.8).astype(np.float64)
    return logps, old, ref, adv, mask


@pytest.mark.parametrize("eps,beta", [(0.5, 0.04), (0.2, 0.0), (0.1, 1.0)])
def test_grpo_loss_value_and_metrics(eps, beta):
    logps, old, ref, adv, mask = _random()
    loss, m = losses.grpo_loss(jnp.array(logps), jnp.array(old), jnp.array(ref),
                               jnp.array(adv), jnp.array(mask), epsilon=eps, beta=beta)
    want, kl, clip = np_grpo(logps, old, ref, adv, mask, eps, beta)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    np.testing.assert_allclose(float(m["clip_ratio"]), clip, rtol=1e-6)
    assert ("kl" in m) == (beta != 0)
    if beta:
        np.testing.assert_allclose(float(m["kl"]), kl, rtol=1e-5)
    ratio = np.exp(logps - old)[mask > 0]
    np.testing.assert_allclose([float(m["ratio_min"]), float(m["ratio_max"])],
                               [ratio.min(), ratio.max()], rtol=1e-5)


def test_grpo_gradient_matches_finite_differences():
    logps, old, ref, adv, mask = _random(1, b=2, lc=3)
    f = lambda lp: losses.grpo_loss(lp, jnp.array(old), jnp.array(ref), jnp.array(adv),
                                    jnp.array(mask), epsilon=0.5, beta=0.04)[0]
    with jax.enable_x64(True):
        g = np.asarray(jax.grad(f)(jnp.array(logps, jnp.float64)))
    h = 1e-6
    num = np.zeros_like(logps)
    for idx in np.ndindex(logps.shape):
        up, dn = logps.copy(), logps.copy()
        up[idx] += h
        dn[idx] -= h
        num[idx] = (np_grpo(up, old, ref, adv, mask, 0.5, 0.04)[0]
                    - np_grpo(dn, old, ref, adv, mask, 0.5, 0.04)[0]) / (2 * h)
    np.testing.assert_allclose(g, num, atol=1e-6)


def test_sft_loss_matches_numpy(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    rs = np.random.RandomState(0)
    ids = rs.randint(0, c.vocab_size - 4, (3, 12)).astype(np.int32)
    plen = np.array([3, 5, 0], np.int32)
    key = jax.random.key(4)
    loss, m = losses.sft_loss(tiny_model, tiny_params, ids, plen, key, mask_id=c.mask_token_id)
    noisy, is_mask, t = (np.asarray(a) for a in losses.sft_noise(key, ids, plen, c.mask_token_id))
    assert not is_mask[np.arange(12)[None] < plen[:, None]].any()  # prompt never masked
    np.testing.assert_array_equal(noisy, np.where(is_mask, c.mask_token_id, ids))
    logits = np.asarray(tiny_model.apply({"params": tiny_params}, noisy), np.float64)
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -np.take_along_axis(lsm, ids[..., None], -1)[..., 0]
    want = (ce * is_mask / t[:, None]).sum() / (ids.size - plen.sum())
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_tiny_model_overfits_eight_sequences(tiny_config):
    c = d1jax.preset("test-tiny", d_model=64, mlp_hidden_size=192)
    model = d1jax.LLaDA(c)
    params = d1jax.init_params(model, jax.random.key(0))
    ids = np.random.RandomState(1).randint(0, 32, (8, 16)).astype(np.int32)
    plen = np.full(8, 4, np.int32)
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(p, s, k):
        (l, _), g = jax.value_and_grad(lambda q: losses.sft_loss(
            model, q, ids, plen, k, mask_id=c.mask_token_id), has_aux=True)(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, l
    first = None
    for i in range(600):
        params, state, loss = step(params, state, jax.random.key(i))
        first = first if first is not None else float(loss)
    evals = [float(losses.sft_loss(model, params, ids, plen, jax.random.key(10_000 + i),
                                   mask_id=c.mask_token_id)[0]) for i in range(8)]
    assert first > 2.0 and np.mean(evals) < 0.05, (first, evals)
