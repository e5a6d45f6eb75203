"""The trusted side of a function-call test: decides pass or fail outside the untrusted process.

``sandbox.run_calls`` starts this file as ``python -I -S -B sandbox_judge.py`` (a process of
the trainer's user that never runs model code) with one JSON line on stdin: the program, its
tests, the limits, the module name and the command of the untrusted worker
(``sandbox_child.py serve``, inside bubblewrap by default). For each test it has the worker
load the program into a fresh namespace, binds every name the test reads but does not define
(nor a builtin) to what the program holds under that name (a function becomes a ``Remote``,
a proxy that sends plain-data arguments to the worker and receives plain data back; plain
data is copied; a module of ``MODULES`` is imported here; a class or anything else stays
unbound and the test fails), and runs the test here, with this process's builtins: every
comparison, ``__eq__`` included, is trusted code on trusted values. A test passes if it
returns within ``program_s``. One line per test goes to stdout: ``{"i", "ok", "error"}``.
"""

import builtins
import json
import os
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_codec as codec  # noqa: E402 - this file runs as a script
from sandbox_names import free_names  # noqa: E402

# Modules a test may read from the program's namespace (``math.isclose`` after the program's
# ``import math``): imported here instead, so only the standard library's own code runs.
MODULES = frozenset(("math", "cmath", "re", "string", "collections", "itertools", "functools",
                     "heapq", "bisect", "random", "statistics", "fractions", "decimal",
                     "operator", "copy", "datetime", "typing", "hashlib", "json"))


class Timeout(BaseException):
    """The test ran out of ``program_s`` (its own code or the worker's answer)."""


class RemoteError(Exception):
    """The worker's call failed, or its answer was not plain data."""


class Worker:
    """The untrusted process, talked to in JSON lines; started on first use, again after it
    died or was killed."""

    def __init__(self, payload: dict):
        self.cmd, self.cwd = payload["worker"], payload.get("cwd")
        self.seccomp = bytes.fromhex(payload.get("seccomp", ""))
        self.hello = codec.dump_line({"limits": payload["limits"],
                                      "module_name": payload["module_name"]})
        self.proc, self.buffer = None, b""

    def start(self) -> None:
        pass_fds, cmd = (), list(self.cmd)
        if self.seccomp:
            r, w = os.pipe()
            os.write(w, self.seccomp)
            os.close(w)
            pass_fds, cmd = (r,), [c.replace("{seccomp_fd}", str(r)) for c in cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": self.cwd or "/tmp", "TMPDIR": self.cwd or "/tmp",
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, pass_fds=pass_fds,
                                         cwd=self.cwd, env=env, bufsize=0)
        finally:
            for fd in pass_fds:
                os.close(fd)
        self.buffer = b""
        self._send(self.hello)

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a raw pipe may take part of it (a signal)
            view = view[os.write(self.proc.stdin.fileno(), view):]

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def request(self, message: dict, deadline: float) -> dict:
        try:
            if self.proc is None:
                self.start()
            self._send(codec.dump_line(message))
        except OSError:
            self.kill()
            raise RemoteError("the worker ended") from None
        return self._reply(deadline)

    def _reply(self, deadline: float) -> dict:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise Timeout()
            if len(self.buffer) > codec.MAX_LINE:
                self.kill()
                raise RemoteError("an answer too long")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self.kill()
                    raise RemoteError("the worker ended")
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            reply = codec.parse_line(line + b"\n")
        except codec.NotPlain as e:
            self.kill()
            raise RemoteError(str(e)) from None
        if reply.get("ok") is not True:
            error = reply.get("error")
            raise RemoteError(error[:200] if type(error) is str else "failed")
        return reply


class Remote:
    """A function of the program, called in the worker with plain data."""

    __slots__ = ("_name", "_worker", "_deadline")

    def __init__(self, name: str, worker: Worker, deadline: float):
        self._name, self._worker, self._deadline = name, worker, deadline

    def __call__(self, *args, **kwargs):
        try:
            message = {"op": "call", "name": self._name, "args": codec.encode(list(args)),
                       "kwargs": codec.encode(dict(kwargs))}
        except codec.NotPlain as e:
            raise RemoteError(f"argument {e}") from None
        reply = self._worker.request(message, self._deadline)
        try:
            return codec.decode(reply.get("value"))
        except codec.NotPlain as e:
            raise RemoteError(str(e)) from None

    def __repr__(self):
        return f"<remote function {self._name}>"


def bind(test: str, worker: Worker, deadline: float, module_name: str) -> dict:
    """The test's namespace: its free names bound to what the program holds (module docstring)."""
    names = free_names(test)
    namespace = {"__name__": module_name, "__builtins__": builtins}
    if not names:
        return namespace
    described = worker.request({"op": "describe", "names": names}, deadline).get("names")
    if type(described) is not dict:
        raise RemoteError("a description that is not a dict")
    for name in names:
        info = described.get(name)
        kind = info.get("kind") if type(info) is dict else None
        if kind == "call":
            namespace[name] = Remote(name, worker, deadline)
        elif kind == "data":
            try:
                namespace[name] = codec.decode(info.get("value"))
            except codec.NotPlain as e:
                raise RemoteError(f"{name}: {e}") from None
        elif kind == "module" and info.get("name") in MODULES:
            namespace[name] = __import__(info["name"])
    return namespace


def run_test(i: int, test: str, program: str, worker: Worker, program_s: float,
             module_name: str) -> dict:
    deadline = time.monotonic() + program_s

    def on_alarm(signum, frame):
        raise Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, program_s + 0.05)
    try:
        code = compile(test, f"<test {i}>", "exec")
        worker.request({"op": "load", "program": program}, deadline)
        exec(code, bind(test, worker, deadline, module_name))  # noqa: S102 - trusted tests
        return {"i": i, "ok": True, "error": ""}
    except Timeout:
        worker.kill()
        return {"i": i, "ok": False, "error": "timeout"}
    except BaseException as e:  # the test failed (AssertionError, NameError, RemoteError...)
        return {"i": i, "ok": False, "error": " ".join(f"{type(e).__name__}: {e}".split())[:200]}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> None:
    payload = json.loads(sys.stdin.buffer.readline())
    worker = Worker(payload)
    program, lim = payload["program"], payload["limits"]
    try:
        for i, test in enumerate(payload["tests"]):
            result = run_test(i, test, program, worker, lim["program_s"], payload["module_name"])
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    finally:
        worker.kill()


if __name__ == "__main__":
    main()
