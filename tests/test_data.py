"""The example iterator: deterministic order, exact mid-epoch resume, host sharding."""

import pytest

from d1jax.train.data import ExampleIterator


def take(it, n):
    return [next(it) for _ in range(n)]


def test_same_seed_same_order_and_epochs_cover_all():
    a = take(ExampleIterator(range(10), 4, seed=3), 4)
    b = take(ExampleIterator(range(10), 4, seed=3), 4)
    assert a == b
    epoch0 = sorted(a[0] + a[1])
    assert len(set(epoch0)) == 8  # two full batches, tail of 2 dropped
    assert take(ExampleIterator(range(10), 4, seed=4), 2) != a[:2]


def test_resume_mid_epoch_is_exact():
    it = ExampleIterator(range(13), 3, seed=0)
    take(it, 5)  # crosses the epoch boundary (4 batches per epoch)
    state = it.get_state()
    rest = take(it, 6)
    it2 = ExampleIterator(range(13), 3, seed=0)
    it2.set_state(state)
    assert take(it2, 6) == rest


def test_hosts_split_each_global_batch():
    full = take(ExampleIterator(range(16), 8, seed=1, process_index=0, process_count=1), 3)
    h0 = take(ExampleIterator(range(16), 8, seed=1, process_index=0, process_count=2), 3)
    h1 = take(ExampleIterator(range(16), 8, seed=1, process_index=1, process_count=2), 3)
    assert [a + b for a, b in zip(h0, h1)] == full


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="not divisible"):
        ExampleIterator(range(16), 7, seed=0, process_index=0, process_count=2)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        ExampleIterator(range(3), 4, seed=0)
