"""The sandbox's walls (d1jax/tasks/sandbox.py, sandbox_os.py, sandbox_judge.py): one hostile
completion per root cause of issue 56, each scoring 0 through the default path (the trusted
judge, ``run_calls``) and, where the verdict could be forged there, the child-reported path
(``run_programs``); the limits measured; the parser fuzzed with random bytes.

Each hostile completion also defines ``f``, so it scores 0 only if the sandbox stopped it.
Tests of the OS layer switch the in-process guard off (``python_guard=False``): they show
what holds if a program gets past it. They need bubblewrap (skipped, with its one-line reason,
where it cannot run: ``D1JAX_SANDBOX=process`` is the fallback there).
"""

from __future__ import annotations

import dataclasses
import io
import os
import random
import re
import socket
import time
import tracemalloc
from pathlib import Path

import pytest

from d1jax.tasks import sandbox, sandbox_os

GOOD = "\ndef f(x):\n    return x + 1\n"
TEST = ["assert f(1) == 2"]
LIMITS = sandbox.Limits(wall_s=3.0, program_s=1.5, cpu_s=3, memory_mb=256, file_mb=4,
                        tmpfs_mb=16, isolation="bwrap")
RAW = dataclasses.replace(LIMITS, python_guard=False, file_mb=64)


def _bwrap_reason() -> str:
    try:
        sandbox_os.check()
        return ""
    except sandbox_os.SandboxUnavailable as e:
        return str(e)


needs_bwrap = pytest.mark.skipif(bool(_bwrap_reason()), reason=_bwrap_reason() or "bwrap runs")

# Forging the child-reported verdict: each payload finds the child's `report` and reports a
# pass for every program, then ends the process before the real report.
FORGE = ("for i in range(8):\n    report(f'{i} 1')\nreport('done')\nimport os\nos._exit(0)\n")
ROOT_CAUSES = {
    # 1. a module imported before the guard, reachable under another name: ctypes' memory
    # (it passes as soon as ctypes is reachable: the forging that follows is a bonus)
    "preguard_module": (
        "import sys\nm = [v for v in list(sys.modules.values()) if v is not None and "
        "hasattr(v, 'pythonapi')][0]\ntry:\n    api = m.pythonapi\n"
        "    api.PyEval_GetFrame.restype = m.py_object\n"
        "    report = api.PyEval_GetFrame().f_back.f_locals['report']\n"
        + "".join("    " + line + "\n" for line in FORGE.splitlines())
        + "except Exception:\n    pass\n"),
    # 2. a dead exception frame kept by the collector's debug mode leads back to the harness
    "gc_saveall_frames": (
        "import gc\ngc.set_debug(gc.DEBUG_SAVEALL)\ndef g():\n    try:\n        raise ValueError\n"
        "    except ValueError as e:\n        x = e\ng()\ngc.collect()\nreport = None\n"
        "for fr in [o for o in gc.garbage if type(o).__name__ == 'frame']:\n"
        "    while fr is not None and report is None:\n"
        "        report = fr.f_locals.get('report')\n        fr = fr.f_back\n" + FORGE),
}


@needs_bwrap
@pytest.mark.parametrize("name", sorted(ROOT_CAUSES))
def test_forging_root_causes_score_zero_on_both_paths(name):
    code = ROOT_CAUSES[name] + GOOD
    assert sandbox.run_calls(code, TEST, LIMITS).passed == (False,)
    o = sandbox.run(code, TEST + ["assert False"], LIMITS)
    assert o.passed == (False, False), (name, o)


@needs_bwrap
def test_a_replaced_result_channel_stops_reports():
    """3. The channel is known by its fd number: a program that closes it and opens a file of
    its own there would read the next report (the nonce) and forge with a saved copy."""
    steal = ("import os\nd = os.dup(3)\nos.close(3)\nos.open('log', os.O_RDWR | os.O_CREAT)\n"
             "open('saved', 'w').write(str(d))\n")
    forge = ("import os\nn = open('log').read().split()[0]\nd = int(open('saved').read())\n"
             "os.write(d, f'{n} 2 1\\n{n} done\\n'.encode())\nos._exit(0)\n")
    o = sandbox.run_programs([steal, "pass", forge, "assert False"], LIMITS)
    assert o.passed[3] is False and o.passed[2] is False, o


def test_result_parser_is_strict_on_unicode_digits_and_floods():
    """4. A report whose index is a Unicode digit raised ValueError in the parent; 9. a flood
    on the channel cost it hundreds of MB."""
    nonce = "ab" * 16
    text = f"{nonce} ² 1\n{nonce} ٣ 1\n{nonce} 0 1\n{nonce} 0 1\n{nonce} 1 1\n{nonce} done\n"
    passed, errors, done = sandbox.parse_report(io.BytesIO(text.encode()), nonce, 3)
    assert passed == [False, True, False] and errors[0] == "reported twice" and done
    flood = io.BytesIO((f"{nonce} 0 1\n".encode() * 8 + b"\n") * 200_000)
    tracemalloc.start()
    sandbox.parse_report(flood, nonce, 3)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_result_parser_fuzz_never_raises():
    rng = random.Random(0)
    nonce = "cd" * 16
    alphabet = [b"\n", b" ", b"0", b"1", b"9", nonce.encode(), "²".encode(), "٣".encode(),
                b"done", b"\xff", b"-", b"+1", b"99999999"]
    alphabet += [b"\n" + nonce.encode() + x + b" 1\n"  # whole lines, the signed and the odd
                 for x in (b" -1", b" +1", b" 1", b" 0002", b" 1 ", " ٣".encode(), b" 3\x00")]
    for _ in range(3000):
        n = rng.randrange(0, 5)
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        else:
            data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        passed, errors, done = sandbox.parse_report(io.BytesIO(data), nonce, n)
        assert len(passed) == len(errors) == n and isinstance(done, bool)
        for i in (i for i, ok in enumerate(passed) if ok):  # only a whole line "<nonce> <i in ASCII digits> 1"
            assert re.search(rb"(^|\n)" + nonce.encode() + rb" 0*" + str(i).encode() + rb" 1\n",
                             data), (i, data)


def test_an_error_of_one_completion_is_its_zero(monkeypatch):
    """5. A full temporary filesystem made mkdtemp raise in the trainer: the batch was lost."""
    real, calls = sandbox.tempfile.mkstemp, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)
    monkeypatch.setattr(sandbox.tempfile, "mkstemp", flaky)
    limits = dataclasses.replace(LIMITS, isolation="process")
    outcomes = sandbox.run_many([(GOOD, TEST)] * 3, limits, workers=1)
    assert [o.share for o in outcomes] == [1.0, 0.0, 1.0]
    assert outcomes[1].status == "error" and "No space" in outcomes[1].errors[0]


# ------------------------------------------------------------------------- the OS layer


def _escapes(sentinel: Path, trainer_pid: int, port: int) -> dict[str, str]:
    """Each passes only if it got out (guard off): the walls must stop it."""
    s = str(sentinel)
    libc = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    return {
        "read_trainer_env": ("import os\nfound = False\nfor p in os.listdir('/proc'):\n    try:\n"
                             "        found |= b'D1JAX_SECRET=' in open(f'/proc/{p}/environ', "
                             "'rb').read()\n    except OSError:\n        pass\nassert found\n"),
        "stat_outside": f"import os\nos.stat('{s}/keep.txt')\n",  # 10. metadata outside
        "write_outside": f"open('{s}/pwned', 'w').write('x')\n",
        "signal_trainer": f"import os\nos.kill({trainer_pid}, 0)\n",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
        # memory the kernel does not count in RLIMIT_AS: 300 MB under a 256 MB limit
        "memfd_beyond_limit": ("import os\nblock = b'0' * (50 << 20)\nfds = []\n"
                               "for _ in range(6):\n    fds.append(os.memfd_create('x'))\n"
                               "    os.write(fds[-1], block)\n"),
        "tmpfs_beyond_limit": ("block = b'0' * (10 << 20)\nfor i in range(3):\n"
                               "    open(f'big{i}', 'wb').write(block)\n"),
        "shm_beyond_limit": ("block = b'0' * (10 << 20)\nfor i in range(3):\n"
                             "    open(f'/dev/shm/big{i}', 'wb').write(block)\n"),
        "new_namespace": libc + "assert libc.unshare(0x50000000) == 0\n",  # user + net
        "ptrace": libc + "assert libc.ptrace(0, 0, 0, 0) == 0\n",
        "sysv_shm": libc + "assert libc.shmget(0, 64 << 20, 0o1600) >= 0\n",
    }


@pytest.fixture(scope="module")
def escapes(tmp_path_factory):
    sentinel = tmp_path_factory.mktemp("sentinel")
    (sentinel / "keep.txt").write_text("keep")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    os.environ["D1JAX_SECRET"] = "x"
    try:
        cases = _escapes(sentinel, os.getpid(), srv.getsockname()[1])
        outcomes = sandbox.run_many_calls([(c + GOOD, TEST) for c in cases.values()], RAW,
                                          workers=2)
    finally:
        del os.environ["D1JAX_SECRET"]
        srv.close()
    return dict(zip(cases, outcomes)), sentinel


@needs_bwrap
@pytest.mark.parametrize("name", list(_escapes(Path("/x"), 1, 1)))
def test_the_os_layer_holds_without_the_guard(escapes, name):
    outcomes, sentinel = escapes
    assert outcomes[name].passed == (False,), (name, outcomes[name])
    assert sorted(p.name for p in sentinel.iterdir()) == ["keep.txt"]


MARKER = "d1jax-sandbox-left-behind-7f3a"


def _left_behind() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and MARKER.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("isolation", ["bwrap", "process"])
def test_no_process_outlives_a_normal_end(isolation):
    """Issue 55: a process the program started is killed after a normal end too (guard off,
    so the fork is allowed; with the guard on it is refused)."""
    if isolation == "bwrap" and _bwrap_reason():
        pytest.skip(_bwrap_reason())
    spawn = ("import os, sys\nif os.fork() == 0:\n    os.execv(sys.executable, [sys.executable, "
             f"'-c', 'import time; time.sleep(30)', '{MARKER}'])\n")
    limits = dataclasses.replace(RAW, isolation=isolation)
    o = sandbox.run_calls(spawn + GOOD, TEST, limits)
    assert o.status == "done" and o.passed == (True,), o
    time.sleep(0.2)
    assert _left_behind() == []


@needs_bwrap
def test_the_judge_holds_time_when_the_program_disarms_its_alarm():
    """7. A program that disarmed the per-program alarm ran on to the wall; the judge's own
    deadline ends the test at program_s, and the worker with it."""
    code = ("import signal\ndef f(x):\n    signal.setitimer(signal.ITIMER_REAL, 0)\n"
            "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\n"
            "    while True:\n        pass\n")
    limits = dataclasses.replace(RAW, wall_s=10.0, program_s=1.0, cpu_s=10)
    o = sandbox.run_calls(code, TEST + TEST, limits)
    assert o.passed == (False, False) and o.errors == ("timeout", "timeout"), o
    assert o.wall_s < 2 * limits.program_s + 1.0, o.wall_s


@needs_bwrap
def test_wall_time_includes_cleanup():
    """8. Cleanup ran seconds past the wall (a directory of many files removed by the parent):
    the tmpfs dies with the namespace."""
    flood = "import os\ni = 0\nwhile True:\n    open(str(i), 'w').close()\n    i += 1\n"
    limits = dataclasses.replace(LIMITS, wall_s=2.0, program_s=5.0)
    o = sandbox.run_calls(flood + GOOD, TEST, limits)
    assert o.passed == (False,) and o.status == "timeout"
    assert o.wall_s < limits.wall_s + 0.5, o.wall_s


def test_unavailable_bwrap_is_one_line_naming_the_fallback(monkeypatch):
    monkeypatch.setattr(sandbox_os, "binary", lambda: None)
    sandbox_os._probe.cache_clear()
    try:
        with pytest.raises(sandbox_os.SandboxUnavailable) as e:
            sandbox.run_many_calls([(GOOD, TEST)], LIMITS)
    finally:
        sandbox_os._probe.cache_clear()
    assert "\n" not in str(e.value) and "D1JAX_SANDBOX=process" in str(e.value)
    monkeypatch.setenv("D1JAX_SANDBOX", "process")
    assert sandbox.run_calls(GOOD, TEST, dataclasses.replace(LIMITS, isolation="")).passed == (True,)
