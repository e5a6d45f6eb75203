"""The Qwen decoder that the Dream (Qwen2) and SDAR (Qwen3) families share: the block, the
stack around it, the config's shape names and ``config.json`` reading, the key map.

What differs between the two is named here as a flag, never a family: q/k/v biases
(``qkv_bias``, Qwen2's), a per-head RMSNorm on queries and keys before RoPE (``qk_norm``,
Qwen3's ``q_norm``/``k_norm``), and the attention mask the caller hands the block (a key
mask [B, L] for Dream's bidirectional attention, a per-query mask [B, Q, L] for SDAR's
block-causal one). Parameter names are the checkpoint's with the ``model.``/``self_attn.``/
``mlp.`` scopes dropped (``embed_tokens``, ``layers.{q,k,v,o}_proj``, ``layers.{q,k}_norm``,
``layers.{gate,up,down}_proj``, ``layers.input_layernorm``,
``layers.post_attention_layernorm``, ``norm``, ``lm_head``); kernels are [in, out] and the
blocks are stacked on a leading ``layers`` axis (``nn.scan``).

Shape letters: B batch, L sequence (keys), Q queries, R rows, D hidden, N query heads,
K kv heads, H head dim, F intermediate, V vocab.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model import hf_checkpoint as hf
from d1jax.model.attention import attention
from d1jax.model.hf_checkpoint import HFShapeNames, UnsupportedConfigError
from d1jax.model.kv_cache import KVCache, attend_cached
from d1jax.model.layers import Proj, RMSNorm, apply_rope, rope_tables, swiglu
from d1jax.model.lora import LoraConfig

Array = jax.Array
DType = Any

# The block projections by their module names (self_attn's q/k/v/o_proj, mlp's
# gate/up/down_proj): LoRA's targets, and d1's GRPO list, where all seven exist.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GRPO_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj")
# ``Family.fields``: the config fields a tokenizer-sized random model sets.
FIELDS = dict(vocab=("vocab_size",), mask=("mask_token_id",),
              eos=("eos_token_id", "bos_token_id"), pad=("pad_token_id",),
              length=("max_position_embeddings",), width=("hidden_size",),
              mlp=("intermediate_size",), layers=("num_hidden_layers",))
# rope_scaling types implemented: HF's "default" (none) and "linear" (positions / factor).
ROPE_TYPES = ("default", "linear")
_REQUIRED_HF = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads")


class QwenConfig(HFShapeNames):
    """Mixin of a frozen Qwen config dataclass (Hugging Face field names): the shape names
    every family answers, RoPE scaling, and ``config.json`` reading and writing.

    A subclass sets ``HF_FIELDS`` (the config.json fields read and written, in the released
    files' order), ``REQUIRED_VALUES`` (fields whose one value the port implements) and
    ``RELEASES`` (named in the refusal of an unsupported RoPE scaling)."""

    HF_FIELDS: tuple[str, ...] = ()
    REQUIRED_VALUES: Mapping[str, Any] = {}
    RELEASES = ""

    def _check(self) -> None:
        """``__post_init__``'s shared part: kv heads default to N, rope_scaling made
        hashable; GQA, even head_dim and the RoPE scaling checked."""
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise UnsupportedConfigError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """[in, out] of each block projection, by its LoRA target name (biases and q/k
        norms left out)."""
        d, q, kv, f = self.hidden_size, self.num_attention_heads * self.head_dim, \
            self.num_key_value_heads * self.head_dim, self.intermediate_size
        return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
                "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}

    @property
    def rope_factor(self) -> float:
        """Positions are divided by this before RoPE (1 unless rope_scaling is "linear")."""
        if self.rope_scaling is None:
            return 1.0
        scaling = dict(self.rope_scaling)
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise UnsupportedConfigError(
                f"rope_scaling type {kind!r} is not supported by d1jax (supported: "
                f"{ROPE_TYPES}); {self.RELEASES} use rope_scaling=null")
        return float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0

    @classmethod
    def hf_kwargs(cls, d: Mapping[str, Any], *, model_types: tuple[str, ...], refusal: str,
                  none_ok: bool = False) -> dict[str, Any]:
        """The constructor's kwargs from a ``config.json`` dict. UnsupportedConfigError,
        naming the field: a ``model_type`` not in ``model_types`` (``refusal`` says what
        the class reads), a ``REQUIRED_VALUES`` field with another value (``none_ok``: null
        passes), a required shape missing."""
        if d.get("model_type", model_types[0]) not in model_types:
            raise UnsupportedConfigError(
                f"config.json has model_type={d['model_type']!r}; {refusal}")
        for key, want in cls.REQUIRED_VALUES.items():
            if d.get(key, want) not in ((want, None) if none_ok else (want,)):
                raise UnsupportedConfigError(
                    f"config.json has {key}={d[key]!r}; d1jax supports only {key}={want!r}")
        kw = {k: d[k] for k in cls.HF_FIELDS if k in d}
        if isinstance(kw.get("eos_token_id"), list):  # HF allows several; the first ends text
            kw["eos_token_id"] = kw["eos_token_id"][0]
        missing = [k for k in _REQUIRED_HF if k not in kw]
        if missing:
            raise UnsupportedConfigError(f"config.json lacks required fields {missing}")
        return kw

    def hf_dict(self, architectures: list[str], model_type: str,
                auto_map: Mapping[str, str]) -> dict[str, Any]:
        """A ``config.json`` dict: ``HF_FIELDS``, ``REQUIRED_VALUES``, then the class names
        and Qwen's fixed facts (no sliding window, no KV cache in training)."""
        d = {k: getattr(self, k) for k in self.HF_FIELDS}
        d["rope_scaling"] = None if self.rope_scaling is None else dict(self.rope_scaling)
        d.update(self.REQUIRED_VALUES)
        d.update(architectures=architectures, model_type=model_type, sliding_window=None,
                 max_window_layers=self.num_hidden_layers, use_cache=False,
                 auto_map=dict(auto_map))
        return d


class BiasedProj(Proj):
    """``Proj`` plus a bias [out] (Qwen2's q/k/v projections); the bias is never adapted."""

    @nn.compact
    def __call__(self, x: Array, use_lora: bool = True, deterministic: bool = True) -> Array:
        y = super().__call__(x, use_lora, deterministic)
        b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axes[1],)),
                       (self.features,), self.param_dtype)
        return y + b.astype(y.dtype)


class QwenBlock(nn.Module):
    """One Qwen decoder layer: x + Attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(.)).

    Full (``cache`` None; as ``nn.scan`` calls it): the rows [B, L, D] are the sequence and
    attend to each other under ``mask`` (a key mask [B, L], a per-query mask [B or 1, L, L],
    or None). Cached: the first ``n_fresh`` rows are recomputed positions whose keys/values
    are fresh (a slice q_start:+n_fresh, or with ``window`` the window rows ``idx_bq``, as
    ``kv_cache.attend_cached``; ``mask`` is then a key mask [B, L]); the rows after them are
    query-only: they attend like the others and their keys/values are the cache's. Returns
    (x, the fresh rows' keys/values, the slice or the updated window, when ``return_kv``,
    else None).
    """

    config: Any  # a QwenConfig
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None = None
    qkv_bias: bool = False  # Qwen2: biases on q, k and v
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's H features of q and k, before RoPE

    def _proj(self, name: str, features: int, axes: tuple[str, str], bias: bool = False):
        lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
        cls = BiasedProj if bias else Proj
        return cls(features, axes, self.dtype, self.param_dtype,
                   init_std=self.config.initializer_range, lora=lora, name=name,
                   quant=self.lora.base_quant if self.lora is not None else "none")

    @nn.compact
    def __call__(self, x_bld: Array, rope: tuple[Array, Array], mask: Array | None,
                 use_lora: bool, deterministic: bool, cache: KVCache | None = None,
                 window: KVCache | None = None, q_start: Array | int = 0,
                 idx_bq: Array | None = None, n_fresh: int | None = None,
                 return_kv: bool = False) -> tuple[Array, KVCache | None]:
        c = self.config
        n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        kw = dict(use_lora=use_lora, deterministic=deterministic)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bld = nn.with_logical_constraint(x_bld, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))
        b, l = x_bld.shape[:2]
        xn = norm(name="input_layernorm")(x_bld)
        xf, rope_f = xn, rope  # the rows with fresh keys/values
        if n_fresh is not None:
            xf, rope_f = xn[:, :n_fresh], tuple(r[:, :n_fresh] for r in rope)
        f = xf.shape[1]
        bias = self.qkv_bias
        q = self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS), bias)(xn, **kw)
        kk = self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias)(xf, **kw)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS), bias)(xf, **kw)
        q, kk = q.reshape(b, l, n, h), kk.reshape(b, f, k, h)
        if self.qk_norm:
            q, kk = norm(name="q_norm")(q), norm(name="k_norm")(kk)
        q = apply_rope(q, *rope)
        fresh = KVCache(apply_rope(kk, *rope_f), v.reshape(b, f, k, h))
        if cache is None:
            att, own = attention(q, fresh.k, fresh.v, mask, h ** -0.5), fresh
        else:
            att, own = attend_cached(q, fresh, cache, q_start, mask, window, idx_bq)
        x_bld = x_bld + self._proj("o_proj", c.hidden_size, (shd.Q_HEADS, shd.EMBED))(
            att.reshape(b, l, n * h), **kw)

        xn = norm(name="post_attention_layernorm")(x_bld)
        x_bld = x_bld + swiglu(self._proj, xn, c.intermediate_size, c.hidden_size,
                               ("gate_proj", "up_proj", "down_proj"), **kw)
        return x_bld, (own if return_kv else None)


class QwenStack(nn.Module):
    """Embedding, the stacked Qwen blocks, the final norm and the output head; a family's
    module subclasses it, setting ``qkv_bias``/``qk_norm`` and adding its entry points.

    Attributes:
      config: architecture (a QwenConfig).
      dtype: compute dtype of matmuls; norms, RoPE and softmax statistics run in float32.
      param_dtype: storage dtype of the parameters.
      remat: rematerialise each block in the backward pass.
      lora: optional LoRA adapters on the projections named in ``lora.targets``
        (``LORA_TARGETS``).
      unroll_layers: unroll the layer scan (straight-line code) instead of a loop (None:
        a loop, as False).
      layers_per_loop: layers per iteration of that loop (``nn.scan``'s unroll).
    """

    config: Any
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    remat: bool = False
    lora: LoraConfig | None = None
    unroll_layers: bool | None = None
    layers_per_loop: int = 1

    qkv_bias = False  # class attributes of a family's module (QwenBlock's flags)
    qk_norm = False

    def _block(self, **kw: Any) -> QwenBlock:
        return QwenBlock(self.config, self.dtype, self.param_dtype, self.lora,
                         qkv_bias=self.qkv_bias, qk_norm=self.qk_norm, **kw)

    def setup(self):
        c = self.config
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, param_dtype=self.param_dtype, dtype=self.dtype,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(stddev=c.initializer_range), (shd.VOCAB, shd.EMBED)))
        block = QwenBlock
        if self.remat:
            block = nn.remat(QwenBlock, prevent_cse=False, static_argnums=(4, 5),
                             policy=jax.checkpoint_policies.nothing_saveable)
        bc = nn.broadcast
        self.layers = nn.scan(
            block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
            in_axes=(bc, bc, bc, bc), length=c.num_hidden_layers,
            metadata_params={nn.PARTITION_NAME: shd.LAYERS},
            unroll=c.num_hidden_layers if self.unroll_layers else self.layers_per_loop,
        )(c, self.dtype, self.param_dtype, self.lora, self.qkv_bias, self.qk_norm)
        self.norm = RMSNorm(c.rms_norm_eps, self.dtype, self.param_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Proj(c.vocab_size, (shd.EMBED, shd.VOCAB), self.dtype,
                                self.param_dtype, init_std=c.initializer_range)

    def unrolled(self) -> bool:
        """Whether the layer scan runs as straight-line code (``unroll_layers``)."""
        return bool(self.unroll_layers)

    def rope(self, positions_br: Array) -> tuple[Array, Array]:
        """sin, cos [B or 1, R, H] of integer RoPE positions [B or 1, R] (linear scaling
        applied)."""
        c = self.config
        return rope_tables(positions_br.astype(jnp.float32) / c.rope_factor, c.head_dim,
                           c.rope_theta)

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
        return self.logits(self.sliced_hidden(
            input_ids, attention_mask, positions=positions, slice_start=slice_start,
            slice_len=slice_len, use_lora=use_lora, deterministic=deterministic))

    def sliced_hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
                      positions: Array | None = None, slice_start: Array | int | None = None,
                      slice_len: int | None = None, use_lora: bool = True,
                      deterministic: bool = True) -> Array:
        """``__call__`` before the output head: prediction-aligned hidden states [B, L or
        slice_len, D]."""
        h = self.hidden(input_ids, attention_mask, positions=positions, use_lora=use_lora,
                        deterministic=deterministic)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, 0 if slice_start is None else slice_start,
                                             slice_len, axis=1)
        return h

    @staticmethod
    def output_head(params: dict[str, Any], config: Any) -> tuple[Array, float | None]:
        """(the output head as [D, V], logit scale or None) for chunked log-softmax."""
        return head_weight(params, config), None

    def full_with_cache(self, input_ids: Array, attention_mask: Array | None, mask: Array | None,
                        slice_start: Array | int, slice_len: int | None, use_lora: bool,
                        rows=None) -> tuple[Array, KVCache]:
        """``prefill``'s body: one forward under ``mask`` at ``token_positions`` of the padding
        mask; (logits [B, S, V] of rows slice_start:+slice_len, all when slice_len is None,
        after ``rows`` maps the hidden states (Dream's shift); every layer's keys/values)."""
        h, cache = self.cached_stack(input_ids,
                                     token_positions(attention_mask, input_ids.shape[1]), mask,
                                     use_lora, return_kv=True)
        h = h if rows is None else rows(h)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, slice_start, slice_len, axis=1)
        return self.logits(h), cache

    def cached_stack(self, ids_br: Array, positions_br: Array, key_mask_bl: Array | None,
                     use_lora: bool, cache: KVCache | None = None,
                     window: KVCache | None = None, q_start: Array | int = 0,
                     idx_bq: Array | None = None, n_fresh: int | None = None,
                     return_kv: bool = False) -> tuple[Array, KVCache | None]:
        """Rows [B, R] at RoPE positions [B or 1, R] through every layer (``QwenBlock``'s
        cached mode), one ``lax.scan`` over the stacked params (the full forward's
        ``nn.scan`` is left as it is): (final-norm hidden [B, R, D], the fresh keys/values
        stacked [n_layers, ...] or None)."""
        c = self.config
        rope = self.rope(positions_br)
        block = self._block(parent=None)

        def layer(x, per_layer):
            p, kv, win = per_layer
            return block.apply({"params": p}, x, rope, key_mask_bl, use_lora, True, kv, win,
                               q_start, idx_bq, n_fresh, return_kv)
        x, kv = jax.lax.scan(layer, self.embed_tokens(ids_br),
                             (self.layers.variables["params"], cache, window),
                             unroll=c.num_hidden_layers if self.unroll_layers
                             else self.layers_per_loop)
        return self.norm(x), kv


def token_positions(attention_mask_bl: Array | None, length: int) -> Array:
    """RoPE positions [B or 1, L]: ``tok_idx`` of Dream's sampler and dLLM-RL
    (cumsum(mask) - 1, padding set to 1), or 0..L-1 without a mask."""
    if attention_mask_bl is None:
        return jnp.arange(length)[None]
    m = jnp.asarray(attention_mask_bl).astype(jnp.int32)
    return jnp.where(m == 0, 1, jnp.cumsum(m, axis=-1) - 1)


def head_weight(params: dict[str, Any], config: Any) -> Array:
    """The output head as [D, V] (for chunked log-softmax over the vocabulary)."""
    if config.tie_word_embeddings:
        return params["embed_tokens"]["embedding"].T
    return params["lm_head"]["kernel"]


def key_map(config: Any, *, biased: tuple[str, ...] = (),
            head_norms: tuple[str, ...] = ()) -> hf.KeyMap:
    """HF key -> (param path, layer index or None, transposed?), in checkpoint order, of a
    Qwen checkpoint (torch Linear weights [out, in], our kernels [in, out]); ``biased``:
    the attention projections with a bias, ``head_norms``: self_attn's q/k norms."""
    out: hf.KeyMap = {"model.embed_tokens.weight": (("embed_tokens", "embedding"), None, False)}
    for i in range(config.num_hidden_layers):
        pre = f"model.layers.{i}."
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"{pre}self_attn.{p}.weight"] = (("layers", p, "kernel"), i, True)
            if p in biased:
                out[f"{pre}self_attn.{p}.bias"] = (("layers", p, "bias"), i, False)
        for n in head_norms:
            out[f"{pre}self_attn.{n}.weight"] = (("layers", n, "weight"), i, False)
        for p in ("gate_proj", "up_proj", "down_proj"):
            out[f"{pre}mlp.{p}.weight"] = (("layers", p, "kernel"), i, True)
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[f"{pre}{n}.weight"] = (("layers", n, "weight"), i, False)
    out["model.norm.weight"] = (("norm", "weight"), None, False)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head", "kernel"), None, True)
    return out
