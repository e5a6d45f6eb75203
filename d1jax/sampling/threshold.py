"""dInfer's block decoding for LLaDA2 (inclusionAI/dInfer ``python/dinfer/decoding``:
``BlockDiffusionLLM`` with ``ThresholdParallelDecoder``, the block cache of
``BlockDiffusionPrefixCacheManager``): blocks left to right over the committed blocks' exact
KV cache, each decoded by threshold parallel decoding until it has no mask left.

Their loop, batch 1 (``generate_uniform.py``, ``parallel_strategy.py``, ``utils.py``):

- the buffer is the prompt then masks up to ``ceil((P + gen_length) / block) * block``;
  blocks are counted from position 0 and the first decoded block starts at
  ``block * (P // block)``: it holds the prompt's partial last block (kept) and masks;
  the prompt's whole blocks are prefilled into the cache;
- a step runs the block (its positions at their own RoPE positions) against the cache of
  the earlier blocks, bidirectional inside the block, and for every position draws
  ``x0 = argmax(exp(l) / (-log u)^T)`` (float64, u ~ U[0, 1); T = 0: the argmax) and
  ``p = softmax(l)[x0]`` in float32 over the raw logits (no temperature, top-k or top-p:
  the decoder has none). The candidates are the masked positions whose ``x0`` is not the
  mask id; a step commits every candidate with ``p >= threshold`` and, when none reaches
  it, those with ``p >= max p - 1e-5`` (the most confident one and its near ties);
- a block runs until no mask is left in it (no step cap, no step schedule: ``steps`` is
  not read); its final tokens' keys/values are written into the cache;
- after a block, a row whose block holds ``eos_id`` (the prompt's part included) has every
  later position set to ``eos_id``; the loop stops when every row has; their output for
  batch 1 drops every ``eos_id`` token of the buffer.

Here: one jitted program for a left-padded batch, in block diffusion's layout
(``block_diffusion``: each row's blocks counted from its first real token, the same as
theirs for an unpadded row); the Gumbel-max draw in log space, ``argmax(l - T log(-log
u))``, in float32 (the same order as theirs but for rounding), u from
``jax.random.uniform(step_key(rng, block, step))`` over [B, block, V]; a block stops after
``max_steps`` steps (theirs would loop for ever when every open position keeps predicting
the mask id at temperature 0; a block needs at most ``block`` steps otherwise); the
completions are cut after their first EOS, as every d1jax sampler returns them.

Shape letters: B batch, T buffer, S block, V vocab.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.sampling.block_diffusion import _completions, _repad, layout, step_key
from d1jax.sampling.config import SamplerConfig
from d1jax.sampling.model_fns import ModelFns

Array = jax.Array
F32 = jnp.float32
NEAR_TIE = 1e-5  # get_transfer_index_threshold: max(confidence) - 1e-5
FLOOR = -1000.0  # ... .clamp(-1000, threshold)


def noise(key: Array, shape: tuple[int, ...]) -> Array:
    """u ~ U(0, 1) float32 [B, S, V] of one step (their ``torch.rand_like``; 0 excluded so
    that ``-log u`` is finite)."""
    return jax.random.uniform(key, shape, F32, minval=np.finfo(np.float32).tiny, maxval=1.0)


def transfer(logits_bsv: Array, open_bs: Array, u_bsv: Array | None, temperature: float,
             threshold: float, mask_id: int) -> tuple[Array, Array]:
    """(x0 [B, S] int32, commit bool [B, S]) of one step: ``get_transfer_index_threshold``
    (rm_mask on) and ``ThresholdParallelDecoder.decode``'s ``& mask_index``."""
    l = logits_bsv.astype(F32)
    score = l if temperature == 0 else l - temperature * jnp.log(-jnp.log(u_bsv))
    x0 = jnp.argmax(score, axis=-1).astype(jnp.int32)
    p = jnp.take_along_axis(jax.nn.softmax(l, axis=-1), x0[..., None], axis=-1)[..., 0]
    cand = open_bs & (x0 != mask_id)  # never decode to the mask id
    conf = jnp.where(cand, p, -jnp.inf)
    bar = jnp.clip(jnp.max(conf, axis=1, keepdims=True) - NEAR_TIE, FLOOR, threshold)
    return x0, cand & (conf >= bar)


class Decoded(NamedTuple):
    ids: Array  # [B, T] int32: the buffer (module docstring's layout), eos after an EOS block.
    decoded_at: Array  # [B, T] int32: the row's step count that committed a position; -1.
    completion_start: Array  # [B] int32: where each row's completion starts in ``ids``.
    block_steps: Array  # [n] int32: steps each block ran.


def decode(fns: ModelFns, params: Any, prompt_ids: Array, prompt_mask: Array | None,
           rng: Array, cfg: SamplerConfig, max_steps: int | None = None) -> Decoded:
    """dInfer's loop (module docstring) reading ``cfg``'s block_length, gen_length,
    temperature, threshold, mask_id, eos_id and kv_cache ("prefix": the committed blocks'
    cache; "none": a block-causal forward every step). ``max_steps``: a block's step cap
    (default 4 x block_length)."""
    b, lp = prompt_ids.shape
    bl, gen = cfg.block_length, cfg.gen_length
    cap = 4 * bl if max_steps is None else max_steps
    start, n = layout(lp, gen, bl)
    total = start + n * bl
    if prompt_mask is None:
        prompt_mask = jnp.ones((b, lp), jnp.int32)
    ids, attn, comp = _repad(prompt_ids, prompt_mask, cfg, start, total)
    cached = cfg.kv_cache != "none"
    cache = fns.prefill(params, ids, attn, 0, 1)[1] if cached else None
    pos = jnp.arange(total)[None]

    def logits_of(ids, cache, at):
        if cached:
            return fns.decode(params, ids, cache, at, bl, attn, bl)
        return fns.forward(params, ids, attn, at, bl)

    def step(carry):
        ids, trace, count, k, at, cache, done, i = carry
        blk = jax.lax.dynamic_slice_in_dim(ids, at, bl, axis=1)
        masked = (blk == cfg.mask_id) & ~done[:, None]
        logits = logits_of(ids, cache, at)
        u = noise(step_key(rng, i, k), logits.shape) if cfg.temperature > 0 else None
        x0, put = transfer(logits, masked, u, cfg.temperature, cfg.threshold, cfg.mask_id)
        ids = jax.lax.dynamic_update_slice_in_dim(ids, jnp.where(put, x0, blk), at, axis=1)
        old = jax.lax.dynamic_slice_in_dim(trace, at, bl, axis=1)
        trace = jax.lax.dynamic_update_slice_in_dim(
            trace, jnp.where(put, count[:, None], old), at, axis=1)
        count = count + jnp.any(masked, axis=1)
        return ids, trace, count, k + 1, at, cache, done, i

    def open_masks(carry):
        ids, _, _, k, at, _, done, _ = carry
        blk = jax.lax.dynamic_slice_in_dim(ids, at, bl, axis=1)
        return (k < cap) & jnp.any((blk == cfg.mask_id) & ~done[:, None])

    def block(carry):
        ids, trace, count, cache, done, steps, i = carry
        at = start + i * bl
        ids, trace, count, k, _, _, _, _ = jax.lax.while_loop(
            open_masks, step, (ids, trace, count, 0, at, cache, done, i))
        if cached:  # the decoded block's keys/values, from its final tokens
            idx = jnp.broadcast_to(jnp.arange(bl)[None], (b, bl))
            window = jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, at, bl, axis=2),
                                  cache)
            _, window = fns.decode_at(params, ids, idx, cache, window, at, attn)
            cache = jax.tree.map(lambda c, w: jax.lax.dynamic_update_slice_in_dim(
                c, w.astype(c.dtype), at, axis=2), cache, window)
        in_block = (pos >= at) & (pos < at + bl) & (attn > 0)  # the prompt's part too
        eos = jnp.any(in_block & (ids == cfg.eos_id), axis=1) & ~done
        ids = jnp.where(eos[:, None] & (pos >= at + bl), cfg.eos_id, ids)  # their early stop
        done = done | eos | (at + bl - comp >= gen)
        return ids, trace, count, cache, done, steps.at[i].set(k), i + 1

    def more(carry):
        return (carry[-1] < n) & ~jnp.all(carry[4])

    trace = jnp.full((b, total), -1, jnp.int32)
    ids, trace, _, _, _, steps, _ = jax.lax.while_loop(
        more, block, (ids, trace, jnp.zeros((b,), jnp.int32), cache,
                      jnp.zeros((b,), bool), jnp.zeros((n,), jnp.int32), 0))
    return Decoded(ids, trace, comp, steps)


def generate(fns: ModelFns, params: Any, prompt_ids: Array, prompt_mask: Array | None,
             rng: Array, cfg: SamplerConfig, max_steps: int | None = None
             ) -> tuple[Array, Array, Array]:
    """(ids [B, Lp + gen_length]: the prompts as given, then the completions cut after
    their first EOS; decoded_at [B, gen_length]; block_steps [n]): ``loop="sdar"``'s
    outputs under dInfer's decoding rule."""
    d = decode(fns, params, prompt_ids, prompt_mask, rng, cfg, max_steps)
    return _completions(d.ids, d.decoded_at, d.completion_start, prompt_ids, cfg) + (
        d.block_steps,)
