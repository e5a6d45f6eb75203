"""LLaDA: the model, its configs, LoRA, the Hugging Face checkpoint layout and tokenizer."""

from d1jax.model.config import (PRESETS, LLaDAConfig, LoraConfig, UnsupportedConfigError,
                                preset)
from d1jax.model.kv_cache import KVCache
from d1jax.model.llada import LLaDA, head_weight, init_params

__all__ = ["PRESETS", "KVCache", "LLaDA", "LLaDAConfig", "LoraConfig", "UnsupportedConfigError",
           "head_weight", "init_params", "preset"]
