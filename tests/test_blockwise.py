"""Block diffusion's training layout and block SFT (d1jax/objectives/blockwise.py) against a
float64 torch port of Gen-Verse/dLLM-RL ``train/sft_sdar.py`` (tests/dllm_rl_port.py) on a
tiny random SDAR model: the same HF-keyed weights, the same masks handed in; loss and every
parameter's gradient compared."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.model import sdar
from d1jax.objectives import blockwise
from test_sdar import CFG, hf_state
from tests import published

torch = pytest.importorskip("torch")
import dllm_rl_port as port  # noqa: E402

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

L0, L1, BS = 7, 10, CFG.block_size  # L1 not a multiple of the block: a partial last block
PAD, MASK = CFG.pad_token_id, CFG.mask_token_id


@pytest.fixture(scope="module")
def sd():
    return hf_state(CFG, seed=3)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, sd):
    d = published.write_checkpoint(tmp_path_factory.mktemp("sdar") / "ckpt", CFG.to_hf_dict(), sd)
    cfg, params = sdar.load_hf_checkpoint(d)
    return sdar.SDAR(cfg), params


def rows(pads=(0, 3, 1, 2), resp_pads=(3, 0, 5, 4), seed=0):
    """Their UniversalPrompting layout: prompts left-padded to L0, responses right-padded
    with pad_id to L1."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CFG.vocab_size - 2, (len(pads), L0 + L1))
    prompt_mask = np.ones((len(pads), L0), np.int32)
    for b, (p, r) in enumerate(zip(pads, resp_pads)):
        ids[b, :p], prompt_mask[b, :p] = PAD, 0
        if r:
            ids[b, -r:] = PAD
    return ids, prompt_mask


def jax_grads_by_hf_name(grads, cfg, key_map=sdar.key_map):
    out = {}
    for key, (path, layer, transposed) in key_map(cfg).items():
        g = grads
        for p in path:
            g = g[p]
        g = np.asarray(g if layer is None else g[layer])
        out[key] = g.T if transposed else g
    return out


def compare_grads(grads, model_t, cfg, key_map=sdar.key_map):
    mine, theirs = jax_grads_by_hf_name(grads, cfg, key_map), model_t.grads()
    assert set(mine) == set(theirs)
    diff = max(np.abs(mine[k] - theirs[k]).max() for k in mine)
    scale = max(np.abs(theirs[k]).max() for k in theirs)
    return diff, scale


def test_stream_mask_is_their_basic_block_attention_with_process_pad():
    ids, pm = rows()
    real = np.concatenate([pm, np.ones((len(pm), L1), np.int32)], 1)
    mine = np.asarray(blockwise.stream_mask(jnp.asarray(real), jnp.full((len(pm),), L0), 1,
                                            L1, BS))
    ext = np.concatenate([ids, ids[:, L0:]], 1)
    theirs = port.process_pad(port.make_basic_block_attention(L0 + 2 * L1, L0, BS)
                              .repeat_interleave(len(ids), 0), torch.tensor(ext), L0, PAD)
    theirs = theirs[:, 0].numpy().astype(bool)
    # Prompt padding query rows differ (theirs: itself only; never read): compare the rest.
    real_rows = np.concatenate([real, np.ones((len(pm), L1), bool)], 1).astype(bool)
    for b in range(len(ids)):
        np.testing.assert_array_equal(mine[b][real_rows[b]], theirs[b][real_rows[b]])


@pytest.mark.parametrize("copies,copy_len,anchors", [(1, L1, (L0,) * 4), (3, L1, (L0,) * 4),
                                                     (2, L0 + L1, (3, 5, 7, 8))])
def test_stream_facts_build_every_chunk_of_the_whole_mask(copies, copy_len, anchors):
    """The StreamMask's rows, built chunk by chunk (chunks not dividing N, the last past the
    end), are ``stream_mask``'s rows (itself checked against theirs above)."""
    _, pm = rows()
    real = jnp.asarray(np.concatenate([pm, np.ones((len(pm), L1), np.int32)], 1))
    anchor = jnp.asarray(anchors)
    whole = np.asarray(blockwise.stream_mask(real, anchor, copies, copy_len, BS))
    facts = blockwise.stream_facts(real, anchor, copies, copy_len, BS)
    n = whole.shape[1]
    for size in (1, 5, n):
        for start in range(0, n, size):
            got = np.asarray(facts.rows(start, size))[:, :n - start]
            np.testing.assert_array_equal(got, whole[:, start:start + size])


def test_query_chunks_equal_the_whole_mask_in_logps_and_grads(loaded):
    """Attention in query chunks of 5 (N = 47: a partial last chunk) under the StreamMask
    gives the log-probs and gradients of one pass under the whole [N, N] mask."""
    model, params = loaded
    ids, pm = rows()
    real = np.concatenate([pm, np.ones_like(ids[:, L0:])], 1)
    rng = np.random.default_rng(2)
    noised = jnp.asarray(np.where(rng.random((len(ids), 3, L1)) < 0.5, MASK, ids[:, None, L0:]))
    anchor = jnp.full((len(ids),), L0)

    def f(prm, chunk):
        lp = blockwise.copy_logps(model, prm, ids, real, anchor, noised, query_chunk=chunk)
        return jnp.sum(lp * jnp.linspace(0.5, 1.5, lp.size).reshape(lp.shape)), lp
    (_, want), g_want = jax.value_and_grad(f, has_aux=True)(params, None)
    (_, got), g_got = jax.jit(jax.value_and_grad(f, has_aux=True), static_argnums=1)(params, 5)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):  # float32 sums' order
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                                   atol=1e-5 * float(np.abs(np.asarray(b)).max()))
    # No value of the chunked gradient's program is [.., >= N, N] (the dense one's are).
    n = L0 + L1 + 3 * L1
    assert square_values(jax.make_jaxpr(jax.grad(lambda p: f(p, None)[0]))(params), n)
    assert not square_values(jax.make_jaxpr(jax.grad(lambda p: f(p, 5)[0]))(params), n)


def square_values(closed, n: int) -> list:
    """Shapes of the values [..., >= n, n] anywhere in a jaxpr (its sub-jaxprs included)."""
    found, todo = [], [closed.jaxpr]
    while todo:
        jaxpr = todo.pop()
        for eqn in jaxpr.eqns:
            found += [v.aval.shape for v in eqn.outvars if len(getattr(v.aval, "shape", ())) >= 2
                      and v.aval.shape[-1] == n and v.aval.shape[-2] >= n]
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        todo.append(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        todo.append(sub)
    return found


def test_copies_in_one_row_equal_one_copy_per_row(loaded):
    model, params = loaded
    ids, pm = rows()
    real = np.concatenate([pm, np.ones_like(ids[:, L0:])], 1)
    rng = np.random.default_rng(1)
    noised = np.where(rng.random((len(ids), 3, L1)) < 0.5, MASK, ids[:, None, L0:])
    anchor = jnp.full((len(ids),), L0)
    packed = blockwise.copy_logps(model, params, ids, real, anchor, jnp.asarray(noised))
    for r in range(3):
        one = blockwise.copy_logps(model, params, ids, real, anchor,
                                   jnp.asarray(noised[:, r:r + 1]))
        np.testing.assert_allclose(np.asarray(packed[:, r]), np.asarray(one[:, 0]),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post_num", [0, 2, None])
def test_block_sft_loss_and_grads_match_their_sft_sdar(loaded, sd, post_num):
    model, params = loaded
    ids, pm = rows()
    rng = np.random.default_rng(7)
    p = rng.uniform(0.1, 0.9, (len(ids), L1))
    tails = rng.random((len(ids), L1)) <= p  # their semi-ar draw, handed to both
    tails[2] = False
    tails[2, -2:] = True  # row 2: response padding only -> dropped when post_num == 0
    # theirs
    model_t = port.TorchSDAR(sd, CFG)
    ext, p_mask, tok, labels, keep = port.masked_rows(torch.tensor(ids), tails, L0, MASK, PAD,
                                                      post_num)
    logp = port.their_logp(model_t, ext, tok, labels, L0, BS, PAD)
    want = port.their_sft_loss(logp, p_mask, L1)
    want.backward()
    want = want.item()
    assert (post_num == 0) == (not keep[2])
    # mine
    real = np.concatenate([pm, np.ones_like(ids[:, L0:])], 1)

    def loss_fn(prm):
        return blockwise.block_sft_loss(model, prm, jnp.asarray(ids), jnp.asarray(real),
                                        jnp.full((len(ids),), L0), jnp.asarray(tails),
                                        copy_len=L1, post_num=post_num, pad_id=PAD,
                                        norm_len=L1)
    (loss, m), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    diff, scale = compare_grads(grads, model_t, CFG)
    print(f"block SFT post_num={post_num}: loss {float(loss):.8g} vs {want:.8g} "
          f"(abs diff {abs(float(loss) - want):.2g}); grad max abs diff {diff:.2g} "
          f"(max |grad| {scale:.2g})")
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert diff < 1e-5 * max(scale, 1.0)
    assert float(m["kept_rows"]) == pytest.approx(float(keep.float().mean()))


def test_sft_stage_loss_runs_on_sft_rows_and_learns(loaded):
    """The SFT stage's rows (prompt then completion, EOS-padded): finite, and one gradient
    step lowers it on the same draw."""
    model, params = loaded
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, CFG.vocab_size - 2, (2, 12)))
    plen = jnp.asarray([3, 5])
    key = jax.random.key(0)

    def f(prm):
        return blockwise.sft_stage_loss(model, prm, ids, plen, key, lower=0.1, upper=0.9,
                                        post_num=0, pad_id=PAD)[0]
    loss, g = jax.jit(jax.value_and_grad(f))(params)
    stepped = jax.tree.map(lambda p, d: p - 0.5 * d, params, g)
    assert np.isfinite(float(loss)) and float(jax.jit(f)(stepped)) < float(loss)


def _stage_pmask(monkeypatch, ids, plen, key, lower, upper):
    """The masked positions [B, L] ``sft_stage_loss`` hands to ``block_sft_loss`` (captured
    there; the model is not run)."""
    seen = {}

    def capture(model, params, ids_bl, real_bl, anchor_b, pmask_bc, **kw):
        seen.update(pmask=np.asarray(pmask_bc), anchor=np.asarray(anchor_b), **kw)
        return jnp.float32(0.0), {}
    monkeypatch.setattr(blockwise, "block_sft_loss", capture)
    blockwise.sft_stage_loss(None, None, jnp.asarray(ids), jnp.asarray(plen), key, lower=lower,
                             upper=upper, post_num=None, pad_id=PAD)
    np.testing.assert_array_equal(seen["anchor"], plen)  # blocks counted from the response
    assert seen["copy_len"] == ids.shape[1]
    return seen["pmask"]


def test_sft_stage_masks_every_response_position_from_the_first_and_no_prompt_token(
        monkeypatch, loaded, sd):
    """Which positions block SFT masks (sft_sdar.py's semi-ar: each response position
    masked when u <= p, p ~ U(lower_p, upper_p) drawn per position; the prompt never):
    with p = 1 exactly the response, its first token included, and the loss then equals
    their loss on that mask; with p ~ U(0.1, 0.9) each response position (the first one
    too) is masked half the time, independently of the row's other positions; with p = 0.25
    a quarter of the time."""
    b, l = 256, 24
    rng = np.random.default_rng(1)
    ids = rng.integers(0, CFG.vocab_size - 2, (b, l))
    plen = rng.integers(2, 12, b)
    resp = np.arange(l)[None] >= plen[:, None]
    full = _stage_pmask(monkeypatch, ids, plen, jax.random.key(0), 1.0, 1.0)
    np.testing.assert_array_equal(full, resp)

    mid = _stage_pmask(monkeypatch, ids, plen, jax.random.key(1), 0.1, 0.9)
    assert not mid[~resp].any()
    first = mid[np.arange(b), plen]
    assert 0.4 < first.mean() < 0.6, first.mean()  # E 0.5, sd 0.03
    share = [mid[i, plen[i]:].mean() for i in range(b)]
    assert 0.45 < np.mean(share) < 0.55 and np.var(share) < 0.03, (np.mean(share), np.var(share))
    # (one p per row: variance ~0.05 + 0.25 / 12..22)
    quarter = _stage_pmask(monkeypatch, ids, plen, jax.random.key(2), 0.25, 0.25)
    assert 0.22 < quarter[resp].mean() < 0.28 and not quarter[~resp].any()
    monkeypatch.undo()

    # p = 1 on rows with a common prompt length: their loss on the full response mask,
    # normalised by the stage's copy length (the whole row) instead of their L1
    model, params = loaded
    ids, _ = rows(pads=(0, 0, 0, 0), resp_pads=(3, 0, 5, 4))
    model_t = port.TorchSDAR(sd, CFG)
    ext, p_mask, tok, labels, _ = port.masked_rows(
        torch.tensor(ids), np.ones((len(ids), L1), bool), L0, MASK, PAD, None)
    want = port.their_sft_loss(port.their_logp(model_t, ext, tok, labels, L0, BS, PAD),
                               p_mask, L1).item() * L1 / (L0 + L1)
    got, m = blockwise.sft_stage_loss(model, params, jnp.asarray(ids), jnp.full((4,), L0),
                                      jax.random.key(0), lower=1.0, upper=1.0, post_num=None,
                                      pad_id=PAD)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    assert float(m["masked_tokens"]) == L1
