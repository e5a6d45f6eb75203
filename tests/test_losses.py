"""GRPO and SFT losses against independent numpy implementations of d1's formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import d1jax
from d1jax.objectives import losses
from d1jax.objectives import table
from d1jax.run import optim
from d1jax.train import jit_steps as steps_lib

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


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


def test_mu1_uses_detached_current_logps_and_dr_grpo_normaliser():
    logps, _, ref, adv, mask = _random(2)
    f = lambda lp, **kw: losses.grpo_loss(lp, None, jnp.array(ref), jnp.array(adv),
                                          jnp.array(mask), epsilon=0.2, beta=0.0, **kw)
    loss, m = f(jnp.array(logps, jnp.float32))
    assert float(m["ratio_min"]) == float(m["ratio_max"]) == 1.0 and float(m["clip_ratio"]) == 0
    np.testing.assert_allclose(float(loss), -(adv[:, None] * mask).sum() / mask.sum(), rtol=1e-5)
    # d1 with mu == 1: the gradient is -A / n per token (ratio 1, d ratio = ratio d logp).
    g = jax.grad(lambda lp: f(lp)[0])(jnp.array(logps, jnp.float32))
    np.testing.assert_allclose(np.asarray(g), -adv[:, None] * mask / mask.sum(), rtol=1e-5)
    loss_c, _ = f(jnp.array(logps, jnp.float32), max_tokens=100)
    np.testing.assert_allclose(float(loss_c), -(adv[:, None] * mask).sum() / 100, rtol=1e-5)


def test_clip_metrics_on_a_hand_case():
    # d1 (TRL of its day) counts is_clipped = ratio A < clip(ratio) A, the unclipped term
    # strictly smaller. Tokens: ratio e^0.5, A > 0 (1.65 > 1.2: not counted); e^-0.5, A > 0
    # (0.61 < 0.8: counted); e^0.5, A < 0 (-1.65 < -1.2: counted); a masked-out token.
    logps = jnp.array([[0.5, -0.5], [0.5, 3.0]])
    old = jnp.zeros((2, 2))
    adv = jnp.array([1.0, -1.0])
    mask = jnp.array([[1, 1], [1, 0]])
    _, m = losses.grpo_loss(logps, old, None, adv, mask, epsilon=0.2, beta=0.0)
    np.testing.assert_allclose(float(m["clip_ratio"]), 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(m["ratio_max"]), np.exp(0.5), rtol=1e-6)
    np.testing.assert_allclose(float(m["ratio_min"]), np.exp(-0.5), rtol=1e-6)
    np.testing.assert_allclose(float(m["ratio_mean"]), (2 * np.exp(0.5) + np.exp(-0.5)) / 3,
                               rtol=1e-6)
    with pytest.raises(ValueError, match="needs ref_logps"):
        losses.grpo_loss(logps, old, None, adv, mask, epsilon=0.2, beta=0.1)


def test_sft_loss_matches_numpy(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    rs = np.random.RandomState(0)
    ids = rs.randint(0, c.vocab_size - 4, (3, 12)).astype(np.int32)
    plen = np.array([3, 5, 0], np.int32)
    key = jax.random.key(4)
    loss, m = losses.sft_loss(tiny_model, tiny_params, ids, plen, key, seq_chunk=4)
    noisy, is_mask, t = (np.asarray(a) for a in losses.sft_noise(key, ids, plen, c.mask_token_id))
    assert not is_mask[np.arange(12)[None] < plen[:, None]].any()  # prompt never masked
    assert is_mask.any()
    np.testing.assert_array_equal(noisy, np.where(is_mask, c.mask_token_id, ids))
    logits = np.asarray(tiny_model.apply({"params": tiny_params}, noisy), np.float64)
    logits -= logits.max(-1, keepdims=True)
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -np.take_along_axis(lsm, ids[..., None], -1)[..., 0]
    want = (ce * is_mask / t[:, None]).sum() / (ids.size - plen.sum())
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    np.testing.assert_allclose(float(m["unscaled_loss"]), (ce * is_mask).sum() / is_mask.sum(),
                               rtol=1e-5)


def _np_ce(model, params, noisy, ids):
    """Cross-entropy [B, L] of ``ids`` under the full-sequence logits, float64 numpy."""
    logits = np.asarray(model.apply({"params": params}, noisy), np.float64)
    logits -= logits.max(-1, keepdims=True)
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(lsm, ids[..., None], -1)[..., 0]


@pytest.mark.parametrize("eps", [1e-3, 0.05])
def test_sft_mask_ratio_floor_and_inverse_t_weight_on_pinned_draws(tiny_model, tiny_params,
                                                                  tiny_config, monkeypatch, eps):
    """d1's forward_process and compute_loss with the draws pinned: u ~ U(0, 1) per row at
    0 and 1e-6 (where only the floor keeps t = (1 - eps) u + eps away from 0), 0.5 and just
    below 1; a token is masked when its own uniform draw is below t; loss = sum over masked
    tokens of CE / t, over the completion positions of the batch."""
    c = tiny_config
    b, l = 4, 10
    ids = np.random.RandomState(3).randint(0, c.vocab_size - 4, (b, l)).astype(np.int32)
    plen = np.array([2, 0, 3, 1], np.int32)
    u_b = np.array([0.0, 1e-6, 0.5, 1.0 - 2.0 ** -24], np.float32)
    # Per token: 0 (masked whenever t > 0), eps / 2 (masked iff t >= eps, the floor), 0.3 and
    # 0.7 (around t ~ 0.5), 0.999 (masked only when t ~ 1); away from every t boundary.
    pattern = np.array([0.0, eps / 2, 0.3, 0.7, 0.999], np.float32)
    u_bl = np.tile(pattern, (b, l // len(pattern)))
    real = jax.random.uniform

    def pinned(key, shape=(), dtype=jnp.float32, minval=0.0, maxval=1.0):
        for draw in (u_b, u_bl):
            if tuple(shape) == draw.shape and (minval, maxval) == (0.0, 1.0):
                return jnp.asarray(draw, dtype)
        return real(key, shape, dtype, minval, maxval)

    monkeypatch.setattr(jax.random, "uniform", pinned)
    loss, m = losses.sft_loss(tiny_model, tiny_params, ids, plen, jax.random.key(0), eps=eps)
    _, is_mask, t = (np.asarray(a) for a in losses.sft_noise(jax.random.key(0), ids, plen,
                                                              c.mask_token_id, eps))
    monkeypatch.undo()

    t_want = (1.0 - eps) * u_b.astype(np.float64) + eps
    mask_want = (u_bl < t_want[:, None]) & (np.arange(l)[None] >= plen[:, None])
    # Rows 0 and 1 (t = eps): the 0 and eps / 2 tokens of the completion; row 2: those and
    # the 0.3 ones; row 3 (t ~ 1): every completion token.
    assert mask_want.sum(1).tolist() == [2, 4, 3, 9]
    noisy = np.where(mask_want, c.mask_token_id, ids)
    ce = _np_ce(tiny_model, tiny_params, noisy, ids)
    n_completion = b * l - plen.sum()
    want = (ce * mask_want / t_want[:, None]).sum() / n_completion
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    np.testing.assert_allclose(float(m["unscaled_loss"]), (ce * mask_want).sum() / mask_want.sum(),
                               rtol=1e-5)
    np.testing.assert_allclose(float(m["mask_ratio"]), mask_want.sum() / n_completion, rtol=1e-6)
    np.testing.assert_allclose(t, t_want, rtol=1e-6)
    np.testing.assert_array_equal(is_mask, mask_want)


def test_tiny_model_overfits_eight_sequences():
    """Masked SFT through sft_update_step (AdamW, clipping): 8 random sequences memorised."""
    c = d1jax.preset("test-tiny", d_model=64, mlp_hidden_size=128)
    model = d1jax.LLaDA(c)
    params = d1jax.init_params(model, jax.random.key(0))
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=3e-3, weight_decay=0.0,
                                                 max_grad_norm=1.0))
    steps = steps_lib.make_jitted_steps(model, None, opt, lora=False, sft=table.SFTConfig())
    state = steps.init(params)
    ids = np.random.RandomState(1).randint(0, 100, (8, 16)).astype(np.int32)
    batch = {"input_ids": ids, "prompt_len": np.full(8, 4, np.int32)}
    first = None
    for i in range(500):
        state, m = steps.sft_update(state, batch, jax.random.key(i))
        first = float(m["loss"]) if first is None else first
    evaluate = jax.jit(lambda p, k: losses.sft_loss(model, p, ids, batch["prompt_len"], k)[0])
    evals = [float(evaluate(state.params, jax.random.key(10_000 + i))) for i in range(8)]
    # Memorised: the masked tokens' mean probability above 0.95 (from ~1/128 at the start).
    assert first > 3.0 and np.mean(evals) < 0.05, (first, evals)


def np_d1_device_means(logps, old, ref, adv, mask, eps, beta, rows_per_device):
    """d1's loss as its GPUs compute it: each device micro-batch of ``rows_per_device``
    contiguous rows (per_device_train_batch_size 6 = num_generations in d1's train.yaml:37,41,
    so one prompt's group) takes its own token mean (diffu_grpo_trainer.py:121); Trainer
    divides by the accumulation steps and DDP averages the devices: the mean of the blocks."""
    blocks = range(0, logps.shape[0], rows_per_device)
    return np.mean([np_grpo(*(x[i:i + rows_per_device] for x in (logps, old, ref, adv, mask)),
                            eps, beta)[0] for i in blocks])


def test_group_token_mean_is_d1s_per_device_mean_through_strided_micro_batches():
    """``GRPOConfig.norm_group``: the loss and its gradient, split into d1jax's strided
    micro-batches (grad_accum 2), equal d1's mean of per-device token means, while the
    batch-wide token mean differs (groups of very different completion lengths)."""
    g, groups, c = 3, 4, 8
    logps, old, ref, adv, mask = _random(seed=5, b=g * groups, lc=c)
    mask[:g] = 0
    mask[:g, :2] = 1  # group 0: short completions; its tokens weigh more per token in d1
    eps, beta = 0.2, 0.04
    want = np_d1_device_means(logps, old, ref, adv, mask, eps, beta, g)
    flat = np_grpo(logps, old, ref, adv, mask, eps, beta)[0]
    assert abs(want - flat) > 0.05 * abs(want)  # a case where the two normalisations differ

    cfg = table.GRPOConfig(num_iterations=2, beta=beta, epsilon=eps, norm_group=g)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    rows = table.GRPOBatch(
        prompt_ids=jnp.zeros((g * groups, 1), jnp.int32), prompt_mask=jnp.ones((g * groups, 1)),
        completion_ids=jnp.zeros((g * groups, c), jnp.int32), completion_mask=f32(mask),
        advantages=f32(adv), mask_seeds=None, old_logps=f32(old), ref_logps=f32(ref),
        per_row={"logps": f32(logps)})
    rows = table.with_group_tokens(cfg, rows)

    def loss_fn(shift, mb, i):  # logps + shift: d loss / d shift sums d loss / d logps
        return table._ratio_loss(cfg, mb.per_row["logps"] + shift, mb, None)

    loss, grad, _ = optim.accumulate_gradients(loss_fn, jnp.float32(0.0), rows, 2)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    h = 1e-5
    fd = (np_d1_device_means(logps + h, old, ref, adv, mask, eps, beta, g)
          - np_d1_device_means(logps - h, old, ref, adv, mask, eps, beta, g)) / (2 * h)
    assert float(grad) == pytest.approx(fd, rel=1e-4)
    # the switch: one token mean per micro-batch (norm_group None), as before
    step = table.GRPOConfig(num_iterations=2, beta=beta, epsilon=eps)
    one = table._ratio_loss(step, f32(logps), rows, None)[0]
    assert float(one) == pytest.approx(flat, rel=1e-5)
    with pytest.raises(ValueError, match="groups of 5"):
        losses.group_token_counts(f32(mask), 5)
