"""d1jax: diffu-GRPO (d1) post-training of masked diffusion LLMs (LLaDA) in JAX/Flax."""

from d1jax.model import LLaDA, LLaDAConfig, LoraConfig, init_params, preset

__all__ = ["LLaDA", "LLaDAConfig", "LoraConfig", "init_params", "preset"]
__version__ = "0.1.0"
