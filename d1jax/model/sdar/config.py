"""The block-diffusion family's architecture config (SDAR-*-Chat, TraDo-*-Instruct), with
Hugging Face field names.

``SDARConfig`` reads a ``config.json`` of ``model_type`` "sdar" (JetAstra/SDAR
``training/model/SDAR-{4B,8B}-Chat/config.json``; the class is Gen-Verse/dLLM-RL
``models/sdar/configuration_sdar.py``: a Qwen3 config) plus the two fields the released
configs add, ``block_size`` and ``mask_token_id``. It refuses the variants this port does
not implement (``UnsupportedConfigError`` names the field): sliding-window attention,
activations other than SiLU, attention dropout, attention biases (false in every
release), RoPE scalings other than none / "default" /
"linear".

``block_align`` is d1jax's own (not written to config.json): where the block grid of the
block-causal mask starts (``d1jax.model.sdar.model.block_ids``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from d1jax.model.hf_checkpoint import UnsupportedConfigError
from d1jax.model.qwen import ROPE_TYPES, QwenConfig  # noqa: F401 (ROPE_TYPES: its home moved)

# Fields of an SDAR config.json that the port reads.
_HF_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
    "block_size", "mask_token_id", "pad_token_id", "bos_token_id", "eos_token_id",
    "initializer_range",
)

# Fields whose value must be the one given here: the port implements only that variant.
_REQUIRED_VALUES = {"hidden_act": "silu", "use_sliding_window": False, "attention_dropout": 0.0,
                    "attention_bias": False}

# "end": blocks counted back from the row's end (dLLM-RL's training mask); "start": from each
# row's first real token (JetAstra generate.py's block_diffusion_generate).
BLOCK_ALIGNS = ("end", "start")


@dataclasses.dataclass(frozen=True)
class SDARConfig(QwenConfig):
    """Architecture of an SDAR/TraDo model (Qwen3 blocks, block-causal attention)."""

    HF_FIELDS = _HF_FIELDS
    REQUIRED_VALUES = _REQUIRED_VALUES
    RELEASES = "the SDAR and TraDo releases"

    vocab_size: int = 151936  # Rows of embed_tokens / lm_head.
    hidden_size: int = 4096  # D.
    intermediate_size: int = 12288  # F, the SwiGLU hidden width.
    num_hidden_layers: int = 36
    num_attention_heads: int = 32  # N query heads.
    num_key_value_heads: int | None = 8  # K kv heads (GQA); None: N.
    head_dim: int = 128  # H; Qwen3 sets it apart from hidden_size / N.
    max_position_embeddings: int = 32768  # Longest sequence the sampler accepts.
    rms_norm_eps: float = 1e-6  # Every RMSNorm, the per-head q/k norms included.
    rope_theta: float = 1000000.0
    # HF's rope_scaling dict as sorted (key, value) pairs (hashable: a static jit argument).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    tie_word_embeddings: bool = False  # True: lm_head is embed_tokens transposed.
    block_size: int = 4  # Tokens of a diffusion block: bidirectional inside, causal across.
    mask_token_id: int = 151669  # <MASK>.
    pad_token_id: int = 151643  # <|endoftext|> (generation_config.json).
    bos_token_id: int | None = 151643
    eos_token_id: int | None = 151643
    initializer_range: float = 0.02  # std of the random init (HF _init_weights).
    block_align: str = "end"  # d1jax's: where the block grid starts (BLOCK_ALIGNS).

    def __post_init__(self):
        self._check()
        if self.block_size < 1:
            raise UnsupportedConfigError(f"block_size={self.block_size} must be >= 1")
        if self.block_align not in BLOCK_ALIGNS:
            raise ValueError(f"block_align={self.block_align!r}: one of {BLOCK_ALIGNS}")
        self.rope_factor  # validates rope_scaling

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "SDARConfig":
        """Builds the config from a ``config.json`` dict (model_type "sdar"); raises
        UnsupportedConfigError naming the field for a variant the port does not implement."""
        kw = cls.hf_kwargs(d, model_types=("sdar",), none_ok=True,
                           refusal="SDARConfig reads 'sdar' checkpoints (SDAR-*-Chat, "
                                   "TraDo-*-Instruct)")
        if kw.get("head_dim") is None:
            kw["head_dim"] = kw["hidden_size"] // kw["num_attention_heads"]  # HF's fallback
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dict with the released files' fields (SDAR-4B-Chat's order of
        facts; ``block_align`` is d1jax's and left out)."""
        d = self.hf_dict(architectures=["SDARForCausalLM"], model_type="sdar",
                         auto_map={"AutoConfig": "configuration_sdar.SDARConfig",
                                   "AutoModel": "modeling_sdar.SDARModel",
                                   "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"})
        # Read by the published modeling_sdar.py's forward (an export ships it). The releases
        # say true: no logits in train mode, their fused loss patched in; false: logits always.
        d["fuse_cross_entropy"] = False
        return d

    def num_params(self) -> int:
        d, f, v, h = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        q, kv = self.num_attention_heads * h, self.num_key_value_heads * h
        attn = 2 * d * q + 2 * d * kv + 2 * h  # q, o, k, v; q_norm, k_norm
        per_layer = attn + 3 * d * f + 2 * d
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_hidden_layers * per_layer + v * d * heads + d


PRESETS: dict[str, dict[str, Any]] = {
    # JetAstra/SDAR training/model/SDAR-8B-Chat/config.json (TraDo-8B-Instruct: its RL
    # fine-tune, the same shapes).
    "sdar-8b": dict(),
    # training/model/SDAR-4B-Chat/config.json (TraDo-4B-Instruct: the same shapes).
    "sdar-4b": dict(hidden_size=2560, intermediate_size=9728),
    # Width-32 model for unit tests (GQA 4:2, head_dim 16 apart from width / heads, untied).
    "sdar-tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
                      block_size=4, mask_token_id=127, pad_token_id=126, bos_token_id=126,
                      eos_token_id=126),
}


def preset(name: str, **overrides: Any) -> SDARConfig:
    """A named SDAR architecture (``sdar-8b``, ``sdar-4b``, ``sdar-tiny``) with overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown SDAR preset {name!r}; choose from {sorted(PRESETS)}")
    return SDARConfig(**{**PRESETS[name], **overrides})
