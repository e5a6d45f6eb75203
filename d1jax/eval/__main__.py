"""``python -m d1jax.eval --config=configs/eval.py:TASK``: the same as ``d1jax.main``."""

from d1jax.eval.evaluate import main

main()
