"""Sharding over 8 fake CPU devices: params placed as the logical rules say (at init, by
``param_shardings`` and by ``load_hf_checkpoint``), and a sharded forward equals one device;
the abstract-params probe against a real init."""

import math

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import d1jax
from d1jax import sharding
from d1jax.model import LoraConfig
from d1jax.model.llada import weights
from d1jax.model import lora as lora_lib

MESH_SHAPES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]  # (data, fsdp, tensor)
MESH_IDS = ["x".join(map(str, s)) for s in MESH_SHAPES]

# DEFAULT_RULES applied by hand to each param's logical axes: layers -> None, embed -> fsdp,
# q_heads / kv_heads / mlp / vocab -> tensor, norm -> None.
EXPECTED_SPECS = {
    "wte/embedding": P("tensor", "fsdp"),  # (vocab, embed)
    "ff_out/kernel": P("fsdp", "tensor"),  # (embed, vocab)
    "ln_f/weight": P(None),  # (norm,)
    "blocks/q_proj/kernel": P(None, "fsdp", "tensor"),  # (layers, embed, q_heads)
    "blocks/k_proj/kernel": P(None, "fsdp", "tensor"),  # (layers, embed, kv_heads)
    "blocks/v_proj/kernel": P(None, "fsdp", "tensor"),  # (layers, embed, kv_heads)
    "blocks/attn_out/kernel": P(None, "tensor", "fsdp"),  # (layers, q_heads, embed)
    "blocks/ff_proj/kernel": P(None, "fsdp", "tensor"),  # (layers, embed, mlp)
    "blocks/up_proj/kernel": P(None, "fsdp", "tensor"),  # (layers, embed, mlp)
    "blocks/ff_out/kernel": P(None, "tensor", "fsdp"),  # (layers, mlp, embed)
    "blocks/attn_norm/weight": P(None, None),  # (layers, norm)
    "blocks/ff_norm/weight": P(None, None),  # (layers, norm)
}


def by_name(tree):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(k.key for k in path): leaf for path, leaf in flat}


def assert_placed_by_the_rules(params, mesh):
    """Each param's spec is the table's, and each device holds the matching block."""
    arrays = by_name(params)
    assert set(arrays) == set(EXPECTED_SPECS)
    for name, arr in arrays.items():
        spec = EXPECTED_SPECS[name]
        assert arr.sharding.mesh == mesh and arr.sharding.spec == spec, name
        split = [math.prod(mesh.shape[a] for a in np.atleast_1d(ax)) if ax else 1 for ax in spec]
        block = tuple(n // s for n, s in zip(arr.shape, split + [1] * (arr.ndim - len(split))))
        assert all(s.data.shape == block for s in arr.addressable_shards), name


@pytest.fixture(scope="module")
def batch():
    """8 sequences (some left-padded) and their logits on one device."""
    rs = np.random.RandomState(0)
    ids = rs.randint(0, 128, (8, 12))
    mask = np.ones((8, 12), np.int32)
    mask[::3, :5] = 0
    return ids, mask


@pytest.fixture(scope="module")
def single_device_logits(tiny_model, tiny_params, batch):
    ids, mask = batch
    return np.asarray(jax.jit(lambda p: tiny_model.apply({"params": p}, ids, mask))(tiny_params))


@pytest.mark.parametrize("shape", MESH_SHAPES, ids=MESH_IDS)
def test_param_shardings_follow_the_rules(shape, tiny_model, tiny_params):
    mesh = sharding.make_mesh(shape)
    placed = jax.device_put(tiny_params, sharding.param_shardings(tiny_model, mesh))
    assert_placed_by_the_rules(placed, mesh)


@pytest.mark.parametrize("shape", MESH_SHAPES, ids=MESH_IDS)
def test_init_params_are_born_sharded_by_the_rules(shape, tiny_model, tiny_params):
    mesh = sharding.make_mesh(shape)
    params = d1jax.init_params(tiny_model, jax.random.key(0), mesh)
    assert_placed_by_the_rules(params, mesh)
    # Same key, same values as the single-device init (partitionable random bits).
    jax.tree.map(np.testing.assert_array_equal, params, tiny_params)


def test_abstract_params_have_the_initialised_shapes(tiny_config):
    model = d1jax.LLaDA(tiny_config, lora=LoraConfig(rank=4))
    real = d1jax.init_params(model, jax.random.key(0))
    abstract = sharding.abstract_params(model)
    assert jax.tree.structure(abstract) == jax.tree.structure(real)
    for a, r in zip(jax.tree.leaves(abstract), jax.tree.leaves(real)):
        assert isinstance(a, jax.ShapeDtypeStruct) and (a.shape, a.dtype) == (r.shape, r.dtype)


def test_adapters_only_init_is_the_full_inits_adapters_born_sharded(tiny_config):
    model = d1jax.LLaDA(tiny_config, lora=LoraConfig(rank=4))
    mesh = sharding.make_mesh((2, 2, 2))
    full = d1jax.init_params(model, jax.random.key(1))
    only = by_name(d1jax.init_params(model, jax.random.key(1), mesh, adapters_only=True))
    want = by_name(lora_lib.split(full)[1])
    assert set(only) == set(want) and all(n.endswith(("lora_a", "lora_b")) for n in only)
    specs = by_name(sharding.param_shardings(model, mesh))
    for name, arr in only.items():
        np.testing.assert_array_equal(arr, want[name])
        assert arr.sharding.spec == specs[name].spec, name


@pytest.mark.parametrize("shape", MESH_SHAPES, ids=MESH_IDS)
def test_sharded_forward_equals_single_device(shape, tiny_model, tiny_params, batch,
                                              single_device_logits):
    mesh = sharding.make_mesh(shape)
    params = jax.device_put(tiny_params, sharding.param_shardings(tiny_model, mesh))
    ids, mask = (jax.device_put(x, sharding.batch_sharding(mesh)) for x in batch)
    with sharding.activate(mesh):
        logits = jax.jit(lambda p, x, m: tiny_model.apply({"params": p}, x, m))(params, ids, mask)
    np.testing.assert_allclose(np.asarray(logits), single_device_logits, atol=1e-5)
    # The activation constraints took effect: batch over data x fsdp, vocab over tensor.
    want = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
    assert logits.sharding.is_equivalent_to(want, logits.ndim)


@pytest.mark.parametrize("shape", MESH_SHAPES, ids=MESH_IDS)
def test_load_hf_checkpoint_places_params_by_the_rules(shape, tmp_path, tiny_config, tiny_params):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params)
    mesh = sharding.make_mesh(shape)
    _, params = weights.load_hf_checkpoint(tmp_path, mesh=mesh)
    assert_placed_by_the_rules(params, mesh)
    jax.tree.map(np.testing.assert_array_equal, params, tiny_params)


def test_make_mesh_fills_in_minus_one():
    mesh = sharding.make_mesh((-1, 2, 1))
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}


@pytest.mark.parametrize("shape,message", [
    ((3, 2, 2), r"mesh shape \(3, 2, 2\) needs 12 devices, have 8"),
    ((-1, -1, 1), r"mesh shape \(-1, -1, 1\) has more than one -1"),
    ((-1, 3, 1), r"mesh shape \(-1, 3, 1\) does not divide 8 devices"),
])
def test_make_mesh_refuses_shapes_that_do_not_fit(shape, message):
    with pytest.raises(ValueError, match=message):
        sharding.make_mesh(shape)
