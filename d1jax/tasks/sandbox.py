"""Runs model-written Python against tests, each completion in a subprocess of its own.

    outcome = sandbox.run(code, ["assert f(1) == 2", "assert f(2) == 3"])
    outcome.passed            # (True, False): one verdict per test program
    outcomes = sandbox.run_many([(code, tests), ...], Limits(wall_s=5))   # a bounded pool

The trainer never executes model text: ``run`` writes the programs to a child process
(``sandbox_child.py``, started as ``python -I -S -B``: no site-packages, no PYTHON*
variables, no bytecode written) that holds

* its own session and process group, killed whole (SIGKILL) when the wall time runs out and
  again after it ends, so nothing it started outlives it;
* a fresh temporary directory as cwd (and HOME, TMPDIR), removed afterwards;
* a minimal environment and no inherited fds but stdio (``close_fds``); its stdout is an
  unlinked file of the parent's, write-only and O_APPEND (read after it ends, at most
  ``file_mb``); user output goes to /dev/null;
* rlimits (address space, CPU, file size, open files, no core, NPROC 0) and, where the kernel
  allows, a network namespace of its own; an audit hook refusing fork/exec/kill/sockets/ctypes,
  writes outside its directory, reads outside it and the standard library, and every way to
  a frame (``sandbox_child.py`` lists them).

A test passes only if its program returned normally and the child said so on the result
channel with the run's nonce: ``sys.exit(0)``, ``os._exit(0)``, a crash, a kill or a timeout
all fail. docs/evaluation.md ("The code sandbox") states what this does not stop.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

CHILD = Path(__file__).with_name("sandbox_child.py")


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-completion limits (one child process runs all of a completion's test programs)."""

    wall_s: float = 10.0  # Wall time of the whole child; then its process group is killed.
    program_s: float = 5.0  # Alarm per test program (DiffuCoder: 5 s per test case).
    cpu_s: int = 10  # RLIMIT_CPU seconds (SIGXCPU, then SIGKILL one second later).
    memory_mb: int = 1024  # RLIMIT_AS: address space, interpreter included.
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the child may write (results included).
    open_files: int = 64  # RLIMIT_NOFILE.
    network: bool = False  # False: own network namespace where possible, sockets refused.
    python_guard: bool = True  # The audit hook; False only for tests of the OS-level layers.
    module_name: str = "__main__"  # __name__ of the programs ("__main__": as `python -c`).

    def __post_init__(self):
        if self.wall_s <= 0 or self.program_s <= 0 or self.cpu_s < 1 or self.memory_mb < 64:
            raise ValueError(f"sandbox limits out of range: {self} (wall_s, program_s > 0, "
                             f"cpu_s >= 1, memory_mb >= 64)")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one child did: a verdict per program, how it ended, and why programs failed."""

    passed: tuple[bool, ...]
    status: str  # "done" (ran every program), "timeout" (killed at wall_s), "died" (ended early)
    wall_s: float
    returncode: int | None
    errors: tuple[str, ...]  # per program: "" if passed, else the error (or "no report")
    network: str  # "netns", "guard" (audit hook only) or "allowed"
    pid: int  # the child's pid = its session and process-group id

    @property
    def share(self) -> float:
        """Share of the programs that passed (0 for no programs)."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(workdir: str) -> None:
    """Deletes the child's directory, however deep it nested it (shutil.rmtree recurses and
    would raise RecursionError; then ``rm -rf``, which does not)."""
    try:
        shutil.rmtree(workdir, ignore_errors=True)
    except RecursionError:
        pass
    if os.path.lexists(workdir):
        subprocess.run(["rm", "-rf", "--one-file-system", workdir], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def _result_channel():
    """(reader, writer fd) of one unlinked file: the child gets the writer, write-only and
    O_APPEND, so it cannot read earlier lines (their nonce) or write over them (its guard
    refuses fcntl, which could clear O_APPEND)."""
    fd, path = tempfile.mkstemp(prefix="d1jax-sandbox-results-")
    try:
        sink = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        os.close(fd)
        raise
    finally:
        os.unlink(path)
    return os.fdopen(fd, "rb"), sink


def run(code: str, tests: Sequence[str], limits: Limits = Limits()) -> Outcome:
    """Runs ``code + "\\n" + test`` for each test as its own program (a fresh namespace each),
    all in one sandboxed child; see the module docstring."""
    programs = [f"{code}\n{t}" for t in tests]
    return run_programs(programs, limits)


def run_programs(programs: Sequence[str], limits: Limits = Limits()) -> Outcome:
    """Runs whole ``programs`` in one sandboxed child; a program passes if it returns."""
    nonce = secrets.token_hex(16)
    payload = json.dumps({"nonce": nonce, "programs": list(programs),
                          "module_name": limits.module_name,
                          "limits": {**dataclasses.asdict(limits)}}).encode()
    workdir = tempfile.mkdtemp(prefix="d1jax-sandbox-")
    t0 = time.perf_counter()
    status, rc, pid = "died", None, -1
    results, sink = _result_channel()
    with results:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(CHILD)], stdin=subprocess.PIPE,
                stdout=sink, stderr=subprocess.DEVNULL, cwd=workdir, env=_env(workdir),
                close_fds=True, start_new_session=True)
            pid = proc.pid
            try:
                proc.communicate(payload, timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                status = "timeout"
                _kill_group(proc.pid)
                proc.communicate()
            rc = proc.returncode
            _kill_group(proc.pid)  # anything it left behind in its group
        finally:
            os.close(sink)
            _remove(workdir)
        results.seek(0)
        text = results.read(limits.file_mb * 1024 * 1024).decode("utf-8", "replace")
    wall = time.perf_counter() - t0
    passed, errors, network, done = _parse(text, nonce, len(programs))
    if done and status != "timeout":
        status = "done"
    return Outcome(passed=tuple(passed), status=status, wall_s=wall, returncode=rc,
                   errors=tuple(errors), network=network, pid=pid)


def _parse(text: str, nonce: str, n: int):
    passed, errors = [False] * n, ["no report"] * n
    network, done = "unknown", False
    seen: set[int] = set()
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if head != nonce:
            continue
        fields = rest.split(" ", 2)
        if fields[0] == "done":
            done = True
        elif fields[0] == "net" and len(fields) > 1:
            network = fields[1]
        elif fields[0].isdigit() and len(fields) > 1 and int(fields[0]) < n:
            i = int(fields[0])
            if i in seen:  # a second line for one program: not the child's; fail it
                passed[i], errors[i] = False, "reported twice"
                continue
            seen.add(i)
            passed[i] = fields[1] == "1"
            errors[i] = "" if passed[i] else (fields[2] if len(fields) > 2 else "failed")
    return passed, errors, network, done


def default_workers() -> int:
    """Children run at once by ``run_many``: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def run_many(jobs: Sequence[tuple[str, Sequence[str]]], limits: Limits = Limits(),
             workers: int | None = None) -> list[Outcome]:
    """``run(code, tests)`` for each job, at most ``workers`` children at a time (threads
    that wait on subprocesses), results in the order of ``jobs``."""
    if not jobs:
        return []
    workers = min(workers or default_workers(), len(jobs))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run(job[0], job[1], limits), jobs))


def run_many_programs(jobs: Sequence[Sequence[str]], limits: Limits = Limits(),
                      workers: int | None = None) -> list[Outcome]:
    """``run_programs`` for each job (a list of whole programs), in a bounded pool."""
    if not jobs:
        return []
    workers = min(workers or default_workers(), len(jobs))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda programs: run_programs(programs, limits), jobs))
