"""Softmax attention of LLaDA's bidirectional blocks, full and over a KV cache.

Scores and softmax statistics are float32 whatever the compute dtype; grouped-query heads
(N a multiple of K) share their kv head. Heads go in front, [B, K, G*Q, H] against
[B, K, L, H], so that both products are plain batched matmuls: XLA:CPU runs an einsum
whose batch axes sit between the others as a slow generic loop (on bench-tiny 2.7x slower
forward and 2x slower gradient than this layout). The softmax is normalised after the value
product, as flash attention does: one divide per output element instead of one per score.
A row whose keys are all masked gives 0.

A per-query mask may also be a ``RowMask``: rows built on demand from per-position facts, so
that attention runs ``query_chunk`` query rows at a time, each chunk's mask and float32 scores
built, used and (under the gradient) rebuilt alone: memory of one chunk's [Q_c, L] scores
instead of the whole [Q, L] (block diffusion's training layout of TraDo-8B at 10.8k tokens
would hold ~15 GB of float32 scores per row, 32 heads of [N, N], otherwise).

Shape letters: B batch, Q query rows, L keys, S keys of a second set, N query heads,
K kv heads, G = N / K, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
F32 = jnp.float32


def _queries(q_bqnh: Array, k: int) -> Array:
    """[B, Q, N, H] -> [B, K, G*Q, H] (the G query heads of a kv head stacked on rows)."""
    b, q, n, h = q_bqnh.shape
    return q_bqnh.reshape(b, q, k, n // k, h).transpose(0, 2, 3, 1, 4).reshape(b, k, -1, h)


def _scores(q_bkmh: Array, k_blkh: Array, mask: Array | None, scale: float) -> Array:
    """float32 scores [B, K, G*Q, L], -inf where ``mask`` is 0: a key mask [B, L], or a
    per-query one [B or 1, Q, L] (each of a kv head's G query heads reads its query's row)."""
    s = jnp.matmul(q_bkmh, k_blkh.transpose(0, 2, 3, 1), preferred_element_type=F32) * scale
    if mask is None:
        return s
    if mask.ndim == 2:
        return jnp.where(mask[:, None, None, :].astype(bool), s, -jnp.inf)
    b, q, l = mask.shape
    g = s.shape[2] // q
    rows = jnp.broadcast_to(mask.astype(bool)[:, None, None], (b, 1, g, q, l))
    return jnp.where(rows.reshape(b, 1, g * q, l), s, -jnp.inf)


def _values(p_bkml: Array, v_blkh: Array) -> Array:
    """Unnormalised output [B, K, G*Q, H] (float32) of weights over the keys' values."""
    return jnp.matmul(p_bkml.astype(v_blkh.dtype), v_blkh.transpose(0, 2, 1, 3),
                      preferred_element_type=F32)


def _output(out_bkmh: Array, q_bqnh: Array) -> Array:
    """[B, K, G*Q, H] -> [B, Q, N, H] in the queries' dtype."""
    b, q, n, h = q_bqnh.shape
    k = out_bkmh.shape[1]
    out = out_bkmh.reshape(b, k, n // k, q, h).transpose(0, 3, 1, 2, 4).reshape(b, q, n, h)
    return out.astype(q_bqnh.dtype)


def _row_max(*scores: Array) -> Array:
    """Softmax shift [B, K, G*Q, 1]: the row max over every key set, 0 for an all-masked
    row (its output is then 0); no gradient flows through it."""
    top = jax.lax.stop_gradient(
        jnp.max(jnp.stack([jnp.max(s, axis=-1) for s in scores]), axis=0))[..., None]
    return jnp.where(jnp.isfinite(top), top, 0.0)


class RowMask:
    """A per-query mask [B, Q, L] that is never held whole: ``rows(start, size)`` builds
    rows start:+size (bool [B, size, L]; rows past Q may repeat the last one, they are
    dropped). A subclass is a pytree (it rides through the layer scan) whose
    ``query_chunk`` (static) is the rows attention takes at a time."""

    query_chunk: int

    def rows(self, start: Array | int, size: int) -> Array:
        raise NotImplementedError


def _attention_by_rows(q_bqnh: Array, k_blkh: Array, v_blkh: Array, mask: RowMask,
                       scale: float) -> Array:
    """``attention`` under a ``RowMask``, ``mask.query_chunk`` query rows at a time (the
    last chunk padded); each chunk rematerialised, so its scores are never kept."""
    b, q, n, h = q_bqnh.shape
    c = max(1, min(mask.query_chunk, q))
    m = -(-q // c)
    if m == 1:
        return attention(q_bqnh, k_blkh, v_blkh, mask.rows(0, q), scale)
    q_mbcnh = jnp.pad(q_bqnh, ((0, 0), (0, m * c - q), (0, 0), (0, 0))).reshape(
        b, m, c, n, h).swapaxes(0, 1)

    @jax.checkpoint
    def chunk(args):
        i, q_c = args
        return attention(q_c, k_blkh, v_blkh, mask.rows(i * c, c), scale)

    out = jax.lax.map(chunk, (jnp.arange(m), q_mbcnh))  # [M, B, C, N, H]
    return out.swapaxes(0, 1).reshape(b, m * c, n, h)[:, :q]


def attention(q_bqnh: Array, k_blkh: Array, v_blkh: Array, mask: Array | RowMask | None,
              scale: float) -> Array:
    """Softmax attention [B, Q, N, H] over keys [B, L, K, H]: bidirectional with padding
    keys ignored (``mask`` a key mask [B, L], 0 at padding), or under a per-query mask
    [B or 1, Q, L] (block-causal, SDAR's), or a ``RowMask`` (in query chunks)."""
    if isinstance(mask, RowMask):
        return _attention_by_rows(q_bqnh, k_blkh, v_blkh, mask, scale)
    s = _scores(_queries(q_bqnh, k_blkh.shape[2]), k_blkh, mask, scale)
    p = jnp.exp(s - _row_max(s))
    den = jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
    return _output(_values(p, v_blkh) / den, q_bqnh)


def attend_two_part(q_bqnh: Array, k1_blkh: Array, v1_blkh: Array, mask1_bl: Array,
                    k2_bskh: Array, v2_bskh: Array, mask2_bs: Array | None,
                    scale: float) -> Array:
    """Softmax attention over two key sets at once, as if concatenated: [B, Q, N, H].

    Lets cached steps attend to a big cache (its stale part masked out by ``mask1``) and to
    fresh keys/values without writing them into a copy of the cache.
    """
    q = _queries(q_bqnh, k1_blkh.shape[2])
    s1 = _scores(q, k1_blkh, mask1_bl, scale)
    s2 = _scores(q, k2_bskh, mask2_bs, scale)
    top = _row_max(s1, s2)
    p1, p2 = jnp.exp(s1 - top), jnp.exp(s2 - top)
    den = jnp.maximum(jnp.sum(p1, axis=-1, keepdims=True) + jnp.sum(p2, axis=-1, keepdims=True),
                      1e-30)
    return _output((_values(p1, v1_blkh) + _values(p2, v2_bskh)) / den, q_bqnh)
