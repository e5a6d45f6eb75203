"""Coupled-GRPO against numpy re-derivations of DiffuCoder's estimator and loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.objectives import coupled_grpo as cg
from d1jax.objectives import masking
from objective_checks import assert_step_moves_likelihoods, brute_logps, group_batch

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def test_pair_masks_every_completion_token_exactly_once(tiny_config):
    mask_id = tiny_config.mask_token_id
    rs = np.random.RandomState(0)
    prompt = rs.randint(0, 100, (3, 4)).astype(np.int32)
    comp = rs.randint(0, 100, (3, 2000)).astype(np.int32)
    ts = set()
    for seed in range(5):
        is_mask, t = (np.asarray(a) for a in masking.coupled_masks(jax.random.key(seed), 3, 2000))
        ids = np.asarray(cg.coupled_inputs(prompt, comp, is_mask, mask_id))
        assert ids.shape == (3, 3, 2004) and t.shape == (3,) and (t == t[0]).all()
        np.testing.assert_array_equal(ids[:, :, :4], np.stack([prompt] * 3))  # prompt kept
        in_m, in_c = ids[1, :, 4:] == mask_id, ids[2, :, 4:] == mask_id
        assert (in_m ^ in_c).all()  # each token masked in exactly one sequence of the pair
        np.testing.assert_array_equal(in_m, is_mask)
        assert (ids[0, :, 4:] == mask_id).all()
        np.testing.assert_array_equal(ids[1, :, 4:][~in_m], comp[~in_m])
        np.testing.assert_array_equal(ids[2, :, 4:][~in_c], comp[~in_c])
        assert 0.2 <= t[0] <= 0.8 and abs(is_mask.mean() - t[0]) < 0.02
        ts.add(float(t[0]))
    assert len(ts) == 5


def test_token_logps_formula():
    rs = np.random.RandomState(1)
    full, pm, pc = (rs.uniform(-4, 0, (3, 5)) for _ in range(3))
    is_mask = rs.uniform(size=(3, 5)) < 0.5
    t = np.array([0.35, 0.5, 0.7])
    got = np.asarray(cg.coupled_token_logps(*(jnp.asarray(a) for a in (full, pm, pc, is_mask, t))))
    want = np.empty((3, 5))
    for i, j in np.ndindex(3, 5):
        pair = pm[i, j] * (1 / t[i]) if is_mask[i, j] else pc[i, j] * (1 / (1 - t[i]))
        want[i, j] = 0.5 * (full[i, j] + pair)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def np_grpo(logps, old, ref, adv, mask, eps, beta):
    ratio = np.exp(logps - old)
    per = -np.minimum(ratio * adv[:, None], np.clip(ratio, 1 - eps, 1 + eps) * adv[:, None])
    per += beta * (np.exp(ref - logps) - (ref - logps) - 1)
    return (per * mask).sum() / mask.sum()


def _brute_coupled(model, params, prompt, prompt_mask, comp, is_mask, t):
    ids = np.asarray(cg.coupled_inputs(prompt, comp, is_mask, model.config.mask_token_id))
    attn = np.concatenate([prompt_mask, np.ones_like(comp)], 1)
    lp = [brute_logps(model, params, ids[k], comp, attn) for k in range(3)]
    return 0.5 * (lp[0] + np.where(is_mask, lp[1] / t[:, None], lp[2] / (1 - t[:, None])))


def test_loss_matches_numpy(tiny_model, tiny_params, tiny_config):
    rs = np.random.RandomState(2)
    prompt = rs.randint(0, 100, (3, 6)).astype(np.int32)
    prompt_mask = np.ones_like(prompt)
    prompt_mask[0, :2] = 0  # left padding, not attended
    comp = rs.randint(0, 100, (3, 8)).astype(np.int32)
    comp_mask = (rs.uniform(size=(3, 8)) < 0.8).astype(np.int32)
    adv = np.array([1.0, -0.5, 0.25], np.float32)
    cfg = cg.CoupledGRPOConfig(beta=0.01, epsilon=0.2)
    is_mask, t = (np.asarray(a) for a in masking.coupled_masks(jax.random.key(3), 3, 8))
    logps = _brute_coupled(tiny_model, tiny_params, prompt, prompt_mask, comp, is_mask, t)
    got = cg.coupled_logps(tiny_model, tiny_params, prompt, prompt_mask, comp, is_mask, t, cfg)
    np.testing.assert_allclose(np.asarray(got), logps, atol=2e-5)
    old = logps + rs.normal(0, 0.3, logps.shape)
    ref = logps + rs.normal(0, 0.3, logps.shape)
    loss, m = cg.coupled_grpo_loss(tiny_model, tiny_params, prompt, prompt_mask, comp, comp_mask,
                                   adv, is_mask, t, cfg, old_logps_bc=jnp.asarray(old, jnp.float32),
                                   ref_logps_bc=jnp.asarray(ref, jnp.float32))
    np.testing.assert_allclose(float(loss), np_grpo(logps, old, ref, adv, comp_mask, 0.2, 0.01),
                               rtol=1e-4)
    np.testing.assert_allclose(float(m["mask_ratio"]), t[0], rtol=1e-6)


def test_one_step_moves_likelihoods_by_advantage_sign(tiny_model, tiny_params, tiny_config):
    prompt, prompt_mask, comp, comp_mask = group_batch(tiny_config)
    adv = jnp.array([1.0, -1.0])
    cfg = cg.CoupledGRPOConfig(beta=0.0)
    is_mask, t = masking.coupled_masks(jax.random.key(0), 2, comp.shape[1])

    def loss(params):
        return cg.coupled_grpo_loss(tiny_model, params, prompt, prompt_mask, comp, comp_mask,
                                    adv, is_mask, t, cfg)[0]
    assert_step_moves_likelihoods(tiny_model, tiny_params, loss, prompt, comp)


@pytest.mark.parametrize("kw", [dict(t_min=0.0), dict(t_min=0.6, t_max=0.5), dict(t_max=1.0),
                                dict(beta=-0.1)])
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError) as err:
        cg.CoupledGRPOConfig(**kw)
    assert all(f"{k}={v}" in str(err.value) for k, v in kw.items()), err.value  # names it


def test_group_token_mean_with_groups_of_different_lengths_through_the_update_split(
        tiny_model, tiny_params, tiny_config):
    """The default ``grpo.token_mean`` "group" (``GRPOConfig.norm_group`` = G): the table's
    coupled-GRPO loss, split into two strided micro-batches as the update splits it, is the
    mean over groups of each group's token mean of the per-token loss (d1's one-group
    micro-batches), on brute-force coupled log-probs; its gradient is that of the same
    normalisation written here on the whole batch. Groups of 2, 8 and 5 tokens per row make
    the batch-wide token mean differ."""
    from d1jax.objectives.table import GRPOConfig, OBJECTIVES
    from d1jax.run import optim
    from objective_checks import grpo_batch
    g, groups, p, c, eps, beta = 2, 3, 4, 8, 0.2, 0.05
    rs = np.random.RandomState(4)
    prompt = np.repeat(rs.randint(0, 100, (groups, p)), g, 0).astype(np.int32)
    comp = rs.randint(0, 100, (g * groups, c)).astype(np.int32)
    ends = np.repeat([2, 8, 5], g)
    ends[1] = 1  # a row of one token in the short group
    comp_mask = (np.arange(c)[None] < ends[:, None]).astype(np.int32)
    adv = rs.normal(0, 1, g * groups).astype(np.float32)
    hp = cg.CoupledGRPOConfig(beta=beta, epsilon=eps)
    cfg = GRPOConfig(objective="coupled_grpo", num_iterations=2, beta=beta, epsilon=eps,
                     norm_group=g, hparams=hp)
    rows = grpo_batch(prompt, np.ones_like(prompt), comp, comp_mask, adv)
    o = OBJECTIVES["coupled_grpo"]
    prepared = o.prepare(tiny_model, cfg, rows, jax.random.key(5))
    is_mask, t = (np.asarray(prepared.per_row[k]) for k in ("is_mask", "t"))
    logps = _brute_coupled(tiny_model, tiny_params, prompt, np.ones_like(prompt), comp,
                           is_mask, t)
    old = logps + rs.normal(0, 0.3, logps.shape)
    ref = logps + rs.normal(0, 0.3, logps.shape)
    prepared = prepared.replace(mask_seeds=None, old_logps=jnp.asarray(old, jnp.float32),
                                ref_logps=jnp.asarray(ref, jnp.float32))
    blocks = [slice(i, i + g) for i in range(0, g * groups, g)]
    want = np.mean([np_grpo(logps[s], old[s], ref[s], adv[s], comp_mask[s], eps, beta)
                    for s in blocks])
    flat = np_grpo(logps, old, ref, adv, comp_mask, eps, beta)
    assert abs(want - flat) > 0.1 * abs(want)  # the two normalisations differ here

    def loss_fn(params, mb, i):
        return o.loss(tiny_model, cfg, params, mb, jnp.zeros((1,), jnp.int32), None)
    loss, grads, _ = jax.jit(lambda p: optim.accumulate_gradients(loss_fn, p, prepared, 2))(
        tiny_params)
    np.testing.assert_allclose(float(loss), want, rtol=2e-4)

    def group_mean_loss(params):  # the normalisation written out on the whole batch
        lp = cg.coupled_logps(tiny_model, params, prompt, np.ones_like(prompt), comp,
                              is_mask, t, hp)
        ratio = jnp.exp(lp - old)
        per = -jnp.minimum(ratio * adv[:, None], jnp.clip(ratio, 1 - eps, 1 + eps) * adv[:, None])
        per = (per + beta * (jnp.exp(ref - lp) - (ref - lp) - 1)) * comp_mask
        return jnp.mean(jnp.stack([per[s].sum() / comp_mask[s].sum() for s in blocks]))
    want_grads = jax.jit(jax.grad(group_mean_loss))(tiny_params)
    diff = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()),
                                            grads, want_grads)))
    top = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(want_grads))
    assert diff < 1e-4 * top, (diff, top)
