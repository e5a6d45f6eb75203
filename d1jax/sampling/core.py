"""LLaDA's semi-autoregressive masked-diffusion sampler as one jitted program.

Semantics of LLaDA ``generate.py`` and d1's ``DiffuGRPOTrainer.generate``: the completion
starts fully masked and is decoded block by block, left to right. Each block gets
``steps // num_blocks`` steps (at least one, as d1; LLaDA asserts divisibility instead) and
step ``i`` unmasks the ``get_num_transfer_tokens`` budget (remainder front-loaded) of the
most confident masked positions of the block.

Work saved versus the reference, without changing a token: positions beyond the current
block always have confidence -inf and decoded positions never change, so only the current
block's logits are needed. The output head, the noise and the softmax run on
``block_length`` positions instead of the whole sequence; steps whose budget is zero
(``steps > gen_length``) are skipped; the whole generation (blocks x steps) is one XLA
program with no host round trip.

Precision (LLaDA draws Gumbel noise in float64 as ``exp(l) / (-log u)^T``): we use the
equivalent log-space form ``argmax(l + T g)`` in float32, which cannot overflow (``exp(l)``
does above l = 88 in float32). ``jax.random.gumbel`` in float32 draws u on a 2^-23 grid, so
g is capped at 15.9 and coarse above ~12: with a 126k vocabulary, tokens of relative
probability < ~1e-6 are under-sampled (arXiv:2409.02908). ``gumbel_noise`` builds g from 32
random bits with ``log1p`` (cap 22.9), which matches float64 sampling; ``bench/sampler.py``
measures all three. Confidence is ``exp(l[x0] - max l) / sum exp(l - max l)`` in float32
(the reference softmaxes [B, L, V] in float64; only the chosen token's probability is read).

Approximate fast decoding (Fast-dLLM, arXiv:2505.22618), options of the same loop:
- ``kv_cache`` "prefix" / "dual": at each block start one full forward computes every
  layer's keys/values (its logits serve the block's first step); later steps recompute only
  the block ("dual") or the block and everything after it ("prefix"), attending to the
  cached keys/values elsewhere. The cache is refreshed at the next block (and within it
  with ``cache_refresh``).
- ``threshold`` tau < 1: a step unmasks every masked position of the block whose confidence
  exceeds tau, and at least the exact schedule's budget (Fast-dLLM floors at one token), so
  tau >= 1 is the exact sampler and no block needs more than its steps; a block ends as
  soon as no row has a mask left in it (bounded while loop). With random remasking the
  "confidence" is the random draw, as in Fast-dLLM's code.
- ``recompute="masked"`` (dual cache): a step recomputes only the block positions masked
  before the previous step; older decoded positions keep the keys/values of the step after
  their decoding (dKV-Cache's delayed caching). ``cache_refresh=n``: a full forward again
  once n block tokens were decoded since the last one (n = 1 is the exact sampler).
- Cached steps run the output head on the still-masked positions only. Every step unmasks
  at least its budget, so their count has a static bound per step; static widths keep the
  program's shapes fixed (``head_sizes``, ``recompute_sizes``).
``SamplerConfig.fast()`` is the recommended setting (dual cache refreshed every 8 tokens,
tau 0.99; README).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
# (params, ids [B, L], attention mask [B, L] | None, slice_start, slice_len) -> [B, S, V].
ApplyFn = Callable[[Any, Array, Array | None, Array, int], Array]

REMASKING = ("low_confidence", "random")
FAST_DEFAULTS = dict(kv_cache="dual", threshold=0.99, cache_refresh=8)


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Static knobs of the sampler (frozen and hashable: a static jit argument)."""

    gen_length: int = 128  # Completion tokens.
    block_length: int = 32  # Semi-autoregressive block size (must divide gen_length).
    steps: int = 64  # Denoising steps in total; steps // num_blocks per block (min 1).
    temperature: float = 0.0  # Gumbel-max temperature T; 0 = argmax.
    cfg_scale: float = 0.0  # Classifier-free guidance w; > 0 adds a prompt-masked pass.
    remasking: str = "low_confidence"  # "low_confidence" (p of the chosen token) or "random".
    mask_id: int = 126336  # [MASK] token id.
    use_attention_mask: bool = True  # False attends to left padding, exactly as d1 does.
    logits_eos_inf: bool = False  # LLaDA App. B.4: never sample EOS.
    confidence_eos_eot_inf: bool = False  # LLaDA App. B.4: EOS/EoT are unmasked last.
    eos_id: int = 126081  # <|endoftext|>.
    eot_id: int = 126348  # <|eot_id|>.
    kv_cache: str = "none"  # "none" (exact), "prefix" or "dual" (Fast-dLLM block KV cache).
    threshold: float = 1.0  # Parallel decoding tau: also unmask every p > tau; >= 1 is off.
    recompute: str = "block"  # dual cache: recompute the whole block ("block", Fast-dLLM) or
    #                          only positions masked before the previous step ("masked").
    cache_refresh: int = 0  # kv_cache: a full forward (fresh keys/values) before any step
    #                        once this many block tokens were decoded since the last one;
    #                        0 = only at block starts (Fast-dLLM).

    def __post_init__(self):
        for name in ("gen_length", "block_length", "steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.gen_length % self.block_length:
            raise ValueError(f"block_length={self.block_length} must divide "
                             f"gen_length={self.gen_length} (LLaDA and d1 assert the same)")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking={self.remasking!r}: use one of {REMASKING}")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} must be >= 0")
        if self.kv_cache not in ("none", "prefix", "dual"):
            raise ValueError(f"kv_cache={self.kv_cache!r}: use 'none', 'prefix' or 'dual'")
        if self.recompute not in ("block", "masked"):
            raise ValueError(f"recompute={self.recompute!r}: use 'block' or 'masked'")
        if self.recompute == "masked" and self.kv_cache != "dual":
            raise ValueError(f"recompute='masked' needs kv_cache='dual', got "
                             f"kv_cache={self.kv_cache!r}")
        if self.cache_refresh < 0:
            raise ValueError(f"cache_refresh={self.cache_refresh} must be >= 0 (0: refresh "
                             "only at block starts)")
        if self.cache_refresh > 0 and self.kv_cache == "none":
            raise ValueError(f"cache_refresh={self.cache_refresh} needs a KV cache "
                             "(kv_cache='prefix' or 'dual')")
        if self.kv_cache != "none" and self.cfg_scale > 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} with kv_cache={self.kv_cache!r} is not "
                             "supported; use kv_cache='none' for classifier-free guidance")

    @classmethod
    def fast(cls, **overrides) -> "SamplerConfig":
        """The fast sampler's defaults under ``overrides``: Fast-dLLM's dual KV cache,
        refreshed after every 8 decoded tokens, and parallel decoding at tau 0.99 (the
        README's accuracy sweeps: within 1 point of exact on every trained model and set
        measured; without the refresh, tau 0.9 or with ``recompute="masked"`` it was not)."""
        return cls(**{**FAST_DEFAULTS, **overrides})

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        """d1's ``max(1, steps // num_blocks)``: the step budget of each block."""
        return max(1, self.steps // self.num_blocks)

    @property
    def loop_steps(self) -> int:
        """Steps actually run per block: those after the block_length-th have a zero budget."""
        return min(self.steps_per_block, self.block_length)


class GenerateOutput(NamedTuple):
    ids: Array  # [B, Lp + gen_length] int32: prompt followed by the completion.
    decoded_at: Array  # [B, gen_length] int32: global step (block * steps_per_block + i)
    #                    at which each token was unmasked: the per-step history.
    block_steps: Array  # [num_blocks] int32: model evaluations each block took.


class ModelFns(NamedTuple):
    """The model as the sampler sees it. ``prefill``/``decode`` serve ``kv_cache`` only.

    forward: ``ApplyFn``.
    prefill: ``(params, ids [B, L], mask, slice_start, slice_len) -> (logits [B, S, V],
      cache)``, cache holding every layer's keys/values of the whole sequence.
    decode: ``(params, ids [B, Q], cache, q_start, mask [B, L], head_len) -> logits
      [B, head_len, V]``: positions q_start:+Q recomputed, attending to the cache elsewhere.
    max_length: the model's max_sequence_length (longer requests are refused).
    decode_hidden, head: optional split of ``decode`` into ``(params, ids, cache, q_start,
      mask) -> hidden [B, Q, D]`` and ``(params, hidden [B, S, D]) -> logits [B, S, V]``;
      with them cached steps run the output head on the still-masked positions only.
    decode_at: ``(params, ids [B, Q], idx [B, Q], cache, window, window_start, mask) ->
      (hidden [B, Q, D], window)``, for ``recompute="masked"``: window positions
      window_start + idx recomputed, their keys/values written into ``window`` (the
      block's keys/values, kept apart from the cache; idx >= W: a padding row, not
      written), attending to it and to the cache.
    """

    forward: ApplyFn
    prefill: Callable[..., tuple[Array, Any]] | None = None
    decode: Callable[..., Array] | None = None
    max_length: int | None = None
    decode_hidden: Callable[..., Array] | None = None
    head: Callable[[Any, Array], Array] | None = None
    decode_at: Callable[..., tuple[Array, Any]] | None = None


def num_transfer_tokens(block_length: int, steps: int) -> np.ndarray:
    """Tokens unmasked per step for a fully masked block: [steps], remainder first."""
    base, rem = divmod(block_length, steps)
    return np.array([base + (i < rem) for i in range(steps)], np.int32)


def llada_apply_fn(model) -> ApplyFn:
    """Adapts a ``d1jax.LLaDA`` to ``apply_fn(params, ids, mask, slice_start, slice_len)``."""
    def apply_fn(params, ids, mask, slice_start, slice_len):
        return model.apply({"params": params}, ids, mask, slice_start=slice_start,
                           slice_len=slice_len)
    return apply_fn


def llada_fns(model) -> ModelFns:
    """``ModelFns`` of a ``d1jax.LLaDA``, with the KV-cache entry points."""
    def prefill(params, ids, mask, slice_start, slice_len):
        return model.apply({"params": params}, ids, mask, slice_start=slice_start,
                           slice_len=slice_len, method=model.prefill)

    def decode(params, ids, cache, q_start, mask, head_len):
        return model.apply({"params": params}, ids, cache, q_start, mask, head_len=head_len,
                           method=model.decode_slice)

    def decode_hidden(params, ids, cache, q_start, mask):
        return model.apply({"params": params}, ids, cache, q_start, mask,
                           method=model.decode_hidden)

    def head(params, hidden):
        return model.apply({"params": params}, hidden, method=model.logits)

    def decode_at(params, ids, idx, cache, window, window_start, mask):
        return model.apply({"params": params}, ids, idx, cache, window, window_start, mask,
                           method=model.decode_at)
    return ModelFns(llada_apply_fn(model), prefill, decode, model.config.max_sequence_length,
                    decode_hidden, head, decode_at)


def step_keys(rng: Array, step: Array | int) -> tuple[Array, Array]:
    """(Gumbel key, random-remasking key) of one global step; public for reference tests."""
    return tuple(jax.random.split(jax.random.fold_in(rng, step)))


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

    XLA:CPU lowers argmax to a scalar loop (3.2 ms for 8 x 32 x 8192 logits here); the
    maxima of ~sqrt(V)-wide chunks, the first chunk holding the overall maximum and the
    argmax inside it give the same index in a quarter of the time. Small or awkward
    vocabularies (no divisor in [16, sqrt(V)]) use argmax directly.
    """
    v = x.shape[-1]
    c = max(d for d in range(1, int(v ** 0.5) + 1) if v % d == 0)
    if v < 2048 or c < 16:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    chunks = x.reshape(*x.shape[:-1], v // c, c)
    which = jnp.argmax(jnp.max(chunks, axis=-1), axis=-1)
    inner = jnp.take_along_axis(chunks, which[..., None, None], axis=-2)[..., 0, :]
    return (which * c + jnp.argmax(inner, axis=-1)).astype(jnp.int32)


def _propose(logits_bsv: Array, key_g: Array, key_r: Array, cfg: SamplerConfig,
             idx_bs: Array | None = None):
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
    if cfg.remasking == "random":
        conf = jax.random.uniform(key_r, (b, blk), jnp.float32)
        if idx_bs is not None:
            conf = jnp.take_along_axis(conf, idx_bs, axis=1)
    else:
        lg = logits_bsv
        if cfg.confidence_eos_eot_inf:
            lg = lg.at[..., jnp.array([cfg.eos_id, cfg.eot_id])].set(-jnp.inf)
        chosen = jnp.take_along_axis(lg, x0[..., None], axis=-1)[..., 0]
        top = jnp.max(lg, axis=-1, keepdims=True)  # softmax of the chosen token, stably
        conf = jnp.exp(chosen - top[..., 0]) / jnp.sum(jnp.exp(lg - top), axis=-1)
    if cfg.confidence_eos_eot_inf:
        conf = jnp.where((x0 == cfg.eos_id) | (x0 == cfg.eot_id), 0.0, conf)
    x0 = x0.astype(jnp.int32)
    if idx_bs is not None:  # back to block positions
        rows = jnp.arange(b)[:, None]
        x0 = jnp.zeros((b, blk), jnp.int32).at[rows, idx_bs].set(x0)
        conf = jnp.zeros((b, blk), jnp.float32).at[rows, idx_bs].set(conf)
    return x0, conf


def _select(conf_bs: Array, masked_bs: Array, k_b: Array) -> Array:
    """Bool [B, S]: the k_b most confident masked positions of each row (ties: lower index).

    Masked confidences are >= 0 and others -inf, so masked positions always rank first.
    """
    score = jnp.where(masked_bs, conf_bs, -jnp.inf)
    rank = jnp.argsort(jnp.argsort(-score, axis=-1, stable=True), axis=-1, stable=True)
    return (rank < k_b[:, None]) & masked_bs


class _Ctx(NamedTuple):
    """Per-call constants of the sampling loop."""

    params: Any
    rng: Array
    attn: Array | None  # [B, L] key mask, or None (attend to all).
    prompt_len: int
    budget: Array  # [loop_steps] int32.


def _gstep(block, i, cfg: SamplerConfig):
    """Global step number of step i of a block (keys, ``decoded_at``)."""
    return block * cfg.steps_per_block + i


def _keys(ctx: _Ctx, block, i, cfg: SamplerConfig) -> tuple[Array, Array]:
    return step_keys(ctx.rng, _gstep(block, i, cfg))


def _transfer(carry, x0: Array, conf: Array, i: Array, block, ctx: _Ctx, cfg: SamplerConfig):
    """One denoising step on the current block given its proposals x0, conf [B, blk]."""
    x, decoded_at = carry
    blk = cfg.block_length
    start = ctx.prompt_len + block * blk
    gstep = _gstep(block, i, cfg)
    xb = jax.lax.dynamic_slice_in_dim(x, start, blk, axis=1)
    masked = xb == cfg.mask_id
    k = jnp.broadcast_to(ctx.budget[i], masked.shape[:1])
    if cfg.threshold < 1.0:  # Fast-dLLM: also every position more confident than tau.
        k = jnp.maximum(k, jnp.sum(masked & (conf > cfg.threshold), axis=-1))
    take = _select(conf, masked, k)
    x = jax.lax.dynamic_update_slice_in_dim(x, jnp.where(take, x0, xb), start, axis=1)
    db = jax.lax.dynamic_slice_in_dim(decoded_at, block * blk, blk, axis=1)
    decoded_at = jax.lax.dynamic_update_slice_in_dim(
        decoded_at, jnp.where(take, gstep, db), block * blk, axis=1)
    return x, decoded_at


def _run_steps(carry, first: int, propose_fn, aux, block, ctx: _Ctx, cfg: SamplerConfig):
    """Steps first.. of a block until it is decoded or its budget is spent.

    ``propose_fn(x, aux, i) -> (x0, conf, aux)`` gives step i's proposals [B, blk]; ``aux``
    is loop state of its own (the KV cache). Returns (carry, steps taken counting from 0).
    A bounded while loop: without a threshold it always runs ``loop_steps`` steps; with
    one a block may finish early.
    """
    blk, start = cfg.block_length, ctx.prompt_len + block * cfg.block_length

    def cond(state):
        (x, _), _, i = state
        xb = jax.lax.dynamic_slice_in_dim(x, start, blk, axis=1)
        return (i < cfg.loop_steps) & jnp.any(xb == cfg.mask_id)

    def body(state):
        carry, aux, i = state
        x0, conf, aux = propose_fn(carry[0], aux, i)
        return _transfer(carry, x0, conf, i, block, ctx, cfg), aux, i + 1

    carry, _, n = jax.lax.while_loop(cond, body, (carry, aux, jnp.asarray(first, jnp.int32)))
    return carry, n


def _guided_logits(fns: ModelFns, ctx: _Ctx, x: Array, start, cfg: SamplerConfig) -> Array:
    """Float32 logits [B, blk, V] of the block from a full forward, CFG when enabled."""
    blk = cfg.block_length
    if cfg.cfg_scale > 0:  # LLaDA: un + (w + 1)(cond - un), prompt masked in the un-pass.
        prompt_pos = jnp.arange(x.shape[1])[None, :] < ctx.prompt_len
        both = jnp.concatenate([x, jnp.where(prompt_pos, cfg.mask_id, x)], axis=0)
        attn = None if ctx.attn is None else jnp.concatenate([ctx.attn, ctx.attn], axis=0)
        cond, uncond = jnp.split(fns.forward(ctx.params, both, attn, start, blk), 2, axis=0)
        logits = uncond.astype(jnp.float32) + (cfg.cfg_scale + 1.0) * (
            cond.astype(jnp.float32) - uncond.astype(jnp.float32))
    else:
        logits = fns.forward(ctx.params, x, ctx.attn, start, blk).astype(jnp.float32)
    return _mask_eos(logits, cfg)


def _mask_eos(logits_bsv: Array, cfg: SamplerConfig) -> Array:
    if cfg.logits_eos_inf:
        logits_bsv = logits_bsv.at[..., cfg.eos_id].set(-jnp.inf)
    return logits_bsv


def _exact_block(block, carry, fns: ModelFns, ctx: _Ctx, cfg: SamplerConfig):
    """One block of the exact sampler: a full forward per step."""
    start = ctx.prompt_len + block * cfg.block_length

    def propose_fn(x, aux, i):
        logits = _guided_logits(fns, ctx, x, start, cfg)
        return (*_propose(logits, *_keys(ctx, block, i, cfg), cfg), aux)
    return _run_steps(carry, 0, propose_fn, None, block, ctx, cfg)


def _bounds(cfg: SamplerConfig) -> np.ndarray:
    """Most masked positions of the block before each step: [loop_steps].

    Every step unmasks at least its budget (or all that is left), so before step i at
    most ``block_length - sum(budget[:i])`` positions are masked.
    """
    budget = num_transfer_tokens(cfg.block_length, cfg.steps_per_block)[:cfg.loop_steps]
    return cfg.block_length - np.concatenate([[0], np.cumsum(budget)[:-1]])


def _bucket(bound: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    return np.array([min(j for j, m in enumerate(sizes) if m >= max(n, 1)) for n in bound],
                    np.int32)


def _widths(block_length: int) -> tuple[int, ...]:
    """The static widths of cached steps: ceil(block_length * j / 8), j = 1..8."""
    return tuple(sorted({-(-block_length * j // 8) for j in range(1, 9)}))


def head_sizes(cfg: SamplerConfig) -> tuple[np.ndarray, tuple[int, ...]]:
    """Static output-head widths of cached steps: (size index per step, sizes).

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


def _recompute_masked(fns: ModelFns, ctx: _Ctx, cfg: SamplerConfig, block_ids: Array,
                      cache, prev_masked: Array, i: Array, start):
    """``recompute="masked"``: the positions masked before the previous step, recomputed at
    the static width of ``recompute_sizes``; their keys/values go into the block's window.
    Returns (hidden [B, blk, D] (other rows zero, never read), (cache, window))."""
    blk = cfg.block_length
    rows = jnp.arange(block_ids.shape[0])[:, None]
    order, (which, sizes) = _first(prev_masked), recompute_sizes(cfg)

    def on(m):
        def fn():  # rows past the masked count point outside the block: dropped
            idx = jnp.where(jnp.arange(m) < jnp.sum(prev_masked, -1, keepdims=True),
                            order[:, :m], blk)
            ids = jnp.take_along_axis(block_ids, jnp.minimum(idx, blk - 1), axis=1)
            h, window = fns.decode_at(ctx.params, ids, idx, *cache, start, ctx.attn)
            h_blk = jnp.zeros((h.shape[0], blk, h.shape[-1]), h.dtype)
            return h_blk.at[rows, idx].set(h, mode="drop"), (cache[0], window)
        return fn
    return jax.lax.switch(_width(which, sizes, i, prev_masked), [on(m) for m in sizes])


def _propose_masked(fns: ModelFns, ctx: _Ctx, cfg: SamplerConfig, h_bsd: Array,
                    masked_bs: Array, i: Array, keys) -> tuple[Array, Array]:
    """Proposals [B, blk] with the output head run on the masked positions only, at the
    static width of ``head_sizes`` (the first m of ``_first``: all of them)."""
    order, (which, sizes) = _first(masked_bs), head_sizes(cfg)

    def head_on(m):
        def fn():
            idx = order[:, :m]
            hm = jnp.take_along_axis(h_bsd, idx[..., None], axis=1)
            logits = _mask_eos(fns.head(ctx.params, hm).astype(jnp.float32), cfg)
            return _propose(logits, *keys, cfg, idx_bs=idx)
        return fn
    return jax.lax.switch(_width(which, sizes, i, masked_bs), [head_on(m) for m in sizes])


def _cached_block(block, carry, fns: ModelFns, ctx: _Ctx, cfg: SamplerConfig):
    """One block with a Fast-dLLM KV cache: a full forward (also step 0), then cached steps.

    "prefix" recomputes the block and everything after it; "dual" only the block, reusing
    the suffix's keys/values from the block's first forward; with ``recompute="masked"``
    only the block positions masked before the previous step, whose fresh keys/values are
    kept in a window of the block's keys/values. With ``cache_refresh`` a step runs a full
    forward instead (new cache) once that many block tokens were decoded since the last
    one. Cached steps run the output head only on positions still masked when ``fns`` has
    ``decode_hidden`` and ``head``.
    """
    blk, total = cfg.block_length, carry[0].shape[1]
    start = ctx.prompt_len + block * blk
    q_len = blk if cfg.kv_cache == "dual" else total - start  # static: block is an int
    block_ids = lambda x: jax.lax.dynamic_slice_in_dim(x, start, blk, axis=1)

    def full(x, i):
        """A full forward: proposals and (cache, the block's window of it or None)."""
        logits, cache = fns.prefill(ctx.params, x, ctx.attn, start, blk)
        x0, conf = _propose(_mask_eos(logits.astype(jnp.float32), cfg),
                            *_keys(ctx, block, i, cfg), cfg)
        window = None
        if cfg.recompute == "masked":  # [n_layers, B, L, ...] leaves: the block's slice
            window = jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, start, blk, axis=2),
                                  cache)
        return x0, conf, (cache, window)

    def cached(x, cache, prev_masked, now, i):
        keys = _keys(ctx, block, i, cfg)
        ids = jax.lax.dynamic_slice_in_dim(x, start, q_len, axis=1)
        if fns.decode_hidden is None or fns.head is None:
            out = fns.decode(ctx.params, ids, cache[0], start, ctx.attn, blk)
            return (*_propose(_mask_eos(out.astype(jnp.float32), cfg), *keys, cfg), cache)
        if cfg.recompute == "masked":
            h, cache = _recompute_masked(fns, ctx, cfg, block_ids(x), cache, prev_masked, i,
                                         start)
        else:
            h = fns.decode_hidden(ctx.params, ids, cache[0], start, ctx.attn)[:, :blk]
        return (*_propose_masked(fns, ctx, cfg, h, now, i, keys), cache)

    masked0 = block_ids(carry[0]) == cfg.mask_id
    x0, conf, cache = full(carry[0], 0)
    carry = _transfer(carry, x0, conf, 0, block, ctx, cfg)
    count = lambda masked_bs: jnp.sum(masked_bs, axis=-1, dtype=jnp.int32)

    # aux: (cache, block mask before the previous step, masked count at the last forward)
    def propose_fn(x, aux, i):
        cache, prev_masked, then = aux
        now = block_ids(x) == cfg.mask_id

        def step():
            x0, conf, new = cached(x, cache, prev_masked, now, i)
            return x0, conf, (new, now, then)
        if cfg.cache_refresh == 0:
            return step()

        def refresh():
            x0, conf, new = full(x, i)
            return x0, conf, (new, now, count(now))
        return jax.lax.cond(jnp.max(then - count(now)) >= cfg.cache_refresh, refresh, step)
    return _run_steps(carry, 1, propose_fn, (cache, masked0, count(masked0)), block, ctx, cfg)


def generate(model_fns: ModelFns | ApplyFn, params: Any, prompt_ids: Array,
             prompt_mask: Array | None, rng: Array, config: SamplerConfig,
             max_length: int | None = None) -> GenerateOutput:
    """Generates ``config.gen_length`` tokens after each left-padded prompt.

    Args:
      model_fns: ``ModelFns`` (``llada_fns(model)``), or just an ``ApplyFn``
        (``llada_apply_fn(model)``) when ``config.kv_cache == "none"``.
      params: model params (any sharding).
      prompt_ids: [B, Lp] int, left-padded; must not contain ``mask_id``.
      prompt_mask: [B, Lp] 1 for real tokens, 0 for padding (None: no padding).
      rng: PRNG key; global step s draws from ``step_keys(rng, s)``.
      config: SamplerConfig (static).
      max_length: the model's max_sequence_length (default: ``model_fns.max_length``).
    Returns:
      GenerateOutput(ids [B, Lp + gen_length], decoded_at [B, gen_length],
      block_steps [num_blocks]).
    """
    fns = model_fns if isinstance(model_fns, ModelFns) else ModelFns(model_fns)
    b, lp = prompt_ids.shape
    total = lp + config.gen_length
    max_length = fns.max_length if max_length is None else max_length
    if max_length is not None and total > max_length:
        raise ValueError(f"prompt length {lp} + gen_length {config.gen_length} = {total} exceeds "
                         f"the model's max_sequence_length {max_length}; truncate the prompt")
    if prompt_mask is not None and prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompt_ids shape "
                         f"{prompt_ids.shape}")
    if config.kv_cache != "none" and (fns.prefill is None or fns.decode is None):
        raise ValueError(f"kv_cache={config.kv_cache!r} needs ModelFns with prefill and decode "
                         "(e.g. sampler.llada_fns(model)), got a plain apply_fn")
    if config.recompute == "masked" and None in (fns.decode_at, fns.decode_hidden, fns.head):
        raise ValueError("recompute='masked' needs ModelFns with decode_at, decode_hidden and "
                         "head (e.g. sampler.llada_fns(model))")
    attn = None
    if config.use_attention_mask and prompt_mask is not None:
        attn = jnp.concatenate([prompt_mask.astype(jnp.int32),
                                jnp.ones((b, config.gen_length), jnp.int32)], axis=1)
    budget = num_transfer_tokens(config.block_length, config.steps_per_block)
    ctx = _Ctx(params, rng, attn, lp, jnp.asarray(budget[:config.loop_steps]))
    x = jnp.concatenate([prompt_ids.astype(jnp.int32),
                         jnp.full((b, config.gen_length), config.mask_id, jnp.int32)], axis=1)
    carry = (x, jnp.full((b, config.gen_length), -1, jnp.int32))
    (x, decoded_at), block_steps = _block_loop(carry, fns, ctx, config)
    return GenerateOutput(x, decoded_at, block_steps)


def _block_loop(carry, fns: ModelFns, ctx: _Ctx, cfg: SamplerConfig):
    """Blocks left to right: a lax loop, or unrolled for "prefix" (its shapes vary by block)."""
    block_fn = _exact_block if cfg.kv_cache == "none" else _cached_block
    if cfg.kv_cache == "prefix":
        steps = []
        for block in range(cfg.num_blocks):
            carry, n = block_fn(block, carry, fns, ctx, cfg)
            steps.append(n)
        return carry, jnp.stack(steps)

    def body(block, state):
        carry, steps = state
        carry, n = block_fn(block, carry, fns, ctx, cfg)
        return carry, steps.at[block].set(n)
    return jax.lax.fori_loop(0, cfg.num_blocks, body,
                             (carry, jnp.zeros((cfg.num_blocks,), jnp.int32)))


def make_generate_fn(model_fns: ModelFns | ApplyFn, config: SamplerConfig,
                     max_length: int | None = None):
    """``jax.jit``-ed ``(params, prompt_ids, prompt_mask, rng) -> GenerateOutput``.

    Compiles once per (batch, prompt length) for this config; shardings follow the inputs
    (params by the rules, the batch over (data, fsdp)).
    """
    def fn(params, prompt_ids, prompt_mask, rng):
        return generate(model_fns, params, prompt_ids, prompt_mask, rng, config, max_length)
    return jax.jit(fn)


def history(out: GenerateOutput, prompt_len: int, mask_id: int) -> np.ndarray:
    """Completions after each global step, [T, B, gen_length] (host numpy, for inspection)."""
    ids = np.asarray(out.ids)[:, prompt_len:]
    at = np.asarray(out.decoded_at)
    steps = np.arange(int(at.max()) + 1)[:, None, None]
    return np.where(at[None] <= steps, ids[None], mask_id)
