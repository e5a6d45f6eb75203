"""The CPU demo: d1's recipe (base -> SFT -> diffu-GRPO) in miniature on 4x4 Sudoku.

A client of d1jax's public API: importing it registers the demo's task (``task.NAME``).
"""

from examples.demo import task  # noqa: F401  (registers the demo's task with d1jax.tasks)
