"""LLaDA and Dream: the models, their configs, LoRA, the HF checkpoint layout, the tokenizer."""

from d1jax.model.config import (PRESETS, LLaDAConfig, LoraConfig, UnsupportedConfigError,
                                preset)
from d1jax.model.dream import Dream, dream_positions, shift_logits
from d1jax.model.dream_config import DREAM_PRESETS, DreamConfig, dream_preset
from d1jax.model.kv_cache import KVCache
from d1jax.model.llada import LLaDA, head_weight, init_params
from d1jax.model.predictor import is_shifted, output_head, predict_logits

__all__ = ["DREAM_PRESETS", "PRESETS", "Dream", "DreamConfig", "KVCache", "LLaDA", "LLaDAConfig",
           "LoraConfig", "UnsupportedConfigError", "dream_positions", "dream_preset",
           "head_weight", "init_params", "is_shifted", "output_head", "predict_logits",
           "preset", "shift_logits"]
