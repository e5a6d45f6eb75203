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
from d1jax.model.qwen import ROPE_TYPES, QwenConfig  # noqa: F401 (ROPE_TYPES: its home moved)

# Fields of a Hugging Face Dream config.json that the port reads.
_HF_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_scaling", "tie_word_embeddings", "mask_token_id", "pad_token_id",
    "bos_token_id", "eos_token_id", "initializer_range",
)

# Fields whose value must be the one given here: the port implements only that variant.
_REQUIRED_VALUES = {"hidden_act": "silu", "use_sliding_window": False, "attention_dropout": 0.0}


@dataclasses.dataclass(frozen=True)
class DreamConfig(QwenConfig):
    """Architecture of a Dream model (Qwen2 blocks with q/k/v biases, bidirectional)."""

    HF_FIELDS = _HF_FIELDS
    REQUIRED_VALUES = _REQUIRED_VALUES
    RELEASES = "Dream-v0-7B and DiffuCoder-7B"

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
        if self.hidden_size % self.num_attention_heads:  # head_dim is their quotient
            raise UnsupportedConfigError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}")
        self._check()
        self.rope_factor  # validates rope_scaling

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DreamConfig":
        """Builds the config from a Hugging Face ``config.json`` dict (model_type "Dream").

        Raises UnsupportedConfigError naming the field for any variant the port does not
        implement.
        """
        return cls(**cls.hf_kwargs(
            d, model_types=("Dream", "dream"),
            refusal="DreamConfig reads 'Dream' checkpoints (for LLaDA use "
                    "d1jax.model.llada.load_hf_checkpoint)"))

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dict that HKUNLP's ``configuration_dream.DreamConfig`` reads."""
        return self.hf_dict(architectures=["DreamModel"], model_type="Dream",
                            auto_map={"AutoConfig": "configuration_dream.DreamConfig",
                                      "AutoModel": "modeling_dream.DreamModel"})

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
