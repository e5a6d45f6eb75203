"""Expert parallelism of LLaDA2's MoE (d1jax.model.llada2.moe) on 8 fake CPU devices: the
logits and the gradient of every param are the same with the experts on 1, 4 and 8 shards
of an ``expert`` mesh axis (the rest of the devices on ``data``), and the sharded runs go
through the shard_map over the expert axis with each device holding E/n experts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sharding as shd
from d1jax.model.llada2 import LLaDA2, preset
from d1jax.model.predictor import init_params

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

AXES = ("data", "fsdp", "tensor", "expert")
RULES = shd.DEFAULT_RULES + ((shd.EXPERT, "expert"),)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")


def _loss_and_grad(model, params, ids, mesh):
    """(logits, grads of a scalar of them) under ``mesh`` with the expert rule, params placed
    by their logical axes."""
    def loss(p):
        out = model.apply({"params": p}, ids)
        return jnp.sum(jnp.sin(out)), out
    with shd.activate(mesh, RULES):
        placed = jax.device_put(params, shd.param_shardings(model, mesh, RULES))
        step = jax.jit(jax.value_and_grad(loss, has_aux=True))
        (_, out), grads = step(placed)
        text = str(jax.make_jaxpr(jax.value_and_grad(loss, has_aux=True))(placed))
        experts = placed["moe_layers"]["experts"]["gate_proj"]
    return np.asarray(out), jax.tree.map(np.asarray, grads), text, experts


def test_expert_shards_do_not_change_numerics():
    config = preset("llada2-tiny", num_hidden_layers=1, first_k_dense_replace=0)  # one MoE layer
    model = LLaDA2(config)
    params = init_params(model, jax.random.key(0))
    # A sizable bias so that selection depends on it, as in the checkpoint tests.
    params["moe_layers"]["gate"]["expert_bias"] = 0.3 * jax.random.normal(
        jax.random.key(1), params["moe_layers"]["gate"]["expert_bias"].shape)
    ids = jax.random.randint(jax.random.key(2), (8, 8), 0, config.vocab_size)
    runs = {}
    for n in (1, 4, 8):
        mesh = shd.make_mesh((8 // n, 1, 1, n), AXES)
        out, grads, text, experts = _loss_and_grad(model, params, ids, mesh)
        assert ("shard_map" in text) == (n > 1), n
        local = experts.addressable_shards[0].data.shape
        assert local[1] == config.num_experts // n, (n, local)
        runs[n] = out, grads
    out1, g1 = runs[1]
    for n in (4, 8):
        np.testing.assert_allclose(runs[n][0], out1, rtol=1e-5, atol=1e-5)
        # float32 sums in another order (the psum over shards): 1e-5 of each param's scale
        jax.tree.map(lambda a, b: np.testing.assert_allclose(
            a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max()), runs[n][1], g1)
    # The expert weights get a gradient (the routed path is differentiated).
    assert np.abs(g1["moe_layers"]["experts"]["down_proj"]).max() > 0
    assert np.abs(g1["moe_layers"]["gate"]["kernel"]).max() > 0
    assert np.abs(g1["moe_layers"]["gate"]["expert_bias"]).max() == 0  # selection only


def test_bfloat16_experts_on_an_expert_axis_sum_in_float32():
    """A bfloat16 model on 4 expert shards compiles and runs (a bfloat16 ``psum`` in the
    shard_map aborted XLA:CPU's compiler) and equals the unsharded bfloat16 run to bfloat16's
    rounding: the shards' partial outputs are summed in float32, then rounded once."""
    config = preset("llada2-tiny", num_hidden_layers=1, first_k_dense_replace=0)
    model = LLaDA2(config, dtype=jnp.bfloat16)
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a,
                          init_params(model, jax.random.key(0)))
    params["moe_layers"]["gate"]["expert_bias"] = jnp.zeros_like(
        params["moe_layers"]["gate"]["expert_bias"], jnp.float32)  # a buffer stays float32
    ids = jax.random.randint(jax.random.key(2), (8, 8), 0, config.vocab_size)
    runs = {n: _loss_and_grad(model, params, ids, shd.make_mesh((8 // n, 1, 1, n), AXES))
            for n in (1, 4)}
    out1, out4 = (np.asarray(runs[n][0], np.float32) for n in (1, 4))
    assert "shard_map" in runs[4][2] and runs[4][0].dtype == jnp.bfloat16
    np.testing.assert_allclose(out4, out1, rtol=0.02, atol=0.02 * np.abs(out1).max())
    g1, g4 = (runs[n][1]["moe_layers"]["experts"]["down_proj"].astype(np.float32)
              for n in (1, 4))
    np.testing.assert_allclose(g4, g1, rtol=0.05, atol=0.02 * np.abs(g1).max())
