"""The untrusted side of ``d1jax.tasks.sandbox``: the only process that runs model code.

Started as a script (``python -I -S -B sandbox_child.py MODE``), inside bubblewrap
(``sandbox_os.py``) or, as the explicit fallback, as a plain process in a fresh temporary
directory; never imported by the trainer; it loads only the standard library and its three
siblings (``sandbox_policy``, ``sandbox_guard``, ``sandbox_codec``), before any program runs.
It reads one JSON payload line on stdin (limits, module name; in ``programs`` mode also the
programs and a nonce), sets its rlimits (address space, CPU, file size, open files, no core,
NPROC 0), points fds 0-2 at /dev/null, installs the guard (``sandbox_guard.install_guard``)
and then

* ``serve`` (the default path, ``sandbox_judge.py`` on the other end): answers requests, one
  JSON line each: ``load`` a program into a fresh namespace, ``describe`` names of it, ``call``
  one of its functions with plain data. It decides nothing: the judge runs the tests, and a
  reply that is not plain data (``sandbox_codec``) fails the call;
* ``programs`` (tests that cannot be split, ``sandbox.run_programs``): runs each program under
  a per-program alarm and reports ``<nonce> <i> 1`` or ``<nonce> <i> 0 <error>``, then
  ``<nonce> done``, on the result channel (its stdout, an unlinked file of the parent's). A
  program that ends the process leaves no line: the parent counts it as failed. Before every
  report the channel is checked to be the same file (``os.dup2`` over it stopped reports).
"""

import os
import resource
import signal
import sys


class ProgramTimeout(BaseException):
    """Raised by the per-program alarm (a BaseException: ``except Exception`` misses it)."""


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


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200] or "failed"


def _siblings():
    """The policy, guard and codec modules, from this file's directory (``-I`` leaves it off
    sys.path: it is put there for these imports only, so the guard reads nothing of it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import sandbox_codec
        import sandbox_guard
        import sandbox_policy
    finally:
        sys.path.remove(here)
    for name in ("sandbox_codec", "sandbox_guard", "sandbox_policy"):
        del sys.modules[name]
    return sandbox_policy, sandbox_guard, sandbox_codec


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "programs"
    policy, guard, codec = _siblings()
    stdin = os.fdopen(os.dup(0), "rb")
    payload = codec.parse_line(stdin.readline(codec.MAX_LINE + 1))
    lim, module_name = payload["limits"], payload["module_name"]
    if mode != "serve":  # the payload is all it reads
        stdin.close()
    out = os.dup(1)  # the result channel (programs) or the reply pipe (serve)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    set_limits(lim)
    root = os.path.realpath(os.getcwd())

    def on_alarm(signum, frame):
        raise ProgramTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    if mode == "serve":
        serve(stdin, out, lim, module_name, root, policy, guard, codec)
    else:
        programs(payload, out, lim, module_name, root, policy, guard)
    os._exit(0)  # no atexit handlers of the programs


def _guarded(lim, root, policy, guard) -> None:
    if lim["python_guard"]:
        guard.install_guard(root, lim["network"], policy)


def programs(payload, out, lim, module_name, root, policy, guard) -> None:
    """Runs every program; reports each on the result channel (see the module docstring)."""
    nonce, todo = payload["nonce"], list(enumerate(payload["programs"]))
    del payload
    # What the loop calls, captured: programs may rebind builtins and module attributes.
    write, run, setitimer, timer, str_ = os.write, exec, signal.setitimer, signal.ITIMER_REAL, str
    fstat, exit_, base_exception, builtins_ = os.fstat, os._exit, BaseException, __builtins__
    channel = fstat(out)
    channel = (channel.st_dev, channel.st_ino)

    def report(line: str) -> None:
        now = fstat(out)
        if (now.st_dev, now.st_ino) != channel:  # fd replaced: the report would leak the nonce
            exit_(3)
        write(out, f"{nonce} {line}\n".encode("utf-8", "replace"))

    compiled = []
    for i, program in todo:
        try:
            compiled.append((i, compile(program, f"<program {i}>", "exec")))
        except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
            compiled.append((i, f"{type(e).__name__}: {e}"))
    del todo
    _guarded(lim, root, policy, guard)
    program_s = lim["program_s"]
    for i, code in compiled:
        if code.__class__ is str_:
            report(f"{i} 0 {_one_line(code)}")
            continue
        error = None
        setitimer(timer, program_s)
        try:
            run(code, {"__name__": module_name, "__builtins__": builtins_})
        except ProgramTimeout:
            error = "timeout"
        except base_exception as e:  # SystemExit and KeyboardInterrupt included: a fail
            error = f"{e.__class__.__name__}: {e}"
        finally:
            setitimer(timer, 0)
        report(f"{i} 1" if error is None else f"{i} 0 {_one_line(error)}")
    report("done")


def serve(stdin, out, lim, module_name, root, policy, guard, codec) -> None:
    """Answers the judge's requests until stdin closes (see the module docstring)."""
    write, run, setitimer, timer = os.write, exec, signal.setitimer, signal.ITIMER_REAL
    readline, base_exception, builtins_ = stdin.readline, BaseException, __builtins__
    encode, decode, dump_line, parse_line = codec.encode, codec.decode, codec.dump_line, \
        codec.parse_line
    max_line, not_plain, program_s = codec.MAX_LINE, codec.NotPlain, lim["program_s"]
    type_, dict_, str_, callable_, isinstance_ = type, dict, str, callable, isinstance
    module_type = type(sys)
    _guarded(lim, root, policy, guard)
    namespace = {}

    def describe(value):
        if type_(value) is module_type:
            return {"kind": "module", "name": value.__name__}
        if isinstance_(value, type_):
            return {"kind": "class"}
        if callable_(value):
            return {"kind": "call"}
        return {"kind": "data", "value": encode(value)}

    def answer(request):
        nonlocal namespace
        op = request.get("op")
        if op == "load":
            namespace = {"__name__": module_name, "__builtins__": builtins_}
            run(compile(request["program"], "<program>", "exec"), namespace)
            return {"ok": True}
        if op == "describe":
            return {"ok": True, "names": {n: describe(namespace[n]) if n in namespace
                                          else {"kind": "absent"} for n in request["names"]}}
        if op == "call":
            args, kwargs = decode(request["args"]), decode(request["kwargs"])
            return {"ok": True, "value": encode(namespace[request["name"]](*args, **kwargs))}
        raise ValueError(f"unknown op {op!r}")

    while True:
        line = readline(max_line + 1)
        if not line:
            return
        setitimer(timer, program_s)
        try:
            reply = answer(parse_line(line))
        except ProgramTimeout:
            reply = {"ok": False, "error": "timeout"}
        except not_plain as e:
            reply = {"ok": False, "error": f"not plain data: {e}"}
        except base_exception as e:  # the program's error, SystemExit included: a fail
            reply = {"ok": False, "error": type_(e).__name__}
            try:  # its text is the program's code (__str__): inside the alarm still
                reply["error"] = _one_line(f"{type_(e).__name__}: {e}")
            except base_exception:
                pass
        finally:
            setitimer(timer, 0)
        try:
            data = dump_line(reply)
        except base_exception:
            data = dump_line({"ok": False, "error": "reply not encodable"})
        write(out, data)


if __name__ == "__main__":
    main()
