"""The cached block loop (Fast-dLLM's prefix / dual KV cache) and its static widths.

A block starts with a full forward that fills the cache (its logits serve step 0); later
steps recompute only the block ("dual") or the block and everything after it ("prefix"),
or with ``recompute="masked"`` only the block positions masked before the previous step.
Cached steps run the output head on the still-masked positions only. Every shape is
static: the number of positions a step can find masked is bounded by the rule's minimum
transfer per step (``min_transfer``), and each step runs at the smallest of eight widths
holding that bound (``head_sizes``, ``recompute_sizes``), widening at run time only when a
proposal equal to mask_id left more positions masked.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.sampling.config import SamplerConfig
from d1jax.sampling.model_fns import ModelFns
from d1jax.sampling.step import (Context, DecodeState, block_keys, block_start, mask_eos,
                                 propose, run_steps, transfer)

Array = jax.Array


class CacheState(NamedTuple):
    """The cached block loop's own carry (``StepLoopState.aux``)."""

    kv: tuple[Any, Any]  # (every layer's keys/values of the sequence, recompute="masked"'s
    #                      window of the block's keys/values or None).
    prev_masked_bs: Array  # [B, blk] bool: the block's mask before the previous step.
    masked_at_forward_b: Array  # [B] int32: masked block positions at the last full forward.


def _bounds(cfg: SamplerConfig) -> np.ndarray:
    """Most masked positions of the block before each step: [loop_steps].

    Every step unmasks at least ``min_transfer`` (or all that is left), so before step i
    at most ``block_length - sum(min_transfer[:i])`` positions are masked.
    """
    floor = cfg.min_transfer()
    return cfg.block_length - np.concatenate([[0], np.cumsum(floor)[:-1]])


def _bucket(bound: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    return np.array([min(j for j, m in enumerate(sizes) if m >= max(n, 1)) for n in bound],
                    np.int32)


def _widths(block_length: int) -> tuple[int, ...]:
    """The static widths of cached steps: ceil(block_length * j / 8), j = 1..8."""
    return tuple(sorted({-(-block_length * j // 8) for j in range(1, 9)}))


def head_sizes(cfg: SamplerConfig) -> tuple[np.ndarray, tuple[int, ...]]:
    """Static output-head widths of cached steps: (size index per step [loop_steps], sizes).

    Step i runs the head on the smallest of ``ceil(block_length * j / 8)`` (j = 1..8) that
    holds the positions that can still be masked (``_bounds``).
    """
    sizes = _widths(cfg.block_length)
    return _bucket(_bounds(cfg), sizes), sizes


def recompute_sizes(cfg: SamplerConfig) -> tuple[np.ndarray, tuple[int, ...]]:
    """``recompute="masked"``: static widths of the recomputed set, (index per step, sizes).

    Step i >= 1 recomputes the positions masked before step i - 1 (those still masked and
    those unmasked by step i - 1); the smallest of ``ceil(block_length * j / 8)`` (j =
    1..8) holding them. Each width is a branch holding the layer stack (8 compiled copies).
    """
    sizes, bound = _widths(cfg.block_length), _bounds(cfg)
    return _bucket(np.concatenate([bound[:1], bound[:-1]]), sizes), sizes


def _width(which: np.ndarray, sizes: tuple[int, ...], i: Array, masked_bs: Array) -> Array:
    """Index of the width step i runs at: the static one, or a wider one when some row has
    more masked positions than the bound (a proposal equal to mask_id keeps its position
    masked, as in the reference)."""
    need = jnp.searchsorted(jnp.asarray(sizes), jnp.max(jnp.sum(masked_bs, axis=-1)))
    return jnp.maximum(jnp.asarray(which)[i], need.astype(jnp.int32))


def _first(masked_bs: Array) -> Array:
    """Per row, the masked positions first (in order), then the others: [B, S] int32."""
    return jnp.argsort(~masked_bs, axis=-1, stable=True).astype(jnp.int32)


def _count(masked_bs: Array) -> Array:
    return jnp.sum(masked_bs, axis=-1, dtype=jnp.int32)


def _block_ids(ids_bl: Array, start, cfg: SamplerConfig) -> Array:
    return jax.lax.dynamic_slice_in_dim(ids_bl, start, cfg.block_length, axis=1)


def _recompute_masked(fns: ModelFns, ctx: Context, cfg: SamplerConfig, ids_bl: Array,
                      kv, prev_masked_bs: Array, i: Array, start):
    """``recompute="masked"``: the positions masked before the previous step, recomputed at
    the static width of ``recompute_sizes``; their keys/values go into the block's window.
    Returns (hidden [B, blk, D] (other rows zero, never read), (cache, window))."""
    blk = cfg.block_length
    rows = jnp.arange(ids_bl.shape[0])[:, None]
    order, (which, sizes) = _first(prev_masked_bs), recompute_sizes(cfg)

    def on(m):
        def fn():  # rows past the masked count point outside the block: dropped
            idx = jnp.where(jnp.arange(m) < jnp.sum(prev_masked_bs, -1, keepdims=True),
                            order[:, :m], blk)
            h, window = fns.decode_at(ctx.params, ids_bl, idx, *kv, start, ctx.attn_bl)
            h_bsd = jnp.zeros((h.shape[0], blk, h.shape[-1]), h.dtype)
            return h_bsd.at[rows, idx].set(h, mode="drop"), (kv[0], window)
        return fn
    return jax.lax.switch(_width(which, sizes, i, prev_masked_bs), [on(m) for m in sizes])


def propose_masked(fns: ModelFns, ctx: Context, cfg: SamplerConfig, h_bsd: Array,
                   masked_bs: Array, i: Array, keys) -> tuple[Array, Array]:
    """Proposals [B, blk] with the output head run on the masked positions only, at the
    static width of ``head_sizes`` (the first m of ``_first``: all of them)."""
    order, (which, sizes) = _first(masked_bs), head_sizes(cfg)

    def head_on(m):
        def fn():
            idx = order[:, :m]
            hm = jnp.take_along_axis(h_bsd, idx[..., None], axis=1)
            logits = mask_eos(fns.head(ctx.params, hm).astype(jnp.float32), cfg)
            return propose(logits, *keys, cfg, idx_bs=idx)
        return fn
    return jax.lax.switch(_width(which, sizes, i, masked_bs), [head_on(m) for m in sizes])


def _full_forward(fns: ModelFns, ctx: Context, cfg: SamplerConfig, block, ids_bl: Array, i):
    """A full forward: proposals [B, blk] and a fresh (cache, the block's window or None)."""
    start = block_start(ctx, block, cfg)
    logits, cache = fns.prefill(ctx.params, ids_bl, ctx.attn_bl, start, cfg.block_length)
    x0, conf = propose(mask_eos(logits.astype(jnp.float32), cfg),
                       *block_keys(ctx, block, i, cfg), cfg)
    window = None
    if cfg.recompute == "masked":  # [n_layers, B, L, ...] leaves: the block's slice
        window = jax.tree.map(
            lambda c: jax.lax.dynamic_slice_in_dim(c, start, cfg.block_length, axis=2), cache)
    return x0, conf, (cache, window)


def _cached_step(fns: ModelFns, ctx: Context, cfg: SamplerConfig, block, ids_bl: Array,
                 state: CacheState, masked_bs: Array, i):
    """A step against the cache: proposals [B, blk] and the (cache, window) after it."""
    blk, start, kv = cfg.block_length, block_start(ctx, block, cfg), state.kv
    keys = block_keys(ctx, block, i, cfg)
    q_len = blk if cfg.kv_cache == "dual" else ids_bl.shape[1] - start  # static: block is int
    if fns.decode_hidden is None or fns.head is None:
        out = fns.decode(ctx.params, ids_bl, kv[0], start, q_len, ctx.attn_bl, blk)
        return (*propose(mask_eos(out.astype(jnp.float32), cfg), *keys, cfg), kv)
    if cfg.recompute == "masked":
        h, kv = _recompute_masked(fns, ctx, cfg, ids_bl, kv, state.prev_masked_bs, i, start)
    else:
        h = fns.decode_hidden(ctx.params, ids_bl, kv[0], start, q_len, ctx.attn_bl)[:, :blk]
    return (*propose_masked(fns, ctx, cfg, h, masked_bs, i, keys), kv)


def cached_block(block, seq: DecodeState, fns: ModelFns, ctx: Context,
                 cfg: SamplerConfig) -> DecodeState:
    """One block with a Fast-dLLM KV cache: a full forward (also step 0), then cached steps.

    With ``cache_refresh`` a step runs a full forward instead (new cache) once that many
    block tokens were decoded since the last one.
    """
    start = block_start(ctx, block, cfg)
    masked0 = _block_ids(seq.ids_bl, start, cfg) == cfg.mask_id
    x0, conf, kv = _full_forward(fns, ctx, cfg, block, seq.ids_bl, 0)
    seq = transfer(seq, x0, conf, 0, block, ctx, cfg)

    def propose_fn(ids_bl: Array, state: CacheState, i: Array):
        now = _block_ids(ids_bl, start, cfg) == cfg.mask_id

        def step():
            x0, conf, kv = _cached_step(fns, ctx, cfg, block, ids_bl, state, now, i)
            return x0, conf, CacheState(kv, now, state.masked_at_forward_b)
        if cfg.cache_refresh == 0:
            return step()

        def refresh():
            x0, conf, kv = _full_forward(fns, ctx, cfg, block, ids_bl, i)
            return x0, conf, CacheState(kv, now, _count(now))
        stale = jnp.max(state.masked_at_forward_b - _count(now)) >= cfg.cache_refresh
        return jax.lax.cond(stale, refresh, step)
    return run_steps(seq, 1, propose_fn, CacheState(kv, masked0, _count(masked0)), block, ctx,
                     cfg)
