"""Training stages: the train state, the pure update steps (``pure_steps``), their one jit
layer (``jit_steps``), rollouts, and the SFT and diffu-GRPO loops built on them. What every
stage shares (spec, building, run context) is ``d1jax.run``; the objectives by name are
``d1jax.objectives.table``."""
