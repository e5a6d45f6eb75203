"""Block diffusion's sampler (SDAR, TraDo): blocks decoded left to right, each denoised in a
few steps, with the exact KV cache of the committed blocks; one jitted program for a
left-padded batch (``SamplerConfig(loop="sdar")``).

The semantics are those of the authors' samplers, batch 1 and unpadded: JetAstra/SDAR
``generate.py`` (``block_diffusion_generate``) and the engine Gen-Verse/dLLM-RL rolls TraDo
out with (``sample/jetengine_ext``: ``engine/sequence.py``, ``engine/scheduler.py``):

- the blocks are counted from each row's first real token: the prompt's whole blocks are
  prefilled into the cache; its last partial block (the remainder ``r = len % block``)
  opens the first denoised block, its other positions masked;
- a block runs at most ``steps_per_block`` steps and ends once it has no mask left. A step
  draws ``x0`` at every position (temperature, then top-k, then top-p, then the softmax;
  temperature 0 takes the argmax) with ``p0`` its probability, and commits among the masked
  positions: ``low_confidence_static`` the ``num_transfer_tokens(block, steps)[step]`` of
  highest ``p0``; ``low_confidence_dynamic`` every one with ``p0 > threshold``, or those
  top ones when fewer pass;
- a decoded block's keys/values are computed once more from its final tokens and written
  into the cache (their ``store_kv=True`` pass), which every later block reads;
- a row stops at the block where its completion holds EOS (kept, as their
  ``commit_block``) or reaches ``gen_length`` tokens; what follows is ``eos_id``.

The trace: ``decoded_at`` [B, gen_length] is the row's own step count (0-based) at the step
that committed each completion token, -1 past the stop; ``decoded_at + 1`` is the engine's
``first_unmask_times``. A row counts the steps in which its block had masks.

Layout: rows are re-padded so that every row's blocks start at the same buffer positions:
row r (p_r real prompt tokens) starts at ``S - block * (p_r // block)`` with
``S = block * (Lp // block)``, so its remainder sits at S, the first denoised block is
S:+block for every row, and its completion starts at ``S + p_r % block``. The buffer is
``S + n * block`` long, n = ceil((block - 1 + gen_length) / block), so that a full
completion fits after any remainder; a block-causal model sees the same blocks whether it
counts them from the row's end or its first real token.

Where this differs from the authors' code: a step never commits more than the masked
positions (their ``topk`` over a block with fewer masks than the step's budget also picks
decoded positions, re-sampling them; with ``steps_per_block == block_length``, every
released config, that cannot happen); the multinomial draw is the Gumbel-max one (the same
distribution; torch's own stream cannot be reproduced); EOS is looked for in the completion
only (theirs also reads the prompt's remainder).

Shape letters: B batch, Lp prompt, T buffer, S block, V vocab.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.sampling.config import SamplerConfig, num_transfer_tokens
from d1jax.sampling.model_fns import ModelFns

Array = jax.Array
F32 = jnp.float32


def layout(prompt_len: int, gen_length: int, block: int) -> tuple[int, int]:
    """(S, n): the first denoised block's buffer position and how many blocks are denoised."""
    return block * (prompt_len // block), -(-(block - 1 + gen_length) // block)


def step_key(rng: Array, block: int | Array, step: int | Array) -> Array:
    """The PRNG key of denoising step ``step`` of block ``block`` (0-based, the block's own
    step count)."""
    return jax.random.fold_in(jax.random.fold_in(rng, block), step)


def filter_logits(logits_bsv: Array, temperature: float, top_k: int, top_p: float) -> Array:
    """float32 logits / temperature, then top-k, then top-p (the authors' order: their
    ``top_k_logits``/``top_p_logits``), filtered entries -inf; temperature 0 divides by 1."""
    x = logits_bsv.astype(F32) / (temperature if temperature > 0 else 1.0)
    if top_k > 0:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if top_p < 1.0:
        order = jnp.argsort(-x, axis=-1)
        srt = jnp.take_along_axis(x, order, axis=-1)
        cum = jnp.cumsum(jax.nn.softmax(srt, axis=-1), axis=-1)
        drop = jnp.concatenate([jnp.zeros_like(cum[..., :1], bool), cum[..., :-1] > top_p], -1)
        inv = jnp.argsort(order, axis=-1)
        x = jnp.where(jnp.take_along_axis(drop, inv, axis=-1), -jnp.inf, x)
    return x


def draw(logits_bsv: Array, key: Array, cfg: SamplerConfig) -> tuple[Array, Array]:
    """(x0 [B, S] int32, p0 [B, S] float32): a token from the filtered softmax (Gumbel-max;
    the argmax at temperature 0) and its probability there."""
    x = filter_logits(logits_bsv, cfg.temperature, cfg.top_k, cfg.top_p)
    logp = jax.nn.log_softmax(x, axis=-1)
    if cfg.temperature > 0:
        g = jax.random.gumbel(key, x.shape, F32)
        x0 = jnp.argmax(jnp.where(jnp.isfinite(logp), logp + g, -jnp.inf), axis=-1)
    else:
        x0 = jnp.argmax(x, axis=-1)
    p0 = jnp.exp(jnp.take_along_axis(logp, x0[..., None], axis=-1)[..., 0])
    return x0.astype(jnp.int32), p0


def select(masked_bs: Array, p0_bs: Array, budget: Array, cfg: SamplerConfig) -> Array:
    """bool [B, S]: the masked positions a step commits (module docstring's rules)."""
    conf = jnp.where(masked_bs, p0_bs, -jnp.inf)
    s = conf.shape[1]
    i = jnp.arange(s)
    # rank among the block: higher confidence first, the lower index on ties. Their
    # torch.topk leaves the order of ties unspecified (CPU returned index 2 of four equal
    # values): a step choosing among tied positions has no backend-independent reference.
    ahead = (conf[:, None, :] > conf[:, :, None]) | (
        (conf[:, None, :] == conf[:, :, None]) & (i[None, None, :] < i[None, :, None]))
    top = masked_bs & (jnp.sum(ahead, axis=-1) < budget)
    if cfg.remasking == "low_confidence_static":
        return top
    high = masked_bs & (p0_bs > cfg.threshold)
    enough = jnp.sum(high, axis=-1, keepdims=True) >= budget
    return jnp.where(enough, high, top | high)


def _repad(prompt_ids: Array, prompt_mask: Array, cfg: SamplerConfig, start: int,
           total: int) -> tuple[Array, Array, Array]:
    """(ids [B, T] with masks after each prompt, attention mask [B, T], completion start
    [B]) of the module docstring's layout."""
    b, lp = prompt_ids.shape
    bl = cfg.block_length
    p = jnp.sum(prompt_mask.astype(jnp.int32), axis=1)
    t = jnp.arange(total)[None] - (start - bl * (p // bl))[:, None]  # index in the real prompt
    src = jnp.clip(lp - p[:, None] + t, 0, lp - 1)
    prompt = jnp.take_along_axis(prompt_ids.astype(jnp.int32), src, axis=1)
    ids = jnp.where(t < p[:, None], prompt, cfg.mask_id)
    real = t >= 0
    return jnp.where(real, ids, cfg.eos_id), real.astype(jnp.int32), start + p % bl


def generate(fns: ModelFns, params: Any, prompt_ids: Array, prompt_mask: Array | None,
             rng: Array, cfg: SamplerConfig) -> tuple[Array, Array, Array]:
    """(ids [B, Lp + gen_length]: the prompts as given, then the completions; decoded_at
    [B, gen_length]; block_steps [n]: the steps each block ran). ``cfg.kv_cache`` "prefix":
    the committed-block cache (``fns.prefill``/``decode``/``decode_at``); "none": a full
    block-causal forward every step (``fns.forward``)."""
    b, lp = prompt_ids.shape
    bl, gen = cfg.block_length, cfg.gen_length
    start, n = layout(lp, gen, bl)
    total = start + n * bl
    if prompt_mask is None:
        prompt_mask = jnp.ones((b, lp), jnp.int32)
    ids, attn, comp = _repad(prompt_ids, prompt_mask, cfg, start, total)
    budgets = jnp.asarray(num_transfer_tokens(bl, cfg.steps_per_block))
    cached = cfg.kv_cache != "none"
    cache = fns.prefill(params, ids, attn, 0, 1)[1] if cached else None
    pos = jnp.arange(total)[None]

    def logits_of(ids, cache, at):
        if cached:
            return fns.decode(params, ids, cache, at, bl, attn, bl)
        return fns.forward(params, ids, attn, at, bl)

    def denoise(carry):
        ids, trace, count, k, at, cache, done, i = carry
        blk = jax.lax.dynamic_slice_in_dim(ids, at, bl, axis=1)
        masked = (blk == cfg.mask_id) & ~done[:, None]
        x0, p0 = draw(logits_of(ids, cache, at), step_key(rng, i, k), cfg)
        put = select(masked, p0, budgets[k], cfg)
        blk = jnp.where(put, x0, blk)
        old = jax.lax.dynamic_slice_in_dim(trace, at, bl, axis=1)
        trace = jax.lax.dynamic_update_slice_in_dim(
            trace, jnp.where(put, count[:, None], old), at, axis=1)
        count = count + jnp.any(masked, axis=1)
        ids = jax.lax.dynamic_update_slice_in_dim(ids, blk, at, axis=1)
        return ids, trace, count, k + 1, at, cache, done, i

    def open_masks(carry):
        ids, _, _, k, at, _, done, _ = carry
        blk = jax.lax.dynamic_slice_in_dim(ids, at, bl, axis=1)
        return (k < cfg.steps_per_block) & jnp.any((blk == cfg.mask_id) & ~done[:, None])

    def block(carry):
        ids, trace, count, cache, done, steps, i = carry
        at = start + i * bl
        ids, trace, count, k, _, _, _, _ = jax.lax.while_loop(
            open_masks, denoise, (ids, trace, count, 0, at, cache, done, i))
        if cached:
            cache = commit_block(fns, params, ids, cache, at, bl, attn)
        in_block = (pos >= at) & (pos < at + bl) & (pos >= comp[:, None])
        eos = jnp.any(in_block & (ids == cfg.eos_id), axis=1)
        done = done | eos | (at + bl - comp >= gen)
        return ids, trace, count, cache, done, steps.at[i].set(k), i + 1

    def more(carry):
        return (carry[-1] < n) & ~jnp.all(carry[4])

    trace = jnp.full((b, total), -1, jnp.int32)
    ids, trace, _, _, _, steps, _ = jax.lax.while_loop(
        more, block, (ids, trace, jnp.zeros((b,), jnp.int32), cache,
                      jnp.zeros((b,), bool), jnp.zeros((n,), jnp.int32), 0))
    return _completions(ids, trace, comp, prompt_ids, cfg) + (steps,)


def _completions(ids: Array, trace: Array, comp: Array, prompt_ids: Array,
                 cfg: SamplerConfig) -> tuple[Array, Array]:
    """(prompts then completions [B, Lp + gen_length], decoded_at [B, gen_length]), each
    completion cut after its first EOS."""
    at = comp[:, None] + jnp.arange(cfg.gen_length)[None]
    out = jnp.take_along_axis(ids, at, axis=1)
    steps = jnp.take_along_axis(trace, at, axis=1)
    is_eos = out == cfg.eos_id
    after = (jnp.cumsum(is_eos, axis=1) - is_eos) > 0  # past the first EOS
    out = jnp.where(after, cfg.eos_id, out)
    steps = jnp.where(after, -1, steps)
    return jnp.concatenate([prompt_ids.astype(jnp.int32), out], axis=1), steps


def commit_block(fns: ModelFns, params: Any, ids: Array, cache: Any, at: Array, bl: int,
                 attn: Array) -> Any:
    """``cache`` with the decoded block ``ids[:, at:at + bl]``'s keys/values written in, from
    its final tokens (one forward of the block over the earlier blocks' cache)."""
    b = ids.shape[0]
    idx = jnp.broadcast_to(jnp.arange(bl)[None], (b, bl))
    window = jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, at, bl, axis=2), cache)
    _, window = fns.decode_at(params, ids, idx, cache, window, at, attn)
    return jax.tree.map(lambda c, w: jax.lax.dynamic_update_slice_in_dim(
        c, w.astype(c.dtype), at, axis=2), cache, window)
