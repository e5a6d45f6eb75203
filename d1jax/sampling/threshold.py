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

LLaDA2.1's token editing (``SamplerConfig.edit_threshold >= 0``): SGLang's ``JointThreshold``
(sgl-project/sglang ``python/sglang/srt/dllm/algorithm/joint_threshold.py``: the joint M2T +
T2T threshold decoding of the LLaDA2.1 report, as SGLang implements it) on the same blocks.
A step takes ``x0`` the argmax and ``p`` its softmax probability; mask to token (M2T): the
masked positions with ``p > threshold``, else the single most confident one; token to token
(T2T): every position of the block decoded in this block (not the prompt's) whose ``x0``
differs from its token and ``p > edit_threshold`` takes ``x0``. Once a block has no mask,
each further step counts toward ``max_post_edit_steps``; a row's block ends at the first
step that changes nothing or when that count passes the limit (at most
``block + max_post_edit_steps + 1`` steps).
EOS is handled as above (SGLang's scheduler stops a request elsewhere); at temperature > 0
``x0`` is the Gumbel-max draw above (theirs is greedy only).

Shape letters: B batch, T buffer, S block, V vocab.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.sampling.block_diffusion import (_completions, _repad, commit_block, layout,
                                             step_key)
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
    x0, p = draw(logits_bsv, u_bsv, temperature)
    cand = open_bs & (x0 != mask_id)  # never decode to the mask id
    conf = jnp.where(cand, p, -jnp.inf)
    bar = jnp.clip(jnp.max(conf, axis=1, keepdims=True) - NEAR_TIE, FLOOR, threshold)
    return x0, cand & (conf >= bar)


def draw(logits_bsv: Array, u_bsv: Array | None, temperature: float) -> tuple[Array, Array]:
    """(x0 [B, S] int32, p [B, S] float32): the Gumbel-max draw (the argmax at temperature
    0) and its probability under the raw logits' softmax."""
    l = logits_bsv.astype(F32)
    score = l if temperature == 0 else l - temperature * jnp.log(-jnp.log(u_bsv))
    x0 = jnp.argmax(score, axis=-1).astype(jnp.int32)
    return x0, jnp.take_along_axis(jax.nn.softmax(l, axis=-1), x0[..., None], axis=-1)[..., 0]


def joint_transfer(x0_bs: Array, p_bs: Array, blk_bs: Array, masked_bs: Array,
                   editable_bs: Array, threshold: float, edit_threshold: float) -> Array:
    """bool [B, S]: the positions a ``JointThreshold`` step writes ``x0`` to (M2T among the
    masked, T2T among the editable decoded ones; module docstring)."""
    conf = jnp.where(masked_bs, p_bs, -jnp.inf)
    m2t = masked_bs & (conf > threshold)
    top = jax.nn.one_hot(jnp.argmax(conf, axis=1), conf.shape[1], dtype=bool) & masked_bs
    m2t = jnp.where(jnp.any(m2t, axis=1, keepdims=True), m2t, top)
    t2t = editable_bs & ~masked_bs & (p_bs > edit_threshold) & (blk_bs != x0_bs)
    return m2t | t2t


class Decoded(NamedTuple):
    ids: Array  # [B, T] int32: the buffer (module docstring's layout), eos after an EOS block.
    decoded_at: Array  # [B, T] int32: the row's step count that last wrote a position; -1.
    completion_start: Array  # [B] int32: where each row's completion starts in ``ids``.
    block_steps: Array  # [n] int32: steps each block ran.


def decode(fns: ModelFns, params: Any, prompt_ids: Array, prompt_mask: Array | None,
           rng: Array, cfg: SamplerConfig, max_steps: int | None = None) -> Decoded:
    """dInfer's loop (module docstring) reading ``cfg``'s block_length, gen_length,
    temperature, threshold, mask_id, eos_id and kv_cache ("prefix": the committed blocks'
    cache; "none": a block-causal forward every step); ``steps``, ``remasking``,
    ``parallel_rule`` are not read. ``max_steps``: a block's step cap (default 4 x
    block_length). ``cfg.edit_threshold >= 0``: LLaDA2.1's JointThreshold steps instead (M2T
    at ``cfg.threshold``, T2T at ``cfg.edit_threshold``, ``cfg.max_post_edit_steps``)."""
    b, lp = prompt_ids.shape
    bl, gen = cfg.block_length, cfg.gen_length
    joint = cfg.edit_threshold >= 0
    edit_threshold, max_post_edit_steps = cfg.edit_threshold, cfg.max_post_edit_steps
    if max_steps is None:
        max_steps = bl + max_post_edit_steps + 1 if joint else 4 * bl
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

    def step(carry):  # fin [B]: the row's block is over; post [B]: its post-fill steps
        ids, trace, count, k, at, cache, fin, post, i = carry
        blk = jax.lax.dynamic_slice_in_dim(ids, at, bl, axis=1)
        masked = (blk == cfg.mask_id) & ~fin[:, None]
        logits = logits_of(ids, cache, at)
        u = noise(step_key(rng, i, k), logits.shape) if cfg.temperature > 0 else None
        if joint:
            x0, p = draw(logits, u, cfg.temperature)
            has = jnp.any(masked, axis=1)
            post = post + (~has & ~fin)
            stop = fin | (~has & (post > max_post_edit_steps))
            editable = (at + jnp.arange(bl))[None] >= comp[:, None]  # not the prompt's
            put = joint_transfer(x0, p, blk, masked, editable, cfg.threshold,
                                 edit_threshold) & ~stop[:, None]
            new_fin = stop | ~jnp.any(put, axis=1)  # a step that changes nothing ends it
        else:
            x0, put = transfer(logits, masked, u, cfg.temperature, cfg.threshold,
                               cfg.mask_id)
            new_fin = fin | ~jnp.any(masked & ~put, axis=1)  # no mask left
        ids = jax.lax.dynamic_update_slice_in_dim(ids, jnp.where(put, x0, blk), at, axis=1)
        old = jax.lax.dynamic_slice_in_dim(trace, at, bl, axis=1)
        trace = jax.lax.dynamic_update_slice_in_dim(
            trace, jnp.where(put, count[:, None], old), at, axis=1)
        return ids, trace, count + ~fin, k + 1, at, cache, new_fin, post, i

    def open_rows(carry):
        return (carry[3] < max_steps) & ~jnp.all(carry[6])

    def block(carry):
        ids, trace, count, cache, done, steps, i = carry
        at = start + i * bl
        blk = jax.lax.dynamic_slice_in_dim(ids, at, bl, axis=1)
        fin = done | ~jnp.any(blk == cfg.mask_id, axis=1)
        ids, trace, count, k, _, _, _, _, _ = jax.lax.while_loop(
            open_rows, step, (ids, trace, count, 0, at, cache, fin, jnp.zeros((b,), jnp.int32),
                              i))
        if cached:
            cache = commit_block(fns, params, ids, cache, at, bl, attn)
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
    outputs under dInfer's decoding rule (``decode``'s arguments); what
    ``sampling.generate`` runs for ``parallel_rule="dinfer"``."""
    d = decode(fns, params, prompt_ids, prompt_mask, rng, cfg, max_steps)
    return _completions(d.ids, d.decoded_at, d.completion_start, prompt_ids, cfg) + (
        d.block_steps,)
