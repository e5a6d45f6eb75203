"""d1jax/run/lock.py: one writer per workdir. Holders are real processes (a live one holding the
lock, a finished one whose pid is gone); records of other hosts are written as such a host would
write them. The end-to-end scenarios (two launches, a stale lock) are in test_faults.py."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from d1jax.run import lock

ROOT = Path(__file__).resolve().parents[1]
HOLD = """
import sys, time
from d1jax.run import lock
lock.acquire(sys.argv[1])
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def live_holder(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert p.stdout.readline() == "held\n"
    yield p
    p.stdin.close()
    p.wait(timeout=60)


def record(path: Path, host: str, pid: int, started: str = "", since: float = 0.0,
           age: float = 0.0) -> None:
    path.write_text(json.dumps({"host": host, "pid": pid, "started": started, "since": since}))
    t = time.time() - age
    os.utime(path, (t, t))


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_live_holder_in_another_process_refuses_and_its_record_is_untouched(
        tmp_path, live_holder):
    file = tmp_path / lock.LOCK_NAME
    before = (file.read_bytes(), file.stat().st_mtime_ns)
    rec = json.loads(before[0])
    assert (rec["host"], rec["pid"]) == (socket.gethostname(), live_holder.pid)
    with pytest.raises(lock.WorkdirBusy) as e:
        lock.acquire(tmp_path)
    assert str(e.value).startswith(f"workdir {tmp_path.resolve()} is in use by pid "
                                   f"{live_holder.pid} on {socket.gethostname()} since ")
    assert "(it holds the lock); nothing was changed" in str(e.value)
    assert (file.read_bytes(), file.stat().st_mtime_ns) == before


def test_the_holders_exit_releases_the_lock_and_removes_its_file(tmp_path, live_holder):
    live_holder.stdin.close()
    assert live_holder.wait(timeout=60) == 0
    assert not (tmp_path / lock.LOCK_NAME).exists()  # released at its interpreter's exit
    held = lock.acquire(tmp_path)
    held.release()
    held.release()  # idempotent
    assert os.listdir(tmp_path) == []


def test_a_dead_holders_record_on_this_host_is_taken_over(tmp_path, capsys):
    pid = dead_pid()
    record(tmp_path / lock.LOCK_NAME, socket.gethostname(), pid, started="1")
    held = lock.acquire(tmp_path)
    assert f"taking over {tmp_path.resolve()}/{lock.LOCK_NAME} from pid {pid} on " \
           f"{socket.gethostname()}" in capsys.readouterr().out
    rec = json.loads((tmp_path / lock.LOCK_NAME).read_text())
    assert (rec["host"], rec["pid"]) == (socket.gethostname(), os.getpid())
    held.release()


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path, capsys):
    # The parent process runs, but it is not the process that wrote the record: the record's
    # start time is not the parent's. The holder is checked, not trusted by its pid alone.
    record(tmp_path / lock.LOCK_NAME, socket.gethostname(), os.getppid(), started="1")
    lock.acquire(tmp_path).release()
    assert "which is gone" in capsys.readouterr().out


def test_another_hosts_record_is_honoured_while_its_heartbeat_is_fresh(tmp_path, capsys):
    file = tmp_path / lock.LOCK_NAME
    record(file, "pod-worker-7", 4242, since=time.time() - 3600, age=5)
    with pytest.raises(lock.WorkdirBusy, match=r"in use by pid 4242 on pod-worker-7 since .*"
                       r"\(its heartbeat is \d+ s old; if that process is gone, rerun after "):
        lock.acquire(tmp_path)
    record(file, "pod-worker-7", 4242, age=lock.STALE_AFTER_S + 5)
    lock.acquire(tmp_path).release()
    assert "from pid 4242 on pod-worker-7" in capsys.readouterr().out


def test_another_hosts_heartbeat_several_intervals_old_but_not_stale_still_refuses(
        tmp_path):
    # A holder that missed a few beats (a slow filesystem, a paused VM) is alive until
    # STALE_AFTER_S: taking over after one interval would let two runs write one workdir.
    age = 3 * lock.HEARTBEAT_S
    assert lock.HEARTBEAT_S < age < lock.STALE_AFTER_S - 10
    file = tmp_path / lock.LOCK_NAME
    record(file, "pod-worker-7", 4242, since=time.time() - 3600, age=age)
    before = (file.read_bytes(), file.stat().st_mtime_ns)
    with pytest.raises(lock.WorkdirBusy) as e:
        lock.acquire(tmp_path)
    wait = re.search(r"its heartbeat is (\d+) s old; if that process is gone, rerun after "
                     r"(\d+) s\)", str(e.value))
    assert wait, str(e.value)
    assert abs(int(wait[1]) - age) <= 2
    assert abs(int(wait[2]) - (lock.STALE_AFTER_S - age)) <= 2
    assert (file.read_bytes(), file.stat().st_mtime_ns) == before  # nothing taken over


def test_without_filesystem_locks_the_record_alone_refuses_a_live_holder(
        tmp_path, live_holder, monkeypatch):
    monkeypatch.setattr(lock, "_flock", lambda fd: None)  # gcsfuse: no flock at all
    with pytest.raises(lock.WorkdirBusy, match=f"pid {live_holder.pid} .*it is running"):
        lock.acquire(tmp_path)


def test_the_holder_refreshes_its_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.05)
    held = lock.acquire(tmp_path)
    file = tmp_path / lock.LOCK_NAME
    t = time.time() - 100
    os.utime(file, (t, t))
    time.sleep(0.5)
    assert time.time() - file.stat().st_mtime < 5
    held.release()


def test_a_run_of_this_process_that_did_not_release_is_replaced(tmp_path):
    first = lock.acquire(tmp_path)  # a run that ended in an error before releasing
    second = lock.acquire(tmp_path)
    assert first.fd is None and lock.held(tmp_path) is second
    second.release()
    assert lock.held(tmp_path) is None and os.listdir(tmp_path) == []
