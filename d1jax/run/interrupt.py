"""How a run ends on a signal (docs/training.md, "What a run guarantees").

* SIGTERM (a preemption notice, ``kill``) and the first Ctrl-C (SIGINT) ask the training loop
  to stop: it finishes the step it is in, saves, and exits with its rerun code (SIGTERM:
  ``train.stopped_exit_code``, 75; Ctrl-C: 130, as a shell reports an interrupted command).
* A second Ctrl-C exits at once, with one line naming the last checkpoint.
* Ctrl-C before the run's first step in this process finished (loading weights, compiling)
  exits at once as well, with the same line: there is nothing new to save. So does SIGTERM in
  a command (exit 143, its own line): a preemption's grace period is shorter than a compile.

Exiting at once is ``os._exit``: an asynchronous save in flight is abandoned, and Orbax
never commits a partial step, so the newest committed checkpoint is the one named.

In a command (``d1jax.main``, ``d1jax.eval``, ``d1jax.plan``; ``install_watcher``) Ctrl-C is
acted on by a watcher thread that ``signal.set_wakeup_fd`` wakes, so it acts while the main
thread is inside XLA (compiling, running a step), where Python's handler would wait for the
main thread to come back, and where a ``KeyboardInterrupt`` raised there has crashed the
interpreter at exit. Without the watcher (a notebook, a test calling ``run`` in-process) the
Python-level handler asks for the stop in the same way, as soon as the main thread runs Python
again, and a second Ctrl-C is Python's ``KeyboardInterrupt``; the handlers it replaced are
restored when the run ends, however it ends (``uninstall``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

CTRL_C_EXIT = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
REASONS = ("", "SIGTERM", "Ctrl-C")  # index = the code should_stop gathers across hosts

_ACTIVE: "StopRequest | None" = None  # the running loop's, between install and uninstall
_WATCHING = False  # install_watcher ran in this process
_CHECKPOINTS: Path | None = None  # where the command's run keeps checkpoints, if it does
_REQUESTED = ""  # "SIGTERM" or "Ctrl-C": a loop was asked to stop in this process (requested())


class StopRequest:
    """Set by SIGTERM or the first Ctrl-C during a training loop; the loop then saves and
    stops. ``checkpoints``: the run's checkpoint folder, named by the line of an exit at once."""

    def __init__(self, checkpoints: Path | None = None):
        self.checkpoints = checkpoints
        self.reason = ""  # "SIGTERM" or "Ctrl-C" once set
        self.progressed = False  # a step finished in this process (set by the loop)
        self._event = threading.Event()
        self._previous: dict[int, object] = {}

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def install(self) -> "StopRequest":
        global _ACTIVE
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._python_handler)
            if not _WATCHING:  # else the watcher acts on Ctrl-C and Python's handler is a no-op
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT,
                                                              self._python_handler)
        _ACTIVE = self
        return self

    def uninstall(self) -> None:
        global _ACTIVE
        for signum, previous in self._previous.items():
            # None: a handler set outside Python, which cannot be put back; the default is nearest
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
        if _ACTIVE is self:
            _ACTIVE = None

    def _python_handler(self, signum, frame) -> None:
        del frame
        if signum == signal.SIGTERM and _WATCHING and not self.progressed:
            return  # the watcher exits at once (143); "saving" would be a false line
        self.on_signal(signum)

    def on_signal(self, signum: int) -> None:
        global _REQUESTED
        if signum == signal.SIGTERM:
            if not self.is_set:
                self.reason = _REQUESTED = "SIGTERM"
                print("SIGTERM received: saving a checkpoint and stopping", flush=True)
                self._event.set()
            return
        if self.is_set or not self.progressed:
            if not _WATCHING:  # in-process (a notebook): Python's own interrupt
                raise KeyboardInterrupt
            exit_now(self.checkpoints, "again" if self.is_set else "")
        self.reason = _REQUESTED = "Ctrl-C"
        _say("Ctrl-C received: saving a checkpoint after this step and stopping "
             "(Ctrl-C again exits at once)")
        self._event.set()


def requested() -> str:
    """"SIGTERM" or "Ctrl-C" once a training loop of this process was asked to stop, else "".
    A command that runs several loops in turn (examples/demo) asks it between them: a signal
    that came during a loop's last step finished that run, and must not start the next."""
    return _REQUESTED


def clear_requested() -> None:
    """Forgets a stop asked earlier in this process: a new command in the same interpreter (a
    notebook rerunning the demo after Ctrl-C) starts afresh."""
    global _REQUESTED
    _REQUESTED = ""


def exit_now(checkpoints: Path | None, again: str = "", signame: str = "Ctrl-C") -> None:
    """Ends the process at once with one line naming the newest committed checkpoint (exit
    130 for Ctrl-C, 143 for SIGTERM: 128 + the signal, as a shell reports them)."""
    step = last_checkpoint(checkpoints)
    if checkpoints is None:
        tail = ""
    elif step is None:
        tail = f"; no checkpoint is saved in {checkpoints}"
    else:
        tail = (f"; the last checkpoint is step {step} ({checkpoints / str(step)}): rerun the "
                "same command to resume from it")
    _say(f"{signame}{' ' + again if again else ''}: exiting now{tail}")
    from d1jax.run import lock
    lock.release_all()  # os._exit skips atexit, which would release it
    os._exit(CTRL_C_EXIT if signame == "Ctrl-C" else 128 + signal.SIGTERM)


def last_checkpoint(checkpoints: Path | None) -> int | None:
    """The newest committed step in ``checkpoints`` (Orbax writes a step under a temporary
    name and renames it when complete, so a bare number is a committed one)."""
    from d1jax.checkpoint import list_steps
    steps = list_steps(checkpoints) if checkpoints is not None else []
    return steps[0] if steps else None


def expect_checkpoints(checkpoints: Path | None) -> None:
    """The folder an exit at once names before a training loop has started (``run_stage``)."""
    global _CHECKPOINTS
    _CHECKPOINTS = checkpoints


def install_watcher() -> None:
    """For a command's process (main thread, once): Ctrl-C acts at once through a watcher
    thread, whatever the main thread is doing. Outside a training loop Ctrl-C and SIGTERM exit
    the process at once with one line (and the workdir's lock released), and so does SIGTERM
    in a loop before its first step in this process finished."""
    global _WATCHING
    if _WATCHING or threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for signum in (signal.SIGINT, signal.SIGTERM):  # the watcher acts, not Python
        signal.signal(signum, _leave_to_watcher)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd,), name="d1jax-ctrl-c", daemon=True).start()
    _WATCHING = True


def _watch(read_fd: int) -> None:
    while True:
        data = os.read(read_fd, 64)
        if not data:
            return
        for signum in data:
            active = _ACTIVE
            if signum == signal.SIGINT and active is not None:
                active.on_signal(signal.SIGINT)
            elif signum == signal.SIGINT:
                exit_now(_CHECKPOINTS)
            elif signum == signal.SIGTERM and active is None:
                exit_now(_CHECKPOINTS, signame="SIGTERM")
            elif signum == signal.SIGTERM and not active.progressed:  # else the loop saves
                exit_now(active.checkpoints, signame="SIGTERM")


def _leave_to_watcher(signum, frame) -> None:
    del signum, frame


def _say(line: str) -> None:
    """A line on stderr that does not wait for stdout's lock (the main thread may hold it)."""
    try:
        os.write(sys.stderr.fileno(), f"\n{line}\n".encode())
    except (OSError, ValueError):
        pass
