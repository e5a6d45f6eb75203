"""d1jax/run/interrupt.py from Python: a run called in-process (a notebook, a test) installs its
own SIGTERM and Ctrl-C handlers while it runs and gives back the ones it found when it ends,
finished or failed. The command-line cases (Ctrl-C and SIGTERM while loading, compiling or
training) run d1jax.main in tests/test_faults.py."""

import signal

import pytest

from d1jax import checkpoint
from d1jax.run import interrupt
from d1jax.train import engine, grpo
from tests import learnable


@pytest.fixture
def notebook_handlers():
    """Handlers of the caller's own (a notebook's), put back by the fixture whatever happens."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    mine = {s: (lambda signum, frame: None) for s in before}
    for s, h in mine.items():
        signal.signal(s, h)
    yield mine
    for s, h in before.items():
        signal.signal(s, h)
    interrupt.clear_requested()


def handlers() -> dict:
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}


def test_an_in_process_run_gives_back_the_handlers_it_found(tmp_path, notebook_handlers,
                                                             monkeypatch):
    during = []
    advance = engine.GRPOEngine.advance

    def spy(self, step):
        during.append(handlers())
        yield from advance(self, step)
    monkeypatch.setattr(engine.GRPOEngine, "advance", spy)
    grpo.run(learnable.config(**{"train.num_steps": 2}), str(tmp_path / "finished"))
    assert during and during[0][signal.SIGTERM] is not notebook_handlers[signal.SIGTERM]
    assert during[0][signal.SIGTERM].__name__ == "_python_handler"  # the run's, while it ran
    assert handlers() == notebook_handlers

    # A run that fails before its loop starts (no checkpoint restores) gives them back too.
    def unreadable(self, abstract):
        raise checkpoint.RestoreError("no checkpoint restores: step 2: unreadable")
    monkeypatch.setattr(checkpoint.Checkpointer, "restore", unreadable)
    with pytest.raises(checkpoint.RestoreError):
        grpo.run(learnable.config(**{"train.num_steps": 2}), str(tmp_path / "failed"))
    assert handlers() == notebook_handlers
    assert interrupt._ACTIVE is None  # no stale stop request left for the next run


def test_handlers_set_outside_python_come_back_as_the_default():
    # signal.getsignal says None for a handler a C library set; it cannot be put back, and
    # signal.signal(s, None) would raise in the middle of the run's cleanup.
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop = interrupt.StopRequest()
    stop._previous = {signal.SIGTERM: None}
    try:
        stop.uninstall()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
