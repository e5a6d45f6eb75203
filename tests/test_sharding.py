"""Sharded forward over 8 fake devices equals one device; params sharded as the rules say."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import d1jax
from d1jax import sharding, weights

# What DEFAULT_RULES give each param (leading None: the scanned layers axis).
EXPECTED = {
    ("wte", "embedding"): P("tensor", "fsdp"),
    ("ff_out", "kernel"): P("fsdp", "tensor"),
    ("ln_f", "weight"): P(None),
    ("blocks", "q_proj", "kernel"): P(None, "fsdp", "tensor"),
    ("blocks", "k_proj", "kernel"): P(None, "fsdp", "tensor"),
    ("blocks", "v_proj", "kernel"): P(None, "fsdp", "tensor"),
    ("blocks", "attn_out", "kernel"): P(None, "tensor", "fsdp"),
    ("blocks", "ff_proj", "kernel"): P(None, "fsdp", "tensor"),
    ("blocks", "up_proj", "kernel"): P(None, "fsdp", "tensor"),
    ("blocks", "ff_out", "kernel"): P(None, "tensor", "fsdp"),
    ("blocks", "attn_norm", "weight"): P(None, None),
    ("blocks", "ff_norm", "weight"): P(None, None),
}


def _specs(params):
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {tuple(k.key for k in path): leaf.sharding.spec for path, leaf in flat}


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2), (1, 2, 4)])
def test_sharded_forward_equals_single_device(shape, tiny_model, tiny_params):
    mesh = sharding.make_mesh(shape)
    sp = d1jax.init_params(tiny_model, jax.random.key(0), mesh)
    assert _specs(sp) == EXPECTED
    ids = np.random.RandomState(0).randint(0, 100, (8, 12))
    mask = np.ones((8, 12), np.int32)
    mask[::3, :5] = 0
    want = np.asarray(tiny_model.apply({"params": tiny_params}, ids, mask))
    fwd = jax.jit(lambda p, x, m: tiny_model.apply({"params": p}, x, m))
    with sharding.activate(mesh):
        got = fwd(sp, jax.device_put(ids, sharding.batch_sharding(mesh)),
                  jax.device_put(mask, sharding.batch_sharding(mesh)))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    assert got.addressable_shards[0].data.shape[0] == 8 // dp  # batch split over data x fsdp


def test_checkpoint_loads_onto_the_mesh(tmp_path, tiny_params, tiny_config):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params)
    _, params = weights.load_hf_checkpoint(tmp_path, mesh=sharding.make_mesh((2, 2, 2)))
    assert _specs(params) == EXPECTED
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(tiny_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_make_mesh_errors():
    with pytest.raises(ValueError, match="needs 12 devices, have 8"):
        sharding.make_mesh((3, 2, 2))
    with pytest.raises(ValueError, match="more than one -1"):
        sharding.make_mesh((-1, -1, 1))
    assert sharding.make_mesh((-1, 2, 1)).shape == {"data": 4, "fsdp": 2, "tensor": 1}
