"""Train loops composed from the jitted pieces: SFT, diffu-GRPO, and the CPU demo."""
