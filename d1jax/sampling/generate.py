"""LLaDA's semi-autoregressive masked-diffusion sampler as one jitted program (any family).

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
  with ``cache_refresh``). Either family: Dream's cached forwards also recompute the row
  before the block, which predicts its first position (``d1jax.model.dream``).
- Parallel decoding at threshold tau, by ``parallel_rule``:
  "budget" (tau < 1): a step unmasks every masked position of the block whose confidence
  exceeds tau, and at least the exact schedule's budget, so tau >= 1 is the exact sampler
  and no block needs more than its steps.
  "fast_dllm" (Fast-dLLM's ``get_transfer_index`` with a threshold): a step unmasks the
  most confident masked position and every other one whose confidence is at least tau,
  with no per-step budget; ``steps`` does not apply and a block runs until it has no mask
  left, at most ``block_length`` steps (tau > 1: one token per step, the exact sampler with
  ``steps = gen_length``). Global step numbers (keys, ``decoded_at``) then reserve
  ``block_length`` per block.
  Either way a block ends as soon as no row has a mask left in it (bounded while loop).
  "dinfer" (``loop="sdar"`` only): dInfer's ``ThresholdParallelDecoder`` on block
  diffusion's blocks, and with ``edit_threshold >= 0`` LLaDA2.1's token editing
  (``d1jax.sampling.threshold``).
  ``first_position`` ("fast_dllm" only): step 0 unmasks the block's first position alone,
  as Fast-dLLM's Dream loop does at each block's full forward.
  With random remasking the "confidence" is the random draw, as in Fast-dLLM's code.
- ``recompute="masked"`` (dual cache): a step recomputes only the block positions masked
  before the previous step; older decoded positions keep the keys/values of the step after
  their decoding (dKV-Cache's delayed caching). ``cache_refresh=n``: a full forward again
  once n block tokens were decoded since the last one (n = 1 is the exact sampler).
- Cached steps run the output head on the still-masked positions only. Every step unmasks
  at least its rule's minimum (the budget, or one token), so their count has a static bound
  per step; static widths keep the program's shapes fixed (``head_sizes``,
  ``recompute_sizes``).
``SamplerConfig.fast()`` is the recommended setting (dual cache refreshed every 8 tokens,
tau 0.99, "budget" rule; README).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.sampling import block_diffusion, threshold
from d1jax.sampling.cached import cached_block
from d1jax.sampling.config import SamplerConfig
from d1jax.sampling.exact import exact_block
from d1jax.sampling.model_fns import ApplyFn, ModelFns
from d1jax.sampling.step import Context, DecodeState

Array = jax.Array


class GenerateOutput(NamedTuple):
    ids: Array  # [B, Lp + gen_length] int32: prompt followed by the completion.
    decoded_at: Array  # [B, gen_length] int32: global step (block * step_stride + i)
    #                    at which each token was unmasked: the per-step history (loop
    #                    "sdar": the row's own step count; "dream": diffusion_generate's
    #                    step; -1: not decoded).
    block_steps: Array  # [num_blocks] int32: model evaluations each block took.


def _check_call(fns: ModelFns, prompt_ids: Array, prompt_mask: Array | None,
                config: SamplerConfig, max_length: int | None) -> None:
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
                         "(e.g. sampling.model_fns(model)), got a plain apply_fn")
    if config.loop == "sdar" and fns.block_size not in (None, config.block_length):
        raise ValueError(f"loop='sdar' decodes the model's blocks: set block_length="
                         f"{fns.block_size} (its block_size), got {config.block_length}")
    if config.loop == "sdar" and config.kv_cache != "none" and fns.decode_at is None:
        raise ValueError("loop='sdar' with kv_cache='prefix' needs ModelFns with decode_at "
                         "(the committed block's keys/values; sampling.model_fns(model))")
    if config.recompute == "masked" and None in (fns.decode_at, fns.decode_hidden, fns.head):
        raise ValueError("recompute='masked' needs ModelFns with decode_at, decode_hidden and "
                         "head (e.g. sampling.model_fns(model))")


def generate(model_fns: ModelFns | ApplyFn, params: Any, prompt_ids: Array,
             prompt_mask: Array | None, rng: Array, config: SamplerConfig,
             max_length: int | None = None) -> GenerateOutput:
    """Generates ``config.gen_length`` tokens after each left-padded prompt.

    Args:
      model_fns: ``ModelFns`` (``model_fns(model)``), or just an ``ApplyFn``
        (``model_apply_fn(model)``) when ``config.kv_cache == "none"``.
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
    _check_call(fns, prompt_ids, prompt_mask, config, max_length)
    if config.loop == "dream":
        return _dream(fns, params, prompt_ids, prompt_mask, rng, config)
    if config.loop == "sdar":
        mask = prompt_mask if config.use_attention_mask else None
        # "dinfer": dInfer's threshold decoder, LLaDA2.1's token editing with edit_threshold.
        loop = threshold.generate if config.parallel_rule == "dinfer" else block_diffusion.generate
        return GenerateOutput(*loop(fns, params, prompt_ids, mask, rng, config))
    b, lp = prompt_ids.shape
    attn = None
    if config.use_attention_mask and prompt_mask is not None:
        attn = jnp.concatenate([prompt_mask.astype(jnp.int32),
                                jnp.ones((b, config.gen_length), jnp.int32)], axis=1)
    ctx = Context(params, rng, attn, lp, jnp.asarray(config.min_transfer()))
    ids = jnp.concatenate([prompt_ids.astype(jnp.int32),
                           jnp.full((b, config.gen_length), config.mask_id, jnp.int32)], axis=1)
    seq = DecodeState(ids, jnp.full((b, config.gen_length), -1, jnp.int32),
                      jnp.zeros((config.num_blocks,), jnp.int32))
    seq = _block_loop(seq, fns, ctx, config)
    return GenerateOutput(seq.ids_bl, seq.decoded_at_bg, seq.block_steps_n)


def _dream(fns: ModelFns, params: Any, prompt_ids: Array, prompt_mask: Array | None,
           rng: Array, config: SamplerConfig) -> GenerateOutput:
    """``loop="dream"``: Dream's ``diffusion_generate`` on the same model functions
    (``decoded_at``: its step that unmasked each token)."""
    from d1jax.sampling import dream

    def predict(p, ids, mask):
        return fns.forward(p, ids, mask, 0, ids.shape[1])
    mask = prompt_mask if config.use_attention_mask else None
    ids, decoded_at = dream.diffusion_generate(predict, params, prompt_ids, mask, rng,
                                               config.dream_config(), trace=True)
    return GenerateOutput(ids, decoded_at, jnp.full((1,), config.steps, jnp.int32))


def _block_loop(seq: DecodeState, fns: ModelFns, ctx: Context,
                cfg: SamplerConfig) -> DecodeState:
    """Blocks left to right: a lax loop, or unrolled for "prefix" (its shapes vary by block)."""
    block_fn = exact_block if cfg.kv_cache == "none" else cached_block
    if cfg.kv_cache == "prefix":
        for block in range(cfg.num_blocks):
            seq = block_fn(block, seq, fns, ctx, cfg)
        return seq
    return jax.lax.fori_loop(0, cfg.num_blocks,
                             lambda block, s: block_fn(block, s, fns, ctx, cfg), seq)


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
