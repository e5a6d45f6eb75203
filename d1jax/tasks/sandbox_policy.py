"""The in-process guard's policy tables (``sandbox_guard.install_guard`` reads them).

Loaded by ``sandbox_child.py`` before any program runs, never by the trainer; plain data only.
docs/evaluation.md ("The code sandbox") lists what each table refuses and why.
"""

import os

# Audit events refused outright (the docs' table of CPython's events names each).
REFUSED = frozenset((
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
FRAME_EVENTS = frozenset(("sys._getframe",))
# Attributes that hand out frames (audited as object.__getattr__).
FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
SOCKET_EVENTS = frozenset(("socket.__new__", "socket.connect", "socket.bind",
                            "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                            "socket.gethostbyname", "socket.gethostbyaddr"))
# Imports refused: ctypes and kin, and a fresh load of the modules the guard replaces parts
# of (``del sys.modules[...]`` then ``import`` would bring back the originals).
# Then: sub-interpreters (no hook of ours); shm_open("..") (a /dev directory fd), semaphores;
# unaudited file reads and writes (sqlite ATTACH/VACUUM INTO, readline's history, kin);
# faulthandler (it prints the harness's file and lines).
REFUSED_IMPORTS = frozenset((
    "_ctypes", "ctypes", "_posixsubprocess", "cffi", "_cffi_backend", "_thread", "_signal",
    "_imp", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels",
    "_interpqueues", "_posixshmem", "_multiprocessing", "_sqlite3", "sqlite3", "readline",
    "_curses", "_curses_panel", "_tkinter", "nis", "spwd", "syslog", "ossaudiodev", "termios",
    "_dbm", "_gdbm", "dbm", "pwd", "grp", "faulthandler"))
# Modules that reach memory or processes with no audit event: if any was imported before the
# guard, every name it has in sys.modules is cleared (the guard keeps _thread, _signal, _imp,
# whose dangerous functions it replaces).
PURGED = frozenset(("_ctypes", "ctypes", "_posixsubprocess", "cffi", "_cffi_backend",
                    "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_posixshmem",
                    "_multiprocessing", "_sqlite3", "sqlite3", "readline"))
# Extension modules (lib-dynload) programs may load: an allow-list, since an extension's C
# functions raise no audit event unless CPython wrote one (sqlite, readline, shm_open,
# sub-interpreters were found that way). What solutions use: numbers, text, hashing,
# compression, data formats, dates.
EXTENSIONS = frozenset((
    "_bisect", "_blake2", "_bz2", "_codecs_cn", "_codecs_hk", "_codecs_iso2022", "_codecs_jp",
    "_codecs_kr", "_codecs_tw", "_contextvars", "_csv", "_datetime", "_decimal",
    "_elementtree", "_hashlib", "_heapq", "_json", "_lzma", "_md5", "_multibytecodec",
    "_opcode", "_pickle", "_queue", "_random", "_sha1", "_sha256", "_sha3", "_sha512",
    "_statistics", "_struct", "_typing", "_uuid", "_zoneinfo", "array", "binascii", "cmath",
    "math", "pyexpat", "select", "unicodedata", "zlib"))
# CPython's test and example extension modules (sub-interpreters, raw code objects, file
# reads and writes, threads, none audited): refused by prefix.
REFUSED_PREFIXES = ("_test", "_xx", "xx", "_ctypes_test")
# Imported before the guard, from their .pyc, for the programs: after it, modules compile from
# source (no .pyc: marshal is refused), which costs each child a few ms more per module.
PRELOAD = ("json", "typing", "re", "collections", "itertools", "functools", "math", "heapq",
            "bisect", "string", "operator", "copy", "random", "fractions", "decimal", "statistics",
            "datetime", "hashlib", "enum", "dataclasses", "tempfile", "shutil", "struct",
            "array", "textwrap", "unicodedata", "contextlib")
# Function attributes that would let a program rewrite the child's own functions (its signal
# handler, say) with its code (audited as object.__setattr__; __defaults__ stays settable:
# collections.namedtuple sets it).
FUNCTION_ATTRS = frozenset(("__code__",))
# Module functions with no audit event that act on other processes, make device or fifo
# nodes, or read what a listing or link holds: replaced by refusals (``os`` and ``posix``
# share the function objects; ``_imp.create_builtin`` refuses a fresh copy of the modules).
NO_EVENT = {"posix": ("mkfifo", "mknod", "pidfd_open", "setpriority", "sched_setaffinity",
                       "sched_setscheduler", "sched_setparam", "setns", "unshare", "setsid",
                       "setpgid", "setpgrp", "dup2"),
             # the alarm is the child's: a program that disarmed or blocked it kept running
             "_signal": ("pidfd_send_signal", "signal", "setitimer", "alarm",
                         "pthread_sigmask", "siginterrupt", "set_wakeup_fd"),
             # DEBUG_SAVEALL keeps dead frames (the harness's) in gc.garbage
             "gc": ("set_debug",)}
# Where else a module's functions are reachable under another name (``os`` shares posix's).
ALIASES = {"posix": "os", "_signal": "signal", "gc": "gc"}
# Events whose fd argument is refused (the file behind an fd may lie outside: a read-only fd
# of a standard-library file, or /dev/null): metadata changes need a path inside.
NO_FD = frozenset(("os.chmod", "os.chown", "os.utime", "os.setxattr", "os.removexattr"))
# Listings and link reads: their path must be readable under the read policy.
LISTING = frozenset(("os.listdir", "os.scandir", "os.listxattr", "os.getxattr"))
# Events whose path arguments must lie inside the sandbox directory: event -> (positions of
# the paths, positions of dir_fd arguments, which must be absent: None or -1).
PATH_ARGS = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)),
              "os.rename": ((0, 1), (2, 3)), "os.mkdir": ((0,), (2,)),
              "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.link": ((0, 1), (2, 3)),
              "os.truncate": ((0,), ()), "os.utime": ((0,), (3,)),
              "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()),
              "shutil.rmtree": ((0,), (1,))}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Files outside the directory and the standard library that programs may open (read).
READABLE = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/etc/localtime",
             "/usr/share/zoneinfo")
