"""LLaDA's semi-autoregressive sampler and its fast (cached, parallel) variants."""

from d1jax.sampling.core import (FAST_DEFAULTS, REMASKING, GenerateOutput, ModelFns,
                                 SamplerConfig, argmax_last, generate, gumbel_noise, head_sizes,
                                 history, llada_apply_fn, llada_fns, make_generate_fn,
                                 num_transfer_tokens, recompute_sizes, step_keys)

__all__ = ["FAST_DEFAULTS", "REMASKING", "GenerateOutput", "ModelFns", "SamplerConfig",
           "argmax_last", "generate", "gumbel_noise", "head_sizes", "history", "llada_apply_fn",
           "llada_fns", "make_generate_fn", "num_transfer_tokens", "recompute_sizes", "step_keys"]
