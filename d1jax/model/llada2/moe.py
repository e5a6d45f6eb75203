"""LLaDA2's mixture-of-experts feed-forward: the router, the dropless grouped experts, expert
parallelism, and the router's metrics.

The computation is that of inclusionAI's ``modeling_llada2_moe.py`` (``LLaDA2MoeGate``,
``LLaDA2MoeSparseMoeBlock``; dFactory and the Hub releases compute the same):

- router logits in float32 (hidden and weight both cast), scores ``s = sigmoid(logits)``;
- selection on ``s + expert_bias`` (the bias of auxiliary-loss-free balancing picks experts,
  it never weighs them): experts split into ``n_group`` groups, a group scored by the sum of
  its two best biased scores, the ``topk_group`` best groups kept, then the top
  ``num_experts_per_tok`` experts among them;
- weights: the chosen experts' *unbiased* scores, renormalised to sum to 1 (when k > 1, with
  their 1e-20), times ``routed_scaling_factor``;
- output: the weighted sum of the chosen experts' SwiGLU outputs (summed in float32, as their
  ``moe_infer``), plus the shared experts' SwiGLU of the same input.

Routing replay (RL: the update routes as the old-policy pass did, the instability of MoE RL
when the two choose different experts): ``replay`` takes recorded ids in place of the
selection and weighs them as above by the current scores, so the router still gets a gradient.

Experts run dropless as one grouped matmul (``jax.lax.ragged_dot``): the (token, slot) rows
sorted by expert, each expert's rows multiplied by its own weights, then unsorted. No token is
ever dropped, so there is no capacity factor.

Expert parallelism: when the logical axis ``expert`` (``d1jax.sharding.EXPERT``) maps to a mesh
axis of size n > 1 under the active rules, the stacked expert weights [E, ...] are sharded on
it and the grouped matmul runs in a ``shard_map`` over that axis: each shard takes every token
of its (data-parallel) batch, runs only the rows routed to its E/n experts, and a ``psum`` over
the axis adds the shards' outputs (each row is nonzero on exactly one shard). Tokens stay as
the other axes shard them (the shard_map is manual over the expert axis only).

Shape letters: T tokens, D hidden, E experts, I expert width, K chosen experts per token.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from d1jax import sharding as shd

Array = jax.Array
F32 = jnp.float32


def route(x_td: Array, kernel_de: Array, bias_e: Array, *, top_k: int, n_group: int,
          topk_group: int, scaling: float) -> tuple[Array, Array, Array]:
    """(expert ids [T, K] int32, routing weights [T, K] float32, scores [T, E] float32) of
    LLaDA2's sigmoid router with group-limited top-k (module docstring)."""
    t = x_td.shape[0]
    e = kernel_de.shape[1]
    scores = jax.nn.sigmoid(jnp.matmul(x_td.astype(F32), kernel_de.astype(F32)))
    biased = scores + jax.lax.stop_gradient(bias_e.astype(F32))
    grouped = biased.reshape(t, n_group, e // n_group)
    group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [T, G]
    _, groups = jax.lax.top_k(group_score, topk_group)
    keep_g = jnp.zeros((t, n_group), bool).at[jnp.arange(t)[:, None], groups].set(True)
    keep = jnp.repeat(keep_g, e // n_group, axis=1)
    _, ids = jax.lax.top_k(jnp.where(keep, biased, -jnp.inf), top_k)
    return ids.astype(jnp.int32), gate_weights(scores, ids, scaling), scores


def gate_weights(scores_te: Array, ids_tk: Array, scaling: float) -> Array:
    """[T, K] float32: the chosen experts' unbiased scores, renormalised to sum to 1 (K > 1)
    and times ``scaling``; gradients reach the router through ``scores_te``."""
    w = jnp.take_along_axis(scores_te, ids_tk, axis=1)
    if ids_tk.shape[1] > 1:
        w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
    return w * scaling


def replay(ids_tk: Array, scores_te: Array, recorded_tk: Array, scaling: float
           ) -> tuple[Array, Array, Array]:
    """Routing replay: (the recorded experts [T, K] where a token has a record (ids >= 0;
    -1: none, its current ``ids_tk``), their ``gate_weights`` under the current scores,
    changed [T] bool: the token's current expert set differs from the recorded one)."""
    has = recorded_tk[:, :1] >= 0
    used = jnp.where(has, recorded_tk.astype(jnp.int32), ids_tk)
    missing = ~jnp.any(used[:, :, None] == ids_tk[:, None, :], axis=-1)  # [T, K]
    return used, gate_weights(scores_te, used, scaling), jnp.any(missing, axis=-1)


def grouped_experts(x_td: Array, ids_tk: Array, w_tk: Array, gate_edi: Array, up_edi: Array,
                    down_eid: Array, first: Array | int = 0) -> Array:
    """sum_k w[t, k] * SwiGLU_{ids[t, k]}(x[t]) over the experts first..first+E_local-1 held in
    the weights [E_local, ...] (rows routed elsewhere give 0): [T, D] in x's dtype."""
    t, k = ids_tk.shape
    n = gate_edi.shape[0]
    local = ids_tk.reshape(-1) - first
    group = jnp.where((local >= 0) & (local < n), local, n)  # n: another shard's expert
    order = jnp.argsort(group, stable=True)
    sizes = jnp.bincount(group, length=n + 1)[:n].astype(jnp.int32)
    rows = x_td[order // k]  # [T*K, D], sorted by expert
    dt = x_td.dtype
    h = (nn.silu(jax.lax.ragged_dot(rows, gate_edi.astype(dt), sizes))
         * jax.lax.ragged_dot(rows, up_edi.astype(dt), sizes))
    out = jax.lax.ragged_dot(h, down_eid.astype(dt), sizes)
    out = jnp.where((group[order] < n)[:, None], out, 0)  # rows past the groups: not ours
    back = out[jnp.argsort(order)].reshape(t, k, -1)
    return jnp.sum(back.astype(F32) * w_tk[..., None], axis=1).astype(dt)


def expert_mesh_axis() -> str | None:
    """The mesh axis the logical ``expert`` axis maps to under the active rules and mesh, if
    it has more than one device; else None (experts unsharded)."""
    spec = nn.logical_to_mesh_axes((shd.EXPERT,))
    axis = spec[0] if len(spec) else None
    if axis is None:
        return None
    if not isinstance(axis, str):
        raise ValueError(f"the expert axis maps to {axis!r}: expert parallelism takes one mesh "
                         f"axis (sharding rule ('expert', '<axis>'))")
    mesh = jax.sharding.get_abstract_mesh()
    size = dict(zip(mesh.axis_names, mesh.axis_sizes)).get(axis, 1) if mesh.axis_names else 1
    return axis if size > 1 else None


def experts_forward(x_td: Array, ids_tk: Array, w_tk: Array, gate_edi: Array, up_edi: Array,
                    down_eid: Array) -> Array:
    """``grouped_experts`` over every expert, in a shard_map over the expert mesh axis when
    there is one (module docstring). The shard_map's boundary is float32: the shards' partial
    outputs are added by a float32 ``psum`` and the input's cotangent summed over the axis in
    float32 (one rounding to the model dtype after the sum; and a bfloat16 ``psum`` inside a
    shard_map aborts XLA:CPU's compiler, jax 0.10.2: "Invalid binary instruction opcode
    copy"). A float32 model is unchanged."""
    axis = expert_mesh_axis()
    if axis is None:
        return grouped_experts(x_td, ids_tk, w_tk, gate_edi, up_edi, down_eid)
    dt = x_td.dtype

    def local(x, ids, w, g, u, d):
        first = jax.lax.axis_index(axis) * g.shape[0]
        part = grouped_experts(x.astype(dt), ids, w, g, u, d, first)
        return jax.lax.psum(part.astype(F32), axis)
    ex = P(axis)
    return jax.shard_map(local, in_specs=(P(), P(), P(), ex, ex, ex), out_specs=P(),
                         axis_names={axis}, check_vma=False)(
        x_td.astype(F32), ids_tk, w_tk, gate_edi, up_edi, down_eid).astype(dt)


def router_metrics(ids_tk: Array, scores_te: Array) -> dict[str, Array]:
    """Per layer: ``load`` [E], the share of (token, slot) assignments each expert got (sums to
    1; uniform is 1/E), and ``entropy``, the mean over tokens of the entropy (nats) of the
    scores normalised over the experts (log E when the router has no preference)."""
    e = scores_te.shape[1]
    load = jnp.bincount(ids_tk.reshape(-1), length=e).astype(F32) / ids_tk.size
    p = scores_te / jnp.sum(scores_te, axis=-1, keepdims=True)
    entropy = -jnp.mean(jnp.sum(p * jnp.log(jnp.maximum(p, 1e-30)), axis=-1))
    return {"load": jax.lax.stop_gradient(load), "entropy": jax.lax.stop_gradient(entropy)}


class Router(nn.Module):
    """The router's params: ``kernel`` [D, E] (their ``gate.weight`` transposed) and
    ``expert_bias`` [E] (their buffer; selection only, no gradient reaches it)."""

    n_experts: int
    init_std: float
    param_dtype: Any

    @nn.compact
    def __call__(self, width: int) -> tuple[Array, Array]:
        kernel = self.param("kernel", nn.with_logical_partitioning(
            nn.initializers.normal(self.init_std), (shd.EMBED, None)),
            (width, self.n_experts), self.param_dtype)
        bias = self.param("expert_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, (None,)), (self.n_experts,), F32)
        return kernel, bias


class Experts(nn.Module):
    """The routed experts' stacked SwiGLU weights ``gate_proj``/``up_proj`` [E, D, I] and
    ``down_proj`` [E, I, D] (dFactory's merged tensors with each matrix transposed)."""

    n_experts: int
    width: int
    hidden: int
    init_std: float
    param_dtype: Any

    @nn.compact
    def __call__(self) -> tuple[Array, Array, Array]:
        e, d, i = self.n_experts, self.width, self.hidden
        init = nn.initializers.normal(self.init_std)
        gate = self.param("gate_proj", nn.with_logical_partitioning(init, (shd.EXPERT, shd.EMBED, shd.MLP)),
                  (e, d, i), self.param_dtype)
        up = self.param("up_proj", nn.with_logical_partitioning(init, (shd.EXPERT, shd.EMBED, shd.MLP)),
                (e, d, i), self.param_dtype)
        down = self.param("down_proj", nn.with_logical_partitioning(init, (shd.EXPERT, shd.MLP, shd.EMBED)),
                  (e, i, d), self.param_dtype)
        return gate, up, down
