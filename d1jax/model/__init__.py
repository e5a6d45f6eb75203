"""LLaDA: the model, its configs, LoRA, the Hugging Face checkpoint layout and tokenizer."""

from d1jax.model.llada import (PRESETS, KVCache, LLaDA, LLaDAConfig, LoraConfig,
                               UnsupportedConfigError, head_weight, init_params, preset)

__all__ = ["PRESETS", "KVCache", "LLaDA", "LLaDAConfig", "LoraConfig", "UnsupportedConfigError",
           "head_weight", "init_params", "preset"]
