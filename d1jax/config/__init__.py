"""Run configs: the ml_collections defaults that configs/*.py build on, and the checks
that need no model (``d1jax.run.spec`` translates and validates the rest)."""

from d1jax.config.defaults import (ConfigError, base, check_batch, check_inputs, check_workdir,
                                   eval_config, grpo, sampler_fields, sft, step_rows)

__all__ = ["ConfigError", "base", "check_batch", "check_inputs", "check_workdir", "eval_config",
           "grpo", "sampler_fields", "sft", "step_rows"]
