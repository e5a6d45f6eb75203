"""The block-wise approximate KV cache of Fast-dLLM: its type and the attention over it.

A cached step recomputes the queries, keys and values of a slice of positions (the current
block) and reads every other position's keys/values from a cache filled by one full
forward pass. Shape letters: B batch, L sequence, Q recomputed rows, S slice (or window)
length, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from d1jax.model.attention import attend_two_part

Array = jax.Array


class KVCache(NamedTuple):
    """Keys (after RoPE) and values: [n_layers, B, L, K, H] each for the whole model, one
    layer's [B, L, K, H] inside the layer scan."""

    k: Array
    v: Array


def attend_cached(q_bqnh: Array, fresh: KVCache, cache: KVCache, q_start: Array | int,
                  key_mask_bl: Array | None, window: KVCache | None = None,
                  idx_bq: Array | None = None) -> tuple[Array, KVCache]:
    """One layer's attention of recomputed rows to their fresh keys/values and the cache.

    Slice mode (no ``window``): the rows are positions q_start:+Q, ``fresh`` their keys/
    values [B, Q, K, H]; they attend to ``fresh`` and to ``cache`` [B, L, K, H] outside the
    slice. Window mode: ``window`` holds the keys/values [B, S, K, H] of positions
    q_start:+S and the rows are positions q_start + ``idx_bq``; their fresh keys/values
    replace the window's there (rows with idx >= S are padding: never written), and they
    attend to the updated window and to the cache outside it.

    Returns (attention output [B, Q, N, H], the slice's or the updated window's keys/values).
    """
    own = fresh
    if window is not None:
        rows = jnp.arange(q_bqnh.shape[0])[:, None]
        own = KVCache(*(w.at[rows, idx_bq].set(new.astype(w.dtype), mode="drop")
                        for w, new in zip(window, fresh)))
    b, own_len, total = q_bqnh.shape[0], own.k.shape[1], cache.k.shape[1]
    pos = jnp.arange(total)[None, :]
    outside = jnp.broadcast_to((pos < q_start) | (pos >= q_start + own_len), (b, total))
    own_mask = None
    if key_mask_bl is not None:
        outside = outside & key_mask_bl.astype(bool)
        own_mask = jax.lax.dynamic_slice_in_dim(key_mask_bl, q_start, own_len, axis=1)
        own_mask = own_mask.astype(bool)
    dt = q_bqnh.dtype
    att = attend_two_part(q_bqnh, cache.k.astype(dt), cache.v.astype(dt), outside,
                          own.k.astype(dt), own.v.astype(dt), own_mask,
                          q_bqnh.shape[-1] ** -0.5)
    return att, own
