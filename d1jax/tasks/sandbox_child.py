"""The child side of ``d1jax.tasks.sandbox``: runs one completion's test programs.

``sandbox.run`` starts this file as a script (``python -I -S -B``) in a new session, in a
fresh temporary directory, with only stdio open; it is never imported by the trainer and
imports nothing but the standard library. The payload (JSON on stdin) holds the programs,
the limits and a random nonce. Before any program runs, the child

1. detaches from the network (``unshare(CLONE_NEWNET)`` as root, else
   ``CLONE_NEWUSER | CLONE_NEWNET``) where the kernel allows it;
2. sets its rlimits: address space, CPU seconds, file size, open files, no core files, and
   RLIMIT_NPROC 0 (enforced only for a non-root user: root is exempt);
3. points stdin, stdout and stderr at /dev/null and keeps the real stdout on a private fd,
   the result channel, where only lines that start with the nonce count;
4. installs an audit hook (PEP 578; it cannot be removed) that refuses process creation,
   signals to other processes, rlimit changes, threads, ctypes, sockets (unless allowed),
   code-object construction, and writes, deletions, renames and links outside its directory.

Each program then runs in a fresh namespace under a per-program alarm; after it returns the
child writes ``<nonce> <i> 1`` (passed) or ``<nonce> <i> 0 <error>`` and finally
``<nonce> done``. A program that ends the process (``sys.exit`` is caught; ``os._exit``,
a signal or an rlimit kill is not) leaves no line: the parent counts it as failed.
"""

import json
import os
import resource
import signal
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
# Audit events refused outright (the docs' table of CPython's events names each).
_REFUSED = frozenset((
    "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
    "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit",
    "resource.prlimit", "_thread.start_new_thread", "code.__new__", "os.chroot",
    "sys.remote_exec", "pty.spawn", "os.startfile"))
_SOCKET_EVENTS = frozenset(("socket.__new__", "socket.connect", "socket.bind",
                            "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                            "socket.gethostbyname", "socket.gethostbyaddr"))
_REFUSED_IMPORTS = frozenset(("_ctypes", "ctypes", "_posixsubprocess", "cffi", "_cffi_backend"))
# Events whose path arguments must lie inside the sandbox directory: event -> (positions of
# the paths, positions of dir_fd arguments, which must be absent: None or -1).
_PATH_ARGS = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)),
              "os.rename": ((0, 1), (2, 3)), "os.mkdir": ((0,), (2,)),
              "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.link": ((0, 1), (2, 3)),
              "os.symlink": ((1,), (2,)), "os.truncate": ((0,), ()), "os.utime": ((0,), (3,)),
              "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()),
              "shutil.rmtree": ((0,), (1,))}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class ProgramTimeout(BaseException):
    """Raised by the per-program alarm (a BaseException, so ``except Exception`` in the
    program does not swallow it)."""


def isolate_network() -> str:
    """'netns' if the process now has a network namespace of its own (no interfaces but a
    loopback that is down), else 'guard' (only the audit hook stands between it and the net)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
        return "netns" if libc.unshare(flags) == 0 else "guard"
    except (OSError, AttributeError, ImportError):
        return "guard"


def set_limits(lim: dict) -> None:
    mb = 1024 * 1024
    for which, value in ((resource.RLIMIT_AS, lim["memory_mb"] * mb),
                         (resource.RLIMIT_CPU, lim["cpu_s"]),
                         (resource.RLIMIT_FSIZE, lim["file_mb"] * mb),
                         (resource.RLIMIT_NOFILE, lim["open_files"]),
                         (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, 0)):
        hard = value + 1 if which == resource.RLIMIT_CPU else value  # SIGXCPU, then SIGKILL
        resource.setrlimit(which, (value, hard))


def install_guard(root: str, network: bool) -> None:
    inside = lambda p: p == root or p.startswith(root + os.sep)
    realpath = os.path.realpath
    busy = [False]

    def path_ok(path) -> bool:
        if isinstance(path, int):  # an open fd: its file was admitted when it was opened
            return True
        try:
            return inside(realpath(os.fsdecode(path)))
        except (TypeError, ValueError):
            return False

    def hook(event, args):
        if busy[0]:  # realpath's own calls
            return
        busy[0] = True
        try:
            if event in _REFUSED or event.startswith("ctypes."):
                raise PermissionError(f"sandbox: {event} is not allowed")
            if not network and event in _SOCKET_EVENTS:
                raise PermissionError(f"sandbox: no network ({event})")
            if event == "import" and args[0].partition(".")[0] in _REFUSED_IMPORTS:
                raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
            if event == "open":
                path, mode, flags = args
                writes = ((isinstance(mode, str) and any(c in mode for c in "wax+"))
                          or (isinstance(flags, int) and flags & _WRITE_FLAGS))
                if writes and not path_ok(path):
                    raise PermissionError(f"sandbox: no writes outside its directory ({path!r})")
            elif event in _PATH_ARGS:
                paths, dir_fds = _PATH_ARGS[event]
                if any(i < len(args) and args[i] not in (None, -1) for i in dir_fds):
                    raise PermissionError(f"sandbox: {event} with a dir_fd is not allowed")
                for i in paths:
                    if i < len(args) and not path_ok(args[i]):
                        raise PermissionError(f"sandbox: {event} outside its directory "
                                              f"({args[i]!r})")
        finally:
            busy[0] = False

    for name in _REFUSED_IMPORTS:  # already-imported modules come back as ImportError
        sys.modules[name] = None
    # CPython 3.11 has no audit event for new threads: replace the primitive that makes them
    # before ``threading`` (not imported yet) binds it. Threads would open a race between
    # the hook's path check and the open it admits.
    import _thread

    def no_threads(*args, **kwargs):
        raise PermissionError("sandbox: threads are not allowed")
    _thread.start_new_thread = _thread.start_new = no_threads
    sys.addaudithook(hook)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200] or "failed"


def main() -> None:
    payload = json.loads(sys.stdin.buffer.read())
    nonce, lim = payload["nonce"], payload["limits"]
    programs = list(enumerate(payload["programs"]))
    module_name = payload["module_name"]
    del payload
    root = os.path.realpath(os.getcwd())
    net = "allowed" if lim["network"] else isolate_network()
    out = os.dup(1)  # the result channel
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    set_limits(lim)

    def report(line: str) -> None:
        os.write(out, f"{nonce} {line}\n".encode("utf-8", "replace"))

    report(f"net {net}")
    compiled = []
    for i, program in programs:
        try:
            compiled.append((i, compile(program, f"<program {i}>", "exec")))
        except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
            compiled.append((i, f"{type(e).__name__}: {e}"))

    def on_alarm(signum, frame):
        raise ProgramTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    if lim["python_guard"]:
        install_guard(root, lim["network"])
    for i, code in compiled:
        if isinstance(code, str):
            report(f"{i} 0 {_one_line(code)}")
            continue
        error = None
        signal.setitimer(signal.ITIMER_REAL, lim["program_s"])
        try:
            exec(code, {"__name__": module_name, "__builtins__": __builtins__})
        except ProgramTimeout:
            error = "timeout"
        except BaseException as e:  # SystemExit and KeyboardInterrupt included: a fail
            error = f"{type(e).__name__}: {e}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        report(f"{i} 1" if error is None else f"{i} 0 {_one_line(error)}")
    report("done")
    os._exit(0)  # no atexit handlers of the programs


if __name__ == "__main__":
    main()
