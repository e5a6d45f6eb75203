"""The exact block loop: a full forward per step (LLaDA's generate.py, d1's generate)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from d1jax.sampling import cached
from d1jax.sampling.config import SamplerConfig
from d1jax.sampling.model_fns import ModelFns
from d1jax.sampling.step import (Context, DecodeState, block_keys, block_start, mask_eos,
                                 propose, run_steps)

Array = jax.Array


def guided_logits(fns: ModelFns, ctx: Context, ids_bl: Array, start,
                  cfg: SamplerConfig) -> Array:
    """Float32 logits [B, blk, V] of the block from a full forward, CFG when enabled."""
    blk = cfg.block_length
    if cfg.cfg_scale > 0:  # LLaDA: un + (w + 1)(cond - un), prompt masked in the un-pass.
        prompt_pos = jnp.arange(ids_bl.shape[1])[None, :] < ctx.prompt_len
        both = jnp.concatenate([ids_bl, jnp.where(prompt_pos, cfg.mask_id, ids_bl)], axis=0)
        attn = None if ctx.attn_bl is None else jnp.concatenate([ctx.attn_bl] * 2, axis=0)
        cond, uncond = jnp.split(fns.forward(ctx.params, both, attn, start, blk), 2, axis=0)
        logits = uncond.astype(jnp.float32) + (cfg.cfg_scale + 1.0) * (
            cond.astype(jnp.float32) - uncond.astype(jnp.float32))
    else:
        logits = fns.forward(ctx.params, ids_bl, ctx.attn_bl, start, blk).astype(jnp.float32)
    return mask_eos(logits, cfg)


def exact_block(block, seq: DecodeState, fns: ModelFns, ctx: Context,
                cfg: SamplerConfig) -> DecodeState:
    """One block of the exact sampler: a full forward per step.

    Without CFG, and when the model splits its forward from its head, the head runs only on
    the block positions still masked (at the static widths of the cached loop,
    ``cached.head_sizes``): the others' logits are never read (x0 keeps their tokens).
    """
    start = block_start(ctx, block, cfg)
    masked_head = cfg.cfg_scale == 0 and None not in (fns.forward_hidden, fns.head)

    def propose_fn(ids_bl, aux, i):
        keys = block_keys(ctx, block, i, cfg)
        if masked_head:
            h = fns.forward_hidden(ctx.params, ids_bl, ctx.attn_bl, start, cfg.block_length)
            masked = jax.lax.dynamic_slice_in_dim(ids_bl, start, cfg.block_length,
                                                  axis=1) == cfg.mask_id
            return (*cached.propose_masked(fns, ctx, cfg, h, masked, i, keys), aux)
        logits = guided_logits(fns, ctx, ids_bl, start, cfg)
        return (*propose(logits, *keys, cfg), aux)
    return run_steps(seq, 0, propose_fn, None, block, ctx, cfg)
