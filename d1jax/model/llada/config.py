"""LLaDA's architecture config and the named presets.

``LLaDAConfig`` uses the Hugging Face ``config.json`` field names and refuses the variants
this port does not implement (``UnsupportedConfigError`` names the field).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from d1jax.model.hf_checkpoint import UnsupportedConfigError

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

    # The shape names every family's config answers (the planner's FLOP counts read these).
    @property
    def width(self) -> int:
        return self.d_model

    @property
    def depth(self) -> int:
        return self.n_layers

    @property
    def query_heads(self) -> int:
        return self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads

    @property
    def output_vocab(self) -> int:
        """Columns of the output head (the logits' last axis)."""
        return self.embedding_size

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """[in, out] of each block projection, by its LoRA target name."""
        d, q, kv, f = self.d_model, self.n_heads * self.head_dim, \
            self.n_kv_heads * self.head_dim, self.mlp_hidden_size
        return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "attn_out": (q, d),
                "ff_proj": (d, f), "up_proj": (d, f), "ff_out": (f, d)}

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


PRESETS: dict[str, dict[str, Any]] = {
    # LLaDA-8B-Base/Instruct (config.json of GSAI-ML/LLaDA-8B-Instruct).
    "llada-8b": dict(),
    # The standard CPU benchmark model (docs/benchmarks.md, "The workload: bench-tiny").
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
