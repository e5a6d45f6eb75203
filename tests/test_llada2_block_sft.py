"""LLaDA2's block SFT (the family's ``sft_loss="block_dfactory"``, ``d1jax.objectives.blockwise``)
against a float64 NumPy port of dFactory's ``tasks/train_llada2_bd.py`` (inclusionAI/dFactory
at 92b6890808088b112fcf5fc73a341b78b6ab76bf; its ``tasks/dataset/data_transform.py`` and
``configs/sft/llada2_mini_bd_sft.yaml``), ported from their equations, not their code:

- noising (data_transform.py:116-121, ``sft_noise_transition``): one t ~ U(0.3, 0.8) per row,
  each position from the prompt's end on (padding included, :31) masked when u < t;
  labels are the clean tokens at the masked positions (:28-41);
- the row fed to the model is [noised (n) | clean (n)] with position ids arange(n) for both
  halves (train_llada2_bd.py:425-434), under ``block_diffusion_mask`` (:122-166) with blocks
  counted from position 0: a noised query sees the noised keys of its own block and the clean
  keys of the blocks strictly before it; a clean query sees the clean keys of its block and
  the blocks before it;
- the loss (``same_token_labels: true`` in the yaml: no shift, :452-458) is the cross entropy
  of the noised half's logits at the masked positions, summed and divided by the number of
  masked positions of the micro-batch, no 1/t weight; micro-batches (one row each in the
  yaml) average by the ``/ len(micro_batches)`` and the summed backward.

The model's float64 forward is tests/test_llada2.py's port (``np_logits``). A noised block b
under their mask attends exactly to the clean blocks < b and to itself, so its logits are the
block-causal forward of ``clean[:b*bs] + noised block b`` at the same positions (routing is
per token); ``test_dfactory_mask_reduces_to_prefixes`` checks that reading of their mask.

Checked here: d1jax's training-layout mask (``stream_mask``) equals theirs on every row that
is read; d1jax's per-token log-probs of the noised copy (``copy_logps``, the ``StreamMask``
path the trainer runs) equal the port's; dFactory's loss built on them equals the port's to
1e-5 relative and its ``jax.grad`` equals central differences of the port on entries of six
tensors; d1jax's ``block_sft_loss`` equals the port's log-probs under d1jax's own (dLLM-RL)
normalisation. dFactory's recipe (``sft.loss="block_dfactory"``, the family's own) is
``row_noise``, blocks from position 0 and each row's masked-token mean: its loss equals the
port's through ``sft_stage_loss``, prompts ending on a block boundary or not. (Before it,
d1jax trained LLaDA2 with SDAR's recipe: -sum/L per row, blocks from the prompt's end, each
position's own p; this file found it.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.model import hf_checkpoint as hf
from d1jax.model.llada2 import LLaDA2
from d1jax.model.llada2.weights import key_map, load_hf_checkpoint
from d1jax.objectives import blockwise
from tests.test_llada2 import TINY_JSON, hub_state, np_logits, write_dir

COMPILE_UNOPTIMIZED = True

BS = 4  # block size: 3 blocks in 12 tokens
L = 12
MASK, PAD = TINY_JSON["mask_token_id"], TINY_JSON["pad_token_id"]
# Rows: prompt, completion, padding (PAD) to L. Prompts end on a block boundary (4, 8) where
# d1jax's blocks (counted from the prompt's end) and dFactory's (from 0) coincide.
ROWS = np.array([[5, 17, 99, 3, 64, 12, 40, 8, 1, PAD, PAD, PAD],
                 [7, 2, 33, 90, 11, 54, 23, 6, 81, 44, 3, PAD]])
PROMPT = np.array([4, 8])


def dfactory_noise(rng, ids, prompt_len, low=0.3, high=0.8):
    """Their sft_noise_transition: one t per row, u < t from the prompt's end on (padding
    too). Redrawn until a row has a masked position (their loss is 0/0 otherwise)."""
    out = []
    for row, p in zip(ids, prompt_len):
        while True:
            t = rng.uniform(low, high)
            m = (rng.uniform(size=row.shape) < t) & (np.arange(len(row)) >= p)
            if m.any():
                break
        out.append(m)
    return np.stack(out)


def dfactory_mask(n, block):
    """Their block_diffusion_mask over [noised (n) | clean (n)]: bool [2n, 2n]."""
    i = np.arange(2 * n)
    x0 = i >= n
    blk = np.where(x0, i - n, i) // block
    q, k = (slice(None), None), (None, slice(None))
    diag = (blk[q] == blk[k]) & (x0[q] == x0[k])
    offset = (blk[q] > blk[k]) & x0[k] & ~x0[q]
    causal = (blk[q] >= blk[k]) & x0[k] & x0[q]
    return diag | offset | causal


def np_noised_logps(sd, ids, pmask, block):
    """float64 log p(clean | their view) [L] at every noised position of one row."""
    noised = np.where(pmask, MASK, ids)
    out = np.zeros(len(ids))
    for b in range(len(ids) // block):
        sl = slice(b * block, (b + 1) * block)
        logits = np_logits(sd, TINY_JSON, np.concatenate([ids[:b * block], noised[sl]]),
                           block)[-block:]
        m = logits.max(-1, keepdims=True)
        lsm = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
        out[sl] = lsm[np.arange(block), ids[sl]]
    return out


def np_dfactory_loss(sd, ids, pmask, block):
    """Their step loss with one row per micro-batch: mean over rows of the masked positions'
    summed cross entropy over their count."""
    per_row = [-np_noised_logps(sd, r, m, block)[m].sum() / m.sum() for r, m in zip(ids, pmask)]
    return float(np.mean(per_row))


def dfactory_loss_on(lp, pm):
    """Their normalisation on d1jax's log-probs [B, C] and mask [B, C]."""
    pm = pm.astype(jnp.float32)
    return jnp.mean(-jnp.sum(lp * pm, 1) / jnp.sum(pm, 1))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("llada2_bsft") / "hub"
    sd = hub_state(TINY_JSON, seed=3)
    write_dir(path, TINY_JSON, sd)
    config, params = load_hf_checkpoint(path)
    config = dataclasses.replace(config, block_size=BS)
    pmask = dfactory_noise(np.random.default_rng(0), ROWS, PROMPT)
    return sd, config, params, pmask


def _d1jax_logps(model, params, prompt, pmask):
    noised = jnp.where(pmask, MASK, ROWS)[:, None]
    return blockwise.copy_logps(model, params, jnp.asarray(ROWS), jnp.ones(ROWS.shape, jnp.int32),
                                jnp.asarray(prompt), noised)[:, 0]


def test_dfactory_mask_reduces_to_prefixes():
    """Their mask: a noised query of block b sees noised block b and clean blocks < b; a clean
    query sees clean blocks <= its own (never a noised key): the prefix reading above."""
    m = dfactory_mask(L, BS)
    blk = np.arange(L) // BS
    want_noised = np.concatenate([blk[None] == blk[:, None], blk[None] < blk[:, None]], 1)
    want_clean = np.concatenate([np.zeros((L, L), bool), blk[None] <= blk[:, None]], 1)
    np.testing.assert_array_equal(m[:L], want_noised)
    np.testing.assert_array_equal(m[L:], want_clean)


def test_training_mask_equals_dfactorys_on_read_rows():
    """d1jax's [clean | noised copy] mask, reordered to their [noised | clean], equals theirs
    on the clean rows and the noised rows of the completion (the rows whose output is read;
    the noised prompt rows are never read and d1jax gives them no own-block keys)."""
    got = np.asarray(blockwise.stream_mask(jnp.ones(ROWS.shape, jnp.int32), jnp.asarray(PROMPT),
                                           1, L, BS))
    want = dfactory_mask(L, BS)
    perm = np.concatenate([np.arange(L, 2 * L), np.arange(L)])  # theirs -> d1jax's index
    for r, p in enumerate(PROMPT):
        g = got[r][np.ix_(perm, perm)]
        np.testing.assert_array_equal(g[L:], want[L:])  # clean queries
        np.testing.assert_array_equal(g[p:L], want[p:L])  # noised completion queries
    facts = blockwise.stream_facts(jnp.ones(ROWS.shape, jnp.int32), jnp.asarray(PROMPT), 1, L, BS)
    np.testing.assert_array_equal(np.asarray(facts.rows(0, 2 * L)), got)


def test_loss_and_gradient_equal_the_float64_port(setup):
    sd, config, params, pmask = setup
    model = LLaDA2(config)
    pm = jnp.asarray(pmask)

    def loss(p):
        lp = _d1jax_logps(model, p, PROMPT, pmask)
        return dfactory_loss_on(lp, pm), lp
    (got, got_lp), grads = jax.value_and_grad(loss, has_aux=True)(params)
    want_lp = np.stack([np_noised_logps(sd, r, m, BS) for r, m in zip(ROWS, pmask)])
    np.testing.assert_allclose(np.asarray(got_lp)[pmask], want_lp[pmask], rtol=1e-4, atol=2e-5)
    assert float(got) == pytest.approx(np_dfactory_loss(sd, ROWS, pmask, BS), rel=1e-5)

    kmap = key_map(config, "hub")
    experts = [f"model.layers.{j}.mlp.experts.{e}.gate_proj.weight" for j in (1, 2)
               for e in range(TINY_JSON["num_experts"])]
    g_exp = {k: np.abs(np.asarray(_hf_grad(grads, kmap[k]))).max() for k in experts}
    names = ["lm_head.weight", "model.word_embeddings.weight",
             "model.layers.0.mlp.up_proj.weight", "model.layers.2.attention.query_key_value.weight",
             "model.layers.1.attention.query_layernorm.weight", max(g_exp, key=g_exp.get)]
    for name in names:
        g = np.asarray(_hf_grad(grads, kmap[name]))
        idx = np.unravel_index(np.argmax(np.abs(g)), g.shape)
        h = 1e-4
        fd = []
        for s in (1, -1):
            sd2 = dict(sd)
            a = sd[name].astype(np.float64).copy()
            a[idx] += s * h
            sd2[name] = a
            fd.append(np_dfactory_loss(sd2, ROWS, pmask, BS))
        fd = (fd[0] - fd[1]) / (2 * h)
        assert abs(fd) > 1e-3, name  # an entry that matters
        assert g[idx] == pytest.approx(fd, rel=2e-3), name


def _hf_grad(grads, entry):
    """The gradient of one HF tensor ([out, in]) from d1jax's tree."""
    ppath, grid, swap = entry
    a = hf.get_path(grads, ppath)
    for i in grid:
        a = a[i]
    return jnp.swapaxes(a, -1, -2) if swap else a


def _block_sft_loss(setup, **recipe):
    """d1jax's block_sft_loss on the rows and masks of ``setup`` (their settings: one copy of
    the whole row, every padding position trained: post_num None)."""
    _, config, params, pmask = setup
    anchor = jnp.zeros(2, jnp.int32) if recipe else jnp.asarray(PROMPT)
    return float(blockwise.block_sft_loss(
        LLaDA2(config), params, jnp.asarray(ROWS), jnp.ones(ROWS.shape, jnp.int32), anchor,
        jnp.asarray(pmask), copy_len=L, post_num=None, pad_id=PAD, **recipe)[0])


def test_block_recipe_is_dllm_rls_normalisation_of_the_port(setup):
    """The "block" recipe (SDAR's, dLLM-RL): the port's log-probs, -sum over the masked
    positions / L per row, mean over rows; not dFactory's loss on the same log-probs."""
    sd, _, _, pmask = setup
    lp = np.stack([np_noised_logps(sd, r, m, BS) for r, m in zip(ROWS, pmask)])
    want = np.mean(-np.where(pmask, lp, 0).sum(1) / L)
    got = _block_sft_loss(setup)
    assert got == pytest.approx(want, rel=1e-5)
    assert got != pytest.approx(np_dfactory_loss(sd, ROWS, pmask, BS), rel=1e-2)


def test_block_dfactory_loss_is_dfactorys(setup):
    """``per_token`` with blocks from position 0 (the "block_dfactory" recipe): dFactory's
    loss, the masked cross entropy over the count of masked positions (train_llada2_bd.py:458,
    no 1/t), mean over rows."""
    sd, _, _, pmask = setup
    assert _block_sft_loss(setup, per_token=True) == pytest.approx(
        np_dfactory_loss(sd, ROWS, pmask, BS), rel=1e-5)


def test_unaligned_prompt_logps_are_dfactorys_with_blocks_from_position_0(setup):
    """Prompts not ending on a block boundary: blocks counted from position 0 (their
    block_diffusion_mask, train_llada2_bd.py:145-150, q_idx // block_size) give their
    log-probs; counted from the prompt's end (SDAR's recipe) they do not."""
    sd, config, params, _ = setup
    prompt = np.array([6, 5])
    pmask = dfactory_noise(np.random.default_rng(1), ROWS, prompt)
    want = np.stack([np_noised_logps(sd, r, m, BS) for r, m in zip(ROWS, pmask)])
    model = LLaDA2(config)
    got = np.asarray(_d1jax_logps(model, params, np.zeros(2, np.int64), pmask))
    np.testing.assert_allclose(got[pmask], want[pmask], rtol=1e-4, atol=2e-5)
    other = np.asarray(_d1jax_logps(model, params, prompt, pmask))
    assert not np.allclose(other[pmask], want[pmask], rtol=1e-4, atol=2e-5)


def test_row_noise_draws_one_t_per_row():
    """dFactory's sft_noise_transition: one t ~ U(low, high) per row, u < t per position. Over
    4,096 positions a row's masked share is its t (within 0.03), the rows' t spread over the
    range, and a position's chance does not vary along the row."""
    m = np.asarray(blockwise.row_noise(jax.random.key(0), (64, 4096), 0.3, 0.8))
    share = m.mean(1)
    assert 0.3 - 0.03 < share.min() and share.max() < 0.8 + 0.03
    assert share.max() - share.min() > 0.3  # one t per row, not one per batch
    col = m.mean(0)  # each position: the mean of the rows' t, about 0.55
    assert abs(col.mean() - share.mean()) < 1e-9 and col.std() < 0.1
    # positions in a row are independent given t: about t^2 of adjacent pairs both masked
    pairs = (m[:, 1:] & m[:, :-1]).mean(1)
    np.testing.assert_allclose(pairs, share ** 2, atol=0.03)


def test_sft_stage_loss_of_the_dfactory_recipe_is_the_port(setup):
    """The trainer's entry (``sft_stage_loss``, recipe "block_dfactory", padding trained):
    its draw is row_noise's from the prompt's end on, and its loss is the port's dFactory
    loss on those masks, prompts not ending on a block boundary."""
    sd, config, params, _ = setup
    prompt = np.array([6, 5])
    key = jax.random.key(5)
    pmask = (np.asarray(blockwise.row_noise(key, ROWS.shape, 0.3, 0.8))
             & (np.arange(L)[None] >= prompt[:, None]))
    assert pmask.any(1).all()
    got, metrics = blockwise.sft_stage_loss(
        LLaDA2(config), params, jnp.asarray(ROWS), jnp.asarray(prompt), key, lower=0.3,
        upper=0.8, post_num=None, pad_id=PAD, recipe="block_dfactory")
    assert float(got) == pytest.approx(np_dfactory_loss(sd, ROWS, pmask, BS), rel=1e-5)
    assert float(metrics["masked_tokens"]) == pytest.approx(pmask.sum(1).mean())
