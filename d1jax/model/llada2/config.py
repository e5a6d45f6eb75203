"""The LLaDA2.x mixture-of-experts family's architecture config (LLaDA2.0-mini, LLaDA2.0-flash,
their LLaDA2.1 successors), with the published ``config.json`` field names.

``LLaDA2Config`` reads a ``config.json`` of ``model_type`` "llada2_moe" (the Hub releases,
inclusionAI/LLaDA2.0-{mini,flash}) or "llada2_moe_veomni" (inclusionAI/dFactory
``configs/model_configs/llada2_{mini,flash}/config.json``, the merged-expert layout dFactory
trains). The fields and their meaning follow dFactory's ``configuration_llada2_moe.py`` and
what ``modeling_llada2_moe.py`` reads from them. It refuses what the port does not implement
(``UnsupportedConfigError`` names the field): a score function other than sigmoid, sliding
windows, ``norm_head``, activations other than SiLU, RoPE scalings, attention dropout.

Two fields are d1jax's own (not written to config.json): ``block_size`` (the diffusion block of
the block-causal mask: their ``generate``'s ``block_length``, 32 by default, and dFactory's
``train.block_size``) and ``block_align`` (where the block grid starts; LLaDA2 counts blocks from
position 0: "start").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from d1jax.model.hf_checkpoint import HFShapeNames, UnsupportedConfigError

MODEL_TYPES = ("llada2_moe", "llada2_moe_veomni")  # Hub, dFactory (merged experts)

# Fields of a LLaDA2 config.json that the port reads and writes, in the released files' order.
_HF_FIELDS = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "first_k_dense_replace",
    "max_position_embeddings", "moe_intermediate_size", "num_experts_per_tok",
    "num_attention_heads", "num_experts", "num_key_value_heads", "rope_theta",
    "tie_word_embeddings", "use_bias", "rms_norm_eps", "head_dim", "num_shared_experts",
    "use_qkv_bias", "vocab_size", "routed_scaling_factor", "n_group", "topk_group",
    "initializer_range", "pad_token_id", "partial_rotary_factor", "mask_token_id",
    "eos_token_id",
)

# Fields whose one value the port implements (absent: that value).
_REQUIRED_VALUES = {"hidden_act": "silu", "use_sliding_window": False, "norm_head": False,
                    "score_function": "sigmoid", "attention_dropout": 0.0, "rope_scaling": None,
                    "router_dtype": "fp32", "moe_router_enable_expert_bias": True}
_REQUIRED_HF = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_experts", "moe_intermediate_size")

BLOCK_ALIGNS = ("start", "end")  # as d1jax.model.sdar.config


@dataclasses.dataclass(frozen=True)
class LLaDA2Config(HFShapeNames):
    """Architecture of a LLaDA2 MoE model (defaults: LLaDA2.0-mini's config.json)."""

    vocab_size: int = 157184  # V, rows of word_embeddings / lm_head.
    hidden_size: int = 2048  # D.
    intermediate_size: int = 5120  # F of the dense layers' SwiGLU.
    num_hidden_layers: int = 20
    first_k_dense_replace: int = 1  # The first this many layers are dense, the rest MoE.
    num_attention_heads: int = 16  # N query heads.
    num_key_value_heads: int = 4  # K kv heads (GQA).
    head_dim: int = 128  # H.
    partial_rotary_factor: float = 0.5  # RoPE turns the first H * this features of q and k.
    max_position_embeddings: int = 16384
    rope_theta: float = 600000.0
    rms_norm_eps: float = 1e-6  # Every RMSNorm, the per-head q/k norms included.
    use_qkv_bias: bool = False  # A bias on the fused query_key_value projection.
    use_bias: bool = False  # A bias on the attention output projection (dense).
    tie_word_embeddings: bool = False
    num_experts: int = 256  # E routed experts per MoE layer.
    num_experts_per_tok: int = 8  # k experts each token is sent to.
    moe_intermediate_size: int = 512  # I, each expert's SwiGLU width.
    num_shared_experts: int = 1  # Shared experts (one SwiGLU of width I * this); 0: none.
    n_group: int = 8  # Expert groups of the group-limited top-k.
    topk_group: int = 4  # Groups a token's experts may come from.
    routed_scaling_factor: float = 2.5  # Scales the renormalised routing weights.
    initializer_range: float = 0.02  # std of the random init.
    mask_token_id: int = 156895  # <|mask|> (their generate's mask_id).
    pad_token_id: int = 156892
    eos_token_id: int | None = 156892  # <|endoftext|> (their generate's eos_id)
    block_size: int = 32  # d1jax's: tokens of a diffusion block (their block_length).
    block_align: str = "start"  # d1jax's: blocks counted from position 0 (BLOCK_ALIGNS).

    def __post_init__(self):
        e, g = self.num_experts, self.n_group
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if e % g or not 1 <= self.topk_group <= g:
            raise UnsupportedConfigError(
                f"num_experts={e} must split into n_group={g} equal groups, of which "
                f"topk_group={self.topk_group} (1..n_group) are kept")
        if e // g < 2:  # a group's score is the sum of its two best experts
            raise UnsupportedConfigError(f"n_group={g} leaves fewer than 2 experts per group")
        if not 1 <= self.num_experts_per_tok <= self.topk_group * (e // g):
            raise UnsupportedConfigError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be 1..topk_group * "
                f"num_experts / n_group = {self.topk_group * (e // g)}")
        if self.rotary_dim % 2 or self.rotary_dim < 2:
            raise UnsupportedConfigError(
                f"head_dim={self.head_dim} * partial_rotary_factor={self.partial_rotary_factor} "
                f"must give an even rotary width")
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise UnsupportedConfigError(
                f"first_k_dense_replace={self.first_k_dense_replace} is outside 0.."
                f"num_hidden_layers={self.num_hidden_layers}")
        if self.block_align not in BLOCK_ALIGNS or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} (>= 1), block_align="
                             f"{self.block_align!r} (one of {BLOCK_ALIGNS})")

    # ------------------------------------------------------------------ derived shapes

    @property
    def rotary_dim(self) -> int:
        """Features of each head RoPE turns (their ``int(head_dim * partial_rotary_factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_dense(self) -> int:
        return self.first_k_dense_replace

    @property
    def n_moe(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    @property
    def shared_intermediate_size(self) -> int:
        return self.moe_intermediate_size * self.num_shared_experts

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """[in, out] of each block projection, by its LoRA target name (a dense layer's: the
        fused query_key_value, the attention output ``dense``, the SwiGLU's gate/up/down)."""
        d, f = self.hidden_size, self.intermediate_size
        return {**self._attention_projections(), "gate_proj": (d, f), "up_proj": (d, f),
                "down_proj": (f, d)}

    def _attention_projections(self) -> dict[str, tuple[int, int]]:
        d, h = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * h, self.num_key_value_heads * h
        return {"query_key_value": (d, q + 2 * kv), "dense": (q, d)}

    @property
    def layer_projections(self) -> tuple[dict[str, tuple[int, int]], ...]:
        """Per layer, [in, out] of each matmul a token runs through (the planner's analytic
        FLOPs, ``d1jax.plan.flops``: the ACTIVE ones). A dense layer: ``projections``. A MoE
        layer: the attention's two, the shared experts' SwiGLU (gate/up/down of width
        I * num_shared_experts, the LoRA names; none without shared experts), the router's
        [D, E] logits and the k = num_experts_per_tok routed experts a token is sent to, as
        one SwiGLU of width k * I (``routed_*``: stacked weights, never adapted). So a
        token's forward costs, per layer, 2 D (N + 2K) H + 2 N H D (attention projections)
        plus 6 D F (dense) or 6 D I s + 2 D E + 6 D I k (MoE, s shared experts); attention
        scores and the head are counted as for every family."""
        d, i, k = self.hidden_size, self.moe_intermediate_size, self.num_experts_per_tok
        s = self.shared_intermediate_size
        shared = ({"gate_proj": (d, s), "up_proj": (d, s), "down_proj": (s, d)} if s else {})
        moe = {**self._attention_projections(), **shared, "router": (d, self.num_experts),
               "routed_gate": (d, k * i), "routed_up": (d, k * i), "routed_down": (k * i, d)}
        return (self.projections,) * self.n_dense + (moe,) * self.n_moe

    # ------------------------------------------------------------------ config.json

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "LLaDA2Config":
        """The config of a ``config.json`` dict; UnsupportedConfigError naming the field for a
        variant the port does not implement."""
        if d.get("model_type", MODEL_TYPES[0]) not in MODEL_TYPES:
            raise UnsupportedConfigError(
                f"config.json has model_type={d['model_type']!r}; LLaDA2Config reads "
                f"{' / '.join(MODEL_TYPES)} checkpoints (LLaDA2.0/2.1-mini, -flash)")
        for key, want in _REQUIRED_VALUES.items():
            if d.get(key, want) != want:
                raise UnsupportedConfigError(
                    f"config.json has {key}={d[key]!r}; d1jax supports only {key}={want!r}")
        missing = [k for k in _REQUIRED_HF if d.get(k) is None]
        if missing:
            raise UnsupportedConfigError(f"config.json lacks required fields {missing}")
        kw = {k: d[k] for k in _HF_FIELDS if d.get(k) is not None}
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        kw.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        kw.setdefault("num_key_value_heads", d["num_attention_heads"])
        config = cls(**kw)
        if d.get("rotary_dim") not in (None, config.rotary_dim):
            raise UnsupportedConfigError(
                f"config.json has rotary_dim={d['rotary_dim']} but head_dim * "
                f"partial_rotary_factor = {config.rotary_dim} (their modeling file uses the "
                f"latter)")
        return config

    def to_hf_dict(self, model_type: str = MODEL_TYPES[0]) -> dict[str, Any]:
        """A ``config.json`` dict in the released files' fields (``block_size``/``block_align``
        are d1jax's and left out); ``model_type`` "llada2_moe_veomni" for dFactory's layout."""
        d = {k: getattr(self, k) for k in _HF_FIELDS}
        d.update(_REQUIRED_VALUES)
        d.update(architectures=["LLaDA2MoeModelLM"], model_type=model_type,
                 rotary_dim=self.rotary_dim, norm_topk_prob=True, use_qk_norm=True,
                 use_cache=False, output_router_logits=False, torch_dtype="bfloat16")
        return d

    def num_params(self) -> int:
        """Parameters in total (every expert counted)."""
        d, h = self.hidden_size, self.head_dim
        attn = d * (self.num_attention_heads + 2 * self.num_key_value_heads) * h \
            + self.num_attention_heads * h * d + 2 * h + 2 * d
        dense = 3 * d * self.intermediate_size
        moe = d * self.num_experts + self.num_experts \
            + 3 * d * self.moe_intermediate_size * self.num_experts \
            + 3 * d * self.shared_intermediate_size
        heads = 1 if self.tie_word_embeddings else 2
        return (self.num_hidden_layers * attn + self.n_dense * dense + self.n_moe * moe
                + heads * self.vocab_size * d + d)


PRESETS: dict[str, dict[str, Any]] = {
    # inclusionAI/dFactory configs/model_configs/llada2_mini/config.json (LLaDA2.0-mini, 16B).
    "llada2-mini": dict(),
    # configs/model_configs/llada2_flash/config.json (LLaDA2.0-flash, 100B).
    "llada2-flash": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=9216,
                         moe_intermediate_size=1024, num_attention_heads=32),
    # Width-32 model for unit tests: one dense layer then two MoE layers of 8 experts in 4
    # groups (2 kept), 2 experts a token, one shared expert; GQA 4:2, head_dim 16, rotary 8.
    "llada2-tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
                        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                        n_group=4, topk_group=2, block_size=4, mask_token_id=127,
                        pad_token_id=126, eos_token_id=126),
}


def preset(name: str, **overrides: Any) -> LLaDA2Config:
    """A named LLaDA2 architecture (``llada2-mini``, ``llada2-flash``, ``llada2-tiny``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown LLaDA2 preset {name!r}; choose from {sorted(PRESETS)}")
    return LLaDA2Config(**{**PRESETS[name], **overrides})
