"""The code sandbox (d1jax/tasks/sandbox.py) under hostile completions.

Every hostile completion below also defines the function its test calls, so it scores 0 only
if the sandbox stopped it. They run together in a bounded pool under tight limits (2 s wall,
1 s a program); each must score 0 within its limit, leave no process behind, and leave the
sentinel directory (the parent's cwd while they run) as it was. A benign control in the same
pool must pass, so the zeros are not a broken sandbox's.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from d1jax.tasks import sandbox, sandbox_os


def _isolation() -> str:
    """bwrap where it runs; the guard's tests hold in the fallback too (CI installs bwrap,
    tests/test_sandbox_walls.py skips without it)."""
    try:
        sandbox_os.check()
        return "bwrap"
    except sandbox_os.SandboxUnavailable:
        return "process"


ISOLATION = _isolation()
LIMITS = sandbox.Limits(wall_s=2.0, program_s=1.0, cpu_s=2, memory_mb=256, file_mb=4,
                        isolation=ISOLATION)
GOOD = "\ndef f(x):\n    return x + 1\n"
TEST = ["assert f(1) == 2"]


def hostile(sentinel: Path, port: int) -> dict[str, str]:
    s = str(sentinel)
    return {
        "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
        "fork_bomb_shell": "import subprocess\nsubprocess.Popen(['sh', '-c', ':(){ :|:& };:'])\n",
        "fork_via_ctypes": "import ctypes\nctypes.CDLL(None).fork()\n",
        "threads": "import threading\nthreading.Thread(target=lambda: None).start()\n",
        "infinite_loop": "while True:\n    pass\n",
        "loop_ignoring_alarm": ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                "while True:\n    pass\n"),
        "alloc_10gb": "x = bytearray(10 * 1024 ** 3)\n",
        "raise_rlimit": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n"
                         "x = bytearray(10 * 1024 ** 3)\n"),
        "huge_file_in_own_dir": "open('big', 'wb').write(b'0' * (64 * 1024 ** 2))\n",
        "os_system": f"import os\nos.system('touch {s}/pwned')\n",
        "write_outside": f"open('{s}/pwned', 'w').write('x')\n",
        "append_outside": f"open('{s}/keep.txt', 'a').write('x')\n",
        "write_via_symlink": f"import os\nos.symlink('{s}/keep.txt', 'link')\nopen('link', 'w').write('x')\n",
        "hardlink_out": f"import os\nos.link('{s}/keep.txt', 'mine')\nopen('mine', 'w').write('x')\n",
        "rename_in": f"import os\nos.rename('{s}/keep.txt', 'stolen')\n",
        "socket": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
        "sys_exit_0": "import sys\nsys.exit(0)\n",
        "os__exit_0": "import os\nos._exit(0)\n",
        "kill_parent": "import os\nos.kill(os.getppid(), 9)\n",
        "killpg_parent": "import os\nos.killpg(os.getpgid(os.getppid()), 9)\n",
        "delete_parent_cwd": "import os, shutil\nshutil.rmtree('/proc/%d/cwd' % os.getppid())\n",
        "delete_sentinel": f"import os\nos.remove('{s}/keep.txt')\n",
        "forge_results": ("import os\nfor fd in range(1, 16):\n    try:\n"
                          "        os.write(fd, b'0' * 32 + b' 0 1\\n' + b'0' * 32 + b' done\\n')\n"
                          "    except OSError:\n        pass\nos._exit(0)\n"),
        # The guard's own state and what it calls, rebound by the program (the hook reads
        # only what it captured).
        "unguard_policy": ("import sys, os\nsys.modules['__main__']._REFUSED = frozenset()\n"
                           f"os.system('touch {s}/pwned')\n"),
        "unguard_builtins": ("import builtins, os\nbuiltins.any = lambda x: False\n"
                             "builtins.isinstance = lambda *a: False\n"
                             "os.fsdecode = lambda p: os.getcwd()\n"
                             f"open('{s}/pwned', 'w').write('x')\n"),
        "unguard_realpath": ("import os, posixpath\nposixpath._joinrealpath = "
                             "lambda *a: (os.getcwd(), True)\nos.path.realpath = lambda *a, **k: "
                             f"os.getcwd()\nopen('{s}/pwned', 'w').write('x')\n"),
        # The child's frames hold the result channel: every way CPython hands out a frame.
        "forge_via_getframe": ("import sys, os\nl = sys._getframe(1).f_locals\n"
                               "for i, _ in l['programs']:\n    l['report'](f'{i} 1')\n"
                               "l['report']('done')\nos._exit(0)\n"),
        "forge_via_traceback": ("import os\ntry:\n    raise Exception\nexcept Exception as e:\n"
                                "    l = e.__traceback__.tb_frame.f_back.f_locals\n"
                                "l['report']('0 1')\nl['report']('done')\nos._exit(0)\n"),
        "forge_via_gc": ("import gc, os\nr = [o for o in gc.get_objects() if getattr(o, "
                         "'__name__', '') == 'report'][0]\nr('0 1')\nr('done')\nos._exit(0)\n"),
        "forge_via_signal_handler": (
            "import os, signal, time\ndef h(sig, frame):\n    l = frame.f_back.f_locals\n"
            "    l['report']('0 1')\n    l['report']('done')\n    os._exit(0)\n"
            "signal.signal(signal.SIGALRM, h)\nsignal.setitimer(signal.ITIMER_REAL, 0.01)\n"
            "time.sleep(0.5)\n"),
        "forge_via_settrace": "import sys\nsys.settrace(lambda *a: None)\n",
        "read_result_channel": ("import os\nfor fd in range(3, 20):\n    try:\n"
                                "        n = os.pread(fd, 64, 0).split(b' ')[0]\n"
                                "    except OSError:\n        continue\n"
                                "    os.write(fd, n + b' 0 1\\n' + n + b' done\\n')\n"
                                "    os._exit(0)\n"
                                "raise RuntimeError('no channel read')\n"),
        "clear_append_flag": "import fcntl\nfcntl.fcntl(3, fcntl.F_SETFL, 0)\n",
        "threads_reimported": ("import sys\ndel sys.modules['_thread']\nimport _thread\n"
                               "_thread.start_new_thread(lambda: None, ())\n"),
        # Secrets, memory and files outside: reads are limited too.
        "read_parent_environ": "import os\nopen('/proc/%d/environ' % os.getppid(), 'rb').read()\n",
        "read_own_memory": "open('/proc/self/mem', 'rb')\n",
        "read_outside": f"open('{s}/keep.txt').read()\n",
        "immutable_flag": ("import fcntl, struct\nf = open('x', 'w')\n"
                           "fcntl.ioctl(f, 0x40086602, struct.pack('i', 0x10))\n"),
        # A directory fd outside, or one the hook resolves elsewhere: dir_fd= is not in the
        # open event.
        "dir_fd_outside": (f"import os\nd = os.open('{s}', os.O_RDONLY)\n"
                           "os.open('pwned', os.O_WRONLY | os.O_CREAT, dir_fd=d)\n"),
        "dir_fd_after_chdir": ("import os\nos.mkdir('a')\nd = os.open('.', os.O_RDONLY)\n"
                               "os.chdir('a')\nos.open('../pwned', os.O_WRONLY | os.O_CREAT, "
                               "dir_fd=d)\n"),
        # What has no audit event, or escapes the hook: a sub-interpreter, a fresh builtin
        # module, another function's code, signals and priorities of other processes, nodes,
        # fd-based metadata changes, listings.
        "subinterpreter": ("import _xxsubinterpreters as si\n"
                           "si.run_string(si.create(), 'import os; os.system(\"true\")')\n"),
        "fresh_signal_module": (
            "import importlib.util, importlib.machinery, signal\n"
            "spec = importlib.machinery.BuiltinImporter.find_spec('_signal')\n"
            "m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\n"
            "m.signal(signal.SIGUSR1, lambda *a: None)\n"),
        "swap_handler_code": ("import signal\ndef evil(sig, frame):\n    pass\n"
                              "signal.getsignal(signal.SIGALRM).__code__ = evil.__code__\n"),
        "pidfd_signal_parent": ("import os, signal\n"
                                "signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)\n"),
        "renice_parent": ("import os\np = os.getpriority(os.PRIO_PROCESS, os.getppid())\n"
                          "os.setpriority(os.PRIO_PROCESS, os.getppid(), p)\n"),
        "mkfifo_outside": f"import os\nos.mkfifo('{s}/pwned')\n",
        "fchmod_stdlib_file": ("import os\nfd = os.open(os.__file__, os.O_RDONLY)\n"
                               "os.chmod(fd, os.fstat(fd).st_mode & 0o7777)\n"),
        "list_outside": f"import os\nos.listdir('{s}')\n",
        # Third review: a sub-interpreter through CPython's test module, a directory fd of
        # /dev through shm_open(".."), code objects through marshal (crafted bytecode reads
        # memory past its constants).
        "subinterpreter_via_testcapi": "import _testcapi\n_testcapi.run_in_subinterp('pass')\n",
        "shm_open_dotdot": "import _posixshmem, os\n_posixshmem.shm_open('..', os.O_RDONLY, 0)\n",
        # Fourth review: the guard's wrappers shared closure cells with the hook (setting
        # cell_contents is not audited); sqlite and readline write and read files unaudited.
        "closure_cells": (
            "import os, sys, signal, _imp, _thread\ncells = {}\n"
            "def walk(fn, seen):\n    if id(fn) in seen or not getattr(fn, '__closure__', None):\n"
            "        return\n    seen.add(id(fn))\n"
            "    for n, c in zip(fn.__code__.co_freevars, fn.__closure__):\n"
            "        cells[n] = c\n        walk(c.cell_contents, seen)\n"
            "for m in (os, sys.modules['posix'], _imp, _thread, signal):\n"
            "    for v in list(vars(m).values()):\n        walk(v, set())\n"
            f"cells['real_root'].cell_contents = ''\nopen('{s}/pwned', 'w').write('x')\n"),
        "sqlite_vacuum_outside": (f"import sqlite3\nsqlite3.connect(':memory:').execute("
                                  f"\"vacuum into '{s}/pwned'\")\n"),
        "readline_reads_outside": ("import readline\n"
                                   f"readline.read_history_file('{s}/keep.txt')\n"),
        "extension_off_the_list": "import mmap\n",  # extensions load from an allow-list
        # Fifth review: a .so of the program's own under an allowed name (here the real
        # math, copied), and the installed packages beside the standard library.
        "own_extension_file": (
            "import math, shutil, os, importlib.util as u\nshutil.copy(math.__file__, 'm.so')\n"
            "u.module_from_spec(u.spec_from_file_location('math', os.path.abspath('m.so')))\n"),
        "site_packages": "import os, sysconfig\nos.listdir(sysconfig.get_paths()['purelib'])\n",
        "xattrs_outside": f"import os\nos.listxattr('{s}/keep.txt')\n",  # sixth review
        "marshal_code": ("import marshal\n"
                         "marshal.loads(marshal.dumps(compile('1', 'x', 'eval')))\n"),
        "dir_fd_via_symlink": (f"import os\nos.symlink('{s}', 'ln')\n"
                               "d = os.open('ln', os.O_RDONLY)\n"
                               "os.open('pwned', os.O_WRONLY | os.O_CREAT, dir_fd=d)\n"),
    }


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file()
            else "dir" for p in sorted(root.rglob("*"))}


def _alive_in_session(sid: int) -> list[int]:
    """Processes whose session id is ``sid`` (the child was its session's leader)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def listener():
    """A TCP listener on loopback that counts the connections it accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join()
    srv.close()


@pytest.fixture(scope="module", params=["programs", "calls"])
def fuzz(request, tmp_path_factory, listener):
    """Runs every hostile completion (and the control) once, from the sentinel directory,
    through the child-reported path (``run_many``) and the trusted judge's (``run_many_calls``)."""
    sentinel = tmp_path_factory.mktemp("sentinel")
    (sentinel / "keep.txt").write_text("keep")
    (sentinel / "sub").mkdir()
    (sentinel / "sub" / "also.txt").write_text("also")
    before = _snapshot(sentinel)
    cases = hostile(sentinel, listener[0])
    names = ["control"] + list(cases)
    jobs = [(GOOD, TEST)] + [(code + GOOD, TEST) for code in cases.values()]
    cwd = os.getcwd()
    os.chdir(sentinel)
    try:
        t0 = time.perf_counter()
        run_many = sandbox.run_many if request.param == "programs" else sandbox.run_many_calls
        outcomes = run_many(jobs, LIMITS, workers=4)
        total = time.perf_counter() - t0
    finally:
        os.chdir(cwd)
    return {"outcomes": dict(zip(names, outcomes)), "sentinel": sentinel, "before": before,
            "total_s": total, "accepted": listener[1]}


def test_control_passes(fuzz):
    o = fuzz["outcomes"]["control"]
    assert o.passed == (True,) and o.status == "done" and o.share == 1.0


@pytest.mark.parametrize("name", list(hostile(Path("/x"), 1)))
def test_hostile_completion_scores_zero_within_its_limit(fuzz, name):
    o = fuzz["outcomes"][name]
    assert o.passed == (False,) and o.share == 0.0, (name, o)
    assert o.wall_s < LIMITS.wall_s + 1.0, (name, o.wall_s)
    assert _alive_in_session(o.pid) == [], f"{name} left processes behind"


def test_nothing_outside_changed_and_trainer_carries_on(fuzz):
    assert _snapshot(fuzz["sentinel"]) == fuzz["before"]
    assert fuzz["accepted"] == []  # no completion reached the loopback listener
    assert fuzz["total_s"] < 15, fuzz["total_s"]
    assert sandbox.run(GOOD, TEST, LIMITS).passed == (True,)  # this process is still whole


def test_exit_and_timeouts_fail_only_their_program():
    tests = ["assert f(1) == 2", "assert f(1) == 3", "while True: pass",
             "import sys; sys.exit(0)", "assert f(2) == 3"]
    o = sandbox.run(GOOD, tests, LIMITS)
    assert o.passed == (True, False, False, False, True) and o.status == "done"
    assert o.errors[2] == "timeout" and o.errors[3].startswith("SystemExit")
    # os._exit ends the child: its program and the ones after it have no report
    o = sandbox.run(GOOD, ["assert f(1) == 2", "import os; os._exit(0)", "assert f(2) == 3"],
                    LIMITS)
    assert o.passed == (True, False, False) and o.status == "died"


def test_a_program_cannot_change_how_later_ones_run_or_are_reported():
    """The loop's exec, os.write and timer are captured before any program runs."""
    tests = ["import builtins; builtins.exec = lambda *a, **k: None", "assert False",
             "import os; w = os.write\nos.write = lambda fd, b: w(fd, b.replace(b' 0 ', b' 1 '))",
             "assert False", "assert f(1) == 2"]
    o = sandbox.run(GOOD, tests, LIMITS)
    assert o.passed == (True, False, True, False, True) and o.status == "done", o


def test_a_deep_tree_is_removed_and_the_caller_carries_on():
    """shutil.rmtree recurses: 3000 nested directories made it raise RecursionError in the
    trainer; the directory is removed all the same."""
    deep = ("import os\nos.mkdir('a')\nfor i in range(3000):\n    os.mkdir('n')\n"
            "    os.rename('a', 'n/a')\n    os.rename('n', 'a')\n")
    o = sandbox.run(deep + GOOD, TEST, sandbox.Limits(wall_s=10.0, program_s=8.0, cpu_s=10,
                                                     isolation=ISOLATION))
    assert o.passed == (True,), o.errors


def test_ordinary_programs_still_run_under_the_guard():
    """What solutions use: the standard library (namedtuple, enum, typing and logging ask for
    frames and fall back), files and temporary directories inside the sandbox, pathlib."""
    program = ("import collections, enum, logging, math, re, tempfile, typing, pathlib, os\n"
               "P = collections.namedtuple('P', 'x y')\nT = typing.TypeVar('T')\n"
               "E = enum.Enum('E', 'a b')\nlogging.getLogger('x').warning('w')\n"
               "with tempfile.TemporaryDirectory() as d:\n    open(d + '/f', 'w').write('1')\n"
               "with tempfile.TemporaryFile() as t:\n    t.write(b'x')\n"
               "pathlib.Path('p').mkdir()\n(pathlib.Path('p') / 'q').write_text('z')\n"
               "assert open('p/q').read() == 'z' and math.gcd(4, 6) == 2 and re.match('a', 'a')\n"
               "os.remove('p/q')\nos.rmdir('p')\n")
    o = sandbox.run(GOOD, [program], LIMITS)
    assert o.passed == (True,), o.errors


def test_fresh_directory_minimal_env_and_only_stdio(monkeypatch, tmp_path):
    monkeypatch.setenv("D1JAX_TRAINER_SECRET", "x")
    leaked = open(tmp_path / "held", "w")  # an open fd of the trainer
    try:
        probe = ("import os\n"
                 "assert os.listdir('.') == [], os.listdir('.')\n"
                 "assert 'D1JAX_TRAINER_SECRET' not in os.environ\n"
                 "assert set(os.environ) <= {'PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_ALL', 'PWD'}\n"
                 "def is_open(fd):\n    try:\n        os.fstat(fd)\n    except OSError:\n"
                 "        return False\n    return True\n"
                 # 0-2 -> /dev/null and the result channel
                 "fds = [fd for fd in range(256) if is_open(fd)]\n"
                 "assert len(fds) <= 4, fds\n"
                 "assert os.path.realpath(os.getcwd()) == os.path.realpath(os.environ['HOME'])\n")
        o = sandbox.run(probe, ["pass"], LIMITS)
    finally:
        leaked.close()
    assert o.passed == (True,), o.errors


# ------------------------------------------------- the OS-level layers, audit hook off


RAW = sandbox.Limits(wall_s=1.5, program_s=1.0, cpu_s=2, memory_mb=256, python_guard=False,
                     isolation=ISOLATION)


def test_process_group_is_killed_without_the_python_guard():
    """Children that ignore SIGTERM and outlive the alarm die with the group at wall_s
    (under root RLIMIT_NPROC does not stop the forks; as a user it does: then none start)."""
    code = ("import os, signal, time\nfor _ in range(3):\n"
            "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n        time.sleep(60)\n"
            "signal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(60)\n")
    o = sandbox.run(code, ["pass"], RAW)
    assert o.status == "timeout" and o.passed == (False,)
    assert o.wall_s < RAW.wall_s + 1.0
    time.sleep(0.1)
    assert _alive_in_session(o.pid) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root is exempt from RLIMIT_NPROC")
def test_nproc_stops_fork_for_a_user():
    o = sandbox.run("import os\nos.fork()\n", ["pass"], RAW)
    assert o.passed == (False,) and "BlockingIOError" in o.errors[0]


def test_memory_limit_holds_without_the_python_guard():
    o = sandbox.run("x = bytearray(10 * 1024 ** 3)\n", ["pass"], RAW)
    assert o.passed == (False,) and o.errors[0].startswith("MemoryError")


def test_network_namespace_without_the_python_guard(listener):
    port, accepted = listener
    o = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
                    ["pass"], RAW)
    if o.network != "netns":
        pytest.skip(f"no network namespace here ({o.network}): the audit hook alone refuses sockets")
    assert o.passed == (False,) and accepted == []
    assert "OSError" in o.errors[0] or "Error" in o.errors[0]


def test_limits_are_checked():
    with pytest.raises(ValueError, match="out of range"):
        sandbox.Limits(wall_s=0)
