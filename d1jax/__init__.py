"""d1jax: diffu-GRPO (d1) post-training of masked diffusion LLMs (LLaDA, Dream) in JAX/Flax.

    import d1jax
    model = d1jax.LLaDA(d1jax.preset("test-tiny"))
    params = d1jax.init_params(model, jax.random.key(0))
    d1jax.sampling.generate(...)          # subpackages load on first use

The model names are imported eagerly; the subpackages (``model``, ``sampling``,
``objectives``, ``train``, ``eval``, ``tasks``) only when first touched, so ``import d1jax``
stays cheap.
"""

import importlib

from d1jax.model import LLaDA, LLaDAConfig, LoraConfig, init_params, preset

SUBPACKAGES = ("model", "sampling", "objectives", "train", "eval", "tasks")

__all__ = ["LLaDA", "LLaDAConfig", "LoraConfig", "init_params", "preset", *SUBPACKAGES]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in SUBPACKAGES:
        return importlib.import_module(f"d1jax.{name}")
    raise AttributeError(f"module 'd1jax' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(SUBPACKAGES))
