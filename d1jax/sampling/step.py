"""One denoising step: proposals and confidences, which positions to unmask, the transfer,
and the bounded loop of steps over one block (shared by the exact and cached loops)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from d1jax.sampling.config import SamplerConfig

Array = jax.Array


class Context(NamedTuple):
    """Per-call constants of the sampling loop."""

    params: Any
    rng: Array
    attn_bl: Array | None  # [B, L] key mask, or None (attend to all).
    prompt_len: int
    min_transfer_n: Array  # [loop_steps] int32: tokens each step unmasks at least.


class DecodeState(NamedTuple):
    """The sequence being decoded: the carry of the block loop."""

    ids_bl: Array  # [B, L] int32: prompt then completion, mask_id where not yet decoded.
    decoded_at_bg: Array  # [B, gen_length] int32: global step each token was unmasked at
    #                       (-1 while masked).
    block_steps_n: Array  # [num_blocks] int32: model evaluations each block took.


class StepLoopState(NamedTuple):
    """The carry of the step loop within one block."""

    seq: DecodeState
    aux: Any  # The block loop's own state (the KV cache), or None.
    step: Array  # int32 scalar: index of the next step within the block.


# (ids [B, L], aux, step) -> (x0 [B, blk] int32, confidence [B, blk] float32, aux).
ProposeFn = Callable[[Array, Any, Array], tuple[Array, Array, Any]]


def step_keys(rng: Array, step: Array | int) -> tuple[Array, Array]:
    """(Gumbel key, random-remasking key) of one global step; public for reference tests."""
    return tuple(jax.random.split(jax.random.fold_in(rng, step)))


def block_keys(ctx: Context, block, i, cfg: SamplerConfig) -> tuple[Array, Array]:
    """``step_keys`` of step i of a block."""
    return step_keys(ctx.rng, block * cfg.step_stride + i)


def block_start(ctx: Context, block, cfg: SamplerConfig):
    """Position of the block's first token in the sequence."""
    return ctx.prompt_len + block * cfg.block_length


def gumbel_noise(key: Array, shape: tuple[int, ...]) -> Array:
    """Standard Gumbel noise (float32) with 32-bit resolution in the upper tail.

    g = -log(E), E = -log1p(-v) ~ Exp(1), v = (bits + 0.5) / 2^32: small E (large g, the
    values that decide a Gumbel-max sample) are resolved to 2^-32 instead of 2^-23.
    """
    bits = jax.random.bits(key, shape, jnp.uint32)
    v = jnp.minimum((bits.astype(jnp.float32) + 0.5) * 2.0 ** -32, 1.0 - 2.0 ** -24)
    return -jnp.log(-jnp.log1p(-v))


def argmax_last(x: Array) -> Array:
    """``jnp.argmax(x, -1)`` (first maximum on ties), computed in two levels.

    XLA:CPU lowers argmax to a scalar loop (3.2 ms for 8 x 32 x 8192 logits); the maxima
    of ~sqrt(V)-wide chunks, the first chunk holding the overall maximum and the argmax
    inside it give the same index in a quarter of the time. Small or awkward vocabularies
    (no divisor in [16, sqrt(V)]) use argmax directly.
    """
    v = x.shape[-1]
    c = max(d for d in range(1, int(v ** 0.5) + 1) if v % d == 0)
    if v < 2048 or c < 16:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    chunks = x.reshape(*x.shape[:-1], v // c, c)
    which = jnp.argmax(jnp.max(chunks, axis=-1), axis=-1)
    inner = jnp.take_along_axis(chunks, which[..., None, None], axis=-2)[..., 0, :]
    return (which * c + jnp.argmax(inner, axis=-1)).astype(jnp.int32)


def mask_eos(logits_bsv: Array, cfg: SamplerConfig) -> Array:
    """``logits_eos_inf``: EOS can never be proposed."""
    if cfg.logits_eos_inf:
        logits_bsv = logits_bsv.at[..., cfg.eos_id].set(-jnp.inf)
    return logits_bsv


def _confidence(logits_bsv: Array, x0_bs: Array, key_r: Array, cfg: SamplerConfig,
                idx_bs: Array | None) -> Array:
    """Confidence [B, S] float32 of the proposals: a uniform draw or p of the chosen token."""
    if cfg.remasking == "random":
        conf = jax.random.uniform(key_r, (logits_bsv.shape[0], cfg.block_length), jnp.float32)
        return conf if idx_bs is None else jnp.take_along_axis(conf, idx_bs, axis=1)
    lg = logits_bsv
    if cfg.confidence_eos_eot_inf:
        lg = lg.at[..., jnp.array([cfg.eos_id, cfg.eot_id])].set(-jnp.inf)
    chosen = jnp.take_along_axis(lg, x0_bs[..., None], axis=-1)[..., 0]
    top = jnp.max(lg, axis=-1, keepdims=True)  # softmax of the chosen token, stably
    return jnp.exp(chosen - top[..., 0]) / jnp.sum(jnp.exp(lg - top), axis=-1)


def propose(logits_bsv: Array, key_g: Array, key_r: Array, cfg: SamplerConfig,
            idx_bs: Array | None = None) -> tuple[Array, Array]:
    """Proposed tokens x0 [B, blk] int32 and their confidence [B, blk] float32 (>= 0).

    ``logits_bsv`` are the block's logits, or with ``idx_bs`` those of block positions
    ``idx_bs`` [B, S] only (distinct; the others get x0 = 0, confidence 0 and must not be
    chosen). The noise is drawn for the whole block either way, so both give the same draw.
    With ``confidence_eos_eot_inf`` the probability is renormalised without EOS/EoT and is 0
    for them, as LLaDA's code computes at temperature 0 (its chained assignment drops the
    EOS part at T > 0; we do not copy that). 0 rather than -inf keeps the per-step budget.
    """
    b, blk, v = logits_bsv.shape[0], cfg.block_length, logits_bsv.shape[-1]
    if cfg.temperature > 0:
        g = gumbel_noise(key_g, (b, blk, v))
        if idx_bs is not None:
            g = jnp.take_along_axis(g, idx_bs[..., None], axis=1)
        x0 = argmax_last(logits_bsv + cfg.temperature * g)
    else:
        x0 = argmax_last(logits_bsv)
    conf = _confidence(logits_bsv, x0, key_r, cfg, idx_bs)
    if cfg.confidence_eos_eot_inf:
        conf = jnp.where((x0 == cfg.eos_id) | (x0 == cfg.eot_id), 0.0, conf)
    x0 = x0.astype(jnp.int32)
    if idx_bs is not None:  # back to block positions
        rows = jnp.arange(b)[:, None]
        x0 = jnp.zeros((b, blk), jnp.int32).at[rows, idx_bs].set(x0)
        conf = jnp.zeros((b, blk), jnp.float32).at[rows, idx_bs].set(conf)
    return x0, conf


def select(conf_bs: Array, masked_bs: Array, k_b: Array) -> Array:
    """Bool [B, S]: the k_b most confident masked positions of each row (ties: lower index).

    Masked confidences are >= 0 and others -inf, so masked positions always rank first.
    """
    score = jnp.where(masked_bs, conf_bs, -jnp.inf)
    rank = jnp.argsort(jnp.argsort(-score, axis=-1, stable=True), axis=-1, stable=True)
    return (rank < k_b[:, None]) & masked_bs


def num_to_unmask(conf_bs: Array, masked_bs: Array, floor: Array,
                  cfg: SamplerConfig) -> Array:
    """Positions step unmasks per row [B]: its floor, or more under parallel decoding.

    "budget" counts p > tau (tau >= 1: the floor alone); "fast_dllm" counts p >= tau, as
    Fast-dLLM keeps every top-k position not below the threshold.
    """
    k_b = jnp.broadcast_to(floor, masked_bs.shape[:1])
    if not cfg.parallel:
        return k_b
    passes = conf_bs >= cfg.threshold if cfg.parallel_rule == "fast_dllm" else (
        conf_bs > cfg.threshold)
    return jnp.maximum(k_b, jnp.sum(masked_bs & passes, axis=-1))


def transfer(seq: DecodeState, x0_bs: Array, conf_bs: Array, i: Array, block,
             ctx: Context, cfg: SamplerConfig) -> DecodeState:
    """One denoising step on the current block given its proposals x0, conf [B, blk]."""
    blk = cfg.block_length
    start = block_start(ctx, block, cfg)
    xb = jax.lax.dynamic_slice_in_dim(seq.ids_bl, start, blk, axis=1)
    masked = xb == cfg.mask_id
    take = select(conf_bs, masked, num_to_unmask(conf_bs, masked, ctx.min_transfer_n[i], cfg))
    if cfg.first_position:  # Fast-dLLM's Dream loop: step 0 takes the block's first position
        take = jnp.where(i == 0, masked & (jnp.arange(blk) == 0), take)
    ids = jax.lax.dynamic_update_slice_in_dim(seq.ids_bl, jnp.where(take, x0_bs, xb), start,
                                              axis=1)
    db = jax.lax.dynamic_slice_in_dim(seq.decoded_at_bg, block * blk, blk, axis=1)
    decoded_at = jax.lax.dynamic_update_slice_in_dim(
        seq.decoded_at_bg, jnp.where(take, block * cfg.step_stride + i, db), block * blk,
        axis=1)
    return seq._replace(ids_bl=ids, decoded_at_bg=decoded_at)


def run_steps(seq: DecodeState, first: int, propose_fn: ProposeFn, aux, block, ctx: Context,
              cfg: SamplerConfig) -> DecodeState:
    """Steps first.. of a block until it is decoded or ``loop_steps`` ran.

    ``propose_fn(ids, aux, i) -> (x0, conf, aux)`` gives step i's proposals [B, blk];
    ``aux`` is loop state of its own (the KV cache). Records the steps taken (counting from
    0) in ``block_steps_n``. A bounded while loop: without parallel decoding it always runs
    ``loop_steps`` steps; with it a block may finish early.
    """
    blk, start = cfg.block_length, block_start(ctx, block, cfg)

    def cond(state: StepLoopState):
        xb = jax.lax.dynamic_slice_in_dim(state.seq.ids_bl, start, blk, axis=1)
        return (state.step < cfg.loop_steps) & jnp.any(xb == cfg.mask_id)

    def body(state: StepLoopState):
        x0, conf, aux = propose_fn(state.seq.ids_bl, state.aux, state.step)
        seq = transfer(state.seq, x0, conf, state.step, block, ctx, cfg)
        return StepLoopState(seq, aux, state.step + 1)

    out = jax.lax.while_loop(cond, body, StepLoopState(seq, aux, jnp.asarray(first, jnp.int32)))
    return out.seq._replace(block_steps_n=out.seq.block_steps_n.at[block].set(out.step))
