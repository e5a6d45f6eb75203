"""The Dream family's architecture config (Dream-v0-7B, DiffuCoder-7B), with HF field names.

``DreamConfig`` reads a Hugging Face ``config.json`` of ``model_type`` "Dream" (HKUNLP's
``configuration_dream.py``: a Qwen2 config plus ``mask_token_id``) and refuses the variants
this port does not implement (``UnsupportedConfigError`` names the field): sliding-window
attention, activations other than SiLU, attention dropout, RoPE scalings other than
none / "default" / "linear".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from d1jax.model.hf_checkpoint import UnsupportedConfigError

# Fields of a Hugging Face Dream config.json that the port reads.
_HF_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_scaling", "tie_word_embeddings", "mask_token_id", "pad_token_id",
    "bos_token_id", "eos_token_id", "initializer_range",
)

# Fields whose value must be the one given here: the port implements only that variant.
_REQUIRED_VALUES = {"hidden_act": "silu", "use_sliding_window": False, "attention_dropout": 0.0}

# rope_scaling types implemented: HF's "default" (none) and "linear" (positions / factor).
ROPE_TYPES = ("default", "linear")


@dataclasses.dataclass(frozen=True)
class DreamConfig:
    """Architecture of a Dream model (Qwen2 blocks with q/k/v biases, bidirectional)."""

    vocab_size: int = 152064  # Rows of embed_tokens / lm_head (the tokenizer's ids fit below).
    hidden_size: int = 3584  # D.
    intermediate_size: int = 18944  # F, the SwiGLU hidden width.
    num_hidden_layers: int = 28
    num_attention_heads: int = 28  # N query heads.
    num_key_value_heads: int | None = 4  # K kv heads (GQA); None: N.
    max_position_embeddings: int = 131072  # Longest sequence the sampler accepts.
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    # HF's rope_scaling dict as sorted (key, value) pairs (hashable: a static jit argument).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    tie_word_embeddings: bool = False  # True: lm_head is embed_tokens transposed.
    mask_token_id: int = 151666  # <|mask|>.
    pad_token_id: int = 151643  # <|endoftext|>.
    bos_token_id: int | None = 151643
    eos_token_id: int | None = 151643
    initializer_range: float = 0.02  # std of the random init (HF _init_weights).

    def __post_init__(self):
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if self.hidden_size % self.num_attention_heads:
            raise UnsupportedConfigError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise UnsupportedConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        self.rope_factor  # validates rope_scaling

    @property
    def max_sequence_length(self) -> int:
        """Longest sequence the sampler accepts (the interface name LLaDA's config uses)."""
        return self.max_position_embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # The shape names every family's config answers (the planner's FLOP counts read these).
    @property
    def width(self) -> int:
        return self.hidden_size

    @property
    def depth(self) -> int:
        return self.num_hidden_layers

    @property
    def query_heads(self) -> int:
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def output_vocab(self) -> int:
        """Columns of the output head (the logits' last axis)."""
        return self.vocab_size

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """[in, out] of each block projection, by its LoRA target name (q/k/v biases: left
        out, D + 2 K H additions a token)."""
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
                f"{ROPE_TYPES}); Dream-v0-7B and DiffuCoder-7B use rope_scaling=null")
        return float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DreamConfig":
        """Builds the config from a Hugging Face ``config.json`` dict (model_type "Dream").

        Raises UnsupportedConfigError naming the field for any variant the port does not
        implement.
        """
        if d.get("model_type", "Dream") not in ("Dream", "dream"):
            raise UnsupportedConfigError(
                f"config.json has model_type={d['model_type']!r}; DreamConfig reads 'Dream' "
                f"checkpoints (for LLaDA use d1jax.model.llada.load_hf_checkpoint)")
        for key, want in _REQUIRED_VALUES.items():
            if d.get(key, want) != want:
                raise UnsupportedConfigError(
                    f"config.json has {key}={d[key]!r}; d1jax supports only {key}={want!r}")
        kw = {k: d[k] for k in _HF_FIELDS if k in d}
        if isinstance(kw.get("eos_token_id"), list):  # HF allows several; the first ends text
            kw["eos_token_id"] = kw["eos_token_id"][0]
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads") if k not in kw]
        if missing:
            raise UnsupportedConfigError(f"config.json lacks required fields {missing}")
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dict that HKUNLP's ``configuration_dream.DreamConfig`` reads."""
        d = {k: getattr(self, k) for k in _HF_FIELDS}
        d["rope_scaling"] = None if self.rope_scaling is None else dict(self.rope_scaling)
        d.update(_REQUIRED_VALUES)
        d.update(architectures=["DreamModel"], model_type="Dream", sliding_window=None,
                 max_window_layers=self.num_hidden_layers, use_cache=False,
                 auto_map={"AutoConfig": "configuration_dream.DreamConfig",
                           "AutoModel": "modeling_dream.DreamModel"})
        return d

    def num_params(self) -> int:
        d, f, v, h = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        kv = self.num_key_value_heads * h
        attn = 2 * d * d + d + 2 * (d * kv + kv)  # q, o; q bias; k, v with biases
        per_layer = attn + 3 * d * f + 2 * d
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_hidden_layers * per_layer + v * d * heads + d


PRESETS: dict[str, dict[str, Any]] = {
    # Dream-org/Dream-v0-{Base,Instruct}-7B and apple/DiffuCoder-7B-* (Qwen2.5-7B shapes).
    "dream-7b": dict(),
    # Width-32 model for unit tests (GQA 4:2, q/k/v biases).
    "dream-test-tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=256, rope_theta=10000.0, mask_token_id=127,
                            pad_token_id=126, bos_token_id=126, eos_token_id=126),
}


def preset(name: str, **overrides: Any) -> DreamConfig:
    """A named Dream architecture (``dream-7b``, ``dream-test-tiny``) with overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown Dream preset {name!r}; choose from {sorted(PRESETS)}")
    return DreamConfig(**{**PRESETS[name], **overrides})
