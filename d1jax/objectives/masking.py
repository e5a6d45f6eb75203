"""Noise masks of the coupled-GRPO and SPG likelihood estimators, and the masked forward pass.

* ``coupled_masks``: DiffuCoder's complementary pair (``coupled_grpo.py::forward_process``):
  one ratio t ~ U(t_min, t_max) per draw, the set M = {u < t} and its complement, so every
  completion token is masked in exactly one sequence of the pair.
* ``block_masks``: SPG's ``block_random`` forward process (``spg_trainer.py``): per sample a
  block k of the completion's real blocks; blocks after k fully masked, a uniform subset of
  block k masked, the clean blocks before k noised with probability ``p_clean``.
* ``masked_logps``: log p(target) at the completion positions of noisy sequences.

Shape letters: B batch, J samples per sequence, P prompt, C completion, L = P + C, N rows.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.model.predictor import MaskPredictor
from d1jax.objectives.logprob import completion_hidden, head_logps, model_head

Array = jax.Array

# float32 products like 10 * 0.7 land just below the integer that float64 (the authors'
# Python ``int(n * t)``) floors to; this nudge keeps the two floors equal.
_FLOOR_EPS = 1e-4


def attention_mask(prompt_mask_bp: Array, completion_len: int, use: bool) -> Array | None:
    """[B, P + C]: the prompt mask, completion always attended; None when ``use`` is False
    (d1, DiffuCoder and wd1 attend to prompt padding; SPG passes the prompt mask)."""
    if not use:
        return None
    b = prompt_mask_bp.shape[0]
    return jnp.concatenate([prompt_mask_bp, jnp.ones((b, completion_len), prompt_mask_bp.dtype)],
                           axis=1)


def coupled_masks(key: Array, batch: int, completion_len: int, *, t_min: float = 0.2,
                  t_max: float = 0.8) -> tuple[Array, Array]:
    """DiffuCoder's complementary mask pair over the completion.

    Returns (is_mask [B, C] bool: the set M, masked in the first sequence of the pair; its
    complement ~M is masked in the second; t [B] float32: the ratio, one value for the whole
    batch as the authors' ``random.uniform(0.2, 0.8)``, repeated per row so that both arrays
    split by rows into micro-batches). Each token is in M with probability t.
    """
    k_t, k_u = jax.random.split(key)
    t = jax.random.uniform(k_t, (), minval=t_min, maxval=t_max)
    u_bc = jax.random.uniform(k_u, (batch, completion_len))
    return u_bc < t, jnp.full((batch,), t)


def _block_sizes(key: Array, len_b: Array, num_blocks: int, block_length: int, num_t: int
                 ) -> tuple[Array, Array]:
    """(block index k [B, J], its real length [B, J]): a permutation of all blocks taken
    modulo the row's real block count, first J entries (the authors' draw, repeats and all)."""
    real_b = (len_b - 1) // block_length + 1
    perm_bn = jnp.argsort(jax.random.uniform(key, (len_b.shape[0], num_blocks)), axis=-1)
    k_bj = perm_bn[:, :num_t] % real_b[:, None]
    return k_bj, jnp.minimum(block_length, len_b[:, None] - block_length * k_bj)


def block_masks(key: Array, completion_mask_bc: Array, *, block_length: int, num_t: int,
                min_t: float = 0.0, max_t: float = 1.0, p_clean: float = 0.0
                ) -> tuple[Array, Array]:
    """SPG's ``block_random`` masks of the completion, J = ``num_t`` per sequence.

    For each row (real length n = sum of ``completion_mask_bc``, a prefix) and sample j: a
    block k among the row's ceil(n / block_length) real blocks; every position from block
    k + 1 on is masked, and every position past n; in block k, m of its n_k = min(block_length,
    n - k block_length) real positions, chosen uniformly, with m ~ U{lo, ..., max(hi, lo)},
    lo = max(floor(n_k min_t), 1), hi = min(floor(n_k max_t), n_k); each position before
    block k is masked with probability ``p_clean`` (the authors' prompt noise, which also
    reaches the clean blocks).

    Returns (is_mask [B, J, C] bool: the noisy input's masked completion positions,
    k [B, J] int32: the block of each sample).
    """
    b, c = completion_mask_bc.shape
    if c % block_length:
        raise ValueError(f"completion length {c} is not a multiple of block_length "
                         f"{block_length}: pick a block_length that divides it")
    num_blocks = c // block_length
    if not 1 <= num_t <= num_blocks:
        raise ValueError(f"num_t={num_t} must be in [1, {num_blocks}] (the completion's blocks)")
    len_b = jnp.maximum(jnp.sum(completion_mask_bc, axis=-1).astype(jnp.int32), 1)
    k_blk, k_num, k_pos, k_clean = jax.random.split(key, 4)
    k_bj, size_bj = _block_sizes(k_blk, len_b, num_blocks, block_length, num_t)
    size_f = size_bj.astype(jnp.float32)
    lo_bj = jnp.maximum(jnp.floor(size_f * min_t + _FLOOR_EPS).astype(jnp.int32), 1)
    hi_bj = jnp.minimum(jnp.floor(size_f * max_t + _FLOOR_EPS).astype(jnp.int32), size_bj)
    hi_bj = jnp.maximum(hi_bj, lo_bj)  # a short block with floor(n_k max_t) = 0: mask one
    num_bj = jax.random.randint(k_num, (b, num_t), lo_bj, hi_bj + 1)

    pos_c = jnp.arange(c)
    start_bj1 = (k_bj * block_length)[..., None]
    in_block = (pos_c >= start_bj1) & (pos_c < start_bj1 + size_bj[..., None])
    u_bjc = jnp.where(in_block, jax.random.uniform(k_pos, (b, num_t, c)), 2.0)
    chosen = jnp.argsort(jnp.argsort(u_bjc, axis=-1), axis=-1) < num_bj[..., None]
    later = pos_c >= start_bj1 + block_length
    padding = pos_c >= len_b[:, None, None]
    noised = (pos_c < start_bj1) & (jax.random.uniform(k_clean, (b, num_t, c)) < p_clean)
    return chosen | later | padding | noised, k_bj


def masked_logps(model: MaskPredictor, params: Any, noisy_ids_nl: Array, targets_nc: Array,
                 attention_mask_nl: Array | None, *, use_lora: bool = True,
                 dropout_rng: Array | None = None, seq_chunk: int | None = None) -> Array:
    """[N, C] float32 log p(target | noisy sequence) at the last C positions, one forward."""
    h_ncd = completion_hidden(model, params, noisy_ids_nl, attention_mask_nl,
                              targets_nc.shape[1], use_lora=use_lora, dropout_rng=dropout_rng)
    head, scale = model_head(model, params)
    return head_logps(h_ncd, head, targets_nc, scale=scale, seq_chunk=seq_chunk)
