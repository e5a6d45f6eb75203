"""Programs built on d1jax's public API (not part of the package; run from the repo root)."""
