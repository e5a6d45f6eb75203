"""LLaDA as a pure Flax linen module.

A bidirectional LLaMA-style transformer (RMSNorm, RoPE, SwiGLU, no causal mask) that
matches the Hugging Face ``modeling_llada.py`` (block_type "llama"). Parameter names
follow the Hugging Face checkpoint (``wte``, ``blocks.{q,k,v}_proj``, ``attn_out``,
``ff_proj``, ``up_proj``, ``ff_out``, ``attn_norm``, ``ff_norm``, ``ln_f``); kernels are
stored ``[in, out]`` (the transpose of torch's Linear weight), blocks are stacked on a
leading ``layers`` axis and run with ``nn.scan``.

Shape letters: B batch, L sequence, D d_model, N query heads, K kv heads, H head dim,
F mlp hidden, V embedding (vocab) size, S slice length.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd

Array = jax.Array
DType = Any

# Fields of a Hugging Face LLaDA config.json that the port reads.
_HF_FIELDS = (
    "d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "vocab_size",
    "embedding_size", "rope_theta", "rms_norm_eps", "max_sequence_length", "mask_token_id",
    "eos_token_id", "pad_token_id", "weight_tying", "include_bias", "scale_logits",
)

# Fields whose value must be the one given here: the port implements only that variant.
_REQUIRED_VALUES = {
    "alibi": False,
    "rope": True,
    "block_type": "llama",
    "layer_norm_type": "rms",
    "activation_type": "silu",
    "attention_layer_norm": False,
    "clip_qkv": None,
    "include_qkv_bias": False,
    "input_emb_norm": False,
    "layer_norm_with_affine": True,
    "bias_for_layer_norm": False,
    "block_group_size": 1,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
}


class UnsupportedConfigError(ValueError):
    """A LLaDA config value that this port does not implement."""


@dataclasses.dataclass(frozen=True)
class LLaDAConfig:
    """Architecture of a LLaDA model, with the Hugging Face config field names."""

    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = None  # None: n_heads (or 1 with multi_query_attention).
    n_layers: int = 32
    mlp_hidden_size: int = 12288
    vocab_size: int = 126464
    embedding_size: int | None = 126464  # None: vocab_size.
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    max_sequence_length: int = 4096
    mask_token_id: int = 126336
    eos_token_id: int = 126081
    pad_token_id: int = 126081
    weight_tying: bool = False
    include_bias: bool = False
    scale_logits: bool = False

    def __post_init__(self):
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.embedding_size is None:
            object.__setattr__(self, "embedding_size", self.vocab_size)
        if self.include_bias:
            raise UnsupportedConfigError(
                "include_bias=True is not supported by d1jax (LLaDA checkpoints have no biases)")
        if self.d_model % self.n_heads:
            raise UnsupportedConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedConfigError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.embedding_size < self.vocab_size:
            raise UnsupportedConfigError(
                f"embedding_size={self.embedding_size} is smaller than vocab_size={self.vocab_size}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "LLaDAConfig":
        """Builds the config from a Hugging Face ``config.json`` dict.

        Raises UnsupportedConfigError naming the field for any variant the port does not
        implement (alibi, non-RMS norms, qk-norm, biases, dropout, ...).
        """
        for key, want in _REQUIRED_VALUES.items():
            if key in d and d[key] != want and not (key == "block_group_size" and d[key] is None):
                raise UnsupportedConfigError(
                    f"config.json has {key}={d[key]!r}; d1jax supports only {key}={want!r}")
        kw = {k: d[k] for k in _HF_FIELDS if k in d and d[k] is not None}
        kw.setdefault("embedding_size", None)  # HF: embedding_size or vocab_size
        if d.get("n_kv_heads") is None and d.get("multi_query_attention"):
            kw["n_kv_heads"] = 1
        if kw.get("mlp_hidden_size") is None and "mlp_hidden_size" not in kw:
            if d.get("mlp_ratio") is None:
                raise UnsupportedConfigError("config.json has neither mlp_hidden_size nor mlp_ratio")
            kw["mlp_hidden_size"] = int(d["mlp_ratio"] * d["d_model"])
        missing = [k for k in ("d_model", "n_heads", "n_layers", "vocab_size") if k not in kw]
        if missing:
            raise UnsupportedConfigError(f"config.json lacks required fields {missing}")
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dict loadable by the Hugging Face LLaDA code."""
        d = {k: getattr(self, k) for k in _HF_FIELDS}
        d.update(_REQUIRED_VALUES)
        d.update(
            architectures=["LLaDAModelLM"], model_type="llada", activation_type="silu",
            rope_full_precision=True, multi_query_attention=None, mlp_ratio=4,
            auto_map={"AutoConfig": "configuration_llada.LLaDAConfig",
                      "AutoModel": "modeling_llada.LLaDAModelLM",
                      "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        )
        return d

    def num_params(self) -> int:
        d, f, v, kv = self.d_model, self.mlp_hidden_size, self.embedding_size, self.n_kv_heads
        per_layer = 2 * d * d + 2 * d * kv * self.head_dim + 3 * d * f + 2 * d
        return self.n_layers * per_layer + v * d * (1 if self.weight_tying else 2) + d


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (Hu et al. 2021) on the named projections: W x + (alpha/r) B A x."""

    rank: int = 128
    alpha: float = 64.0
    dropout: float = 0.05
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _normal(std: float):
    return nn.initializers.normal(stddev=std)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back, then scaled (as modeling_llada.RMSLayerNorm)."""

    eps: float
    dtype: DType
    param_dtype: DType

    @nn.compact
    def __call__(self, x: Array) -> Array:
        w = self.param("weight", nn.with_logical_partitioning(nn.initializers.ones, (shd.NORM,)),
                       (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return w.astype(self.dtype) * y.astype(self.dtype)


class Proj(nn.Module):
    """A bias-free linear map ``x @ kernel`` with an optional LoRA branch.

    kernel is [in, out] (torch weight transposed). LoRA params ``lora_a`` [in, r] (he-uniform)
    and ``lora_b`` [r, out] (zeros) exist only when ``lora`` targets this projection.
    """

    features: int
    axes: tuple[str, str]
    dtype: DType
    param_dtype: DType
    init_std: float = 0.02
    lora: LoraConfig | None = None

    @nn.compact
    def __call__(self, x: Array, use_lora: bool = True, deterministic: bool = True) -> Array:
        kernel = self.param("kernel", nn.with_logical_partitioning(_normal(self.init_std), self.axes),
                            (x.shape[-1], self.features), self.param_dtype)
        y = jnp.einsum("...i,io->...o", x.astype(self.dtype), kernel.astype(self.dtype))
        if self.lora is None:
            return y
        r = self.lora.rank
        a = self.param("lora_a", nn.with_logical_partitioning(
            nn.initializers.he_uniform(), (self.axes[0], shd.LORA)), (x.shape[-1], r), self.param_dtype)
        b = self.param("lora_b", nn.with_logical_partitioning(
            nn.initializers.zeros, (shd.LORA, self.axes[1])), (r, self.features), self.param_dtype)
        if not use_lora:
            return y
        h = nn.Dropout(self.lora.dropout)(x, deterministic=deterministic)
        h = jnp.einsum("...i,ir->...r", h.astype(self.dtype), a.astype(self.dtype))
        return y + self.lora.scale * jnp.einsum("...r,ro->...o", h, b.astype(self.dtype))


def rope_tables(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """sin, cos [..., H] in float32 for integer positions [...] (half-split layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    freqs = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.sin(freqs), jnp.cos(freqs)


def apply_rope(x_blnh: Array, sin_blh: Array, cos_blh: Array) -> Array:
    """Rotary embedding in float32 (LLaDA's rope_full_precision), rotate-half layout."""
    x = x_blnh.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    rot = jnp.concatenate([-x2, x1], axis=-1)
    out = x * cos_blh[:, :, None, :] + rot * sin_blh[:, :, None, :]
    return out.astype(x_blnh.dtype)


class Block(nn.Module):
    """One LLaDALlamaBlock: x + Attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(.))."""

    config: LLaDAConfig
    dtype: DType
    param_dtype: DType
    lora: LoraConfig | None = None

    def _proj(self, name: str, features: int, axes: tuple[str, str]) -> Proj:
        lora = self.lora if (self.lora is not None and name in self.lora.targets) else None
        return Proj(features, axes, self.dtype, self.param_dtype, lora=lora, name=name)

    @nn.compact
    def __call__(self, x_bld: Array, rope: tuple[Array, Array], key_mask_bl: Array | None,
                 use_lora: bool, deterministic: bool) -> tuple[Array, None]:
        c = self.config
        n, k, h = c.n_heads, c.n_kv_heads, c.head_dim
        kw = dict(use_lora=use_lora, deterministic=deterministic)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bld = nn.with_logical_constraint(x_bld, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))

        xn = norm(name="attn_norm")(x_bld)
        q = self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS))(xn, **kw)
        kk = self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw)
        b, l = x_bld.shape[:2]
        q = apply_rope(q.reshape(b, l, n, h), *rope)
        kk = apply_rope(kk.reshape(b, l, k, h), *rope)
        v = v.reshape(b, l, k, h)
        mask = None if key_mask_bl is None else key_mask_bl[:, None, None, :].astype(bool)
        att = jax.nn.dot_product_attention(q, kk, v, mask=mask, scale=h ** -0.5)
        att = att.reshape(b, l, n * h)
        x_bld = x_bld + self._proj("attn_out", c.d_model, (shd.Q_HEADS, shd.EMBED))(att, **kw)
        return self._mlp(x_bld, norm, kw), None

    def _mlp(self, x_bld: Array, norm, kw) -> Array:
        """x + SwiGLU-MLP(RMSNorm(x)): the second half of the block."""
        c = self.config
        xn = norm(name="ff_norm")(x_bld)
        gate = self._proj("ff_proj", c.mlp_hidden_size, (shd.EMBED, shd.MLP))(xn, **kw)
        up = self._proj("up_proj", c.mlp_hidden_size, (shd.EMBED, shd.MLP))(xn, **kw)
        hid = nn.with_logical_constraint(nn.silu(gate) * up, (shd.BATCH, shd.LENGTH, shd.ACT_MLP))
        return x_bld + self._proj("ff_out", c.d_model, (shd.MLP, shd.EMBED))(hid, **kw)


class LLaDA(nn.Module):
    """The LLaDA mask predictor.

    Attributes:
      config: architecture.
      dtype: compute dtype of matmuls (bfloat16 on accelerators); norms, RoPE and
        softmax statistics run in float32 regardless.
      param_dtype: storage dtype of the parameters.
      remat: rematerialise each block in the backward pass (saves activation memory).
      lora: optional LoRA adapters on the block projections.
    """

    config: LLaDAConfig
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    remat: bool = False
    lora: LoraConfig | None = None

    def setup(self):
        c = self.config
        self.wte = nn.Embed(
            c.embedding_size, c.d_model, param_dtype=self.param_dtype, dtype=self.dtype,
            embedding_init=nn.with_logical_partitioning(_normal(0.02), (shd.VOCAB, shd.EMBED)))
        block = Block
        if self.remat:
            block = nn.remat(Block, prevent_cse=False, static_argnums=(4, 5),
                             policy=jax.checkpoint_policies.nothing_saveable)
        self.blocks = nn.scan(
            block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
            length=c.n_layers, metadata_params={nn.PARTITION_NAME: shd.LAYERS},
        )(c, self.dtype, self.param_dtype, self.lora)
        self.ln_f = RMSNorm(c.rms_norm_eps, self.dtype, self.param_dtype)
        if not c.weight_tying:
            self.ff_out = Proj(c.embedding_size, (shd.EMBED, shd.VOCAB), self.dtype, self.param_dtype)

    def hidden(self, input_ids: Array, attention_mask: Array | None = None, *,
               positions: Array | None = None, use_lora: bool = True,
               deterministic: bool = True) -> Array:
        """Final-norm hidden states [B, L, D] (compute dtype).

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
        if positions is None:
            positions = jnp.arange(l)
        positions = jnp.broadcast_to(positions, (b, l))
        rope = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        x = self.wte(input_ids)
        x, _ = self.blocks(x, rope, attention_mask, use_lora, deterministic)
        return self.ln_f(x)

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
        h = self.hidden(input_ids, attention_mask, positions=positions, use_lora=use_lora,
                        deterministic=deterministic)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, slice_start if slice_start is not None else 0,
                                             slice_len, axis=1)
        return self.logits(h)

    # Block-wise approximate KV cache (Fast-dLLM): additive entry points for the sampler.

    def prefill(self, input_ids: Array, attention_mask: Array | None = None, *,
                slice_start: Array | int = 0, slice_len: int | None = None,
                use_lora: bool = True) -> tuple[Array, "KVCache"]:
        """One full forward: logits [B, S, V] of positions slice_start:+slice_len (all when
        slice_len is None) and every layer's keys/values of the whole sequence."""
        h, cache = self._cached_stack(self.wte(input_ids), 0, attention_mask, None, use_lora)
        if slice_len is not None:
            h = jax.lax.dynamic_slice_in_dim(h, slice_start, slice_len, axis=1)
        return self.logits(h), cache

    def decode_slice(self, slice_ids: Array, cache: "KVCache", slice_start: Array | int,
                     attention_mask: Array | None = None, *, head_len: int | None = None,
                     use_lora: bool = True) -> Array:
        """Logits [B, head_len or Q, V] of positions slice_start:+Q given their ids [B, Q].

        Their queries, keys and values are recomputed; they attend to themselves and to
        ``cache`` (from ``prefill``) at every other position. attention_mask is [B, L] over
        the whole sequence. With a cache of the same sequence this equals ``__call__``.
        """
        h = self.decode_hidden(slice_ids, cache, slice_start, attention_mask, use_lora=use_lora)
        return self.logits(h if head_len is None else h[:, :head_len])

    def decode_hidden(self, slice_ids: Array, cache: "KVCache", slice_start: Array | int,
                      attention_mask: Array | None = None, *, use_lora: bool = True) -> Array:
        """``decode_slice`` before the output head: final-norm hidden states [B, Q, D]
        (``logits`` maps any subset of them, e.g. only the positions still masked)."""
        h, _ = self._cached_stack(self.wte(slice_ids), slice_start, attention_mask, cache,
                                  use_lora)
        return h

    def decode_at(self, ids: Array, idx: Array, cache: "KVCache", window: "KVCache",
                  window_start: Array | int, attention_mask: Array | None = None, *,
                  use_lora: bool = True) -> tuple[Array, "KVCache"]:
        """Recomputes some positions of a window whose keys/values are kept apart.

        The window covers positions window_start:+W; ``window`` holds its keys/values
        ([n_layers, B, W, K, H], e.g. the block's slice of ``prefill``'s cache, updated
        step by step). Positions ``window_start + idx`` (``idx`` [B, Q] distinct within a
        row) hold tokens ``ids``; their fresh keys/values replace the window's at ``idx``,
        and they attend to the updated window and to ``cache`` outside it. Rows with
        ``idx >= W`` are padding: computed, never written (their outputs are meaningless).
        Returns (final-norm hidden [B, Q, D], the updated window).
        """
        return self._cached_stack(self.wte(ids), window_start, attention_mask, cache, use_lora,
                                  window=window, idx=idx)

    def _cached_stack(self, x_bqd: Array, q_start: Array | int, key_mask_bl: Array | None,
                      cache: "KVCache | None", use_lora: bool, window: "KVCache | None" = None,
                      idx: Array | None = None) -> tuple[Array, "KVCache"]:
        """Runs the layers (params of ``blocks``) on positions q_start:+Q, or on
        q_start + idx of a ``window``; final-norm hidden and the keys/values it returns."""
        c = self.config
        b, q = x_bqd.shape[:2]
        pos = q_start + (jnp.broadcast_to(jnp.arange(q), (b, q)) if idx is None else idx)
        rope = rope_tables(pos, c.head_dim, c.rope_theta)
        block = CachedBlock(c, self.dtype, self.param_dtype, self.lora, parent=None)

        def layer(x, xs):
            params, kv, win = xs
            return block.apply({"params": params}, x, rope, key_mask_bl, kv, q_start, use_lora,
                               win, idx)

        x, (k, v) = jax.lax.scan(layer, x_bqd, (self.variables["params"]["blocks"], cache, window))
        return self.ln_f(x), KVCache(k, v)


def head_weight(params: Mapping[str, Any], config: LLaDAConfig) -> Array:
    """The output head as [D, V] (for chunked log-softmax over the vocabulary)."""
    if config.weight_tying:
        return params["wte"]["embedding"].T
    return params["ff_out"]["kernel"]


PRESETS: dict[str, dict[str, Any]] = {
    # LLaDA-8B-Base/Instruct (config.json of GSAI-ML/LLaDA-8B-Instruct).
    "llada-8b": dict(),
    # ../shared/BENCH.md: the standard benchmark model.
    "bench-tiny": dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden_size=768,
                       vocab_size=8192, embedding_size=8192, mask_token_id=8191,
                       eos_token_id=8190, pad_token_id=8190, rope_theta=500000.0,
                       max_sequence_length=1024),
    # Width-32 model for unit tests (GQA on).
    "test-tiny": dict(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=64,
                      vocab_size=128, embedding_size=128, mask_token_id=127, eos_token_id=126,
                      pad_token_id=126, max_sequence_length=256, rope_theta=10000.0),
}


def preset(name: str, **overrides: Any) -> LLaDAConfig:
    """A named architecture (``llada-8b``, ``bench-tiny``, ``test-tiny``) with overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose from {sorted(PRESETS)}")
    return LLaDAConfig(**{**PRESETS[name], **overrides})


def init_params(model: LLaDA, rng: Array, mesh=None, rules=shd.DEFAULT_RULES) -> dict[str, Any]:
    """Random params (plain pytree), born sharded over ``mesh`` by the logical rules."""
    ids = jnp.zeros((1, 8), jnp.int32)
    params, _ = shd.init_sharded(lambda k: model.init(k, ids)["params"], mesh, rng, rules=rules)
    return params


class KVCache(NamedTuple):
    """Every layer's keys (after RoPE) and values: [n_layers, B, L, K, H] each."""

    k: Array
    v: Array


def attend_two_part(q_bqnh: Array, k1_blkh: Array, v1_blkh: Array, mask1_bl: Array,
                    k2_bskh: Array, v2_bskh: Array, mask2_bs: Array | None,
                    scale: float) -> Array:
    """Softmax attention over two key sets at once, as if concatenated: [B, Q, N, H].

    Lets cached steps attend to a big cache (its stale part masked out by ``mask1``) and to
    fresh keys/values without writing them into a copy of the cache. Scores and the
    softmax in float32; grouped-query heads (N a multiple of K).
    """
    b, q, n, h = q_bqnh.shape
    k = k1_blkh.shape[2]
    qg = q_bqnh.reshape(b, q, k, n // k, h)
    f32 = jnp.float32
    s1 = jnp.einsum("bqkgh,blkh->bkgql", qg, k1_blkh, preferred_element_type=f32) * scale
    s2 = jnp.einsum("bqkgh,bskh->bkgqs", qg, k2_bskh, preferred_element_type=f32) * scale
    s1 = jnp.where(mask1_bl[:, None, None, None, :], s1, -jnp.inf)
    if mask2_bs is not None:
        s2 = jnp.where(mask2_bs[:, None, None, None, :], s2, -jnp.inf)
    top = jnp.maximum(jnp.max(s1, axis=-1), jnp.max(s2, axis=-1))[..., None]
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # a row with every key masked: output 0
    p1, p2 = jnp.exp(s1 - top), jnp.exp(s2 - top)
    den = jnp.maximum(jnp.sum(p1, axis=-1) + jnp.sum(p2, axis=-1), 1e-30)  # [b, k, g, q]
    out = (jnp.einsum("bkgql,blkh->bkgqh", p1.astype(v1_blkh.dtype), v1_blkh,
                      preferred_element_type=f32)
           + jnp.einsum("bkgqs,bskh->bkgqh", p2.astype(v2_bskh.dtype), v2_bskh,
                        preferred_element_type=f32)) / den[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, q, n, h).astype(q_bqnh.dtype)


class CachedBlock(Block):
    """``Block`` (same parameters) on a slice of positions, with keys/values given elsewhere.

    Without a cache the slice is the whole sequence: a plain forward that also returns its
    keys/values (x [B, L, D], (k, v) [B, L, K, H]). With ``kv`` (the cache, [B, L, K, H]
    each) the slice q_start:+Q attends to its fresh keys/values and to the cache outside
    it; returns them too. With a ``window`` (keys/values [B, W, K, H] of positions
    q_start:+W) the rows are the window positions ``idx`` [B, Q]: their fresh keys/values
    replace the window's there, the rows attend to the window and to the cache outside
    it, and the updated window is returned.
    """

    @nn.compact
    def __call__(self, x_bqd: Array, rope: tuple[Array, Array], key_mask_bl: Array | None,
                 kv: tuple[Array, Array] | None, q_start: Array | int, use_lora: bool,
                 window: tuple[Array, Array] | None = None,
                 idx: Array | None = None) -> tuple[Array, tuple[Array, Array]]:
        c = self.config
        n, k, h = c.n_heads, c.n_kv_heads, c.head_dim
        kw = dict(use_lora=use_lora, deterministic=True)
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype, self.param_dtype)
        x_bqd = nn.with_logical_constraint(x_bqd, (shd.BATCH, shd.LENGTH, shd.ACT_EMBED))
        b, q_len = x_bqd.shape[:2]

        xn = norm(name="attn_norm")(x_bqd)
        q = apply_rope(self._proj("q_proj", n * h, (shd.EMBED, shd.Q_HEADS))(xn, **kw)
                       .reshape(b, q_len, n, h), *rope)
        kk = apply_rope(self._proj("k_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw)
                        .reshape(b, q_len, k, h), *rope)
        v = self._proj("v_proj", k * h, (shd.EMBED, shd.KV_HEADS))(xn, **kw).reshape(b, q_len, k, h)
        if kv is None:
            mask = None if key_mask_bl is None else key_mask_bl[:, None, None, :].astype(bool)
            att = jax.nn.dot_product_attention(q, kk, v, mask=mask, scale=h ** -0.5)
            own = (kk, v)
        else:
            k_cache, v_cache = kv
            own = (kk, v)
            if window is not None:
                rows = jnp.arange(b)[:, None]
                own = tuple(w.at[rows, idx].set(new.astype(w.dtype), mode="drop")
                            for w, new in zip(window, own))
            own_len, total = own[0].shape[1], k_cache.shape[1]
            pos = jnp.arange(total)[None, :]
            outside = (pos < q_start) | (pos >= q_start + own_len)
            mask1, mask2 = jnp.broadcast_to(outside, (b, total)), None
            if key_mask_bl is not None:
                mask1 = mask1 & key_mask_bl.astype(bool)
                mask2 = jax.lax.dynamic_slice_in_dim(key_mask_bl, q_start, own_len,
                                                     axis=1).astype(bool)
            att = attend_two_part(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), mask1,
                                  own[0].astype(q.dtype), own[1].astype(q.dtype), mask2,
                                  h ** -0.5)
        x_bqd = x_bqd + self._proj("attn_out", c.d_model, (shd.Q_HEADS, shd.EMBED))(
            att.reshape(b, q_len, n * h), **kw)
        return self._mlp(x_bqd, norm, kw), own
