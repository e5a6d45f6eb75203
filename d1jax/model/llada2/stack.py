"""The body LLaDA2 and LLaDA-MoE share: a word embedding, dense layers then mixture-of-experts
layers (two ``nn.scan``s over stacked params), a final RMSNorm, a tied or untied head, the
router summary, and the cached stack their cache entry points run.

A family subclasses ``MoEPredictor`` and sets ``block`` (its layer module, called as
``block(config, dtype, param_dtype, lora, is_moe)`` and then ``(x, rope, mask, use_lora,
deterministic, routing)``, or with the cache arguments of ``cached_stack``), ``embed_name``
(the embedding's parameter name in its checkpoint), and ``default_positions`` and
``default_mask`` (what ``hidden`` uses when the caller gives none); its cache entry points
(``prefill``, ``decode_hidden``, ``decode_at``) call ``cached_stack`` with its own mask.

Shape letters: B batch, L sequence, D hidden, K experts per token, V vocab.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model.kv_cache import KVCache
from d1jax.model.layers import Proj, RMSNorm, rope_tables
from d1jax.model.lora import LoraConfig

Array = jax.Array
DType = Any


class MoEPredictor(nn.Module):
    """A mixture-of-experts mask predictor (row i predicts token i).

    Attributes:
      config: architecture (the family's config).
      dtype: compute dtype of matmuls; norms, RoPE, the router and softmax statistics run in
        float32.
      param_dtype: storage dtype of the parameters (the router's ``expert_bias``: float32).
      remat: rematerialise each block in the backward pass.
      lora: optional LoRA adapters on the projections named in ``lora.targets``.
      unroll_layers: unroll the layer scans into straight-line code.
      layers_per_loop: layers per iteration of each scan.
    """

    config: Any
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    remat: bool = False
    lora: LoraConfig | None = None
    unroll_layers: bool | None = None
    layers_per_loop: int = 1

    shifted_prediction = False
    block: ClassVar[type]  # the family's layer module
    embed_name: ClassVar[str]  # the word embedding's parameter name

    def default_positions(self, attention_mask: Array | None, length: int) -> Array:
        """RoPE positions [B or 1, L] (or [L]) when ``hidden`` is given none."""
        raise NotImplementedError

    def default_mask(self, attention_mask: Array | None, length: int) -> Any:
        """The attention mask ``hidden`` uses when it is given none."""
        raise NotImplementedError

    def _stack(self, n: int, is_moe: bool):
        block = self.block
        if self.remat:
            block = nn.remat(block, prevent_cse=False, static_argnums=(4, 5),
                             policy=jax.checkpoint_policies.nothing_saveable)
        bc = nn.broadcast
        return nn.scan(
            block, variable_axes={"params": 0, "intermediates": 0},
            split_rngs={"params": True, "dropout": True}, in_axes=(bc, bc, bc, bc, 0), length=n,
            metadata_params={nn.PARTITION_NAME: shd.LAYERS},
            unroll=n if self.unroll_layers else self.layers_per_loop,
        )(self.config, self.dtype, self.param_dtype, self.lora, is_moe)

    def setup(self):
        c = self.config
        setattr(self, self.embed_name, nn.Embed(
            c.vocab_size, c.hidden_size, param_dtype=self.param_dtype, dtype=self.dtype,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(stddev=c.initializer_range), (shd.VOCAB, shd.EMBED))))
        self.dense_layers = self._stack(c.n_dense, False) if c.n_dense else None
        self.moe_layers = self._stack(c.n_moe, True) if c.n_moe else None
        self.norm = RMSNorm(c.rms_norm_eps, self.dtype, self.param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Proj(c.vocab_size, (shd.EMBED, shd.VOCAB), self.dtype,
                                self.param_dtype, init_std=c.initializer_range)

    def _embed(self) -> nn.Embed:
        return getattr(self, self.embed_name)

    def unrolled(self) -> bool:
        return bool(self.unroll_layers)

    def rope(self, positions_bl: Array) -> tuple[Array, Array]:
        """sin, cos [B or 1, L, rotary_dim] of integer positions (their default RoPE over the
        rotary features: inv_freq = theta^(-2j / rotary_dim))."""
        c = self.config
        return rope_tables(positions_bl.astype(jnp.float32), c.rotary_dim, c.rope_theta)

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True, keep_last: int | None = None,
               read_upto: Array | int | None = None, mask: Any = None,
               routing: Array | None = None) -> Array:
        """Final-norm hidden states [B, L, D] (or [B, keep_last, D] of the last positions).

        Args:
          input_ids: [B, L] int token ids.
          attention_mask: [B, L] (1 = real token, 0 = padding); None: all real.
          positions: [B, L] or [L] RoPE positions; default ``default_positions``.
          mask: bool [B or 1, L, L] per-query mask (or a ``RowMask``) replacing the family's
            ``default_mask`` (block diffusion training's two streams).
          routing: int32 [n_moe, B, L, K] expert ids recorded by an earlier forward (the
            sown ``moe_layers/router_ids``; -1: a token without a record): every MoE layer
            routes by them, weighing them by the current router (routing replay), and sows
            ``router_changed``, the share of tokens whose current experts differ.
        """
        b, l = input_ids.shape
        c = self.config
        if positions is None:
            positions = self.default_positions(attention_mask, l)
        positions = jnp.asarray(positions)
        positions = positions[None] if positions.ndim == 1 else positions
        rope = tuple(jnp.broadcast_to(r, (b, l, c.rotary_dim)) for r in self.rope(positions))
        if mask is None:
            mask = self.default_mask(attention_mask, l)
        x = self._embed()(input_ids)
        if routing is not None:
            want = (c.n_moe, b, l, c.num_experts_per_tok)
            if routing.shape != want:
                raise ValueError(f"routing {routing.shape}: expected [n_moe, B, L, K] = {want}")
        for stack, routes in ((self.dense_layers, None), (self.moe_layers, routing)):
            if stack is not None:
                x, _ = stack(x, rope, mask, use_lora, deterministic, routes)
        h = self.norm(x)
        return h if keep_last is None else h[:, l - keep_last:]

    def logits(self, hidden_bsd: Array) -> Array:
        """Logits [B, S, V] from hidden states [B, S, D]."""
        if self.config.tie_word_embeddings:
            out = self._embed().attend(hidden_bsd)
        else:
            out = self.lm_head(hidden_bsd)
        return nn.with_logical_constraint(out, (shd.BATCH, shd.LENGTH, shd.ACT_VOCAB))

    def sliced_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                      positions: Array | None = None, slice_start: Array | int | None = None,
                      slice_len: int | None = None, use_lora: bool = True,
                      deterministic: bool = True) -> Array:
        """Hidden states [B, L or slice_len, D] of positions slice_start:+slice_len."""
        h = self.hidden(input_ids, attention_mask, positions=positions, use_lora=use_lora,
                        deterministic=deterministic)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, 0 if slice_start is None else slice_start,
                                             slice_len, axis=1)
        return h

    def __call__(self, input_ids: Array, attention_mask: Array | None = None, *,
                 positions: Array | None = None, slice_start: Array | int | None = None,
                 slice_len: int | None = None, use_lora: bool = True,
                 deterministic: bool = True) -> Array:
        """Logits [B, L, V] (row i predicts token i), or [B, slice_len, V] of a slice."""
        return self.logits(self.sliced_hidden(
            input_ids, attention_mask, positions=positions, slice_start=slice_start,
            slice_len=slice_len, use_lora=use_lora, deterministic=deterministic))

    @staticmethod
    def step_metrics(intermediates: dict[str, Any]) -> dict[str, Array]:
        """The train step's router summary from what the MoE layers sowed in one forward
        (``mutable=["intermediates"]``; {} when none did): ``router_load_max`` /
        ``router_load_min``, the largest and smallest share of the (token, slot) assignments
        an expert of any MoE layer got (1 / num_experts when balanced), and
        ``router_entropy``, the per-token entropy of the normalised scores (nats; log E: no
        preference) averaged over tokens and MoE layers; with routing replay,
        ``router_changed``: the share of (token, MoE layer) pairs whose current expert set
        differs from the replayed one."""
        sown = intermediates.get("moe_layers", {})
        if "router_load" not in sown:
            return {}
        (load_ne,), (entropy_n,) = sown["router_load"], sown["router_entropy"]
        out = {"router_load_max": jnp.max(load_ne), "router_load_min": jnp.min(load_ne),
               "router_entropy": jnp.mean(entropy_n)}
        if "router_changed" in sown:  # routing replay: (token, layer) pairs rerouted
            out["router_changed"] = jnp.mean(sown["router_changed"][0])
        return out

    @classmethod
    def output_head(cls, params: dict[str, Any], config: Any) -> tuple[Array, None]:
        """(the output head as [D, V], no logit scale)."""
        if config.tie_word_embeddings:
            return params[cls.embed_name]["embedding"].T, None
        return params["lm_head"]["kernel"], None

    def cached_stack(self, ids_br: Array, positions_br: Array, mask: Any, use_lora: bool,
                     cache: KVCache | None = None, window: KVCache | None = None,
                     q_start: Array | int = 0, idx_bq: Array | None = None,
                     n_fresh: int | None = None, return_kv: bool = False,
                     ) -> tuple[Array, KVCache | None]:
        """Rows [B, R] at RoPE positions [B or 1, R] through the dense then the MoE layers
        (the block's cached mode when ``cache`` is given) under ``mask`` (the family's: keys
        [B, L] or a per-query mask), one ``lax.scan`` a stack over its stacked params:
        (final-norm hidden [B, R, D], keys/values [n_layers, ...] or None)."""
        c = self.config
        rope = self.rope(positions_br)
        x, kvs = self._embed()(ids_br), []
        for stack, lo, hi, is_moe in ((self.dense_layers, 0, c.n_dense, False),
                                      (self.moe_layers, c.n_dense, c.num_hidden_layers, True)):
            if stack is None:
                continue
            block = self.block(c, self.dtype, self.param_dtype, self.lora, is_moe, parent=None)
            part = lambda t: None if t is None else jax.tree.map(lambda a: a[lo:hi], t)  # noqa: E731

            def layer(x, per_layer, block=block):
                p, kv, win = per_layer
                return block.apply({"params": p}, x, rope, mask, use_lora, True, None, kv, win,
                                   q_start, idx_bq, n_fresh, return_kv)
            x, kv = jax.lax.scan(layer, x, (stack.variables["params"], part(cache), part(window)),
                                 unroll=hi - lo if self.unroll_layers else self.layers_per_loop)
            kvs.append(kv)
        kv = None if not return_kv else jax.tree.map(
            lambda *a: jnp.concatenate(a, axis=0), *kvs)
        return self.norm(x), kv
