"""A deterministic, resumable, host-sharded iterator over an in-memory list of examples.

Order: epoch ``e`` visits ``permutation(seed, e)``; global batch ``k`` of an epoch is the
slice ``[k*B, (k+1)*B)`` of it (the tail that does not fill a batch is dropped). Each
host takes its contiguous ``B / process_count`` share of every global batch. The whole
state is ``{"epoch", "batch"}``: saved with the checkpoint, it resumes mid-epoch exactly.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np


def check_examples(n_examples: int, batch: int, knob: str, source: str | None) -> None:
    """A ConfigError, before a model or tokenizer is built, for training data smaller than
    one batch (with that, every run has at least one optimizer step: spec.from_config
    refuses train.num_steps 0 without num_epochs)."""
    from d1jax.config import ConfigError
    if n_examples < batch:
        where = f"task.source={source!r}" if source else "the task's training data"
        raise ConfigError(f"{where}: {n_examples} examples, fewer than {knob}={batch}")


class ExampleIterator:
    """Yields lists of examples (this host's share of one global batch)."""

    def __init__(self, examples: Sequence[Any], global_batch: int, seed: int,
                 process_index: int | None = None, process_count: int | None = None):
        self.examples = list(examples)
        self.global_batch = global_batch
        self.seed = seed
        self.process_index = jax.process_index() if process_index is None else process_index
        self.process_count = jax.process_count() if process_count is None else process_count
        if global_batch % self.process_count:
            raise ValueError(f"global batch {global_batch} is not divisible by the "
                             f"{self.process_count} processes")
        if len(self.examples) < global_batch:
            raise ValueError(f"dataset has {len(self.examples)} examples, fewer than one "
                             f"global batch of {global_batch}")
        self.batches_per_epoch = len(self.examples) // global_batch
        self.epoch = 0
        self.batch = 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))

    def __iter__(self):
        return self

    def __next__(self) -> list[Any]:
        if self.batch >= self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
        order = self._order(self.epoch)
        local = self.global_batch // self.process_count
        start = self.batch * self.global_batch + self.process_index * local
        self.batch += 1
        return [self.examples[i] for i in order[start:start + local]]

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def set_state(self, state: dict[str, int]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
