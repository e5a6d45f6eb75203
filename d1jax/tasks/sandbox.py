"""Runs model-written Python against tests; the verdict is never the model process's to give.

    outcome = sandbox.run_calls(code, ["assert f(1) == 2", "assert f(2) == 3"])
    outcome.passed            # (True, False): one verdict per test
    outcomes = sandbox.run_many_calls([(code, tests), ...], Limits(wall_s=5))  # a bounded pool

Two paths, both through the same walls:

* ``run_calls`` (the default of HumanEval, MBPP and the toy, ``splittable`` tests): a trusted
  judge process (``sandbox_judge.py``) runs the tests itself; the program runs in an untrusted
  worker (``sandbox_child.py serve``) that only loads it and calls its functions with plain
  data, answering plain data (``sandbox_codec.py``). Comparisons, ``__eq__`` included, are the
  judge's: nothing the worker does can make a test pass but returning the right values.
* ``run_programs`` / ``run`` (tests that need the program's objects, such as its classes):
  the program and test run together in the child, which reports each verdict on a result
  channel with the run's nonce, as before the judge existed; the guard stands between the
  program and the channel.

The walls (docs/evaluation.md, "The code sandbox"): bubblewrap by default (``sandbox_os.py``:
an unprivileged user in fresh namespaces, a read-only system, a private size-limited tmpfs, a
seccomp filter; every process killed with the wall), or, as the explicit fallback
``D1JAX_SANDBOX=process``, a plain process in its own session and a fresh temporary directory;
under either, rlimits (address space, CPU, file size, open files, no core, NPROC 0) and the
in-process guard (``sandbox_guard.py``). At ``wall_s`` the whole process group is killed, and
again after a normal end. Whatever one completion does, its errors are its own: it scores 0,
and ``run_many*`` returns an ``Outcome`` for every job.
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

from d1jax.tasks import sandbox_os
from d1jax.tasks.sandbox_os import SandboxUnavailable

__all__ = ["Limits", "Outcome", "SandboxUnavailable", "run", "run_programs", "run_calls",
           "run_many", "run_many_programs", "run_many_calls", "splittable", "parse_report"]

CHILD = Path(__file__).with_name("sandbox_child.py")
JUDGE = Path(__file__).with_name("sandbox_judge.py")
REPORT_LINE = 512  # bytes of one result line the parent reads (nonce, index, error)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-completion limits (one child, or one judge and its worker, per completion)."""

    wall_s: float = 10.0  # Wall time of the whole completion; then every process is killed.
    program_s: float = 5.0  # Time of one test (DiffuCoder: 5 s per test case).
    cpu_s: int = 10  # RLIMIT_CPU seconds (SIGXCPU, then SIGKILL one second later).
    memory_mb: int = 1024  # RLIMIT_AS: address space, interpreter included.
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the child may write (results included).
    tmpfs_mb: int = 64  # bwrap: size of the private /tmp, the only writable place.
    open_files: int = 64  # RLIMIT_NOFILE.
    network: bool = False  # False: own network namespace (bwrap), sockets refused (guard).
    python_guard: bool = True  # The audit hook; False only for tests of the OS-level layers.
    module_name: str = "__main__"  # __name__ of the programs ("__main__": as `python -c`).
    isolation: str = ""  # "bwrap", "process", or "" for $D1JAX_SANDBOX (default bwrap).

    def __post_init__(self):
        if self.wall_s <= 0 or self.program_s <= 0 or self.cpu_s < 1 or self.memory_mb < 64 \
                or self.tmpfs_mb < 1 or self.isolation not in ("", *sandbox_os.MODES):
            raise ValueError(f"sandbox limits out of range: {self} (wall_s, program_s > 0, "
                             f"cpu_s >= 1, memory_mb >= 64, tmpfs_mb >= 1, isolation one of "
                             f"{sandbox_os.MODES} or '')")

    def mode(self) -> str:
        """The isolation in force; ``SandboxUnavailable`` if bwrap is asked for and cannot run."""
        chosen = self.isolation or sandbox_os.mode()
        if chosen == "bwrap":
            sandbox_os.check()
        return chosen


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one completion did: a verdict per test, how it ended, and why tests failed."""

    passed: tuple[bool, ...]
    status: str  # "done" (every test ran), "timeout" (killed at wall_s), "died" (ended early),
    # "error" (the parent could not run it: scored 0, the error in errors)
    wall_s: float
    returncode: int | None
    errors: tuple[str, ...]  # per test: "" if passed, else the error (or "no report")
    network: str  # "netns" (bwrap), "guard" (audit hook only) or "allowed"
    pid: int  # the child's (or judge's) pid = its session and process-group id

    @property
    def share(self) -> float:
        """Share of the tests that passed (0 for no tests)."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


def _failed(n: int, error: str, wall: float = 0.0) -> Outcome:
    return Outcome(passed=(False,) * n, status="error", wall_s=wall, returncode=None,
                   errors=(error,) * n, network="unknown", pid=-1)


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(workdir: str | None) -> None:
    """Deletes a child's directory, however deep it nested it (shutil.rmtree recurses and
    would raise RecursionError; then ``rm -rf``, which does not)."""
    if workdir is None:
        return
    try:
        shutil.rmtree(workdir, ignore_errors=True)
    except RecursionError:
        pass
    if os.path.lexists(workdir):
        subprocess.run(["rm", "-rf", "--one-file-system", workdir], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def _result_channel():
    """(reader, writer fd) of one unlinked file: the child gets the writer, write-only and
    O_APPEND, so it cannot read earlier lines (their nonce) or write over them."""
    fd, path = tempfile.mkstemp(prefix="d1jax-sandbox-results-")
    try:
        sink = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        os.close(fd)
        raise
    finally:
        os.unlink(path)
    return os.fdopen(fd, "rb"), sink


def _python(mode: str, script: Path, args: list[str], limits: Limits) -> list[str]:
    """The command of an untrusted child; bwrap's ``{seccomp_fd}`` is filled in by who runs it."""
    if mode == "process":
        return [sys.executable, "-I", "-S", "-B", str(script), *args]
    return sandbox_os.command([f"{sandbox_os.INSIDE}/{script.name}", *args], limits.tmpfs_mb,
                              "{seccomp_fd}", network=limits.network)


def _network(mode: str, limits: Limits) -> str:
    return "allowed" if limits.network else "netns" if mode == "bwrap" else "guard"


def _hello(limits: Limits, **extra) -> bytes:
    return (json.dumps({"limits": dataclasses.asdict(limits), "module_name": limits.module_name,
                        **extra}, ensure_ascii=True) + "\n").encode("ascii")


def _wait(proc: subprocess.Popen, payload: bytes, wall_s: float) -> tuple[str, bytes]:
    """Feeds ``payload``, waits up to ``wall_s``; then, and after a normal end too, kills the
    process group (everything the program started in it)."""
    status = "died"
    try:
        out, _ = proc.communicate(payload, timeout=wall_s)
    except subprocess.TimeoutExpired:
        status = "timeout"
        _kill_group(proc.pid)
        out, _ = proc.communicate()
    _kill_group(proc.pid)
    return status, out or b""


def run(code: str, tests: Sequence[str], limits: Limits = Limits()) -> Outcome:
    """Runs ``code + "\\n" + test`` for each test as its own program (a fresh namespace each),
    all in one sandboxed child, verdicts reported by the child (module docstring)."""
    return run_programs([f"{code}\n{t}" for t in tests], limits)


def run_programs(programs: Sequence[str], limits: Limits = Limits()) -> Outcome:
    """Runs whole ``programs`` in one sandboxed child; a program passes if it returns."""
    mode = limits.mode()
    nonce = secrets.token_hex(16)
    payload = _hello(limits, nonce=nonce, programs=list(programs))
    t0 = time.perf_counter()
    # Everything the parent needs exists before the program runs: a full disk fails here.
    workdir = tempfile.mkdtemp(prefix="d1jax-sandbox-") if mode == "process" else None
    rc, pid, status, fds = None, -1, "died", []
    try:
        results, sink = _result_channel()
        fds.append(sink)
        cmd = _python(mode, CHILD, ["programs"], limits)
        if mode == "bwrap":
            fds.append(_seccomp_pipe())
            cmd = [c.replace("{seccomp_fd}", str(fds[-1])) for c in cmd]
        with results:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=sink,
                                    stderr=subprocess.DEVNULL, cwd=workdir,
                                    env=_env(workdir or sandbox_os.WORKDIR), close_fds=True,
                                    pass_fds=tuple(fds[1:]), start_new_session=True)
            pid = proc.pid
            for fd in fds:
                os.close(fd)
            fds = []
            status, _ = _wait(proc, payload, limits.wall_s)
            rc = proc.returncode
            results.seek(0)
            passed, errors, done = parse_report(results, nonce, len(programs))
    finally:
        for fd in fds:
            os.close(fd)
        _remove(workdir)
    if done and status != "timeout":
        status = "done"
    return Outcome(passed=tuple(passed), status=status, wall_s=time.perf_counter() - t0,
                   returncode=rc, errors=tuple(errors), network=_network(mode, limits), pid=pid)


def _seccomp_pipe() -> int:
    """The read end of a pipe holding the seccomp filter, for bwrap's ``--seccomp``."""
    r, w = os.pipe()
    try:
        os.write(w, sandbox_os.seccomp_program())
    finally:
        os.close(w)
    return r


def parse_report(stream, nonce: str, n: int) -> tuple[list[bool], list[str], bool]:
    """(passed, errors, done) from the result channel, read strictly: lines of at most
    ``REPORT_LINE`` bytes, at most ``n + 2`` of them counted, ``<nonce> <i> 1`` with ``i`` in
    ASCII digits below ``n``; a program reported twice fails. Never raises on its content."""
    passed, errors, done = [False] * n, ["no report"] * n, False
    seen: set[int] = set()
    head = nonce.encode("ascii") + b" "
    budget = (n + 8) * REPORT_LINE  # what the child's own lines can take, and no more
    while budget > 0:
        line = stream.readline(min(budget, REPORT_LINE))
        budget -= len(line)
        if not line:
            break
        if not line.endswith(b"\n") or not line.startswith(head):
            if not line.endswith(b"\n"):  # a line too long: skip to its end, within budget
                while budget > 0 and line and not line.endswith(b"\n"):
                    line = stream.readline(min(budget, REPORT_LINE))
                    budget -= len(line)
            continue
        fields = line[len(head):-1].split(b" ", 2)
        if fields[0] == b"done":
            done = True
        elif len(fields) > 1 and 0 < len(fields[0]) <= 6 and fields[0].isdigit() \
                and int(fields[0]) < n:  # bytes.isdigit: ASCII digits only
            i = int(fields[0])
            if i in seen:  # a second line for one program: not the child's; fail it
                passed[i], errors[i] = False, "reported twice"
                continue
            seen.add(i)
            passed[i] = fields[1] == b"1"
            errors[i] = "" if passed[i] else (
                fields[2].decode("utf-8", "replace") if len(fields) > 2 else "failed")
    return passed, errors, done


def splittable(tests: Sequence[str], solution: str = "") -> bool:
    """Whether the tests can run on the trusted side (``run_calls``): each parses, and no name
    it reads from the program is a class of the reference ``solution`` (or, without one, a
    capitalised name: a class the tests build); decided from the task's data alone."""
    import ast
    from d1jax.tasks import sandbox_names as names_of
    classes: set[str] = set()
    if solution:
        try:
            classes = {n.name for n in ast.parse(solution).body if isinstance(n, ast.ClassDef)}
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            classes = set()
    for test in tests:
        try:
            free = names_of.free_names(test)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        if any(n in classes or (not solution and n[:1].isupper()) for n in free):
            return False
    return True


def run_calls(code: str, tests: Sequence[str], limits: Limits = Limits()) -> Outcome:
    """Runs each test on the trusted side against ``code`` loaded in an untrusted worker (a
    fresh namespace per test); a test passes if it returns (module docstring)."""
    mode = limits.mode()
    t0 = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="d1jax-sandbox-") if mode == "process" else None
    seccomp = sandbox_os.seccomp_program().hex() if mode == "bwrap" else ""
    payload = _hello(limits, program=code, tests=list(tests), cwd=workdir, seccomp=seccomp,
                     worker=_python(mode, CHILD, ["serve"], limits))
    n, rc, pid, status = len(tests), None, -1, "died"
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", str(JUDGE)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd=workdir or "/",
                                env=_env(workdir or "/tmp"), close_fds=True,
                                start_new_session=True)
        pid = proc.pid
        status, out = _wait(proc, payload, limits.wall_s)
        rc = proc.returncode
    finally:
        _remove(workdir)
    passed, errors = [False] * n, ["no report"] * n
    for line in out.splitlines()[:n]:  # the judge's own lines (one may be cut by the kill)
        try:
            result = json.loads(line)
            passed[result["i"]], errors[result["i"]] = result["ok"] is True, result["error"]
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    if status != "timeout" and rc == 0 and "no report" not in errors:
        status = "done"
    return Outcome(passed=tuple(passed), status=status, wall_s=time.perf_counter() - t0,
                   returncode=rc, errors=tuple(errors), network=_network(mode, limits), pid=pid)


def default_workers() -> int:
    """Children run at once by ``run_many``: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _pool(fn, jobs: Sequence, size, limits: Limits, workers: int | None) -> list[Outcome]:
    """``fn(job)`` for each job in a bounded pool of threads (they wait on subprocesses);
    an error of one job is that job's 0 (``status="error"``), never the batch's."""
    if not jobs:
        return []
    limits.mode()  # a machine that cannot isolate stops here, in one line, before any job

    def one(job):
        t0 = time.perf_counter()
        try:
            return fn(job)
        except (OSError, ValueError, subprocess.SubprocessError, RecursionError,
                MemoryError) as e:
            return _failed(size(job), f"sandbox: {type(e).__name__}: {e}"[:300],
                           time.perf_counter() - t0)
    workers = min(workers or default_workers(), len(jobs))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, jobs))


def run_many(jobs: Sequence[tuple[str, Sequence[str]]], limits: Limits = Limits(),
             workers: int | None = None) -> list[Outcome]:
    """``run(code, tests)`` for each job, results in the order of ``jobs``."""
    return _pool(lambda job: run(job[0], job[1], limits), jobs, lambda job: len(job[1]),
                 limits, workers)


def run_many_programs(jobs: Sequence[Sequence[str]], limits: Limits = Limits(),
                      workers: int | None = None) -> list[Outcome]:
    """``run_programs`` for each job (a list of whole programs)."""
    return _pool(lambda programs: run_programs(programs, limits), jobs, len, limits, workers)


def run_many_calls(jobs: Sequence[tuple[str, Sequence[str]]], limits: Limits = Limits(),
                   workers: int | None = None) -> list[Outcome]:
    """``run_calls(code, tests)`` for each job."""
    return _pool(lambda job: run_calls(job[0], job[1], limits), jobs, lambda job: len(job[1]),
                 limits, workers)
