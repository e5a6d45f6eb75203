"""LLaDA's semi-autoregressive sampler with low-confidence remasking, as one jitted program.

Semantics of LLaDA ``generate.py`` and d1's ``DiffuGRPOTrainer.generate``: the completion
starts fully masked and is decoded block by block, left to right; each block gets
``steps / num_blocks`` steps and each step unmasks the ``get_num_transfer_tokens`` budget
(remainder front-loaded) of the most confident masked positions of the block.

Work saved versus the reference, without changing a token: positions beyond the current
block always have confidence -inf and decoded positions are never changed, so only the
current block's logits are needed; the output head, the Gumbel noise and the softmax run
on ``block_length`` positions instead of the whole sequence, and the whole generation
(blocks x steps) is one XLA program with no host round trip.

Precision: the reference draws Gumbel noise in float64 as ``exp(l) / (-log u)^T``. We use
the equivalent log-space form ``argmax(l + T * g)``, ``g = -log(-log u)`` in float32, which
never overflows (``exp(l)`` overflows float32 above l = 88); confidences are
``exp(l[x0] - logsumexp(l))`` in float32. ``bench/sampler.py`` measures both against float64.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
ApplyFn = Callable[[Any, Array, Array | None, Array, int], Array]


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Static knobs of the sampler (hashable: a static jit argument)."""

    gen_length: int = 128  # Completion tokens.
    block_length: int = 32  # Semi-autoregressive block size (must divide gen_length).
    steps: int = 64  # Denoising steps in total (a multiple of the number of blocks).
    temperature: float = 0.0  # Gumbel-max temperature; 0 = argmax.
    cfg_scale: float = 0.0  # Classifier-free guidance; > 0 adds a prompt-masked pass.
    remasking: str = "low_confidence"  # "low_confidence" or "random".
    mask_id: int = 126336
    use_attention_mask: bool = True  # False attends to left padding, exactly as d1.
    logits_eos_inf: bool = False  # LLaDA App. B.4: never sample EOS.
    confidence_eos_eot_inf: bool = False  # LLaDA App. B.4: EOS/EoT never most confident.
    eos_id: int = 126081
    eot_id: int = 126348

    def __post_init__(self):
        if self.gen_length <= 0 or self.block_length <= 0 or self.steps <= 0:
            raise ValueError(f"gen_length, block_length and steps must be positive, got "
                             f"{self.gen_length}, {self.block_length}, {self.steps}")
        if self.gen_length % self.block_length:
            raise ValueError(f"block_length={self.block_length} must divide "
                             f"gen_length={self.gen_length} (LLaDA asserts the same)")
        if self.steps % self.num_blocks:
            raise ValueError(f"steps={self.steps} must be a multiple of the number of blocks "
                             f"{self.num_blocks} (gen_length / block_length)")
        if self.remasking not in ("low_confidence", "random"):
            raise ValueError(f"remasking={self.remasking!r}: use 'low_confidence' or 'random'")
        if self.temperature < 0 or self.cfg_scale < 0:
            raise ValueError("temperature and cfg_scale must be >= 0")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks


class GenerateOutput(NamedTuple):
    ids: Array  # [B, Lp + gen_length] prompt followed by the completion.
    decoded_at: Array  # [B, gen_length] global step (0-based) at which each token was set.


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


def step_keys(rng: Array, step: Array | int) -> tuple[Array, Array]:
    """(gumbel key, random-remasking key) of one global step; public for reference tests."""
    k = jax.random.fold_in(rng, step)
    return jax.random.split(k)


def _block_logits(apply_fn, params, x, attn, prompt_pos, start, cfg: SamplerConfig):
    """Logits [B, block, V] (float32) of the current block, with CFG when enabled."""
    blk = cfg.block_length
    if cfg.cfg_scale > 0:
        un_x = jnp.where(prompt_pos, cfg.mask_id, x)
        both = jnp.concatenate([x, un_x], axis=0)
        both_attn = None if attn is None else jnp.concatenate([attn, attn], axis=0)
        out = apply_fn(params, both, both_attn, start, blk).astype(jnp.float32)
        cond, uncond = jnp.split(out, 2, axis=0)
        logits = uncond + (cfg.cfg_scale + 1.0) * (cond - uncond)
    else:
        logits = apply_fn(params, x, attn, start, blk).astype(jnp.float32)
    if cfg.logits_eos_inf:
        logits = logits.at[..., cfg.eos_id].set(-jnp.inf)
    return logits


def _propose(logits, key_g, key_r, cfg: SamplerConfig):
    """Proposed tokens x0 [B, blk] and their confidence [B, blk]."""
    if cfg.temperature > 0:
        g = jax.random.gumbel(key_g, logits.shape, jnp.float32)
        x0 = jnp.argmax(logits + cfg.temperature * g, axis=-1)
    else:
        x0 = jnp.argmax(logits, axis=-1)
    if cfg.remasking == "low_confidence":
        chosen = jnp.take_along_axis(logits, x0[..., None], axis=-1)[..., 0]
        conf = jnp.exp(chosen - jax.nn.logsumexp(logits, axis=-1))
    else:
        conf = jax.random.uniform(key_r, x0.shape, jnp.float32)
    if cfg.confidence_eos_eot_inf:
        conf = jnp.where((x0 == cfg.eos_id) | (x0 == cfg.eot_id), -jnp.inf, conf)
    return x0.astype(jnp.int32), conf


def _select(conf, masked, k):
    """Boolean [B, blk]: the k most confident masked positions per row (ties: lower index)."""
    conf = jnp.where(masked, conf, -jnp.inf)
    order = jnp.argsort(-conf, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    return (rank < k) & masked


def generate(apply_fn: ApplyFn, params: Any, prompt_ids: Array, prompt_mask: Array | None,
             rng: Array, config: SamplerConfig, max_length: int | None = None) -> GenerateOutput:
    """Generates ``config.gen_length`` tokens after each left-padded prompt.

    Args:
      apply_fn: ``(params, ids [B, L], mask [B, L] | None, slice_start, slice_len) ->
        logits [B, slice_len, V]``; see ``llada_apply_fn``.
      params: model params (any sharding).
      prompt_ids: [B, Lp] int, left-padded.
      prompt_mask: [B, Lp] 1 for real tokens, 0 for padding (None: no padding).
      rng: PRNG key; each global step folds in its index (``step_keys``).
      config: SamplerConfig (static).
      max_length: the model's max_sequence_length; longer requests are refused.
    Returns:
      GenerateOutput(ids [B, Lp + gen_length], decoded_at [B, gen_length]).
    """
    b, lp = prompt_ids.shape
    total = lp + config.gen_length
    if max_length is not None and total > max_length:
        raise ValueError(f"prompt length {lp} + gen_length {config.gen_length} = {total} exceeds "
                         f"the model's max_sequence_length {max_length}; truncate the prompt")
    if prompt_mask is not None and prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompt_ids shape {prompt_ids.shape}")
    return _generate(apply_fn, params, prompt_ids, prompt_mask, rng, config)


def _generate(apply_fn, params, prompt_ids, prompt_mask, rng, cfg: SamplerConfig):
    b, lp = prompt_ids.shape
    blk, spb = cfg.block_length, cfg.steps_per_block
    x = jnp.concatenate([prompt_ids.astype(jnp.int32),
                         jnp.full((b, cfg.gen_length), cfg.mask_id, jnp.int32)], axis=1)
    prompt_pos = jnp.arange(lp + cfg.gen_length)[None, :] < lp
    attn = None
    if cfg.use_attention_mask and prompt_mask is not None:
        attn = jnp.concatenate([prompt_mask.astype(jnp.int32),
                                jnp.ones((b, cfg.gen_length), jnp.int32)], axis=1)
    budget = jnp.asarray(num_transfer_tokens(blk, spb))
    decoded_at = jnp.full((b, cfg.gen_length), -1, jnp.int32)

    def step(i, carry, block):
        x, decoded_at = carry
        start = lp + block * blk
        gstep = block * spb + i
        key_g, key_r = step_keys(rng, gstep)
        logits = _block_logits(apply_fn, params, x, attn, prompt_pos, start, cfg)
        x0, conf = _propose(logits, key_g, key_r, cfg)
        xb = jax.lax.dynamic_slice_in_dim(x, start, blk, axis=1)
        take = _select(conf, xb == cfg.mask_id, budget[i])
        x = jax.lax.dynamic_update_slice_in_dim(x, jnp.where(take, x0, xb), start, axis=1)
        db = jax.lax.dynamic_slice_in_dim(decoded_at, block * blk, blk, axis=1)
        decoded_at = jax.lax.dynamic_update_slice_in_dim(
            decoded_at, jnp.where(take, gstep, db), block * blk, axis=1)
        return x, decoded_at

    def block_body(block, carry):
        return jax.lax.fori_loop(0, spb, lambda i, c: step(i, c, block), carry)

    x, decoded_at = jax.lax.fori_loop(0, cfg.num_blocks, block_body, (x, decoded_at))
    return GenerateOutput(x, decoded_at)


def make_generate_fn(apply_fn: ApplyFn, config: SamplerConfig, max_length: int | None = None):
    """``jax.jit``-ed ``(params, prompt_ids, prompt_mask, rng) -> GenerateOutput``.

    Compiles once per (batch, prompt length) for this config; shardings follow the inputs
    (params by the rules, the batch over (data, fsdp)).
    """
    def fn(params, prompt_ids, prompt_mask, rng):
        return generate(apply_fn, params, prompt_ids, prompt_mask, rng, config, max_length)
    return jax.jit(fn)
