"""Joining a multi-process run, and leaving it promptly when a peer dies.

``initialize_from_env()`` joins the ``jax.distributed`` run that ``launch/`` (or the user)
describes with ``D1JAX_COORDINATOR``, ``D1JAX_NUM_PROCESSES`` and ``D1JAX_PROCESS_ID`` (or,
on a TPU pod slice, ``D1JAX_DISTRIBUTED=auto``), and starts a ``PeerWatchdog``. Without it a dead peer leaves the others blocked in a collective
until JAX's coordination service gives up (100 s by default) and aborts them with a
"Fatal Python error"; with it they exit within ``D1JAX_PEER_TIMEOUT_S`` (30 s by default)
with one line naming the lost process, and a rerun of all processes resumes from the last
checkpoint.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

LOST_EXIT_CODE = 1  # a failure: the scheduler reruns all processes, which resume
_KEY = "d1jax/peers"


class PeerWatchdog:
    """Heartbeats through the coordination service's key-value store, on a daemon thread.

    Every ``timeout_s / 6`` seconds each process writes a counter under its own key and reads
    the others'. A peer whose counter has not moved for ``timeout_s`` (and that has not said
    it finished) is lost; so is the coordinator (process 0) when the store itself cannot be
    reached for ``timeout_s``. Either ends this process at once with one line, whatever its
    main thread is blocked in.
    """

    def __init__(self, client, process_id: int, num_processes: int, timeout_s: float):
        self.client, self.pid, self.n, self.timeout_s = client, process_id, num_processes, timeout_s
        self._beat = 0
        self._seen: dict[int, tuple[str, float]] = {}  # peer -> (last value, when it changed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="d1jax-peer-watchdog",
                                        daemon=True)

    def start(self) -> "PeerWatchdog":
        self._started = time.monotonic()
        self._last_ok = self._started
        self._thread.start()
        return self

    def _run(self) -> None:
        period = max(self.timeout_s / 6, 0.2)
        while not self._stop.wait(period):
            self.check()

    def check(self) -> None:
        """One heartbeat and one look at the peers (the thread calls it periodically)."""
        now = time.monotonic()
        try:
            self._beat += 1
            self.client.key_value_set(f"{_KEY}/beat/{self.pid}", str(self._beat),
                                      allow_overwrite=True)
            beats = dict(self.client.key_value_dir_get(f"{_KEY}/beat/"))
            # A peer that failed is still watched: it leaves when its wait (_leave) ends.
            done = {k.rsplit("/", 1)[-1] for k, v in self.client.key_value_dir_get(f"{_KEY}/done/")
                    if v != "failed"}
            self._last_ok = now
        except Exception:  # noqa: BLE001 - the store is on process 0: unreachable = lost
            if self.pid != 0 and now - self._last_ok > self.timeout_s:
                self.lost(0, f"no answer for {self.timeout_s:g} s")
            return
        for peer in range(self.n):
            if peer == self.pid or str(peer) in done:
                continue
            value = next((v for k, v in beats.items() if k.rsplit("/", 1)[-1] == str(peer)), "")
            last, since = self._seen.get(peer, ("", self._started))
            if value != last:
                self._seen[peer] = (value, now)
            elif now - since > self.timeout_s:
                self.lost(peer, f"no heartbeat for {self.timeout_s:g} s")

    def lost(self, peer: int, why: str) -> None:
        role = " (the coordinator)" if peer == 0 else ""
        sys.stdout.flush()
        bar = "tqdm" in sys.modules and bool(getattr(sys.modules["tqdm"].tqdm, "_instances", ()))
        sys.stderr.write(("\n" if bar else "") + f"error: lost process {peer}{role} of {self.n} ({why}); rerun all "
                         "processes to resume from the last checkpoint\n")
        sys.stderr.flush()
        os._exit(LOST_EXIT_CODE)  # the main thread may be blocked inside a collective

    def finish(self, state: str = "finished", wait_s: float | None = None) -> bool:
        """Marks this process ``finished`` (or ``failed``) and waits, still watching, until
        every peer has finished or failed too (at most ``wait_s``); then stops, so JAX's
        shutdown sees no watchdog. True when every peer got there."""
        try:
            self.client.key_value_set(f"{_KEY}/done/{self.pid}", state, allow_overwrite=True)
        except Exception:  # noqa: BLE001 - the watchdog reports an unreachable coordinator
            pass
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while deadline is None or time.monotonic() < deadline:
            try:
                done = self.client.key_value_dir_get(f"{_KEY}/done/")
            except Exception:  # noqa: BLE001
                done = None
            if done is not None and len(done) >= self.n:
                break
            time.sleep(0.2)
        else:
            done = None
        self._stop.set()
        self._thread.join()
        return done is not None


_watchdog: PeerWatchdog | None = None


def initialize_from_env() -> None:
    """Joins a multi-process run, and starts the watchdog: with ``D1JAX_COORDINATOR`` (and
    ``D1JAX_NUM_PROCESSES``, ``D1JAX_PROCESS_ID``) as given, or with ``D1JAX_DISTRIBUTED=auto``
    as the platform describes it (a Cloud TPU pod slice: ``jax.distributed.initialize()``
    reads the coordinator and process ids from the TPU metadata; ``launch/tpu_pod.sh`` sets
    it). Neither set: a single-process run."""
    global _watchdog
    coordinator = os.environ.get("D1JAX_COORDINATOR")
    mode = os.environ.get("D1JAX_DISTRIBUTED", "")
    if mode not in ("", "auto"):
        raise ValueError(f"D1JAX_DISTRIBUTED={mode!r}: 'auto' (TPU pods) or unset")
    if not coordinator and mode != "auto":
        return
    import jax
    timeout_s = float(os.environ.get("D1JAX_PEER_TIMEOUT_S", "30"))
    # JAX's own missed-heartbeat handling aborts the process: keep it behind the watchdog.
    heartbeat = int(max(100, 3 * timeout_s))
    if coordinator:
        if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            # Every process waits for the others' CPU topology (default 2 minutes): on a
            # loaded machine a slow starter is not a failure.
            minutes = int(os.environ.get("D1JAX_TOPOLOGY_TIMEOUT_MINUTES", "10"))
            jax.config.update("jax_cpu_get_local_topology_timeout_minutes", minutes)
            jax.config.update("jax_cpu_get_global_topology_timeout_minutes", minutes)
        n, pid = int(os.environ["D1JAX_NUM_PROCESSES"]), int(os.environ["D1JAX_PROCESS_ID"])
        jax.distributed.initialize(coordinator, n, pid, heartbeat_timeout_seconds=heartbeat)
    else:
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat)
        n, pid = jax.process_count(), jax.process_index()
    if n > 1 and timeout_s > 0:
        from jax._src import distributed as jax_distributed
        _watchdog = PeerWatchdog(jax_distributed.global_state.client, pid, n, timeout_s).start()
        atexit.register(_leave)  # runs before JAX's exit handler (registered when jax loaded)


def on_failure(e: BaseException) -> None:
    """In a multi-process run, an error from a collective (a peer died mid-allgather) ends in
    the watchdog's one line naming the lost process instead of a traceback; other errors
    return to be raised.

    A lost coordinator is named at once: JAX's coordination agent aborts the process within
    about a second of losing it, and its error handler cannot be replaced from Python."""
    chain = []
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    if _watchdog is None or not any(k in m for m in chain for k in _COLLECTIVE_ERRORS):
        return
    try:
        _watchdog.client.key_value_try_get(f"{_KEY}/beat/{_watchdog.pid}")
    except Exception:  # noqa: BLE001 - the store (on process 0) is gone
        _watchdog.lost(0, "its connection closed")
    time.sleep(2 * _watchdog.timeout_s)  # the watchdog names the lost peer and exits
    sys.stderr.write(f"error: a collective failed ({' '.join(chain[-1].split())[:300]})\n")
    os._exit(LOST_EXIT_CODE)


_COLLECTIVE_ERRORS = ("Gloo", "Connection reset", "Connection closed", "connection refused")


def finish() -> None:
    """Called when this process's work ended normally (finished or stopped with a save)."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.finish()
        _watchdog = None


def _leave() -> None:
    """At exit without ``finish()``, this process failed (its error is printed already). It
    says so, so that finished peers stop waiting for it, and waits up to the timeout for the
    others to finish or fail too; then JAX's shutdown barrier at exit passes at once. A peer
    still running (blocked in a collective with this one) would keep that barrier waiting
    until JAX aborts both after 5 minutes, so then exit 1 at once: its watchdog names us."""
    global _watchdog
    if _watchdog is None:
        return
    watchdog, _watchdog = _watchdog, None
    if not watchdog.finish("failed", wait_s=watchdog.timeout_s):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(LOST_EXIT_CODE)
