"""Training: the run spec, train state, typed batches, pure update steps, their one jit
layer (steps), and the SFT and diffu-GRPO loops built on them."""
