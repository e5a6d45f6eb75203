"""The model families behind one interface, and what serves them all.

- ``predictor``: the interface every family's module satisfies (``MaskPredictor``),
  ``init_params``; ``family``: the registry of family records (``Family``).
- One package per family: ``llada`` (LLaDA-8B), ``dream`` (Dream-v0-7B, DiffuCoder-7B),
  ``sdar`` (SDAR-*-Chat, TraDo-*-Instruct: block diffusion), ``llada2`` (LLaDA2.x:
  mixture-of-experts block diffusion), ``lladamoe`` (LLaDA-MoE-7B-A1B: mixture of experts,
  full attention).
- Shared: ``layers``, ``attention``, ``kv_cache``, ``lora``, ``quant``, ``hf_checkpoint``
  (Hugging Face safetensors in and out), ``hf_files`` (an export's companion files),
  ``tokenizer``, ``preflight`` (a checkpoint checked against its family before a run).

``preset`` and ``PRESETS`` are LLaDA's (``d1jax.model.llada``), the default family's;
each family package has its own (``d1jax.model.dream.preset``).
"""

from d1jax.model import family
from d1jax.model import dream, llada, llada2, lladamoe, sdar
from d1jax.model.dream import Dream, DreamConfig, dream_positions, shift_logits
from d1jax.model.hf_checkpoint import CheckpointError, UnsupportedConfigError
from d1jax.model.kv_cache import KVCache
from d1jax.model.llada import PRESETS, LLaDA, LLaDAConfig, head_weight, preset
from d1jax.model.lora import LoraConfig
from d1jax.model.predictor import (MaskPredictor, init_params, is_shifted, output_head,
                                   predict_logits)

# The built-in families, in the order messages list them. Another family registers itself
# the same way from its own module (``family.register``; docs/models.md, "Adding a family").
family.register(llada.FAMILY)
family.register(dream.FAMILY)
family.register(sdar.FAMILY)
family.register(llada2.FAMILY)
family.register(lladamoe.FAMILY)

__all__ = ["CheckpointError", "PRESETS", "Dream", "DreamConfig", "KVCache", "LLaDA",
           "LLaDAConfig", "LoraConfig", "MaskPredictor", "UnsupportedConfigError",
           "dream_positions", "head_weight", "init_params", "is_shifted", "output_head",
           "predict_logits", "preset", "shift_logits"]
