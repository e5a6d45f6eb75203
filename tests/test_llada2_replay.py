"""Routing replay on LLaDA2's MoE (d1jax/model/llada2/moe.py ``replay``, ``LLaDA2.hidden``'s
``routing``, EBPO's ``routing_replay`` knob): the old-policy pass records each MoE layer's
chosen experts and the update routes by them, weighing them by the current router.

The model checks use a random two-layer LLaDA2 (a dense then a MoE layer: 8 experts in 4
groups, 2 kept, k = 2), so the MoE's input does not depend on the routing and the current
router's choice under replay is the plain forward's. The MoE output is checked against a
numpy MoE (sigmoid scores, the recorded experts' scores renormalised and scaled, their
SwiGLUs) on the layer input the forward captured.
"""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.metrics import read_jsonl
from d1jax.objectives import ebpo, logprob
from d1jax.objectives.table import OBJECTIVES, GRPOConfig
from d1jax.train import pure_steps
from objective_checks import grpo_batch
from tests.learnable import MAIN
from tests.test_ebpo import tiny_llada2

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]


def forward(model, params, ids, routing=None):
    """(hidden [B, L, D], what the forward sowed and captured)."""
    h, sown = model.apply({"params": params}, ids, method=type(model).hidden,
                          mutable=["intermediates"], capture_intermediates=True,
                          routing=routing)
    return np.asarray(h), sown["intermediates"]


def numpy_routed(xn_td, kernel_de, gate, up, down, ids_tk, scaling):
    """sum_k w_k SwiGLU_{ids_k}(x), w the chosen experts' sigmoid scores renormalised to sum
    to 1 then scaled (LLaDA2MoeGate with top_k > 1), in float64."""
    x = np.asarray(xn_td, np.float64)
    scores = 1.0 / (1.0 + np.exp(-(x @ np.asarray(kernel_de, np.float64))))
    w = np.take_along_axis(scores, ids_tk, axis=1)
    w = w / w.sum(-1, keepdims=True) * scaling
    out = np.zeros_like(x)
    g, u, d = (np.asarray(a, np.float64) for a in (gate, up, down))
    for t in range(x.shape[0]):
        for k, e in enumerate(ids_tk[t]):
            a = x[t] @ g[e]
            out[t] += w[t, k] * ((a / (1.0 + np.exp(-a))) * (x[t] @ u[e])) @ d[e]
    return out


def test_replay_at_unchanged_params_is_the_plain_forward():
    """(a) Same params: replaying the recorded routes gives the plain forward bit for bit,
    no token changes experts; through EBPO, the old pass's routes picked by
    ``iteration_rows`` leave the loss as without replay."""
    model, params, _ = tiny_llada2()
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 120, (2, 12)))
    h, sown = forward(model, params, ids)
    rec = sown["moe_layers"]["router_ids"][0]
    h_rep, sown_rep = forward(model, params, ids, rec)
    np.testing.assert_array_equal(h_rep, h)
    assert float(sown_rep["moe_layers"]["router_changed"][0][0]) == 0.0

    rng = np.random.default_rng(1)
    b, c = 4, 8
    batch = grpo_batch(rng.integers(0, 120, (b, 5)), np.ones((b, 5), int),
                       rng.integers(0, 120, (b, c)), np.ones((b, c), np.int32),
                       np.array([1.0, -1.0, 0.5, -0.5]))
    on = GRPOConfig(objective="ebpo", beta=0.0, num_iterations=2,
                    hparams=ebpo.EBPOConfig(num_t=2, routing_replay=True))
    off = GRPOConfig(objective="ebpo", beta=0.0, num_iterations=2,
                     hparams=ebpo.EBPOConfig(num_t=2))
    entry, seeds = OBJECTIVES["ebpo"], jnp.asarray([3, 7], jnp.int32)
    lp, routes = jax.jit(lambda p: entry.logps(model, on, p, batch, seeds, True))(params)
    n = 5 + c + 2 * c  # the clean row, then N = 2 noised copies of the completion
    assert routes.shape == (2, b, 1, n, 2) and routes.dtype == jnp.int32
    batch = batch.replace(old_logps=lp, old_routing=routes, mask_seeds=seeds,
                          iteration=jnp.int32(1))
    seed_1, rows, _ = pure_steps.iteration_rows(on, None, batch)
    np.testing.assert_array_equal(rows.old_routing, routes[1])
    rows = entry.prepare(model, on, rows, logprob.mask_key(seed_1[0]))
    loss = jax.jit(lambda p, r, cfg: entry.loss(model, cfg, p, r, seed_1, None),
                   static_argnums=2)
    got, m = loss(params, rows, on)
    want, m_off = loss(params, rows.replace(old_routing=None), off)
    assert float(m["router_changed"]) == 0.0 and "router_changed" not in m_off
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    np.testing.assert_allclose(float(m["ratio_mean"]), 1.0, rtol=1e-5)


def test_replay_after_a_perturbation_uses_the_recorded_experts():
    """(b) Other params: the MoE output is the numpy MoE of the recorded experts (not of the
    current ones), and ``router_changed`` is the share of tokens whose current expert set
    differs from the recorded one, counted in numpy; the router still gets a gradient."""
    model, params, old = tiny_llada2()
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 120, (2, 12)))
    c = model.config
    _, sown_old = forward(model, old, ids)
    rec = np.asarray(sown_old["moe_layers"]["router_ids"][0])  # [1, B, L, K]
    _, sown_cur = forward(model, params, ids)
    cur = np.asarray(sown_cur["moe_layers"]["router_ids"][0])
    changed = np.mean([set(a) != set(r)
                       for a, r in zip(cur.reshape(-1, 2), rec.reshape(-1, 2))])
    assert 0.0 < changed < 1.0, changed  # some tokens, not all, route elsewhere

    _, sown = forward(model, params, ids, jnp.asarray(rec))
    np.testing.assert_allclose(float(sown["moe_layers"]["router_changed"][0][0]), changed,
                               rtol=1e-6)
    one = lambda name: np.asarray(sown["moe_layers"][name]["__call__"][0][0])  # noqa: E731
    routed = (np.asarray(sown["moe_layers"]["__call__"][0][0][0])
              - np.asarray(sown["dense_layers"]["__call__"][0][0][0])
              - one("dense") - one("shared_experts"))  # x + att + routed + shared
    xn = one("post_attention_layernorm").reshape(-1, c.hidden_size)
    p = params["moe_layers"]
    weights = [p["experts"][k][0] for k in ("gate_proj", "up_proj", "down_proj")]
    args = (xn, p["gate"]["kernel"][0], *weights)
    want = numpy_routed(*args, rec.reshape(-1, 2), c.routed_scaling_factor)
    np.testing.assert_allclose(routed.reshape(-1, c.hidden_size), want, atol=2e-5)
    other = numpy_routed(*args, cur.reshape(-1, 2), c.routed_scaling_factor)
    assert np.max(np.abs(other - want)) > 1e-3  # the current routes would give another output

    def router_grad(kernel):
        prm = {**params, "moe_layers": {**p, "gate": {**p["gate"], "kernel": kernel}}}
        return jnp.sum(model.apply({"params": prm}, ids, method=type(model).hidden,
                                   routing=jnp.asarray(rec)) ** 2)
    assert float(jnp.max(jnp.abs(jax.grad(router_grad)(p["gate"]["kernel"])))) > 0.0


def test_replay_off_is_the_old_code_path():
    """(c) Off (the default): the old pass returns log-probs only, the rollout carries no
    routes, the update logs the router's load and entropy but no ``router_changed``, and its
    loss is the plain composite forward's bit for bit."""
    model, params, old = tiny_llada2()
    rng = np.random.default_rng(2)
    b, c = 4, 8
    batch = grpo_batch(rng.integers(0, 120, (b, 5)), np.ones((b, 5), int),
                       rng.integers(0, 120, (b, c)), np.ones((b, c), np.int32),
                       np.array([1.0, -1.0, 0.5, -0.5]))
    cfg = GRPOConfig(objective="ebpo", beta=0.0, num_iterations=2,
                     hparams=ebpo.EBPOConfig(num_t=2))
    assert not cfg.hparams.routing_replay
    entry, seeds = OBJECTIVES["ebpo"], jnp.asarray([3, 7], jnp.int32)
    lp = jax.jit(lambda p: entry.logps(model, cfg, p, batch, seeds, True))(old)
    assert isinstance(lp, jax.Array) and lp.shape == (2, b, c)
    batch = batch.replace(old_logps=lp, mask_seeds=seeds, iteration=jnp.int32(1))
    seed_1, rows, _ = pure_steps.iteration_rows(cfg, None, batch)
    assert rows.old_routing is None
    rows = entry.prepare(model, cfg, rows, logprob.mask_key(seed_1[0]))
    got, m = jax.jit(lambda p: entry.loss(model, cfg, p, rows, seed_1, None))(params)
    assert "router_changed" not in m and {"router_entropy", "router_load_max"} <= set(m)

    def plain(p):  # equation (5)'s log-probs from copy_logps with no replay argument
        lp_cur = ebpo.elbo_logps(model, p, rows, rows.per_row["masked"], cfg.hparams)
        return ebpo.ebpo_objective(lp_cur, rows.old_logps, rows.advantages,
                                   rows.completion_mask.astype(bool), eps_low=0.2,
                                   eps_high=0.28)[0]
    assert float(got) == float(jax.jit(plain)(params))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_a_tiny_run_with_replay_logs_router_changed(tmp_path):
    """(d) ``python -m d1jax.main`` on configs/llada2/ebpo_math.py:tiny with replay on, on 8
    fake devices as data 2 x expert 4 and two micro-batches (the routes shard and split with
    their rows): the first update (the rollout's own policy, no recorded routes) changes
    none; the second, one AdamW step later, logs a share above 0."""
    wd = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-c", MAIN, "--config=configs/llada2/ebpo_math.py:tiny",
         f"--workdir={wd}", "--config.train.num_steps=2", "--config.train.export_hf=False",
         "--config.grpo.ebpo.routing_replay=True", "--config.mesh.shape=(2,1,1,4)",
         "--config.optim.grad_accum=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [x["step"] for x in rows] == [1, 2]
    assert rows[0]["router_changed"] == 0.0
    assert 0.0 < rows[1]["router_changed"] < 1.0 and np.isfinite(rows[1]["loss"])
    assert "router_entropy" in rows[1] and "router_load_max" in rows[1]
    # EBPO's mu = 2 (the config's): the first update is the rollout's policy, no KL term
    # (this run is also test_ebpo's run through the command)
    assert rows[0]["ratio_mean"] == 1.0, rows[0]
    assert "clip_ratio" in rows[1] and "kl" not in rows[0]


def test_diffu_grpo_logs_the_router_of_its_update_forward():
    """diffu-GRPO's update on LLaDA2 logs the router summary (``LLaDA2.step_metrics``) of the
    forward it differentiates, the one-step estimator's input (prompt, completion all masked),
    not of another input (the clean rows route otherwise); a model without experts logs none."""
    model, params, _ = tiny_llada2()
    rng = np.random.default_rng(4)
    b, p, c = 4, 5, 8
    prompt, comp = rng.integers(0, 120, (b, p)), rng.integers(0, 120, (b, c))
    pmask = np.ones((b, p), np.int32)
    pmask[1, :2] = 0
    rows = grpo_batch(prompt, pmask, comp, np.ones((b, c), np.int32),
                      np.array([1.0, -1.0, 0.5, -0.5]))
    cfg = GRPOConfig(objective="diffu_grpo", beta=0.0, num_iterations=1)
    seed_1 = jnp.asarray([5], jnp.int32)
    _, m = jax.jit(lambda q: OBJECTIVES["diffu_grpo"].loss(model, cfg, q, rows, seed_1, None))(
        params)

    def summary(ids):
        attn = np.concatenate([pmask, np.ones((b, c), np.int32)], axis=1)
        _, sown = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(attn),
                              method=type(model).hidden, mutable=["intermediates"])
        return {k: float(v) for k, v in model.step_metrics(sown["intermediates"]).items()}
    want = summary(np.concatenate([prompt, np.full((b, c), model.config.mask_token_id)], 1))
    assert set(want) == {"router_load_max", "router_load_min", "router_entropy"}
    for k, v in want.items():
        np.testing.assert_allclose(float(m[k]), v, rtol=1e-5, err_msg=k)
    clean = summary(np.concatenate([prompt, comp], 1))
    assert abs(clean["router_entropy"] - want["router_entropy"]) > 1e-4  # the check can tell

    from d1jax import LLaDA, init_params, preset
    dense = LLaDA(preset("test-tiny"))
    _, m = OBJECTIVES["diffu_grpo"].loss(dense, cfg, init_params(dense, jax.random.key(0)),
                                          rows, seed_1, None)
    assert not any(k.startswith("router") for k in m) and "clip_ratio" in m
