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
4. installs the guard (``install_guard``; docs/evaluation.md, "The code sandbox").

Each program then runs in a fresh namespace under a per-program alarm; after it returns the
child writes ``<nonce> <i> 1`` or ``<nonce> <i> 0 <error>``, finally ``<nonce> done``. A
program that ends the process (``os._exit``, a signal, an rlimit kill; ``sys.exit`` is
caught) leaves no line: the parent counts it as failed.
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
    "sys.remote_exec", "pty.spawn", "os.startfile",
    # fixed cwd, no symlinks: a sandbox directory fd resolves a relative path as the hook does
    "os.chdir", "os.symlink",
    # the child's frames, objects, memory (they hold the result channel); fcntl could clear
    # the channel's O_APPEND; a sub-interpreter has no hook; marshal's code corrupts memory
    "sys.settrace", "sys.setprofile", "sys._current_frames", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "fcntl.ioctl", "fcntl.fcntl",
    "cpython.PyInterpreterState_New", "marshal.loads", "marshal.load"))
# sys._getframe is refused with ValueError, what the standard library catches where frames
# are optional (collections.namedtuple, enum, typing, logging: the caller's module name).
_FRAME_EVENTS = frozenset(("sys._getframe",))
# Attributes that hand out frames (audited as object.__getattr__).
_FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
_SOCKET_EVENTS = frozenset(("socket.__new__", "socket.connect", "socket.bind",
                            "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                            "socket.gethostbyname", "socket.gethostbyaddr"))
# Imports refused: ctypes and kin, and a fresh load of the modules the guard replaces parts
# of (``del sys.modules[...]`` then ``import`` would bring back the originals).
# Then: sub-interpreters (no hook of ours); shm_open("..") (a /dev directory fd), semaphores;
# unaudited file reads and writes (sqlite ATTACH/VACUUM INTO, readline's history, kin);
# faulthandler (it prints the harness's file and lines).
_REFUSED_IMPORTS = frozenset((
    "_ctypes", "ctypes", "_posixsubprocess", "cffi", "_cffi_backend", "_thread", "_signal",
    "_imp", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels",
    "_interpqueues", "_posixshmem", "_multiprocessing", "_sqlite3", "sqlite3", "readline",
    "_curses", "_curses_panel", "_tkinter", "nis", "spwd", "syslog", "ossaudiodev", "termios",
    "_dbm", "_gdbm", "dbm", "pwd", "grp", "faulthandler"))
# Extension modules (lib-dynload) programs may load: an allow-list, since an extension's C
# functions raise no audit event unless CPython wrote one (sqlite, readline, shm_open,
# sub-interpreters were found that way). What solutions use: numbers, text, hashing,
# compression, data formats, dates.
_EXTENSIONS = frozenset((
    "_bisect", "_blake2", "_bz2", "_codecs_cn", "_codecs_hk", "_codecs_iso2022", "_codecs_jp",
    "_codecs_kr", "_codecs_tw", "_contextvars", "_csv", "_datetime", "_decimal",
    "_elementtree", "_hashlib", "_heapq", "_json", "_lzma", "_md5", "_multibytecodec",
    "_opcode", "_pickle", "_queue", "_random", "_sha1", "_sha256", "_sha3", "_sha512",
    "_statistics", "_struct", "_typing", "_uuid", "_zoneinfo", "array", "binascii", "cmath",
    "math", "pyexpat", "select", "unicodedata", "zlib"))
# CPython's test and example extension modules (sub-interpreters, raw code objects, file
# reads and writes, threads, none audited): refused by prefix.
_REFUSED_PREFIXES = ("_test", "_xx", "xx", "_ctypes_test")
# Imported before the guard, from their .pyc, for the programs: after it, modules compile from
# source (no .pyc: marshal is refused), which costs each child a few ms more per module.
_PRELOAD = ("typing", "re", "collections", "itertools", "functools", "math", "heapq", "bisect",
            "string", "operator", "copy", "random", "fractions", "decimal", "statistics",
            "datetime", "hashlib", "enum", "dataclasses", "tempfile", "shutil", "struct",
            "array", "textwrap", "unicodedata", "contextlib")
# Function attributes that would let a program rewrite the child's own functions (its signal
# handler, say) with its code (audited as object.__setattr__; __defaults__ stays settable:
# collections.namedtuple sets it).
_FUNCTION_ATTRS = frozenset(("__code__",))
# Module functions with no audit event that act on other processes, make device or fifo
# nodes, or read what a listing or link holds: replaced by refusals (``os`` and ``posix``
# share the function objects; ``_imp.create_builtin`` refuses a fresh copy of the modules).
_NO_EVENT = {"posix": ("mkfifo", "mknod", "pidfd_open", "setpriority", "sched_setaffinity",
                       "sched_setscheduler", "sched_setparam", "setns", "unshare", "setsid",
                       "setpgid", "setpgrp"),
             "_signal": ("pidfd_send_signal", "signal")}
# Events whose fd argument is refused (the file behind an fd may lie outside: a read-only fd
# of a standard-library file, or /dev/null): metadata changes need a path inside.
_NO_FD = frozenset(("os.chmod", "os.chown", "os.utime", "os.setxattr", "os.removexattr"))
# Listings and link reads: their path must be readable under the read policy.
_LISTING = frozenset(("os.listdir", "os.scandir", "os.listxattr", "os.getxattr"))
# Events whose path arguments must lie inside the sandbox directory: event -> (positions of
# the paths, positions of dir_fd arguments, which must be absent: None or -1).
_PATH_ARGS = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)),
              "os.rename": ((0, 1), (2, 3)), "os.mkdir": ((0,), (2,)),
              "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.link": ((0, 1), (2, 3)),
              "os.truncate": ((0,), ()), "os.utime": ((0,), (3,)),
              "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()),
              "shutil.rmtree": ((0,), (1,))}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Files outside the directory and the standard library that programs may open (read).
_READABLE = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/etc/localtime",
             "/usr/share/zoneinfo")


_CREATE_EVENT = "d1jax.sandbox.create_builtin"


def _create_builtin(spec):
    """``_imp.create_builtin`` once the guard is on: the hook checks the name and makes the
    module. No closure: nothing a program can reach holds the real function."""
    box = []
    sys.audit(_CREATE_EVENT, spec, box)
    if not box:
        raise PermissionError("sandbox: create_builtin refused")
    return box[0]


def _no_threads(*args, **kwargs):
    raise PermissionError("sandbox: threads are not allowed")


def _no_readlink(*args, **kwargs):
    raise PermissionError("sandbox: readlink is not allowed (no symlinks inside; none read "
                          "outside)")


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
    """Installs the audit hook. Programs share this interpreter and may rebind anything a
    module or ``builtins`` holds, so the hook reads only what it captured here: the policy,
    the C functions it calls (``os.lstat``, ``os.readlink``, ``os.getcwd``, ``os.fspath``)
    and the builtins it uses; paths are resolved by its own loop, not ``os.path``'s Python.
    Writes must land in ``root``; reads in ``root``, the standard library (``sys.path``: this
    child runs ``-I -S``) or ``_READABLE``; only ``root``'s directories are opened (the open
    event does not show ``dir_fd=``: with the cwd fixed and no symlinks, a path relative to
    one of them resolves where the hook resolved it, or deeper)."""
    refused, frame_events, frame_attrs = _REFUSED, _FRAME_EVENTS, _FRAME_ATTRS
    sockets, refused_imports, path_args = _SOCKET_EVENTS, _REFUSED_IMPORTS, _PATH_ARGS
    function_attrs, no_fd, listing = _FUNCTION_ATTRS, _NO_FD, _LISTING
    refused_prefixes, extensions = _REFUSED_PREFIXES, _EXTENSIONS
    import _imp
    real_create_builtin, create_event = _imp.create_builtin, _CREATE_EVENT
    module_spec = sys.modules["_frozen_importlib"].ModuleSpec
    list_ = list
    write_flags, str_, bytes_, int_, len_ = _WRITE_FLAGS, str, bytes, int, len
    type_, os_error, perm_error, value_error = type, OSError, PermissionError, ValueError
    lstat, readlink, getcwd = os.lstat, os.readlink, os.getcwd
    link_mode, dir_mode, fmt = 0o120000, 0o040000, 0o170000

    def resolve(path: str) -> str:
        """The absolute path with every symlink that exists resolved (os.path.realpath)."""
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        todo, done, hops = [p for p in path.split("/") if p and p != "."], [], 0
        while todo:
            name = todo.pop(0)
            if name == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join(done + [name])
            try:
                mode = lstat(here).st_mode
            except os_error:
                done.append(name)
                continue
            if mode & fmt == link_mode:
                hops += 1
                if hops > 40:
                    raise value_error("too many symlinks")
                target = readlink(here)
                if target.startswith("/"):
                    done = []
                todo = [p for p in target.split("/") if p and p != "."] + todo
                continue
            done.append(name)
        return "/" + "/".join(done)

    def under(p: str, top: str) -> bool:
        return p == top or p.startswith(top + "/")

    real_root = resolve(root)
    stdlib = tuple(resolve(p) for p in sys.path if p)
    dynload = tuple(p for p in stdlib if str_.endswith(p, "/lib-dynload"))
    readable_files = tuple(resolve(p) for p in _READABLE)

    def as_str(path):
        """The path's text; None for an int (an open fd: admitted when it was opened). Only
        str and bytes are read: a path object's __fspath__ is the program's code, and could
        answer the hook one path and the open another."""
        if type_(path) is int_:
            return None
        if type_(path) is bytes_:
            return path.decode("utf-8", "surrogateescape")
        if type_(path) is str_:
            return path
        raise value_error("not a str or bytes path")

    def inside(path) -> bool:
        try:
            text = as_str(path)
            return text is None or under(resolve(text), real_root)
        except (TypeError, value_error, os_error):
            return False

    def opened_ok(path, writes: bool) -> bool:
        try:
            text = as_str(path)
            if text is None:
                return True
            p = resolve(text)
            if p == "/dev/null":
                return True
            try:
                if lstat(p).st_mode & fmt == dir_mode:  # a directory fd: only the sandbox's
                    return under(p, real_root)
            except os_error:
                pass
            if under(p, real_root):
                return True
            return not writes and (in_stdlib(p) or any_under(p, readable_files))
        except (TypeError, value_error, os_error):
            return False

    def readable(path) -> bool:
        """A path (or an fd: only of this directory's) the program may read or list."""
        try:
            if path is None:  # os.listdir(): the cwd
                path = "."
            if type_(path) is int_:
                return under(readlink(f"/proc/self/fd/{path}"), real_root)
            p = resolve(as_str(path))
            return under(p, real_root) or (in_stdlib(p)) or any_under(p, readable_files)
        except (TypeError, value_error, os_error):
            return False

    def in_stdlib(p: str) -> bool:
        """Under a standard-library root, but not in its site-packages (a pyenv or venv
        interpreter keeps the installed packages there)."""
        return any_under(p, stdlib) and "/site-packages" not in p and "/dist-packages" not in p

    def extension_ok(name, path) -> bool:
        """An allow-listed name, loaded from its own file in the standard library's
        lib-dynload (a program may write a .so into its directory, or find one elsewhere)."""
        try:
            p = resolve(as_str(path))
        except (TypeError, value_error, os_error):
            return False
        if type_(name) is not str_ or name not in extensions or not any_under(p, dynload):
            return False
        base = str_.rpartition(p, "/")[2]
        return str_.partition(base, ".")[0] == name

    def any_under(p: str, tops: tuple) -> bool:
        for top in tops:
            if under(p, top):
                return True
        return False

    def shown(path) -> str:
        return repr(path) if type_(path) in (str_, bytes_, int_) else type_(path).__name__

    def hook(event, args):  # calls only C functions: none of them raises an audit event
        if event == create_event:  # _create_builtin: the name read once, a spec of ours
            spec, box = args
            name = getattr(spec, "name", None)
            if type_(name) is not str_ or type_(box) is not list_:
                raise perm_error("sandbox: create_builtin of something else")
            top = str_.partition(name, ".")[0]
            if top in refused_imports or str_.startswith(top, refused_prefixes) or \
                    top == "posix":
                raise perm_error(f"sandbox: a fresh {name} is not allowed")
            list_.append(box, real_create_builtin(module_spec(name, None)))
            return
        if event in refused or event.startswith("ctypes."):
            raise perm_error(f"sandbox: {event} is not allowed")
        if event in frame_events:
            raise value_error(f"sandbox: {event} is not allowed")
        if event == "object.__getattr__" and len_(args) > 1 and args[1] in frame_attrs:
            raise perm_error(f"sandbox: {args[1]} is not allowed")
        if event == "object.__setattr__" and len_(args) > 1 and args[1] in function_attrs:
            raise perm_error(f"sandbox: setting {args[1]} is not allowed")
        if event in listing and len_(args) > 0 and not readable(args[0]):
            raise perm_error(f"sandbox: no listing of {shown(args[0])}")
        if not network and event in sockets:
            raise perm_error(f"sandbox: no network ({event})")
        if event == "import":
            top = str_.partition(args[0], ".")[0]
            if top in refused_imports or str_.startswith(top, refused_prefixes):
                raise perm_error(f"sandbox: import of {args[0]} is not allowed")
            if len_(args) > 1 and args[1] is not None:  # _imp.create_dynamic: a .so file
                if not extension_ok(args[0], args[1]):
                    raise perm_error(f"sandbox: extension module {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = ((type_(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode
                                                or "+" in mode))
                      or (type_(flags) is int_ and flags & write_flags))
            if not opened_ok(path, bool(writes)):
                raise perm_error(f"sandbox: no {'writes' if writes else 'reads'} of "
                                 f"{shown(path)} (outside its directory, or a directory)")
        elif event in path_args:
            paths, dir_fds = path_args[event]
            for i in dir_fds:
                if i < len_(args) and type_(args[i]) is int_ and args[i] != -1:
                    raise perm_error(f"sandbox: {event} with a dir_fd is not allowed")
            for i in paths:
                if i < len_(args) and event in no_fd and type_(args[i]) is int_:
                    raise perm_error(f"sandbox: {event} of an fd is not allowed")
                if i < len_(args) and not inside(args[i]):
                    raise perm_error(f"sandbox: {event} outside its directory "
                                     f"({shown(args[i])})")

    for name in ("_ctypes", "ctypes", "_posixsubprocess", "cffi", "_cffi_backend",
                 "_xxsubinterpreters", "_xxinterpchannels", "_interpreters"):
        sys.modules[name] = None  # already-imported modules come back as ImportError
    # CPython 3.11 has no audit event for new threads: replace the primitive that makes them
    # before ``threading`` (not imported yet) binds it. Threads would open a race between
    # the hook's path check and the open it admits. A signal handler receives the running
    # frame: programs keep the child's handlers.
    import _signal
    import _thread
    import signal

    import _imp
    import posix
    _thread.start_new_thread = _thread.start_new = _no_threads

    def refusal(name):  # its closure holds the name alone
        def refuse(*args, **kwargs):
            raise PermissionError(f"sandbox: {name} is not allowed")
        return refuse
    for module_name, names in _NO_EVENT.items():
        for name in names:
            if hasattr(sys.modules[module_name], name):
                refuse = refusal(name)
                for module in (sys.modules[module_name], os if module_name == "posix" else signal):
                    setattr(module, name, refuse)
    os.readlink = posix.readlink = _no_readlink
    # After the preloads: later imports compile from source (no .pyc, no marshal.loads).
    for name in _PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    sys.pycache_prefix = os.path.join(root, ".no-pycache")
    # A fresh copy of a builtin module (importlib's BuiltinImporter, no import event) would
    # bring the replaced functions back: _imp.create_builtin goes through the hook, which
    # alone holds the real one.
    _imp.create_builtin = _create_builtin
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

    # What the loop below calls, captured: programs may rebind builtins and module attributes.
    write, run, setitimer, timer, str_ = os.write, exec, signal.setitimer, signal.ITIMER_REAL, str
    base_exception, builtins_ = BaseException, __builtins__

    def report(line: str) -> None:
        write(out, f"{nonce} {line}\n".encode("utf-8", "replace"))

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
    os._exit(0)  # no atexit handlers of the programs


if __name__ == "__main__":
    main()
