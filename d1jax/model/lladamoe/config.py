"""LLaDA-MoE's architecture config (inclusionAI/LLaDA-MoE-7B-A1B-Base and -Instruct), with the
published ``config.json`` field names.

The fields and their meaning follow their ``configuration_lladamoe.py`` (``LLaDAConfig``,
``model_type`` "llada": the published config.json says "llada", the type LLaDA-8B's also
carries; ZHZisZZ/dllm tells its users to rename it "lladamoe", which d1jax reads as well) and
what their ``modeling_lladamoe.py`` reads from them. Fields their modeling file never reads
are kept for the round trip but change nothing: ``norm_topk_prob`` (their MoE block sets
``self.norm_topk_prob = False`` whatever the config says), ``moe_router_score_function``
(always softmax), ``routed_scaling_factor``, ``router_num_group``, ``router_topk_group``,
``router_aux_loss_coef``. Refused (``UnsupportedConfigError`` names the field): activations
other than SiLU, RoPE scalings, attention dropout, a ``moe_layer_freq`` whose dense layers do
not all come first (d1jax stacks the dense layers, then the MoE ones).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from d1jax.model.hf_checkpoint import HFShapeNames, UnsupportedConfigError

# The published type ("llada", as LLaDA-8B's) and dllm's rename of it.
MODEL_TYPES = ("llada", "lladamoe")

# Fields of their config.json that the port reads and writes back.
_HF_FIELDS = (
    "vocab_size", "hidden_size", "dense_intermediate_size", "expert_intermediate_size",
    "shared_expert_intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "initializer_range", "rms_norm_eps",
    "pad_token_id", "eos_token_id", "mask_token_id", "tie_word_embeddings", "rope_theta",
    "partial_rotary_factor", "attention_bias", "clip_qkv", "num_experts_per_tok",
    "num_experts", "router_aux_loss_coef", "norm_topk_prob", "qk_layernorm",
    "moe_layer_freq", "moe_router_enable_expert_bias", "moe_router_score_function",
    "routed_scaling_factor", "router_num_group", "router_topk_group",
)
_REQUIRED_VALUES = {"hidden_act": "silu", "rope_scaling": None, "attention_dropout": 0.0}
_REQUIRED_HF = ("vocab_size", "hidden_size", "expert_intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_experts", "num_experts_per_tok", "moe_layer_freq")


@dataclasses.dataclass(frozen=True)
class LLaDAMoEConfig(HFShapeNames):
    """Architecture of a LLaDA-MoE model (defaults: LLaDA-MoE-7B-A1B's shape)."""

    vocab_size: int = 157184  # V (LLaDA2's tokenizer family).
    hidden_size: int = 2048  # D; head_dim is D / num_attention_heads (their attention).
    dense_intermediate_size: int = 8192  # F of a dense layer's SwiGLU (moe_layer_freq 0).
    expert_intermediate_size: int = 1024  # I, each routed expert's SwiGLU width.
    shared_expert_intermediate_size: int | None = None  # A MoE layer's shared SwiGLU; None: none.
    num_hidden_layers: int = 16
    num_attention_heads: int = 16  # N.
    num_key_value_heads: int = 16  # K (GQA when < N).
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5  # Every RMSNorm, the per-head q/k norms included.
    pad_token_id: int = 156892
    eos_token_id: int | None = 156892  # <|endoftext|> (dInfer's eos_id)
    mask_token_id: int = 156895  # dInfer's mask_id for LLaDA-MoE.
    tie_word_embeddings: bool = False
    rope_theta: float = 50000.0
    partial_rotary_factor: float = 1.0  # RoPE turns the first head_dim * this features.
    attention_bias: bool = False  # Biases on q/k/v/o_proj.
    clip_qkv: float | None = None  # Clamp q, k, v to [-c, c] after the q/k norms.
    num_experts_per_tok: int = 8  # k.
    num_experts: int = 64  # E.
    router_aux_loss_coef: float = 0.01  # Not read by the forward.
    norm_topk_prob: bool | None = False  # Not read: their block never renormalises.
    qk_layernorm: bool = True  # Per-head RMSNorms (weight [head_dim]) on q and k.
    moe_layer_freq: tuple[int, ...] = (1,) * 16  # Per layer: 0 dense SwiGLU, 1 MoE.
    moe_router_enable_expert_bias: bool | None = False  # An expert_bias buffer added to the
    # softmax probabilities before top-k; the chosen biased values weigh the experts.
    moe_router_score_function: str | None = None  # Not read: always softmax.
    routed_scaling_factor: float = 1.0  # Not read.
    router_num_group: int | None = None  # Not read.
    router_topk_group: int | None = None  # Not read.

    def __post_init__(self):
        object.__setattr__(self, "moe_layer_freq", tuple(int(f) for f in self.moe_layer_freq))
        d, n, k = self.hidden_size, self.num_attention_heads, self.num_key_value_heads
        if d % n or n % k:
            raise UnsupportedConfigError(
                f"hidden_size={d} must split into num_attention_heads={n} heads, a multiple "
                f"of num_key_value_heads={k}")
        if len(self.moe_layer_freq) != self.num_hidden_layers or \
                set(self.moe_layer_freq) - {0, 1}:
            raise UnsupportedConfigError(
                f"moe_layer_freq={list(self.moe_layer_freq)} must hold one 0 (dense) or 1 (MoE) "
                f"per layer (num_hidden_layers={self.num_hidden_layers})")
        if list(self.moe_layer_freq) != sorted(self.moe_layer_freq):
            raise UnsupportedConfigError(
                f"moe_layer_freq={list(self.moe_layer_freq)}: d1jax runs the dense layers "
                f"first, then the MoE layers (a dense layer after a MoE one is not supported)")
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise UnsupportedConfigError(f"num_experts_per_tok={self.num_experts_per_tok} "
                                         f"must be 1..num_experts={self.num_experts}")
        if self.rotary_dim % 2 or self.rotary_dim < 2 or self.rotary_dim > self.head_dim:
            raise UnsupportedConfigError(
                f"head_dim={self.head_dim} * partial_rotary_factor={self.partial_rotary_factor} "
                f"must give an even rotary width in 2..head_dim")

    # ------------------------------------------------------------------ derived shapes

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """Features of each head RoPE turns (transformers' default RoPE:
        ``int(head_dim * partial_rotary_factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_dense(self) -> int:
        return self.moe_layer_freq.count(0)

    @property
    def n_moe(self) -> int:
        return self.num_hidden_layers - self.n_dense

    def _attention_projections(self) -> dict[str, tuple[int, int]]:
        d, h = self.hidden_size, self.head_dim
        kv = self.num_key_value_heads * h
        return {"q_proj": (d, d), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (d, d)}

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """[in, out] of each block projection by its LoRA name: attention, and the SwiGLU of
        a dense layer (or, with no dense layer, of the shared expert; the routed experts'
        width otherwise, their stacked weights not being projections)."""
        d = self.hidden_size
        f = (self.dense_intermediate_size if self.n_dense else
             self.shared_expert_intermediate_size or self.expert_intermediate_size)
        return {**self._attention_projections(), "gate_proj": (d, f), "up_proj": (d, f),
                "down_proj": (f, d)}

    @property
    def layer_projections(self) -> tuple[dict[str, tuple[int, int]], ...]:
        """Per layer, [in, out] of each matmul a token runs through (the ACTIVE ones, for the
        planner's FLOPs): attention's four, then a dense layer's SwiGLU, or a MoE layer's
        router [D, E], its k routed experts as one SwiGLU of width k * I (``routed_*``) and
        the shared expert's SwiGLU if any (``gate_proj``/...)."""
        d, i, k = self.hidden_size, self.expert_intermediate_size, self.num_experts_per_tok
        f, s = self.dense_intermediate_size, self.shared_expert_intermediate_size
        dense = {**self._attention_projections(), "gate_proj": (d, f), "up_proj": (d, f),
                 "down_proj": (f, d)}
        shared = {"gate_proj": (d, s), "up_proj": (d, s), "down_proj": (s, d)} if s else {}
        moe = {**self._attention_projections(), **shared, "router": (d, self.num_experts),
               "routed_gate": (d, k * i), "routed_up": (d, k * i), "routed_down": (k * i, d)}
        return (dense,) * self.n_dense + (moe,) * self.n_moe

    def num_params(self) -> int:
        """Parameters in total (every expert counted)."""
        d, h, kv = self.hidden_size, self.head_dim, self.num_key_value_heads * self.head_dim
        attn = 2 * d * d + 2 * d * kv + 2 * d + (2 * h if self.qk_layernorm else 0)
        if self.attention_bias:
            attn += 2 * d + 2 * kv
        dense = 3 * d * self.dense_intermediate_size
        moe = d * self.num_experts + 3 * d * self.expert_intermediate_size * self.num_experts \
            + 3 * d * (self.shared_expert_intermediate_size or 0) \
            + (self.num_experts if self.moe_router_enable_expert_bias else 0)
        heads = 1 if self.tie_word_embeddings else 2
        return (self.num_hidden_layers * attn + self.n_dense * dense + self.n_moe * moe
                + heads * self.vocab_size * d + d)

    def active_params(self) -> int:
        """Parameters a token runs through (k of the E experts)."""
        unused = self.n_moe * 3 * self.hidden_size * self.expert_intermediate_size * (
            self.num_experts - self.num_experts_per_tok)
        return self.num_params() - unused - (0 if self.tie_word_embeddings else
                                             self.vocab_size * self.hidden_size)

    # ------------------------------------------------------------------ config.json

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "LLaDAMoEConfig":
        """The config of a ``config.json`` dict; UnsupportedConfigError naming the field for a
        variant the port does not implement."""
        if d.get("model_type", MODEL_TYPES[0]) not in MODEL_TYPES:
            raise UnsupportedConfigError(
                f"config.json has model_type={d['model_type']!r}; LLaDAMoEConfig reads "
                f"{' / '.join(MODEL_TYPES)} checkpoints (LLaDA-MoE-7B-A1B)")
        for key, want in _REQUIRED_VALUES.items():
            if d.get(key, want) != want:
                raise UnsupportedConfigError(
                    f"config.json has {key}={d[key]!r}; d1jax supports only {key}={want!r}")
        missing = [k for k in _REQUIRED_HF if d.get(k) is None]
        if missing:
            raise UnsupportedConfigError(
                f"config.json lacks required fields {missing} (a LLaDA-MoE config.json names "
                f"num_experts and moe_layer_freq; LLaDA-8B's, also model_type 'llada', does not)")
        kw = {k: d[k] for k in _HF_FIELDS if k in d and d[k] is not None}
        if "shared_expert_intermediate_size" in d:  # None: no shared expert (their check)
            kw["shared_expert_intermediate_size"] = d["shared_expert_intermediate_size"]
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        kw.setdefault("num_key_value_heads", d["num_attention_heads"])
        for flag in ("qk_layernorm", "attention_bias", "moe_router_enable_expert_bias"):
            kw[flag] = bool(d.get(flag))  # their code tests truthiness (None: off)
        return cls(**kw)

    def to_hf_dict(self, model_type: str = MODEL_TYPES[0]) -> dict[str, Any]:
        """A ``config.json`` dict in their fields (``model_type`` "llada" as published, or
        dllm's "lladamoe")."""
        d = {k: getattr(self, k) for k in _HF_FIELDS}
        d["moe_layer_freq"] = list(self.moe_layer_freq)
        d.update(_REQUIRED_VALUES)
        d.update(architectures=["LLaDAMoEModelLM"], model_type=model_type, use_cache=False,
                 output_router_logits=False, torch_dtype="bfloat16")
        return d


PRESETS: dict[str, dict[str, Any]] = {
    # inclusionAI/LLaDA-MoE-7B-A1B-Base / -Instruct: 16 MoE layers of 64 experts, 8 a token.
    "lladamoe-7b-a1b": dict(),
    # Width-32 model for unit tests: one dense layer then two MoE layers of 8 experts, 2 a
    # token, a shared expert, the expert bias, GQA 4:2 (head_dim 8), RoPE on 4 of 8 features.
    "lladamoe-tiny": dict(vocab_size=128, hidden_size=32, dense_intermediate_size=64,
                          expert_intermediate_size=16, shared_expert_intermediate_size=24,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=256, rope_theta=10000.0,
                          partial_rotary_factor=0.5, num_experts=8, num_experts_per_tok=2,
                          moe_layer_freq=(0, 1, 1), moe_router_enable_expert_bias=True,
                          mask_token_id=127, pad_token_id=126, eos_token_id=126),
}


def preset(name: str, **overrides: Any) -> LLaDAMoEConfig:
    """A named LLaDA-MoE architecture (``lladamoe-7b-a1b``, ``lladamoe-tiny``); a depth
    override without ``moe_layer_freq`` keeps the preset's dense layers first (at most all)."""
    if name not in PRESETS:
        raise ValueError(f"unknown LLaDA-MoE preset {name!r}; choose from {sorted(PRESETS)}")
    kw = {**PRESETS[name], **overrides}
    n = kw.get("num_hidden_layers", LLaDAMoEConfig.num_hidden_layers)
    if "moe_layer_freq" not in overrides and len(kw.get("moe_layer_freq", ())) != n:
        dense = min(tuple(kw.get("moe_layer_freq", LLaDAMoEConfig.moe_layer_freq)).count(0), n)
        kw["moe_layer_freq"] = (0,) * dense + (1,) * (n - dense)
    return LLaDAMoEConfig(**kw)
