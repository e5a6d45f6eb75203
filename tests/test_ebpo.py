"""EBPO (d1jax/objectives/ebpo.py, the GRPO loop's "ebpo" objective) against a float64 numpy
port of the LLaDA2.1 tech report's equations (arXiv 2602.08676, section 3.2), written here
from the equations, not from the module:

(4)  J = E[ min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) ]
(5)  log rho ~= sum_n w_n sum_b [ log p(y_b | z_n, x; M) - log p_old(y_b | z_n, x; M) ]

with the choices the report leaves open as docs/objectives.md ("EBPO") states them: t_n on a
right Riemann grid, w_n = dt / t_n, log p(y_b | z_n) the sum over block b's masked tokens.
The model check scores each block by a forward of its own (prompt, the clean blocks before
it, then the noised block, a plain block-causal mask): the composite input's single forward
must give each block exactly that view. No authors' code is public to compare with.
"""


import jax
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import config as config_lib
from d1jax.config import ConfigError
from d1jax.model.llada2 import LLaDA2, preset
from d1jax.objectives import ebpo, logprob
from d1jax.objectives.table import OBJECTIVES, GRPOConfig
from d1jax.run import spec as spec_lib
from objective_checks import grpo_batch

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

EPS_LOW, EPS_HIGH = 0.2, 0.28


# ---------------------------------------------------------------------------- the port
def port_weights(num_t, t_min, t_max):
    """(t_n, w_n) float64: t_n = t_min + n dt, n = 1..N, dt = (t_max - t_min) / N; w_n = dt/t_n."""
    dt = (t_max - t_min) / num_t
    t = np.array([t_min + n * dt for n in range(1, num_t + 1)], np.float64)
    return t, dt / t


def port_log_rho(lp_cur, lp_old, masked, scored, w, block):
    """Equation (5) row by row, block by block: [B] float64."""
    b_rows, n_t, c = lp_cur.shape
    out = np.zeros(b_rows)
    for r in range(b_rows):
        for n in range(n_t):
            for start in range(0, c, block):
                keep = [i for i in range(start, min(start + block, c))
                        if masked[r, n, i] and scored[r, i]]
                block_cur = sum(float(lp_cur[r, n, i]) for i in keep)
                block_old = sum(float(lp_old[r, n, i]) for i in keep)
                out[r] += w[n] * (block_cur - block_old)
    return out


def port_loss(log_rho, adv):
    """-J of equation (4), the mean over rows, and each row's side: -1 clipped below, +1
    clipped above, 0 not clipped."""
    rho = np.exp(log_rho)
    unclipped = rho * adv
    clipped = np.clip(rho, 1 - EPS_LOW, 1 + EPS_HIGH) * adv
    side = np.where(clipped < unclipped, np.sign(adv), 0)
    return -np.mean(np.minimum(unclipped, clipped)), side


def port_grad(log_rho, adv, masked, scored, w):
    """d(-J)/d log p_theta(y_i | z_n): -A rho w_n / B on the rows the unclipped term wins."""
    rho = np.exp(log_rho)
    live = rho * adv <= np.clip(rho, 1 - EPS_LOW, 1 + EPS_HIGH) * adv
    g = -(live * adv * rho)[:, None, None] * w[None, :, None] / len(adv)
    return g * (masked & scored[:, None, :])


# ---------------------------------------------------------------------------- pure math
def test_equations_4_and_5_and_their_gradient_equal_the_float64_port():
    cfg = ebpo.EBPOConfig(num_t=3, t_min=0.1, t_max=0.9, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    rng = np.random.default_rng(0)
    b, c, block = 6, 10, 4  # a partial last block
    t, w = port_weights(3, 0.1, 0.9)
    masked = rng.random((b, 3, c)) < t[None, :, None]
    scored = np.arange(c)[None] < np.array([10, 7, 10, 3, 9, 10])[:, None]
    lp_old = np.log(rng.uniform(0.05, 1.0, (b, 3, c)))
    # rows 0, 1: rho far above 1; rows 2, 3: far below; rows 4, 5: near 1
    shift = np.array([0.15, 0.2, -0.15, -0.3, 0.01, -0.01])[:, None, None]
    lp_cur = lp_old + shift + 0.01 * rng.standard_normal((b, 3, c))
    adv = np.array([1.0, -0.5, -1.0, 0.7, 0.4, -0.3])  # above: clip, not; below: clip, not
    log_rho = port_log_rho(lp_cur, lp_old, masked, scored, w, block)
    want, side = port_loss(log_rho, adv)
    assert set(side) == {-1, 0, 1}, (log_rho, side)  # clipping active on both sides

    np.testing.assert_allclose(ebpo.timesteps(cfg)[1], w, rtol=1e-6)

    def loss(lp):
        cur = ebpo.elbo_token_logps(lp, jnp.asarray(masked), ebpo.timesteps(cfg)[1])
        old = ebpo.elbo_token_logps(jnp.asarray(lp_old, jnp.float32), jnp.asarray(masked),
                                    ebpo.timesteps(cfg)[1])
        return ebpo.ebpo_objective(cur, old, jnp.asarray(adv, jnp.float32),
                                   jnp.asarray(scored), eps_low=EPS_LOW, eps_high=EPS_HIGH)

    (got, metrics), grad = jax.value_and_grad(loss, has_aux=True)(
        jnp.asarray(lp_cur, jnp.float32))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), port_grad(log_rho, adv, masked, scored, w),
                               rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose([float(metrics["clip_low"]), float(metrics["clip_high"])],
                               [np.mean(side < 0), np.mean(side > 0)], rtol=1e-6)
    np.testing.assert_allclose(float(metrics["ratio_max"]), np.exp(log_rho).max(), rtol=1e-5)


def test_the_draw_masks_each_copy_at_its_timestep():
    cfg = ebpo.EBPOConfig(num_t=4)  # t = 1/4, 1/2, 3/4, 1
    t, w = ebpo.timesteps(cfg)
    np.testing.assert_allclose(w, [1, 1 / 2, 1 / 3, 1 / 4], rtol=1e-6)  # t_min 0: w_n = 1/n
    m = np.asarray(ebpo.draw_masks(jax.random.key(3), (64, 128), t))
    np.testing.assert_allclose(m.mean(axis=(0, 2)), t, atol=0.02)
    assert m[:, -1].all()  # t_N = 1: the last copy fully masked


# ---------------------------------------------------------------------------- on a model
def naive_block_logps(model, params, prompt, real_p, y, noised, block):
    """float64 [R, C] log p(y_i | its block's own view) of R noised copies (rows of
    ``noised``, completions ``y``): for each block, a forward of [prompt, clean blocks before
    it, the noised block] under the block-causal mask (blocks counted from the completion's
    start, padding keys never seen)."""
    (r, p), c = prompt.shape, y.shape[1]
    forward = jax.jit(lambda prm, ids, pos, mask: model.apply(
        {"params": prm}, model.apply({"params": prm}, ids, None, method=type(model).hidden,
                                     positions=pos, mask=mask, use_lora=False),
        method=type(model).logits))
    out = np.zeros((r, c))
    for start in range(0, c, block):
        stop = min(start + block, c)
        ids = np.concatenate([prompt, y[:, :start], noised[:, start:stop]], axis=1)
        real = np.concatenate([real_p, np.ones((r, stop), int)], axis=1).astype(bool)
        blk = (np.arange(ids.shape[1]) - p) // block
        mask = (blk[None, None, :] <= blk[None, :, None]) & real[:, None, :]
        pos = np.maximum(np.cumsum(real, axis=1) - 1, 0)
        logits = np.asarray(forward(params, jnp.asarray(ids), jnp.asarray(pos),
                                    jnp.asarray(mask)), np.float64)[:, p + start:]
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        out[:, start:stop] = np.take_along_axis(logp, y[:, start:stop, None], -1)[..., 0]
    return out


def tiny_llada2():
    """A random two-layer LLaDA2 (a dense and a MoE layer; block 4, mask id 127) and an old
    policy near it, weights drawn by shape in numpy (the MoE's jitted init costs seconds)."""
    model = LLaDA2(preset("llada2-tiny", num_hidden_layers=2))
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0),
                                          jnp.zeros((1, 8), jnp.int32))["params"])
    rng = np.random.default_rng(0)

    def draw(path, s, scale, around_one):  # norm weights near 1, the rest near 0
        one = around_one and jax.tree_util.keystr(path).endswith("['weight']")
        return jnp.asarray(one + scale * rng.standard_normal(s.shape), s.dtype)
    params = jax.tree_util.tree_map_with_path(lambda k, s: draw(k, s, 0.3, True), shapes)
    # small enough that the rows' log-ratios take both signs, large enough to clip
    old = jax.tree_util.tree_map_with_path(lambda k, s: draw(k, s, 0.02, False), shapes)
    return model, params, jax.tree.map(jnp.add, params, old)


def test_the_composite_input_loss_equals_the_port_on_per_block_forwards():
    """The record's old pass, draw and loss on a tiny LLaDA2: equal to equations (4)-(5) with
    each block's log-probs from its own forward."""
    model, params, old_params = tiny_llada2()
    rng = np.random.default_rng(1)
    b, p, c, block = 4, 5, 8, 4
    prompt = rng.integers(0, 120, (b, p))
    real_p = np.ones((b, p), int)
    real_p[1, :2] = real_p[3, :1] = 0  # left padding
    y = rng.integers(0, 120, (b, c))
    comp_mask = (np.arange(c)[None] < np.array([8, 6, 8, 5])[:, None]).astype(np.int32)
    h = ebpo.EBPOConfig(num_t=2, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    cfg = GRPOConfig(objective="ebpo", beta=0.0, num_iterations=2, hparams=h)
    entry = OBJECTIVES["ebpo"]
    batch = grpo_batch(prompt, real_p, y, comp_mask, np.zeros(b))
    seed = 7
    old_snc = jax.jit(lambda prm: entry.logps(model, cfg, prm, batch, jnp.asarray([seed]),
                                              True))(old_params)
    rows = entry.prepare(model, cfg, batch, logprob.mask_key(seed))
    masked = np.asarray(rows.per_row["masked"])

    _, w = port_weights(2, 0.0, 1.0)
    copies = np.where(masked, 127, y[:, None, :]).reshape(b * 2, c)  # [B N, C]
    lp = {name: naive_block_logps(model, prm, np.repeat(prompt, 2, 0), np.repeat(real_p, 2, 0),
                                  np.repeat(y, 2, 0), copies, block).reshape(b, 2, c)
          for name, prm in (("cur", params), ("old", old_params))}
    log_rho = port_log_rho(lp["cur"], lp["old"], masked, comp_mask.astype(bool), w, block)
    # A of rho's sign clips rows 0-2; row 3 has the other sign: the unclipped term wins
    adv = np.where(log_rho > 0, 1.0, -1.0) * np.array([0.5, 1.0, 1.5, -0.8])
    want, side = port_loss(log_rho, adv)
    assert set(side) == {-1, 0, 1}, (log_rho, side)  # clipping active on both sides

    rows = rows.replace(advantages=jnp.asarray(adv, jnp.float32), old_logps=old_snc[0])
    got, metrics = jax.jit(lambda prm, rw: entry.loss(model, cfg, prm, rw, jnp.asarray([seed]),
                                                      None))(params, rows)
    np.testing.assert_allclose(float(got), want, rtol=2e-4)
    np.testing.assert_allclose(float(metrics["clip_ratio"]), np.mean(side != 0))


# ---------------------------------------------------------------------------- the config
def test_config_knobs_beta_and_families():
    c = config_lib.grpo("letters", "tiny", objective="ebpo", checkpoint="llada2")
    assert c.grpo.beta == 0.0 and c.grpo.ebpo.num_t == 2  # no KL term; tiny N
    with c.unlocked():
        c.grpo.ebpo.eps_high = 0.3
    assert spec_lib.from_config(c).grpo.hparams == ebpo.EBPOConfig(num_t=2, eps_high=0.3)
    with c.unlocked():
        c.grpo.beta = 0.04
    with pytest.raises(ConfigError, match="EBPO .* has no KL term"):
        spec_lib.from_config(c)
    c = config_lib.grpo("letters", "tiny", objective="ebpo")  # LLaDA: no blocks
    with pytest.raises(ConfigError, match="objective 'ebpo' is not adapted to model family "
                                          "'llada' \\(it runs on sdar, llada2\\)"):
        spec_lib.from_config(c)


# EBPO through `python -m d1jax.main` on a tiny LLaDA2 (mu 2: the first update's ratio is
# 1): tests/test_llada2_replay.py's run (data 2 x expert 4, two micro-batches, replay on) and
# tests/test_llada2_runs.py's (stopped, resumed by the command, exported).
