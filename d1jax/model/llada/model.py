"""LLaDA as a pure Flax linen module.

A bidirectional LLaMA-style transformer (RMSNorm, RoPE, SwiGLU, no causal mask) that
matches the Hugging Face ``modeling_llada.py`` (block_type "llama"). Parameter names
follow the Hugging Face checkpoint (``wte``, ``blocks.{q,k,v}_proj``, ``attn_out``,
``ff_proj``, ``up_proj``, ``ff_out``, ``attn_norm``, ``ff_norm``, ``ln_f``); kernels are
stored ``[in, out]`` (the transpose of torch's Linear weight), blocks are stacked on a
leading ``layers`` axis and run with ``nn.scan`` (prefill, cached decoding); a full
forward runs them as plain JAX code on the stacked params, the first and last layer as
their own code (the last one then runs only the rows an output reads) and the others as
one ``lax.scan`` or unrolled; each is rematerialised when ``remat`` is set.

Shape letters: B batch, L sequence, D d_model, N query heads, K kv heads, H head dim,
F mlp hidden, V embedding (vocab) size, Q recomputed rows, S slice length.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model.attention import attention
from d1jax.model.kv_cache import KVCache, attend_cached
from d1jax.model.layers import Proj, RMSNorm, apply_rope, rope_tables, swiglu
from d1jax.model.llada.config import LLaDAConfig
from d1jax.model.lora import LoraConfig

Array = jax.Array
DType = Any


class Block(nn.Module):
    """One LLaDALlamaBlock: x + Attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(.)).

    One class for every mode, chosen by its arguments (as MaxText's ``model_mode``):
    full (``cache`` None): the rows [B, Q, D] are the whole sequence and attend to each
    other; cached: the rows attend to their fresh keys/values and to ``cache`` elsewhere
    (``kv_cache.attend_cached``: a slice q_start:+Q, or with ``window`` the window rows
    ``idx_bq``). Returns (x [B, Q, D], the keys/values of the rows, the slice or the
    updated window when ``return_kv``, else None).
    """

    config: LLaDAConfig
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None = None

    def _proj(self, name: str, features: int, axes: tuple[str, str]) -> Proj:
        lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
        return Proj(features, axes, self.dtype, self.param_dtype, lora=lora, name=name,
                    quant=self.lora.base_quant if self.lora is not None else "none")

    @nn.compact
    def __call__(self, x_bqd: Array, rope: tuple[Array, Array], key_mask_bl: Array | None,
                 use_lora: bool, deterministic: bool, cache: KVCache | None = None,
                 window: KVCache | None = None, q_start: Array | int = 0,
                 idx_bq: Array | None = None,
                 return_kv: bool = False,
                 out_rows: tuple[Array | int, int] | None = None
                 ) -> tuple[Array, KVCache | None]:
        c = self.config
        n, k, h = c.n_heads, c.n_kv_heads, c.head_dim
        kw = dict(use_lora=use_lora, deterministic=deterministic)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bqd = nn.with_logical_constraint(x_bqd, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))
        b, q_len = x_bqd.shape[:2]

        xn = norm(name="attn_norm")(x_bqd)
        kk = self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw)
        fresh = KVCache(apply_rope(kk.reshape(b, q_len, k, h), *rope), v.reshape(b, q_len, k, h))
        if out_rows is not None:  # only rows start:+n_out continue past the keys/values
            start, q_len = out_rows
            x_bqd, xn, *rope = (jax.lax.dynamic_slice_in_dim(a, start, q_len, axis=1)
                                for a in (x_bqd, xn, *rope))
        q = self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS))(xn, **kw)
        q = apply_rope(q.reshape(b, q_len, n, h), *rope)
        if cache is None:
            att = attention(q, fresh.k, fresh.v, key_mask_bl, h ** -0.5)
            own = fresh
        else:
            att, own = attend_cached(q, fresh, cache, q_start, key_mask_bl, window, idx_bq)
        att = att.reshape(b, q_len, n * h)
        x_bqd = x_bqd + self._proj("attn_out", c.d_model, (shd.Q_HEADS, shd.EMBED))(att, **kw)

        xn = norm(name="ff_norm")(x_bqd)
        x_bqd = x_bqd + swiglu(self._proj, xn, c.mlp_hidden_size, c.d_model,
                               ("ff_proj", "up_proj", "ff_out"), **kw)
        return x_bqd, (own if return_kv else None)


# Depth up to which LLaDA(unroll_layers=None) unrolls its layers (bench-tiny, the demo and
# test models; not LLaDA-8B, whose 32 layers stay one compiled loop).
UNROLL_MAX_LAYERS = 8


def read_widths(n_out: int) -> tuple[int, ...]:
    """The static row widths the last layer switches between under ``read_upto``: a
    quarter, a half and all of ``n_out``."""
    return tuple(sorted({w for w in (n_out // 4, n_out // 2, n_out) if w > 0}))


# Block.__call__ positions (self = 0) that are Python values, static under remat.
_STATIC_BLOCK_ARGS = (4, 5, 10)


def loop_residuals(prim, *_, **__) -> bool:
    """The checkpoint policy of a middle layer in the loop without remat: every value is kept
    for the backward as without a checkpoint, except the reads of the layer's weights from the
    stacked params (a dynamic slice, its squeeze). Kept, the loop stacks each layer's slice
    into a residual buffer: a second copy of the middle layers' weights (13 GB at 8B in
    bf16); recomputed, the backward slices the stack again."""
    return prim not in (jax.lax.dynamic_slice_p, jax.lax.squeeze_p)


class LLaDA(nn.Module):
    """The LLaDA mask predictor.

    Attributes:
      config: architecture.
      dtype: compute dtype of matmuls (bfloat16 on accelerators); norms, RoPE and
        softmax statistics run in float32 regardless.
      param_dtype: storage dtype of the parameters.
      remat: rematerialise each block in the backward pass (saves activation memory).
      lora: optional LoRA adapters on the block projections.
      unroll_layers: run every layer as straight-line code instead of a loop over the
        middle ones (params stay stacked [n_layers, ...] either way; the first and last
        layer are their own code in both). A loop compiles in time independent of depth
        (LLaDA-8B's update: minutes instead of tens of minutes for a TPU), but its
        backward stacks every layer's residuals into zero-filled buffers and reads them
        back, which costs a small model a quarter of its gradient time on CPU. None:
        unroll up to ``UNROLL_MAX_LAYERS`` layers, loop beyond (LLaDA-8B's 32 layers).
      layers_per_loop: middle layers per iteration of that loop (``lax.scan``'s unroll):
        more gives XLA more to schedule across layers at the cost of compile time.
    """

    config: LLaDAConfig
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    remat: bool = False
    lora: LoraConfig | None = None
    unroll_layers: bool | None = None
    layers_per_loop: int = 1

    # Raw row i predicts token i (``d1jax.model.predictor.MaskPredictor``).
    shifted_prediction = False

    def setup(self):
        c = self.config
        self.wte = nn.Embed(
            c.embedding_size, c.d_model, param_dtype=self.param_dtype, dtype=self.dtype,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(stddev=0.02), (shd.VOCAB, shd.EMBED)))
        block = Block
        if self.remat:
            block = nn.remat(Block, prevent_cse=False, static_argnums=_STATIC_BLOCK_ARGS,
                             policy=jax.checkpoint_policies.nothing_saveable)
        # Per-layer inputs: the cache and the window (stacked on their leading axis).
        bc = nn.broadcast
        self.blocks = nn.scan(
            block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
            in_axes=(bc, bc, bc, bc, 0, 0, bc, bc, bc),
            length=c.n_layers, metadata_params={nn.PARTITION_NAME: shd.LAYERS},
            unroll=c.n_layers if self.unrolled() else 1,
        )(c, self.dtype, self.param_dtype, self.lora)
        self.ln_f = RMSNorm(c.rms_norm_eps, self.dtype, self.param_dtype)
        if not c.weight_tying:
            self.ff_out = Proj(c.embedding_size, (shd.EMBED, shd.VOCAB), self.dtype, self.param_dtype)

    def unrolled(self) -> bool:
        """Whether the layers run as straight-line code (``unroll_layers``, or None: up to
        ``UNROLL_MAX_LAYERS`` layers)."""
        if self.unroll_layers is None:
            return self.config.n_layers <= UNROLL_MAX_LAYERS
        return self.unroll_layers

    def _stack(self, x_bqd: Array, positions_bq: Array, key_mask_bl: Array | None,
               use_lora: bool, deterministic: bool = True, cache: KVCache | None = None,
               window: KVCache | None = None, q_start: Array | int = 0,
               idx_bq: Array | None = None, return_kv: bool = False,
               out_rows: tuple[Array | int, int] | None = None,
               read_upto: Array | int | None = None):
        """Every layer on embedded rows at RoPE positions [B or 1, Q]; (final-norm hidden
        [B, Q, D], or [B, n_out, D] of rows start:+n_out with ``out_rows``; stacked
        keys/values [n_layers, ...] or None). ``read_upto``: see ``hidden``."""
        rope = rope_tables(positions_bq, self.config.head_dim, self.config.rope_theta)
        if cache is None and not return_kv and not self.is_initializing():
            return self.ln_f(self._straight_line(x_bqd, rope, key_mask_bl, use_lora,
                                                 deterministic, out_rows, read_upto)), None
        x, kv = self.blocks(x_bqd, rope, key_mask_bl, use_lora, deterministic, cache, window,
                            q_start, idx_bq, return_kv)
        if out_rows is not None:
            x = jax.lax.dynamic_slice_in_dim(x, out_rows[0], out_rows[1], axis=1)
        return self.ln_f(x), kv

    def _straight_line(self, x_bqd: Array, rope: tuple[Array, Array],
                       key_mask_bl: Array | None, use_lora: bool, deterministic: bool,
                       out_rows: tuple[Array | int, int] | None,
                       read_upto: Array | int | None = None) -> Array:
        """A full forward's layers as plain JAX code on the stacked params. The first and
        last layers are always their own code; the others too when the model is unrolled,
        else one ``lax.scan`` (compile time independent of depth).

        What the own code buys (the scan of ``nn.scan``, one body for every layer, can do
        neither): XLA drops the first layer's input gradient when nothing trains the
        embedding (LoRA), and with ``out_rows`` the last layer runs queries, attention
        output and MLP only for rows start:+n_out [B, n_out, D]: the other rows feed it
        keys and values, but no output reads them (the estimator's head reads the
        completion, the sampler's the block). ``read_upto`` narrows those rows further, by
        a switch over static widths (``read_widths``; under remat, inside the checkpoint). LoRA
        dropout draws layer i's masks from ``fold_in(dropout rng, i)`` on every path."""
        stacked = self.blocks.variables["params"]
        block = Block(self.config, self.dtype, self.param_dtype, self.lora, parent=None)
        drop = None if deterministic else self.make_rng("dropout")  # LoRA dropout's stream
        n = self.config.n_layers

        def run(i, x, rows=None, in_loop=False, upto=None):
            def one(x, i, rows):
                # Layer i's params indexed from the stack (in the loop: a dynamic slice of
                # the stacked arrays, as nn.scan does, with no copy of the middle layers).
                p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False)
                                 if in_loop else a[i], stacked)
                rngs = {} if drop is None else {"dropout": jax.random.fold_in(drop, i)}
                return block.apply({"params": p}, x, rope, key_mask_bl, use_lora,
                                   deterministic, out_rows=rows, rngs=rngs)[0]

            def layer(x, i, upto):
                if upto is None:
                    return one(x, i, rows)
                # The narrowest width that covers the rows read; the rows past it are 0.
                start, n_out = rows
                widths = read_widths(n_out)

                def narrow(w):
                    return lambda x: jnp.pad(one(x, i, (start, w)),
                                             ((0, 0), (0, n_out - w), (0, 0)))
                pick = jnp.minimum(jnp.searchsorted(jnp.asarray(widths), upto),
                                   len(widths) - 1)
                # Without remat the backward keeps the union of the branches' residuals
                # (the untaken ones zero-filled): at most 1.75x one layer's; recomputing
                # the layer instead measured slower on CPU.
                return jax.lax.switch(pick, [narrow(w) for w in widths], x)
            if self.remat:  # outside a loop XLA could merge the recompute into the forward
                layer = jax.checkpoint(layer, prevent_cse=not in_loop, static_argnums=(
                    () if in_loop else (1,)), policy=jax.checkpoint_policies.nothing_saveable)
            elif in_loop:  # every residual kept but the layer's weights (loop_residuals)
                layer = jax.checkpoint(layer, prevent_cse=False, policy=loop_residuals)
            return layer(x, i, upto)

        if self.unrolled() or n <= 2:
            for i in range(n - 1):
                x_bqd = run(i, x_bqd)
        else:
            x_bqd = run(0, x_bqd)
            x_bqd, _ = jax.lax.scan(lambda x, i: (run(i, x, in_loop=True), None), x_bqd,
                                    jnp.arange(1, n - 1), unroll=self.layers_per_loop)
        return run(n - 1, x_bqd, out_rows, upto=None if out_rows is None else read_upto)

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True, keep_last: int | None = None,
               read_upto: Array | int | None = None) -> Array:
        """Final-norm hidden states [B, L, D] (compute dtype), or [B, keep_last, D] of the
        last ``keep_last`` positions (the last layer then runs only those rows' queries and
        MLP: d1's estimator needs just the completion).

        ``read_upto`` (with ``keep_last``; may be traced): only the first ``read_upto`` of
        the kept rows are read (``logprob.read_upto`` of d1's completion mask). The last
        layer then runs the narrowest of ``read_widths(keep_last)`` that covers them, and
        the kept rows past that width are 0. Not on a mesh: XLA's SPMD partitioner gets
        the switch's gradient wrong on a (2, 2, 2) mesh (``GRPOConfig.narrow_last_layer``).

        Args:
          input_ids: [B, L] int token ids.
          attention_mask: [B, L] (1 = real token, 0 = padding key); None attends to all.
          positions: [B, L] or [L] RoPE positions; default 0..L-1 (as the HF model, which
            ignores padding for positions; RoPE is relative, so left padding that is
            masked out does not change a sequence's outputs).
          use_lora: run the LoRA branches (False gives the base model: the reference policy).
          deterministic: disable LoRA dropout (needs a 'dropout' rng when False).
        """
        b, l = input_ids.shape
        positions = _positions(positions, b, l)
        rows = None if keep_last is None else (l - keep_last, keep_last)
        h, _ = self._stack(self.wte(input_ids), positions, attention_mask, use_lora,
                           deterministic, out_rows=rows, read_upto=read_upto)
        return h

    def logits(self, hidden_bsd: Array) -> Array:
        """Logits [B, S, V] from hidden states [B, S, D]."""
        if self.config.weight_tying:
            out = self.wte.attend(hidden_bsd)
        else:
            out = self.ff_out(hidden_bsd)
        if self.config.scale_logits:
            out = out * (self.config.d_model ** -0.5)
        return nn.with_logical_constraint(out, (shd.BATCH, shd.LENGTH, shd.ACT_VOCAB))

    def __call__(self, input_ids: Array, attention_mask: Array | None = None, *,
                 positions: Array | None = None, slice_start: Array | int | None = None,
                 slice_len: int | None = None, use_lora: bool = True,
                 deterministic: bool = True) -> Array:
        """Logits [B, L, V], or [B, slice_len, V] for positions slice_start:+slice_len.

        slice_start may be traced (e.g. the current block inside a sampler loop);
        slice_len is static. Only the sliced positions go through the output head.
        """
        return self.logits(self.sliced_hidden(
            input_ids, attention_mask, positions=positions, slice_start=slice_start,
            slice_len=slice_len, use_lora=use_lora, deterministic=deterministic))

    def sliced_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                      positions: Array | None = None, slice_start: Array | int | None = None,
                      slice_len: int | None = None, use_lora: bool = True,
                      deterministic: bool = True) -> Array:
        """``__call__`` before the output head: final-norm hidden states [B, L or slice_len,
        D] (``logits`` maps any subset of them, e.g. the block positions still masked)."""
        b, l = input_ids.shape
        positions = _positions(positions, b, l)
        rows = None if slice_len is None else (
            slice_start if slice_start is not None else 0, slice_len)
        h, _ = self._stack(self.wte(input_ids), positions, attention_mask, use_lora,
                           deterministic, out_rows=rows)
        return h

    @staticmethod
    def output_head(params: Mapping[str, Any], config: LLaDAConfig) -> tuple[Array, float | None]:
        """(the output head as [D, V], logit scale or None) for chunked log-softmax."""
        return head_weight(params, config), (config.d_model ** -0.5 if config.scale_logits
                                             else None)

    # Block-wise approximate KV cache (Fast-dLLM): additive entry points for the sampler.

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, KVCache]:
        """One full forward: logits [B, S, V] of positions slice_start:+slice_len (all when
        slice_len is None) and every layer's keys/values of the whole sequence."""
        b, l = input_ids.shape
        h, cache = self._stack(self.wte(input_ids), jnp.broadcast_to(jnp.arange(l), (b, l)),
                               attention_mask, use_lora, return_kv=True)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, slice_start, slice_len, axis=1)
        return self.logits(h), cache

    def decode_slice(self, slice_ids: Array, cache: KVCache, slice_start: Array | int,
                     attention_mask: Array | None = None, *, head_len: int | None = None,
                     use_lora: bool = True) -> Array:
        """Logits [B, head_len or Q, V] of positions slice_start:+Q given their ids [B, Q]
        (LLaDA's own form, outside the interface: the rows' tokens, not the sequence).

        Their queries, keys and values are recomputed; they attend to themselves and to
        ``cache`` (from ``prefill``) at every other position. attention_mask is [B, L] over
        the whole sequence. With a cache of the same sequence this equals ``__call__``.
        """
        h = self._decode_rows(slice_ids, cache, slice_start, attention_mask, use_lora)
        return self.logits(h if head_len is None else h[:, :head_len])

    def decode_hidden(self, input_ids: Array, cache: KVCache, slice_start: Array | int,
                      attention_mask: Array | None = None, *, slice_len: int,
                      use_lora: bool = True) -> Array:
        """Final-norm hidden states [B, slice_len, D] of positions slice_start:+slice_len of
        the sequence ``input_ids`` [B, L], recomputed against ``cache`` elsewhere
        (``logits`` maps any subset of them, e.g. only the positions still masked)."""
        rows = jax.lax.dynamic_slice_in_dim(input_ids, slice_start, slice_len, axis=1)
        return self._decode_rows(rows, cache, slice_start, attention_mask, use_lora)

    def _decode_rows(self, slice_ids: Array, cache: KVCache, slice_start: Array | int,
                     attention_mask: Array | None, use_lora: bool) -> Array:
        """Hidden [B, Q, D] of positions slice_start:+Q holding ``slice_ids`` [B, Q]."""
        b, q = slice_ids.shape
        positions = slice_start + jnp.broadcast_to(jnp.arange(q), (b, q))
        h, _ = self._stack(self.wte(slice_ids), positions, attention_mask, use_lora,
                           cache=cache, q_start=slice_start)
        return h

    def decode_at(self, input_ids: Array, idx: Array, cache: KVCache, window: KVCache,
                  window_start: Array | int, attention_mask: Array | None = None, *,
                  use_lora: bool = True) -> tuple[Array, KVCache]:
        """Recomputes some positions of a window whose keys/values are kept apart.

        The window covers positions window_start:+W of the sequence ``input_ids`` [B, L];
        ``window`` holds its keys/values ([n_layers, B, W, K, H], e.g. the block's slice of
        ``prefill``'s cache, updated step by step). Positions ``window_start + idx`` (``idx``
        [B, Q] distinct within a row) are recomputed; their fresh keys/values replace the
        window's at ``idx``, and they attend to the updated window and to ``cache`` outside
        it. Rows with ``idx >= W`` are padding: computed, never written (their outputs are
        meaningless). Returns (final-norm hidden [B, Q, D], the updated window).
        """
        w = window.k.shape[2]
        block = jax.lax.dynamic_slice_in_dim(input_ids, window_start, w, axis=1)
        ids = jnp.take_along_axis(block, jnp.minimum(idx, w - 1), axis=1)  # padding: clamped
        return self._stack(self.wte(ids), window_start + idx, attention_mask, use_lora,
                           cache=cache, window=window, q_start=window_start, idx_bq=idx,
                           return_kv=True)


def _positions(positions: Array | None, b: int, l: int) -> Array:
    """RoPE positions [1, L] (shared: the tables are computed once, not per row) or [B, L]."""
    positions = jnp.arange(l) if positions is None else jnp.asarray(positions)
    return positions[None] if positions.ndim == 1 else jnp.broadcast_to(positions, (b, l))


def head_weight(params: Mapping[str, Any], config: LLaDAConfig) -> Array:
    """The output head as [D, V] (for chunked log-softmax over the vocabulary)."""
    if config.weight_tying:
        return params["wte"]["embedding"].T
    return params["ff_out"]["kernel"]
