"""SDAR / TraDo (block diffusion) as a pure Flax linen module.

A Qwen3 transformer (Gen-Verse/dLLM-RL ``models/sdar/modeling_sdar.py``): RMSNorm, grouped-
query attention without biases whose queries and keys get a per-head RMSNorm over head_dim
(``q_norm``, ``k_norm``) before RoPE (rotate-half, theta 1e6), SwiGLU MLP, an untied
``lm_head`` unless ``tie_word_embeddings``. Row i predicts token i (the authors' losses and
samplers read logits at the masked position itself), so ``shifted_prediction`` is False.

Block-causal attention: the HF module takes whatever 4-D mask its caller builds; both
callers build the same shape of mask: a query sees every key in its own block of
``block_size`` tokens and in the blocks before it. Where the grid starts differs:

- "end" (default): blocks counted back from the row's end, so with a completion whose length
  is a multiple of block_size the completion starts a block and the prompt's blocks are
  counted back from its end, as dLLM-RL's ``make_basic_block_attention``
  (train/sft_sdar.py, train/train_sdar_policy.py: response blocks start at the padded prompt
  length L0, prompt blocks are [L0 - (b+1)s, L0 - bs)).
- "start": blocks counted from each row's first real token (``position // block_size``), as
  JetAstra/SDAR ``generate.py``'s ``block_diffusion_generate`` on an unpadded prompt, whose
  last partial block is completed by the first generated tokens.

Left padding as dLLM-RL's ``process_pad``: padding keys are never attended, RoPE positions
count real tokens only (``tok_idx = cumsum(mask) - 1``, padding set to 1). A padding query
row there attends to itself alone; here it attends to what its block allows among real keys
(or to nothing: output 0). Its output is never read, so the real rows are the same.

Parameter names follow the checkpoint with the ``model.``/``self_attn.``/``mlp.`` scopes
dropped; kernels are [in, out]; blocks are stacked on a leading ``layers`` axis (``nn.scan``).

Shape letters: B batch, L sequence (keys), Q queries, D hidden, N query heads, K kv heads,
G = N / K, H head dim, F intermediate, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from d1jax.model.kv_cache import KVCache
from d1jax.model.qwen import QwenStack, head_weight, token_positions  # noqa: F401
from d1jax.model.sdar.config import SDARConfig

Array = jax.Array

def block_ids(positions_bl: Array, length: int, block_size: int, align: str) -> Array:
    """The block of each row [B or 1, L] on the grid ``align`` names (module docstring)."""
    if align == "start":
        return positions_bl // block_size
    return (jnp.arange(length)[None] + (-length) % block_size) // block_size


def block_causal_mask(attention_mask_bl: Array | None, length: int, block_size: int,
                      align: str) -> Array:
    """bool [B or 1, L, L]: query i sees key j iff block(j) <= block(i) and j is real."""
    blk = block_ids(token_positions(attention_mask_bl, length), length, block_size, align)
    mask = blk[:, None, :] <= blk[:, :, None]
    if attention_mask_bl is not None:
        mask = mask & jnp.asarray(attention_mask_bl).astype(bool)[:, None, :]
    return mask


# The cache entry points of block diffusion's exact cache, shared by the block-causal families
# (SDAR, LLaDA2): a module assigns them in its class body (``decode_hidden = decode_hidden``),
# and has ``cached_stack`` (rows at positions through its layers under a key mask, optionally
# against a cache and a window) and ``config.block_size`` / ``block_align``. Under the
# block-causal mask a position's keys/values depend on its own block and the ones before it
# only, so those of committed blocks never go stale; recomputed rows must lie in one block (the
# block being denoised), and see their own fresh keys and the cache's of every earlier block.


def upto_block_of(self, attention_mask: Array | None, length: int, batch: int,
                   row: Array | int) -> Array:
    """Key mask [B, L]: real keys in the block of position ``row`` or before it."""
    c = self.config
    blk = block_ids(token_positions(attention_mask, length), length, c.block_size,
                    c.block_align)
    seen = blk <= jax.lax.dynamic_slice_in_dim(blk, row, 1, axis=1)
    if attention_mask is not None:
        seen = seen & jnp.asarray(attention_mask).astype(bool)
    return jnp.broadcast_to(seen, (batch, length))


def decode_hidden(self, input_ids: Array, cache: KVCache, slice_start: Array | int,
                  attention_mask: Array | None = None, *, slice_len: int,
                  use_lora: bool = True) -> Array:
    """Hidden states [B, slice_len, D] of positions slice_start:+slice_len (inside one
    block) of ``input_ids`` [B, L]: fresh keys/values for the slice, the cache's for the
    blocks before it; with a cache of the committed blocks, ``hidden``'s rows exactly."""
    b, l = input_ids.shape
    seen = self._upto_block_of(attention_mask, l, b, slice_start + slice_len - 1)
    pos = token_positions(attention_mask, l)
    h, _ = self.cached_stack(
        jax.lax.dynamic_slice_in_dim(input_ids, slice_start, slice_len, 1),
        jax.lax.dynamic_slice_in_dim(pos, slice_start, slice_len, 1), seen, use_lora,
        cache=cache, q_start=slice_start)
    return h


def decode_at(self, input_ids: Array, idx: Array, cache: KVCache, window: KVCache,
              window_start: Array | int, attention_mask: Array | None = None, *,
              use_lora: bool = True) -> tuple[Array, KVCache]:
    """Positions ``window_start + idx`` (idx [B, Q]; >= W: padding) of a window of
    [n_layers, B, W, K, H] keys/values inside one block, recomputed and written into the
    window; they see the updated window and the cache's earlier blocks. Returns (hidden
    [B, Q, D], the window): with idx every window row, the block's committed keys/values
    (the store_kv pass of the authors' samplers)."""
    b, l = input_ids.shape
    at = jnp.clip(window_start + idx, 0, l - 1)
    seen = self._upto_block_of(attention_mask, l, b, window_start + window.k.shape[2] - 1)
    pos = jnp.broadcast_to(token_positions(attention_mask, l), (b, l))
    return self.cached_stack(
        jnp.take_along_axis(input_ids, at, axis=1), jnp.take_along_axis(pos, at, axis=1),
        seen, use_lora, cache=cache, window=window, q_start=window_start, idx_bq=idx,
        n_fresh=idx.shape[1], return_kv=True)


class SDAR(QwenStack):
    """The SDAR / TraDo mask predictor: ``QwenStack`` (its attributes) with Qwen3's q/k
    norms under the block-causal mask (``config.block_size``, ``config.block_align``); row i
    predicts token i."""

    config: SDARConfig

    shifted_prediction = False  # raw row i predicts token i
    qk_norm = True

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True, keep_last: int | None = None,
               read_upto: Array | int | None = None, mask: Array | None = None) -> Array:
        """Final-norm hidden states [B, L, D], or [B, keep_last, D] of the last positions
        (``read_upto`` accepted for the interface; every row runs every layer).

        Args:
          input_ids: [B, L] int token ids.
          attention_mask: [B, L] (1 = real token, 0 = padding); None: all real.
          positions: [B, L] or [L] RoPE positions; default ``token_positions`` of the mask.
          mask: bool [B or 1, L, L] per-query mask replacing the block-causal one, or a
            ``RowMask`` built a query chunk at a time (the clean and noised streams of block
            SFT and TraceRL, ``d1jax.objectives.blockwise``).
        """
        b, l = input_ids.shape
        c = self.config
        if positions is None:
            positions = token_positions(attention_mask, l)
        positions = jnp.asarray(positions)
        positions = positions[None] if positions.ndim == 1 else positions
        rope = tuple(jnp.broadcast_to(r, (b, l, c.head_dim)) for r in self.rope(positions))
        if mask is None:
            mask = block_causal_mask(attention_mask, l, c.block_size, c.block_align)
        x, _ = self.layers(self.embed_tokens(input_ids), rope, mask, use_lora, deterministic)
        h = self.norm(x)
        return h if keep_last is None else h[:, l - keep_last:]

    _upto_block_of = upto_block_of
    decode_hidden = decode_hidden
    decode_at = decode_at

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        """One block-causal forward: logits [B, S, V] of positions slice_start:+slice_len (all
        when slice_len is None) and every layer's keys/values [n_layers, B, L, K, H]."""
        c = self.config
        mask = block_causal_mask(attention_mask, input_ids.shape[1], c.block_size,
                                 c.block_align)
        return self.full_with_cache(input_ids, attention_mask, mask, slice_start, slice_len,
                                    use_lora)
