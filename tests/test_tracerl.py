"""TraceRL (d1jax/objectives/tracerl.py, the GRPO loop's "tracerl" objective) against a
float64 torch port of Gen-Verse/dLLM-RL ``train/rl_sdar.py`` / ``train_sdar_policy.py``
(tests/dllm_rl_port.py): their rows built from the rollout's trace (collapse_k_unique,
one_round_vectorized, post_num), their old log-probs, their forward_process loss, on a tiny
random SDAR model with the same weights; loss and every gradient compared."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.objectives import advantages as adv_lib
from d1jax.objectives import tracerl
from d1jax.objectives.table import OBJECTIVES, GRPOConfig
from objective_checks import grpo_batch
from test_blockwise import BS, L0, L1, MASK, PAD, compare_grads, loaded, rows, sd  # noqa: F401

torch = pytest.importorskip("torch")
import dllm_rl_port as port  # noqa: E402

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def their_collapse_rounds(step_map, bs, shrink):
    """Rounds as their loop assigns them: the rows one_round_vectorized emits, in order."""
    ids = torch.zeros(1, len(step_map), dtype=torch.long)
    out = -np.ones(len(step_map), int)
    sm = list(step_map)
    for j in range((len(sm) - 1) // bs + 1):
        sm[j * bs:(j + 1) * bs] = port.collapse_k_unique(sm[j * bs:(j + 1) * bs], shrink)
    step, r = torch.as_tensor(sm), 0
    while (o := port.one_round(ids[0], step, 0, len(sm), bs, MASK)) is not None:
        out[o[1].numpy()] = r
        step, r = o[2], r + 1
    return out


def traces(n, seed=0):
    """Block-sampler-like traces [n, L1]: steps rising block by block with ties, -1 past the
    stop (the rows' response padding)."""
    rng = np.random.default_rng(seed)
    resp_pads = (3, 0, 5, 4)
    out = np.zeros((n, L1), np.int32)
    for b in range(n):
        steps = np.sort(rng.integers(0, 3 * L1 // 2, L1))
        out[b] = rng.permutation(steps.reshape(-1, 2)).reshape(-1) if b % 2 else steps
        if resp_pads[b]:
            out[b, -resp_pads[b]:] = -1
    return out


@pytest.mark.parametrize("shrink", [1, 2, 3])
def test_rounds_are_their_collapse_and_one_round(shrink):
    dec = traces(4)
    mine = np.asarray(tracerl.trace_rounds(jnp.asarray(dec), BS, shrink))
    for b in range(4):
        sm = np.where(dec[b] < 0, dec[b].max() + 1, dec[b])
        np.testing.assert_array_equal(mine[b], their_collapse_rounds(sm.tolist(), BS, shrink))
    assert mine.max() < tracerl.num_rounds(tracerl.TraceRLConfig(shrink=shrink), BS)


def _grads_and_loss(model, params, cfg, batch):
    o = OBJECTIVES["tracerl"]
    prepared = o.prepare(model, cfg, batch, jax.random.key(5))  # the trace draws nothing

    def loss_of(p):
        return o.loss(model, cfg, p, prepared, jnp.zeros((1,), jnp.int32), None)
    (loss, m), g = jax.jit(jax.value_and_grad(loss_of, has_aux=True))(params)
    return float(loss), m, g, prepared


def _trace_parity(loaded, sd, shrink, post_num, beta, adv):
    """(d1jax loss, metrics, prepared rows; their loss, p_mask, old and new log-probs,
    source rows) on the trace of ``rows()``, their grads backpropagated into ``model_t``.
    Their rows are built from the completions with A != 0 only: a group dLLM-RL's
    rl_reward.py drops never reaches their training data."""
    model, params = loaded
    ids, pm = rows()
    dec = traces(len(ids))
    kept = np.flatnonzero(adv != 0)
    # theirs: rows from the trace, old log-probs off the current ones (ratios clip)
    model_t = port.TorchSDAR(sd, model.config)
    step_maps = [np.where(d < 0, d.max() + 1, d).tolist() for d in dec]
    ext, p_mask, tok, labels, src = port.trace_rows(torch.tensor(ids[kept]),
                                                    [step_maps[b] for b in kept], L0, BS,
                                                    shrink, MASK, PAD, post_num)
    src = kept[src]
    with torch.no_grad():
        lp0 = port.their_logp(model_t, ext, tok, labels, L0, BS, PAD)
    old = lp0 + torch.tensor(np.random.default_rng(2).normal(0, 0.3, lp0.shape))
    new = port.their_logp(model_t, ext, tok, labels, L0, BS, PAD)
    want = port.their_rl_loss(new, old, p_mask, adv[src].astype(np.float64), L1, beta=beta)
    want.backward()
    # the same old log-prob per token, [B, C]: each token is scored in one row; the dropped
    # completions' old log-probs are the current ones shifted too, so their KL is not 0
    old_bc = np.asarray(np.random.default_rng(3).normal(0, 0.3, (len(ids), L1)), np.float32)
    for k, b in enumerate(src):
        sel = p_mask[k, L0:].numpy()
        old_bc[b, sel] = old[k, L0:].numpy()[sel]
    h = tracerl.TraceRLConfig(shrink=shrink, post_num=post_num, beta=beta)
    cfg = GRPOConfig(objective="tracerl", num_iterations=1, beta=0.0, epsilon=0.2, hparams=h)
    batch = grpo_batch(ids[:, :L0], pm, ids[:, L0:], np.ones((len(ids), L1)), adv).replace(
        per_row={"decoded_at": jnp.asarray(dec)}, old_logps=jnp.asarray(old_bc))
    loss, m, grads, prepared = _grads_and_loss(model, params, cfg, batch)
    diff, scale = compare_grads(grads, model_t, model.config)
    print(f"TraceRL shrink={shrink} post_num={post_num} beta={beta} A={adv.astype(float).round(2).tolist()}: "
          f"{len(src)} rows; loss {loss:.8g} vs {want.item():.8g} (abs diff "
          f"{abs(loss - want.item()):.2g}); grad max abs diff {diff:.2g} (max |grad| "
          f"{scale:.2g}); clip_ratio {float(m['clip_ratio']):.2f}")
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5, atol=1e-7)
    assert diff < 1e-5 * max(scale, 1.0)
    return m, prepared, (p_mask, old, new, src)


@pytest.mark.parametrize("shrink,post_num,beta", [(1, 0, 0.01), (2, None, 0.01), (1, 2, 0.0)])
def test_loss_and_grads_match_their_forward_process(loaded, sd, shrink, post_num, beta):
    adv = np.array([1.2, -0.7, 0.4, -1.1], np.float32)
    m, _, _ = _trace_parity(loaded, sd, shrink, post_num, beta, adv)
    assert 0 < float(m["clip_ratio"]) < 1


@pytest.mark.parametrize("adv", [[0.0, 0.0, 1.0, -1.0], [1.0, 0.0, 0.0, -1.0]],
                         ids=["first_group_dropped", "middle_rows_dropped"])
def test_dropped_groups_are_left_out_as_their_filter_leaves_them(loaded, sd, adv):
    """Completions of a dropped group (A = 0, zscore_filtered) with the KL to the old policy
    on: loss and grads are their forward_process on the kept completions' rows alone; the
    per-row scale is B / (C n_rows) with their row count; the tokens scored, and the KL
    metric, are theirs."""
    adv = np.array(adv, np.float32)
    m, prepared, (p_mask, old, new, src) = _trace_parity(loaded, sd, 1, 0, 0.01, adv)
    b = len(adv)
    np.testing.assert_allclose(np.asarray(prepared.per_row["scale"]),
                               np.full(b, b / (L1 * len(src))), rtol=1e-6)
    n_tokens = int(p_mask.sum())
    np.testing.assert_allclose(float(m["scored_tokens"]), n_tokens / b, rtol=1e-6)
    d = torch.where(p_mask, new - old, torch.zeros_like(new)).detach()
    kl = ((-d).clamp(-10, 10).exp() - 1.0 + d)[p_mask].sum().item() / n_tokens
    np.testing.assert_allclose(float(m["kl"]), kl, rtol=1e-5)


@pytest.mark.parametrize("method", ["random_masking", "coupled"])
def test_random_variants_match_their_rows(loaded, sd, method):
    """random_masking / coupled: the draw made by prepare, handed to their rows."""
    model, params = loaded
    ids, pm = rows()
    adv = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    h = tracerl.TraceRLConfig(method=method, beta=0.01)
    cfg = GRPOConfig(objective="tracerl", num_iterations=1, beta=0.0, epsilon=0.2, hparams=h)
    batch = grpo_batch(ids[:, :L0], pm, ids[:, L0:], np.ones((len(ids), L1)), adv)
    loss, _, grads, prepared = _grads_and_loss(model, params, cfg, batch)
    rnd = np.asarray(prepared.per_row["round"])
    first = rnd == 0  # the draw; the second copy of coupled is its complement, built here
    assert set(np.unique(rnd)) <= ({0, 1} if method == "coupled" else {0, -1})
    tails = [first] + ([~first] if method == "coupled" else [])
    model_t = port.TorchSDAR(sd, model.config)
    ext, p_mask, tok, labels, keep = port.masked_rows(
        torch.tensor(np.concatenate([ids] * len(tails))), np.concatenate(tails), L0, MASK, PAD, 0)
    src = np.tile(np.arange(len(ids)), len(tails))[keep.numpy()]
    new = port.their_logp(model_t, ext, tok, labels, L0, BS, PAD)
    want = port.their_rl_loss(new, new.detach(), p_mask, adv[src].astype(np.float64), L1)
    want.backward()
    diff, scale = compare_grads(grads, model_t, model.config)
    print(f"{method}: loss {loss:.8g} vs {want.item():.8g}; grad max abs diff {diff:.2g}")
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5, atol=1e-7)
    assert diff < 1e-5 * max(scale, 1.0)


def test_zscore_filtered_advantages_are_their_normalisation():
    r = np.array([1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0], np.float32)  # G = 4
    got = adv_lib.compute("zscore_filtered", r, 4)
    z = (r[:4] - 0.5) / 0.5
    np.testing.assert_allclose(got[:4], z)
    assert not got[4:8].any() and not got[12:].any()  # 1.0 > 0.8; 0.0 < 0.2
    np.testing.assert_allclose(got[8:12], (r[8:12] - 0.25) / np.sqrt(0.1875))


def test_config_refuses_a_reference_beta():
    with pytest.raises(ValueError, match="old policy"):
        GRPOConfig(objective="tracerl", beta=0.04)
