"""One writer per workdir: a run holds ``<workdir>/d1jax.lock`` for its whole life.

Two mechanisms, because pods keep workdirs on filesystems whose locks differ:

* an exclusive ``flock`` on the file, which the kernel (or an NFS server) drops when the
  holder dies, however it dies; a live holder on the same machine, or on any machine of a
  filesystem with coherent locks (NFS v4, Filestore), is always seen;
* a record in the file (host, pid, the pid's start time, since when), whose modification time
  a daemon thread refreshes every ``HEARTBEAT_S``. Where the filesystem does not lock across
  machines (gcsfuse, some FUSE mounts), the record of another host is honoured while its
  heartbeat is younger than ``STALE_AFTER_S``; on this host the holder is checked directly
  (the pid runs and started when the record says), never by the file's age.

A lock left by a dead process is taken over with one line saying so. The file is removed when
the run ends (an ``atexit`` hook covers error exits), so a refused or finished run leaves the
workdir as it found it. Multi-host runs: process 0 holds the lock and tells its peers whether
it got it, so every process of a refused run exits with the same line.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np

LOCK_NAME = "d1jax.lock"
HEARTBEAT_S = 10.0  # how often the holder refreshes the record's mtime
STALE_AFTER_S = 60.0  # a record of another host whose heartbeat is older is a dead run's

# Locks held by this process, by resolved workdir: runs in one process are sequential, so a
# lock still held here when the same process starts another run there belongs to a run that
# ended with an error before releasing it.
_HELD: dict[Path, "WorkdirLock"] = {}


class WorkdirBusy(Exception):
    """Another live process writes to this workdir; nothing was changed."""


@dataclasses.dataclass
class Holder:
    host: str
    pid: int
    started: str  # the pid's start time on its host (``/proc/<pid>/stat`` field 22), "" if unknown
    since: float  # when it took the lock (seconds since the epoch)
    heartbeat_age: float = 0.0  # seconds since the holder last refreshed the file (not saved)

    def describe(self) -> str:
        return (f"pid {self.pid} on {self.host} since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(self.since))}")


def acquire(workdir: str | os.PathLike) -> "WorkdirLock":
    """Takes the workdir's lock for this process (for every process of a multi-host run: process
    0 takes it, the others learn the outcome) or raises ``WorkdirBusy`` naming the holder."""
    import jax
    path = Path(workdir).expanduser().resolve()
    if jax.process_count() == 1:
        return _acquire_here(path)
    from jax.experimental import multihost_utils
    lock, message = None, ""
    if jax.process_index() == 0:
        try:
            lock = _acquire_here(path)
        except WorkdirBusy as e:
            message = str(e)
    code = np.frombuffer(message.encode()[:1024].ljust(1024), np.uint8)
    got = bytes(np.asarray(multihost_utils.broadcast_one_to_all(code))).rstrip(b" ").decode()
    if got:
        raise WorkdirBusy(got)
    return lock if lock is not None else WorkdirLock(path, None)  # a peer holds nothing


def held(workdir: str | os.PathLike) -> "WorkdirLock | None":
    """The lock this process holds on ``workdir``, if any."""
    return _HELD.get(Path(workdir).expanduser().resolve())


def release_all() -> None:
    """Releases every lock this process holds (before an exit that skips ``atexit``)."""
    for lock in list(_HELD.values()):
        lock.release()


def _acquire_here(workdir: Path) -> "WorkdirLock":
    stale = _HELD.pop(workdir, None)
    if stale is not None:  # an earlier run of this process ended without releasing it
        stale.release()
    file = workdir / LOCK_NAME
    while True:
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = _flock(fd)
            if locked is False:
                holder = _read(fd)
                raise WorkdirBusy(_busy_line(workdir, holder, "it holds the lock"))
            if not _same_file(fd, file):  # released and removed between open and flock: retry
                os.close(fd)
                continue
            holder = _read(fd)
            if holder is not None and _alive(holder):
                raise WorkdirBusy(_busy_line(workdir, holder, _why_alive(holder)))
        except BaseException:
            os.close(fd)
            raise
        break
    if holder is not None:
        print(f"workdir lock: taking over {file} from {holder.describe()}, which is gone",
              flush=True)
    lock = WorkdirLock(workdir, fd)
    lock._write()
    _HELD[workdir] = lock
    return lock


class WorkdirLock:
    """Held from ``acquire`` to ``release`` (idempotent; also run at interpreter exit)."""

    def __init__(self, workdir: Path, fd: int | None):
        self.workdir, self.fd = workdir, fd
        self.path = workdir / LOCK_NAME
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if fd is not None:
            atexit.register(self.release)

    def _write(self) -> None:
        me = Holder(socket.gethostname(), os.getpid(), _start_time(os.getpid()), time.time())
        data = json.dumps({k: v for k, v in dataclasses.asdict(me).items()
                           if k != "heartbeat_age"}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)
        self._beat = threading.Thread(target=self._heartbeat, name="d1jax-lock-heartbeat",
                                      daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.fd)
            except OSError:  # released meanwhile, or the filesystem went away: nothing to do
                return

    def release(self) -> None:
        if self.fd is None:
            return
        self._stop.set()
        fd, self.fd = self.fd, None
        try:
            if _same_file(fd, self.path):
                self.path.unlink()  # still holding the flock: a starter retries on the new file
        except OSError:
            pass
        os.close(fd)
        if _HELD.get(self.workdir) is self:
            del _HELD[self.workdir]


def _flock(fd: int) -> bool | None:
    """True: locked; False: another holder has it; None: this filesystem has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read(fd: int) -> Holder | None:
    """The record in the file (None: empty or unreadable), with its heartbeat's age (the
    file's mtime, which the holder refreshes)."""
    size = os.fstat(fd).st_size
    if not size:
        return None
    try:
        rec = json.loads(os.pread(fd, min(size, 4096), 0))
        return Holder(str(rec["host"]), int(rec["pid"]), str(rec.get("started", "")),
                      float(rec["since"]), time.time() - os.fstat(fd).st_mtime)
    except (ValueError, KeyError, TypeError):
        return None


def _alive(holder: Holder) -> bool:
    if holder.host != socket.gethostname():
        return holder.heartbeat_age < STALE_AFTER_S
    if holder.pid == os.getpid():
        return False  # this process's own record, from a run that did not release it
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # runs under another user: alive
        return True
    started = _start_time(holder.pid)
    return not holder.started or not started or started == holder.started  # else a reused pid


def _why_alive(holder: Holder) -> str:
    if holder.host == socket.gethostname():
        return "it is running"
    age = holder.heartbeat_age
    return (f"its heartbeat is {age:.0f} s old; if that process is gone, rerun after "
            f"{STALE_AFTER_S - age:.0f} s")


def _busy_line(workdir: Path, holder: Holder | None, why: str) -> str:
    who = holder.describe() if holder is not None else "another process"
    return (f"workdir {workdir} is in use by {who} ({why}); nothing was changed: wait for it, "
            "stop it, or pass another --workdir")


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), "" elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name (field 2) may hold spaces

