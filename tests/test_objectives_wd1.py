"""wd1 against numpy re-derivations of the authors' weighted-likelihood loss."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.objectives import logprob
from d1jax.objectives import wd1
from d1jax.objectives.table import GRPOConfig
from objective_checks import assert_step_moves_likelihoods, brute_logps, grpo_batch, group_batch, training_loss

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def _grpo_config(**kw):
    """wd1 as training runs it: the GRPO config names the objective (G = 2)."""
    return GRPOConfig(objective="wd1", beta=0.0, hparams=wd1.WD1Config(group_size=2), **kw)



def np_softmax(x):
    e = [math.exp(v) for v in x]
    return [v / sum(e) for v in e]


def np_wd1(logps, mask, adv, g, negative=True):
    """Per group: - sum softmax(A) l + sum softmax(-A) l, l the masked sum; mean over groups."""
    seq = (logps * mask).sum(-1)
    total = 0.0
    for start in range(0, len(adv), g):
        a, s = adv[start:start + g], seq[start:start + g]
        total -= sum(w * v for w, v in zip(np_softmax(a), s))
        if negative:
            total += sum(w * v for w, v in zip(np_softmax(-a), s))
    return total / (len(adv) // g)


def _random(seed=0, b=6, c=5):
    rs = np.random.RandomState(seed)
    return (rs.uniform(-4, -0.1, (b, c)), (rs.uniform(size=(b, c)) < 0.8).astype(np.float64),
            rs.normal(0, 1, b))


def test_weights_are_per_group_softmaxes():
    adv = np.array([1.0, 0.0, -1.0, 2.0, 2.0, -3.0])
    w_pos, w_neg = (np.asarray(w) for w in wd1.wd1_weights(jnp.asarray(adv), 3))
    np.testing.assert_allclose(w_pos, np_softmax(adv[:3]) + np_softmax(adv[3:]), rtol=1e-6)
    np.testing.assert_allclose(w_neg, np_softmax(-adv[:3]) + np_softmax(-adv[3:]), rtol=1e-6)
    with pytest.raises(ValueError, match="groups of 4"):
        wd1.wd1_weights(jnp.asarray(adv), 4)


@pytest.mark.parametrize("negative", [True, False])
def test_objective_value_and_gradient(negative):
    logps, mask, adv = _random()
    w_pos_b, w_neg_b = wd1.wd1_weights(jnp.asarray(adv), 3)
    f = lambda lp: wd1.wd1_weighted_loss(lp, jnp.asarray(mask), w_pos_b, w_neg_b, 2,
                                         negative=negative)
    loss, m = f(jnp.asarray(logps, jnp.float32))
    np.testing.assert_allclose(float(loss), np_wd1(logps, mask, adv, 3, negative), rtol=1e-5)
    np.testing.assert_allclose(float(m["positive_loss"]), np_wd1(logps, mask, adv, 3, False),
                               rtol=1e-5)
    # d loss / d logp_ic = (w-_i [negative] - w+_i) m_ic / n_groups: no ratio anywhere.
    w_pos = np.array(np_softmax(adv[:3]) + np_softmax(adv[3:]))
    w_neg = np.array(np_softmax(-adv[:3]) + np_softmax(-adv[3:])) * negative
    g = jax.grad(lambda lp: f(lp)[0])(jnp.asarray(logps, jnp.float32))
    np.testing.assert_allclose(np.asarray(g), (w_neg - w_pos)[:, None] * mask / 2, rtol=1e-5)


def test_loss_matches_numpy_on_the_one_step_estimator(tiny_model, tiny_params, tiny_config):
    rs = np.random.RandomState(3)
    prompt = rs.randint(0, 100, (4, 6)).astype(np.int32)
    prompt_mask = np.ones_like(prompt)
    prompt_mask[1, :3] = 0
    comp = rs.randint(0, 100, (4, 8)).astype(np.int32)
    comp_mask = (rs.uniform(size=(4, 8)) < 0.8).astype(np.int32)
    adv = np.array([0.5, -0.5, 1.0, -1.0], np.float32)
    cfg = _grpo_config(p_mask_prompt=0.3)
    mask_id = tiny_config.mask_token_id
    # The update's prompt noise is drawn from the iteration's mask key; the rest is brute force.
    noisy = np.asarray(logprob.mask_prompt(logprob.mask_key(5), prompt, 0.3, mask_id))
    assert (noisy != prompt).any()
    ids = np.concatenate([noisy, np.full_like(comp, mask_id)], 1)
    attn = np.concatenate([prompt_mask, np.ones_like(comp)], 1)
    logps = brute_logps(tiny_model, tiny_params, ids, comp, attn)
    loss, _ = training_loss(tiny_model, cfg, tiny_params,
                            grpo_batch(prompt, prompt_mask, comp, comp_mask, adv), seed=5)
    np.testing.assert_allclose(float(loss), np_wd1(logps, comp_mask, adv, 2), rtol=1e-4)


def test_one_step_moves_likelihoods_by_advantage_sign(tiny_model, tiny_params, tiny_config):
    prompt, prompt_mask, comp, comp_mask = group_batch(tiny_config)
    adv = jnp.array([1.0, -1.0])
    cfg = _grpo_config()
    batch = grpo_batch(prompt, prompt_mask, comp, comp_mask, adv)

    def loss(params):
        return training_loss(tiny_model, cfg, params, batch, seed=0)[0]
    assert_step_moves_likelihoods(tiny_model, tiny_params, loss, prompt, comp)


@pytest.mark.parametrize("kw", [dict(group_size=0)])
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError) as err:
        wd1.WD1Config(**kw)
    assert all(f"{k}={v}" in str(err.value) for k, v in kw.items()), err.value  # names it
