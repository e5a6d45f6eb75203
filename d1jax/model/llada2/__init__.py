"""The LLaDA2.x mixture-of-experts family (inclusionAI LLaDA2.0/2.1-mini and -flash:
model_type "llada2_moe", dFactory's merged-expert "llada2_moe_veomni"): the module, its config
and presets, the MoE layer with expert parallelism, and the two published checkpoint layouts
(the Hub's per-expert tensors, dFactory's merged experts) in and out.

Not yet registered as a ``Family`` (issue 58): the cache entry points of the sampler's
interface and the sampler itself are still to come.
"""

from d1jax.model.llada2.config import LLaDA2Config, PRESETS, preset
from d1jax.model.llada2.model import LLaDA2

__all__ = ["LLaDA2", "LLaDA2Config", "PRESETS", "preset"]
