"""Forward pass of a random tiny LLaDA (an install check).

  python -m examples.demo --config=configs/forward_demo.py --workdir=/tmp/d1jax_forward

examples/demo/forward.py runs it (from the repository root).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.stage = "forward"  # Which stage python -m examples.demo runs.
    c.workdir = "/tmp/d1jax_forward"  # Default run directory (--workdir overrides).
    c.seed = 0  # Parameter init seed.
    c.model = ml_collections.ConfigDict()
    c.model.preset = "bench-tiny"  # Architecture preset from d1jax.model.PRESETS.
    c.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 takes the remaining devices.
    c.batch_size = 8  # Sequences per forward pass.
    c.seq_len = 192  # Tokens per sequence.
    c.lock()
    return c
