"""Sharding in one place: logical axis names, their mapping to mesh axes, meshes.

Model code names logical axes (``EMBED``, ``MLP``, ...). A table of rules, set from the
config, maps them onto the mesh axes ``data``, ``fsdp`` and ``tensor`` (and ``expert``, a
fourth axis for expert parallelism). Params are born
sharded: ``jax.eval_shape(init)`` -> logical specs -> ``NamedSharding`` ->
``jax.jit(init, out_shardings=...)``; ``abstract_params`` is the one probe of a model's
param shapes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

# Logical axes of parameters.
LAYERS = "layers"
VOCAB = "vocab"
EMBED = "embed"
Q_HEADS = "q_heads"
KV_HEADS = "kv_heads"
MLP = "mlp"
NORM = "norm"
LORA = "lora"
# The expert axis of a mixture-of-experts layer's stacked expert weights (LLaDA2). No default
# rule (an axis without a rule is unsharded, and recorded run specs stay as they are); a run
# with expert parallelism adds one mapping it to a mesh axis of its own, e.g.
# ("expert", "expert") on a mesh that has one (d1jax.model.llada2.moe).
EXPERT = "expert"
# Logical axes of activations.
BATCH = "batch"
LENGTH = "length"
ACT_EMBED = "act_embed"
ACT_MLP = "act_mlp"
ACT_VOCAB = "act_vocab"

MESH_AXES = ("data", "fsdp", "tensor")
# A fourth mesh axis, when a mesh shape has four entries: the experts' (expert parallelism;
# the run's rules then map EXPERT to it, d1jax.run.spec).
EXPERT_AXIS = "expert"

# FSDP over `fsdp` on the embed dimension, tensor parallelism over heads/mlp/vocab,
# batch over (data, fsdp). Override per run with config.sharding.rules.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    (BATCH, ("data", "fsdp")),
    (LENGTH, None),
    (ACT_EMBED, None),
    (ACT_MLP, "tensor"),
    (ACT_VOCAB, "tensor"),
    (LAYERS, None),
    (VOCAB, "tensor"),
    (EMBED, "fsdp"),
    (Q_HEADS, "tensor"),
    (KV_HEADS, "tensor"),
    (MLP, "tensor"),
    (NORM, None),
    (LORA, None),
)


def make_mesh(shape: Sequence[int] = (-1, 1, 1), axis_names: Sequence[str] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over all devices (all hosts) with Auto axis types (pjit-style sharding).

    One entry of ``shape`` may be -1: it takes the remaining devices. The product must
    equal the device count. ``axis_names`` default: ``MESH_AXES``, plus ``EXPERT_AXIS`` for a
    shape of four entries (data, fsdp, tensor, expert).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = list(shape)
    if axis_names is None:
        if len(shape) not in (3, 4):
            raise ValueError(f"mesh shape {tuple(shape)} needs 3 entries (data, fsdp, tensor) "
                             f"or 4 (data, fsdp, tensor, expert)")
        axis_names = MESH_AXES + ((EXPERT_AXIS,) if len(shape) == 4 else ())
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {tuple(shape)} has more than one -1")
    if -1 in shape:
        rest = int(np.prod([s for s in shape if s != -1]))
        if len(devices) % rest:
            raise ValueError(f"mesh shape {tuple(shape)} does not divide {len(devices)} devices")
        shape[shape.index(-1)] = len(devices) // rest
    if int(np.prod(shape)) != len(devices):
        raise ValueError(
            f"mesh shape {tuple(shape)} needs {int(np.prod(shape))} devices, have {len(devices)}")
    return jax.make_mesh(tuple(shape), tuple(axis_names), devices=devices,
                         axis_types=(AxisType.Auto,) * len(shape))


def logical_to_sharding(logical_tree: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """Maps a tree of logical PartitionSpecs (or boxed abstract params) to NamedShardings."""
    specs = nn.get_partition_spec(logical_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, list(rules))


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=DEFAULT_RULES) -> NamedSharding:
    """Sharding of an activation whose leading axis is the batch."""
    spec = nn.logical_to_mesh_axes((BATCH,) + (None,) * (ndim - 1), list(rules))
    return NamedSharding(mesh, spec)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


@contextlib.contextmanager
def activate(mesh: Mesh | None, rules=DEFAULT_RULES):
    """Context in which the model's logical activation constraints take effect."""
    if mesh is None:
        yield
        return
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        yield


def boxed_init(model: nn.Module, rng: jax.Array) -> Any:
    """``model.init`` on a [1, 8] batch of token ids: its params, each boxed with its logical
    axis names (``nn.Partitioned``). Param shapes do not depend on the batch."""
    return model.init(rng, jnp.zeros((1, 8), jnp.int32))["params"]


def abstract_params(model: nn.Module, *, boxed: bool = False) -> Any:
    """``model``'s params as ShapeDtypeStructs, computed without running the init: a plain
    tree, or with ``boxed`` the logical axis names kept (for ``logical_to_sharding``)."""
    abstract = jax.eval_shape(lambda k: boxed_init(model, k), jax.random.key(0))
    return abstract if boxed else nn.meta.unbox(abstract)


def param_shardings(model: nn.Module, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """NamedShardings of ``model``'s plain params, from its logical axis annotations."""
    return nn.meta.unbox(logical_to_sharding(abstract_params(model, boxed=True), mesh, rules))


def init_sharded(init_fn: Callable[..., Any], mesh: Mesh | None, *args, rules=DEFAULT_RULES):
    """Runs ``init_fn(*args)`` (returns boxed variables) so the result is born sharded.

    Returns (params as a plain pytree, their NamedShardings or None without a mesh).
    """
    if mesh is None:
        return nn.meta.unbox(jax.jit(init_fn)(*args)), None
    shardings = logical_to_sharding(jax.eval_shape(init_fn, *args), mesh, rules)
    with activate(mesh, rules):
        boxed = jax.jit(init_fn, out_shardings=shardings)(*args)
    return nn.meta.unbox(boxed), nn.meta.unbox(shardings)


def host_to_global(local: np.ndarray, mesh: Mesh, rules=DEFAULT_RULES) -> jax.Array:
    """This host's rows of a batch -> the global batch-sharded array (multi-host safe)."""
    return jax.make_array_from_process_local_data(batch_sharding(mesh, local.ndim, rules), local)


def global_to_host(x: jax.Array, mesh: Mesh, rules=DEFAULT_RULES) -> np.ndarray:
    """The rows of a batch-sharded global array that belong to this host (all rows on one)."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils
    spec = batch_sharding(mesh, x.ndim, rules).spec
    return np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, spec))


def gather_all(x: jax.Array) -> np.ndarray:
    """Every element of a (possibly multi-host) global array, on every host."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def gather_rows(local: np.ndarray) -> np.ndarray:
    """Concatenate every host's rows in process order (for metrics)."""
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(local, tiled=True))
