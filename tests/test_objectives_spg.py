"""SPG against numpy re-derivations of the authors' block masks, ELBO, EUBO and mixture."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.objectives import masking
from d1jax.objectives import spg
from d1jax.objectives import logprob
from d1jax.objectives.table import GRPOConfig
from objective_checks import assert_step_moves_likelihoods, brute_logps, grpo_batch, group_batch, training_loss

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def _grpo_config(spg_cfg):
    """SPG as training runs it: the GRPO config names the objective."""
    return GRPOConfig(objective="spg", beta=0.0, hparams=spg_cfg)


LENGTHS = np.array([12, 5, 1, 9, 8])  # real lengths (C = 12, blocks of 4): full, partial, 1


def _comp_mask(lengths=LENGTHS, c=12):
    return (np.arange(c)[None] < lengths[:, None]).astype(np.int32)


def check_block_structure(is_mask, k, lengths, bl, min_t, max_t, p_clean):
    """Every (row, copy) against the authors' block_random rule, position by position."""
    for i, j in np.ndindex(k.shape):
        n, blk = lengths[i], k[i, j]
        real_blocks = (n - 1) // bl + 1
        assert 0 <= blk < real_blocks
        start, size = blk * bl, min(bl, n - blk * bl)
        row = is_mask[i, j]
        assert row[start + bl:].all() and row[n:].all()  # later blocks and padding masked
        m = row[start:start + size].sum()
        lo = max(int(size * min_t), 1)  # the authors' Python floors, in float64
        assert lo <= m <= max(min(int(size * max_t), size), lo), (i, j, m)
        if p_clean == 0.0:
            assert not row[:start].any()
        if p_clean == 1.0:
            assert row[:start].all()


@pytest.mark.parametrize("min_t,max_t,p_clean", [(0.0, 1.0, 0.0), (0.3, 0.7, 1.0),
                                                 (0.5, 0.5, 0.0)])
def test_block_masks_structure(min_t, max_t, p_clean):
    draw = jax.jit(jax.vmap(lambda key: masking.block_masks(
        key, _comp_mask(), block_length=4, num_t=2, min_t=min_t, max_t=max_t, p_clean=p_clean)))
    masks, ks = (np.asarray(a) for a in draw(jax.random.split(jax.random.key(0), 20)))
    assert masks.shape == (20, 5, 2, 12) and ks.shape == (20, 5, 2)
    for is_mask, k in zip(masks, ks):
        check_block_structure(is_mask, k, LENGTHS, 4, min_t, max_t, p_clean)


def test_block_choice_follows_the_authors_permutation_modulo():
    """A permutation of all 3 blocks taken modulo the row's 2 real blocks: block 0 twice as
    likely as block 1 (2/3 vs 1/3); the in-block count is uniform on {1, ..., 4}."""
    draw = jax.jit(jax.vmap(lambda key: masking.block_masks(
        key, _comp_mask(np.array([8])), block_length=4, num_t=1)))
    masks, ks_ = (np.asarray(a)[:, 0, 0] for a in draw(jax.random.split(jax.random.key(1), 600)))
    ks = collections.Counter(ks_.tolist())
    counts = collections.Counter(int(m[4 * k:4 * k + 4].sum()) for m, k in zip(masks, ks_))
    assert set(ks) == {0, 1} and abs(ks[0] / 600 - 2 / 3) < 0.06
    assert set(counts) == {1, 2, 3, 4} and all(abs(v / 600 - 0.25) < 0.06 for v in counts.values())


def test_block_masks_reject_bad_shapes():
    with pytest.raises(ValueError, match="multiple of block_length"):
        masking.block_masks(jax.random.key(0), _comp_mask(), block_length=5, num_t=1)
    with pytest.raises(ValueError, match="num_t=4"):
        masking.block_masks(jax.random.key(0), _comp_mask(), block_length=4, num_t=4)


def np_spg(logps, scored, comp_mask, adv, beta, omega):
    """The authors' _get_per_seq_logps + compute_loss, loops and p ** beta as written."""
    b, j_n, c = logps.shape
    seq, lens = np.zeros(b), comp_mask.sum(-1)
    for i in range(b):
        m = scored[i] & (comp_mask[i] > 0)
        elbo = np.mean([(logps[i, j] * m[j]).sum() / max(m[j].sum(), 1e-8) for j in range(j_n)])
        t = [m[j].sum() / lens[i] for j in range(j_n)]
        avg = [sum(np.exp(logps[i, j, k]) ** beta * m[j, k] / max(t[j], 1e-8)
                   for j in range(j_n)) / j_n for k in range(c)]
        used = [k for k in range(c) if avg[k] > 0]
        eubo = sum(np.log(avg[k]) for k in used) / max(len(used), 1e-8) / beta
        seq[i] = elbo if adv[i] > 0 else omega * eubo + (1 - omega) * elbo
    return -(adv * seq * lens).sum() / lens.sum()


@pytest.mark.parametrize("beta,omega", [(1.5, 0.5), (1.0, 1.0), (2.0, 0.0)])
def test_objective_matches_numpy(beta, omega):
    rs = np.random.RandomState(0)
    logps = rs.uniform(-5, -0.05, (5, 3, 12))
    scored = rs.uniform(size=(5, 3, 12)) < 0.4
    scored[2] = False  # a row with no masked token: both bounds are 0
    comp_mask = _comp_mask()
    adv = np.array([1.0, -0.5, 0.3, -2.0, 0.0])
    loss, m = spg.spg_objective(jnp.asarray(logps, jnp.float32), jnp.asarray(scored),
                                jnp.asarray(comp_mask), jnp.asarray(adv), eubo_beta=beta,
                                mix_weight=omega)
    np.testing.assert_allclose(float(loss), np_spg(logps, scored, comp_mask, adv, beta, omega),
                               rtol=1e-5)
    np.testing.assert_allclose(float(m["positive_share"]), 0.4, rtol=1e-6)
    grads = jax.grad(lambda lp: spg.spg_objective(lp, jnp.asarray(scored), jnp.asarray(comp_mask),
                                                  jnp.asarray(adv), eubo_beta=beta,
                                                  mix_weight=omega)[0])(
        jnp.asarray(logps, jnp.float32))
    g = np.asarray(grads)
    assert np.isfinite(g).all()
    # Only scored real tokens carry gradient.
    assert (g[~(scored & (comp_mask[:, None] > 0))] == 0).all()


def test_loss_matches_numpy_on_brute_force_logps(tiny_model, tiny_params, tiny_config):
    rs = np.random.RandomState(4)
    prompt = rs.randint(0, 100, (3, 5)).astype(np.int32)
    prompt_mask = np.ones_like(prompt)
    prompt_mask[2, :2] = 0
    comp = rs.randint(0, 100, (3, 8)).astype(np.int32)
    comp_mask = _comp_mask(np.array([8, 3, 6]), 8)
    adv = np.array([1.0, -1.0, -0.5], np.float32)
    cfg = spg.SPGConfig(block_length=4, num_t=2, p_mask_prompt=0.3)
    key = logprob.mask_key(2)  # the update's draw for mask seed 2
    ids, scored = (np.asarray(a) for a in spg.spg_inputs(key, prompt, comp, comp_mask,
                                                         tiny_config.mask_token_id, cfg))
    assert ids.shape == (3, 2, 13)
    np.testing.assert_array_equal(ids[:, :, 5:] == tiny_config.mask_token_id, scored)
    attn = np.repeat(np.concatenate([prompt_mask, np.ones_like(comp)], 1), 2, 0)
    logps = brute_logps(tiny_model, tiny_params, ids.reshape(6, 13), np.repeat(comp, 2, 0), attn)
    want = np_spg(logps.reshape(3, 2, 8), scored, comp_mask, adv, 1.5, 0.5)
    loss, _ = training_loss(tiny_model, _grpo_config(cfg), tiny_params,
                            grpo_batch(prompt, prompt_mask, comp, comp_mask, adv), seed=2)
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)


def test_one_step_moves_likelihoods_by_advantage_sign(tiny_model, tiny_params, tiny_config):
    prompt, prompt_mask, comp, comp_mask = group_batch(tiny_config)
    adv = jnp.array([1.0, -1.0])
    cfg = spg.SPGConfig(block_length=4)

    batch = grpo_batch(prompt, prompt_mask, comp, comp_mask, adv)

    def loss(params):
        return training_loss(tiny_model, _grpo_config(cfg), params, batch, seed=0)[0]
    assert_step_moves_likelihoods(tiny_model, tiny_params, loss, prompt, comp)


@pytest.mark.parametrize("kw", [dict(min_t=0.6, max_t=0.5), dict(eubo_beta=0.0),
                                dict(mix_weight=1.5), dict(num_t=0), dict(p_mask_prompt=-0.1)])
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError) as err:
        spg.SPGConfig(**kw)
    assert all(f"{k}={v}" in str(err.value) for k, v in kw.items()), err.value  # names it
