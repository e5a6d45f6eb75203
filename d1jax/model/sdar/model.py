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

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model.kv_cache import KVCache
from d1jax.model.layers import Proj, RMSNorm, apply_rope, rope_tables
from d1jax.model.lora import LoraConfig
from d1jax.model.sdar.config import SDARConfig

Array = jax.Array
DType = Any
F32 = jnp.float32

NO_CACHE = ("SDAR's KV cache is the committed-block cache of block diffusion (every block "
            "before the one being denoised, frozen), issue 44 item 2; d1jax has no cached "
            "SDAR sampler yet: sample with kv_cache='none'")


def token_positions(attention_mask_bl: Array | None, length: int) -> Array:
    """RoPE positions [B or 1, L]: dLLM-RL's ``tok_idx`` (cumsum(mask) - 1, padding 1), or
    0..L-1 without a mask."""
    if attention_mask_bl is None:
        return jnp.arange(length)[None]
    m = jnp.asarray(attention_mask_bl).astype(jnp.int32)
    return jnp.where(m == 0, 1, jnp.cumsum(m, axis=-1) - 1)


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


def masked_attention(q_bqnh: Array, k_blkh: Array, v_blkh: Array, mask_bql: Array,
                     scale: float) -> Array:
    """Softmax attention [B, Q, N, H] with a per-query key mask [B or 1, Q, L]; float32
    scores and statistics; a row with every key masked gives 0."""
    b, q, n, h = q_bqnh.shape
    k = k_blkh.shape[2]
    qg = q_bqnh.reshape(b, q, k, n // k, h)
    s = jnp.einsum("bqkgh,blkh->bkgql", qg, k_blkh, preferred_element_type=F32) * scale
    s = jnp.where(mask_bql[:, None, None], s, -jnp.inf)
    top = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0.0))
    den = jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
    out = jnp.einsum("bkgql,blkh->bkgqh", p.astype(v_blkh.dtype), v_blkh,
                     preferred_element_type=F32) / den
    return out.transpose(0, 3, 1, 2, 4).reshape(b, q, n, h).astype(q_bqnh.dtype)


class SDARBlock(nn.Module):
    """One SDARDecoderLayer: x + Attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(.))."""

    config: SDARConfig
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None = None

    def _proj(self, name: str, features: int, axes: tuple[str, str]):
        lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
        return Proj(features, axes, self.dtype, self.param_dtype,
                    init_std=self.config.initializer_range, lora=lora, name=name,
                    quant=self.lora.base_quant if self.lora is not None else "none")

    @nn.compact
    def __call__(self, x_bld: Array, rope: tuple[Array, Array], mask_bll: Array,
                 use_lora: bool, deterministic: bool) -> tuple[Array, None]:
        c = self.config
        n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        kw = dict(use_lora=use_lora, deterministic=deterministic)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bld = nn.with_logical_constraint(x_bld, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))
        b, l = x_bld.shape[:2]
        xn = norm(name="input_layernorm")(x_bld)
        q = self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS))(xn, **kw)
        kk = self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw)
        # Qwen3: RMSNorm over each head's H features, then RoPE.
        q = apply_rope(norm(name="q_norm")(q.reshape(b, l, n, h)), *rope)
        kk = apply_rope(norm(name="k_norm")(kk.reshape(b, l, k, h)), *rope)
        att = masked_attention(q, kk, v.reshape(b, l, k, h), mask_bll, h ** -0.5)
        x_bld = x_bld + self._proj("o_proj", c.hidden_size, (shd.Q_HEADS, shd.EMBED))(
            att.reshape(b, l, n * h), **kw)

        xn = norm(name="post_attention_layernorm")(x_bld)
        gate = self._proj("gate_proj", c.intermediate_size, (shd.EMBED, shd.MLP))(xn, **kw)
        up = self._proj("up_proj", c.intermediate_size, (shd.EMBED, shd.MLP))(xn, **kw)
        hid = nn.with_logical_constraint(nn.silu(gate) * up, (shd.BATCH, shd.LENGTH, shd.ACT_MLP))
        x_bld = x_bld + self._proj("down_proj", c.hidden_size, (shd.MLP, shd.EMBED))(hid, **kw)
        return x_bld, None


class SDAR(nn.Module):
    """The SDAR / TraDo mask predictor (block-causal, row i predicts token i).

    Attributes:
      config: architecture (``block_size``, ``block_align`` among it).
      dtype: compute dtype of matmuls; norms, RoPE and softmax statistics run in float32.
      param_dtype: storage dtype of the parameters.
      remat: rematerialise each block in the backward pass.
      lora: optional LoRA adapters on the projections named in ``lora.targets``.
      unroll_layers: unroll the layer scan (straight-line code) instead of a loop.
      layers_per_loop: layers per iteration of that loop (``nn.scan``'s unroll).
    """

    config: SDARConfig
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    remat: bool = False
    lora: LoraConfig | None = None
    unroll_layers: bool | None = None
    layers_per_loop: int = 1

    shifted_prediction = False  # raw row i predicts token i

    def setup(self):
        c = self.config
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, param_dtype=self.param_dtype, dtype=self.dtype,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(stddev=c.initializer_range), (shd.VOCAB, shd.EMBED)))
        block = SDARBlock
        if self.remat:
            block = nn.remat(SDARBlock, prevent_cse=False, static_argnums=(4, 5),
                             policy=jax.checkpoint_policies.nothing_saveable)
        bc = nn.broadcast
        self.layers = nn.scan(
            block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
            in_axes=(bc, bc, bc, bc), length=c.num_hidden_layers,
            metadata_params={nn.PARTITION_NAME: shd.LAYERS},
            unroll=c.num_hidden_layers if self.unroll_layers else self.layers_per_loop,
        )(c, self.dtype, self.param_dtype, self.lora)
        self.norm = RMSNorm(c.rms_norm_eps, self.dtype, self.param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Proj(c.vocab_size, (shd.EMBED, shd.VOCAB), self.dtype,
                                self.param_dtype, init_std=c.initializer_range)

    def unrolled(self) -> bool:
        """Whether the layer scan runs as straight-line code (``unroll_layers``)."""
        return bool(self.unroll_layers)

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True, keep_last: int | None = None,
               read_upto: Array | int | None = None) -> Array:
        """Final-norm hidden states [B, L, D], or [B, keep_last, D] of the last positions
        (``read_upto`` accepted for the interface; every row runs every layer).

        Args:
          input_ids: [B, L] int token ids.
          attention_mask: [B, L] (1 = real token, 0 = padding); None: all real.
          positions: [B, L] or [L] RoPE positions; default ``token_positions`` of the mask.
        """
        b, l = input_ids.shape
        c = self.config
        if positions is None:
            positions = token_positions(attention_mask, l)
        positions = jnp.asarray(positions)
        positions = positions[None] if positions.ndim == 1 else positions
        rope = rope_tables(positions.astype(F32) / c.rope_factor, c.head_dim, c.rope_theta)
        rope = tuple(jnp.broadcast_to(r, (b, l, c.head_dim)) for r in rope)
        mask = block_causal_mask(attention_mask, l, c.block_size, c.block_align)
        x, _ = self.layers(self.embed_tokens(input_ids), rope, mask, use_lora, deterministic)
        h = self.norm(x)
        return h if keep_last is None else h[:, l - keep_last:]

    def logits(self, hidden_bsd: Array) -> Array:
        """Logits [B, S, V] from hidden states [B, S, D] (the output head, row-wise)."""
        if self.config.tie_word_embeddings:
            out = self.embed_tokens.attend(hidden_bsd)
        else:
            out = self.lm_head(hidden_bsd)
        return nn.with_logical_constraint(out, (shd.BATCH, shd.LENGTH, shd.ACT_VOCAB))

    def __call__(self, input_ids: Array, attention_mask: Array | None = None, *,
                 positions: Array | None = None, slice_start: Array | int | None = None,
                 slice_len: int | None = None, use_lora: bool = True,
                 deterministic: bool = True) -> Array:
        """Logits [B, L, V], or [B, slice_len, V] of positions slice_start:+slice_len."""
        return self.logits(self.sliced_hidden(
            input_ids, attention_mask, positions=positions, slice_start=slice_start,
            slice_len=slice_len, use_lora=use_lora, deterministic=deterministic))

    def sliced_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                      positions: Array | None = None, slice_start: Array | int | None = None,
                      slice_len: int | None = None, use_lora: bool = True,
                      deterministic: bool = True) -> Array:
        """``__call__`` before the output head: hidden states [B, L or slice_len, D]."""
        h = self.hidden(input_ids, attention_mask, positions=positions, use_lora=use_lora,
                        deterministic=deterministic)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, 0 if slice_start is None else slice_start,
                                             slice_len, axis=1)
        return h

    @staticmethod
    def output_head(params: dict[str, Any], config: SDARConfig) -> tuple[Array, float | None]:
        """(the output head as [D, V], logit scale or None) for chunked log-softmax."""
        return head_weight(params, config), None

    # Fast-dLLM's cache entry points of the interface: not SDAR's cache (NO_CACHE).

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        raise NotImplementedError(NO_CACHE)

    def decode_hidden(self, input_ids: Array, cache: KVCache, slice_start: Array | int,
                      attention_mask: Array | None = None, *, slice_len: int,
                      use_lora: bool = True) -> Array:
        raise NotImplementedError(NO_CACHE)

    def decode_at(self, input_ids: Array, idx: Array, cache: KVCache, window: KVCache,
                  window_start: Array | int, attention_mask: Array | None = None, *,
                  use_lora: bool = True) -> tuple[Array, KVCache]:
        raise NotImplementedError(NO_CACHE)


def head_weight(params: dict[str, Any], config: SDARConfig) -> Array:
    """The output head as [D, V] (for chunked log-softmax over the vocabulary)."""
    if config.tie_word_embeddings:
        return params["embed_tokens"]["embedding"].T
    return params["lm_head"]["kernel"]
