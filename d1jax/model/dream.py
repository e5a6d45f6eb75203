"""Dream (Dream-v0-7B, DiffuCoder-7B) as a pure Flax linen module.

A Qwen2 transformer run bidirectionally, as HKUNLP's ``modeling_dream.py``: RMSNorm,
RoPE (rotate-half), grouped-query attention with biases on q, k and v (not o), SwiGLU MLP,
no causal mask, an untied ``lm_head`` unless ``tie_word_embeddings``. Parameter names follow
the checkpoint with the ``model.``/``self_attn.``/``mlp.`` scopes dropped (``embed_tokens``,
``layers.{q,k,v,o}_proj``, ``layers.{gate,up,down}_proj``, ``layers.input_layernorm``,
``layers.post_attention_layernorm``, ``norm``, ``lm_head``); kernels are ``[in, out]``
(torch's weight transposed) and the blocks are stacked on a leading ``layers`` axis
(``nn.scan``), each parameter carrying logical axis names.

Shifted prediction: Dream keeps its autoregressive initialisation, so the raw output at
position i-1 predicts token i. The mask-predictor interface every d1jax model shares
(``hidden``, ``logits``, ``__call__`` with ``slice_start``/``slice_len``, as ``LLaDA``'s) is
prediction-aligned: ``hidden`` is the one place that shifts (row i is raw row i-1, row 0
repeats raw row 0, as ``cat([l[:, :1], l[:, :-1]])`` in Dream's ``generation_utils._sample``;
the head is row-wise, so shifting hidden states equals shifting logits), and it takes RoPE
positions from the padding mask (Dream's ``tok_idx``: counted from each row's first real
token). The sampler, the estimator, SFT and every objective therefore read row i as the
prediction of token i for either family. ``raw_logits`` is the Hugging Face forward
(unshifted, positions 0..L-1 unless given), for parity with the checkpoint's own code.

Shape letters: B batch, L sequence, D hidden, N query heads, K kv heads, H head dim,
F intermediate, V vocab.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model.attention import attention
from d1jax.model.config import LoraConfig
from d1jax.model.dream_config import DreamConfig
from d1jax.model.layers import Proj, RMSNorm, apply_rope, rope_tables

Array = jax.Array
DType = Any

# Whether this model's raw row i predicts token i+1 (``d1jax.model.predictor`` reads it).
SHIFTED_PREDICTION = True


class BiasedProj(Proj):
    """``Proj`` plus a bias [out] (Qwen2's q/k/v projections); the bias is never adapted."""

    @nn.compact
    def __call__(self, x: Array, use_lora: bool = True, deterministic: bool = True) -> Array:
        y = super().__call__(x, use_lora, deterministic)
        b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axes[1],)),
                       (self.features,), self.param_dtype)
        return y + b.astype(y.dtype)


class DreamBlock(nn.Module):
    """One DreamDecoderLayer: x + Attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(.)).

    Called by ``nn.scan`` as ``(x [B, L, D], rope, key_mask [B, L] | None, use_lora,
    deterministic) -> (x, None)``.
    """

    config: DreamConfig
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None = None

    def _proj(self, name: str, features: int, axes: tuple[str, str], bias: bool = False):
        lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
        cls = BiasedProj if bias else Proj
        return cls(features, axes, self.dtype, self.param_dtype,
                   init_std=self.config.initializer_range, lora=lora, name=name)

    @nn.compact
    def __call__(self, x_bld: Array, rope: tuple[Array, Array], key_mask_bl: Array | None,
                 use_lora: bool, deterministic: bool) -> tuple[Array, None]:
        c = self.config
        n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        kw = dict(use_lora=use_lora, deterministic=deterministic)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bld = nn.with_logical_constraint(x_bld, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))
        b, l = x_bld.shape[:2]

        xn = norm(name="input_layernorm")(x_bld)
        q = self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS), bias=True)(xn, **kw)
        kk = self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias=True)(xn, **kw)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias=True)(xn, **kw)
        q = apply_rope(q.reshape(b, l, n, h), *rope)
        kk = apply_rope(kk.reshape(b, l, k, h), *rope)
        att = attention(q, kk, v.reshape(b, l, k, h), key_mask_bl, h ** -0.5)
        x_bld = x_bld + self._proj("o_proj", c.hidden_size, (shd.Q_HEADS, shd.EMBED))(
            att.reshape(b, l, n * h), **kw)

        xn = norm(name="post_attention_layernorm")(x_bld)
        gate = self._proj("gate_proj", c.intermediate_size, (shd.EMBED, shd.MLP))(xn, **kw)
        up = self._proj("up_proj", c.intermediate_size, (shd.EMBED, shd.MLP))(xn, **kw)
        hid = nn.with_logical_constraint(nn.silu(gate) * up, (shd.BATCH, shd.LENGTH, shd.ACT_MLP))
        x_bld = x_bld + self._proj("down_proj", c.hidden_size, (shd.MLP, shd.EMBED))(hid, **kw)
        return x_bld, None


class Dream(nn.Module):
    """The Dream mask predictor.

    Attributes:
      config: architecture.
      dtype: compute dtype of matmuls; norms, RoPE and softmax statistics run in float32.
      param_dtype: storage dtype of the parameters.
      remat: rematerialise each block in the backward pass.
      lora: optional LoRA adapters on the projections named in ``lora.targets`` (Dream's
        names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
      unroll_layers: unroll the layer scan (straight-line code) instead of a loop (None:
        a loop, as False).
      layers_per_loop: layers per iteration of that loop (``nn.scan``'s unroll).
    """

    config: DreamConfig
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    remat: bool = False
    lora: LoraConfig | None = None
    unroll_layers: bool | None = None
    layers_per_loop: int = 1

    shifted_prediction = SHIFTED_PREDICTION

    def setup(self):
        c = self.config
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, param_dtype=self.param_dtype, dtype=self.dtype,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(stddev=c.initializer_range), (shd.VOCAB, shd.EMBED)))
        block = DreamBlock
        if self.remat:
            block = nn.remat(DreamBlock, prevent_cse=False, static_argnums=(4, 5),
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

    def raw_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                   positions: Array | None = None, use_lora: bool = True,
                   deterministic: bool = True) -> Array:
        """Final-norm hidden states [B, L, D] of the HF forward (unshifted: row i feeds the
        prediction of token i+1).

        Args:
          input_ids: [B, L] int token ids.
          attention_mask: [B, L] (1 = real token, 0 = padding key); None attends to all.
          positions: [B, L] or [L] RoPE positions; default 0..L-1 (the HF forward's).
        """
        b, l = input_ids.shape
        positions = jnp.arange(l) if positions is None else jnp.asarray(positions)
        positions = positions[None] if positions.ndim == 1 else jnp.broadcast_to(positions, (b, l))
        rope = rope_tables(positions.astype(jnp.float32) / self.config.rope_factor,
                           self.config.head_dim, self.config.rope_theta)
        x, _ = self.layers(self.embed_tokens(input_ids), rope, attention_mask, use_lora,
                           deterministic)
        return self.norm(x)

    def raw_logits(self, input_ids: Array, attention_mask: Array | None = None, *,
                   positions: Array | None = None, use_lora: bool = True,
                   deterministic: bool = True) -> Array:
        """The HF model's logits [B, L, V] (unshifted: row i predicts token i+1)."""
        return self.logits(self.raw_hidden(input_ids, attention_mask, positions=positions,
                                           use_lora=use_lora, deterministic=deterministic))

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True, keep_last: int | None = None) -> Array:
        """Prediction-aligned final-norm hidden states [B, L, D] (row i predicts token i), or
        [B, keep_last, D] of the last ``keep_last`` positions.

        positions: RoPE positions; default Dream's ``tok_idx`` of ``attention_mask``
        (``dream_positions``), or 0..L-1 without a mask.
        """
        if positions is None and attention_mask is not None:
            positions = dream_positions(attention_mask)
        h = shift_rows(self.raw_hidden(input_ids, attention_mask, positions=positions,
                                       use_lora=use_lora, deterministic=deterministic))
        return h if keep_last is None else h[:, h.shape[1] - keep_last:]

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
        """Prediction-aligned logits [B, L, V] (row i predicts token i), or [B, slice_len, V]
        of positions slice_start:+slice_len (slice_start may be traced; only those rows go
        through the output head)."""
        h = self.hidden(input_ids, attention_mask, positions=positions, use_lora=use_lora,
                        deterministic=deterministic)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, 0 if slice_start is None else slice_start,
                                             slice_len, axis=1)
        return self.logits(h)

    @staticmethod
    def output_head(params: dict[str, Any], config: DreamConfig) -> tuple[Array, float | None]:
        """(the output head as [D, V], logit scale or None) for chunked log-softmax."""
        return dream_head_weight(params, config), None


def shift_rows(raw_bl_: Array) -> Array:
    """Row i of the result is raw row i-1 (row 0 keeps raw row 0): [B, L, ...]."""
    return jnp.concatenate([raw_bl_[:, :1], raw_bl_[:, :-1]], axis=1)


shift_logits = shift_rows  # raw logits [B, L, V] -> prediction-aligned


def dream_positions(attention_mask_bl: Array) -> Array:
    """Dream's ``tok_idx`` [B, L]: cumsum(mask) - 1, padding positions set to 1."""
    m = jnp.asarray(attention_mask_bl).astype(jnp.int32)
    return jnp.where(m == 0, 1, jnp.cumsum(m, axis=-1) - 1)


def dream_head_weight(params: dict[str, Any], config: DreamConfig) -> Array:
    """The output head as [D, V] (for chunked log-softmax over the vocabulary)."""
    if config.tie_word_embeddings:
        return params["embed_tokens"]["embedding"].T
    return params["lm_head"]["kernel"]
