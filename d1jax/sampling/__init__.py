"""LLaDA's semi-autoregressive sampler and its fast (cached, parallel) variants, for LLaDA
and Dream.

``generate`` (the API and the semantics), ``config`` (SamplerConfig), ``step`` (one
denoising step and the step loop), ``exact`` and ``cached`` (the two block loops),
``model_fns`` (the model as the sampler sees it); ``block_diffusion`` the block-diffusion
loop (SDAR, TraDo: ``loop="sdar"``) and ``dream`` Dream's own (``loop="dream"``).
"""

from d1jax.sampling.cached import head_sizes, recompute_sizes
from d1jax.sampling.config import (FAST_DEFAULTS, KV_CACHES, PARALLEL_RULES, RECOMPUTE,
                                   REMASKING, SamplerConfig, num_transfer_tokens)
from d1jax.sampling.generate import GenerateOutput, generate, history, make_generate_fn
from d1jax.sampling.model_fns import ApplyFn, ModelFns, model_apply_fn, model_fns
from d1jax.sampling.step import argmax_last, gumbel_noise, step_keys

__all__ = ["FAST_DEFAULTS", "KV_CACHES", "PARALLEL_RULES", "RECOMPUTE", "REMASKING",
           "ApplyFn", "GenerateOutput", "ModelFns", "SamplerConfig", "argmax_last", "generate",
           "gumbel_noise", "head_sizes", "history", "model_apply_fn", "model_fns",
           "make_generate_fn", "num_transfer_tokens", "recompute_sizes", "step_keys"]
