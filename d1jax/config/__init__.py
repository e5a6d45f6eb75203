"""Run configs: the ml_collections defaults that configs/*.py build on, and their checks."""

from d1jax.config.defaults import (ConfigError, base, check_batch, check_sampler, check_workdir,
                                   demo, eval_config, grpo, sft, validate)

__all__ = ["ConfigError", "base", "check_batch", "check_sampler", "check_workdir", "demo",
           "eval_config", "grpo", "sft", "validate"]
