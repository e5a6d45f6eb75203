"""The in-process guard of ``sandbox_child.py``: a PEP 578 audit hook and refusals put in
place of the functions CPython does not audit. ``P`` is the policy (``sandbox_policy.py``).

Loaded by the child before any program runs, never by the trainer. It is the second layer:
the wall is the operating system's (``sandbox_os.py``), and verdicts are decided outside the
process that runs model code (``sandbox_judge.py``).
"""

import os
import sys


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


def install_guard(root: str, network: bool, P) -> None:
    """Installs the audit hook. Programs share this interpreter and may rebind anything a
    module or ``builtins`` holds, so the hook reads only what it captured here: the policy,
    the C functions it calls (``os.lstat``, ``os.readlink``, ``os.getcwd``, ``os.fspath``)
    and the builtins it uses; paths are resolved by its own loop, not ``os.path``'s Python.
    Writes must land in ``root``; reads in ``root``, the standard library (``sys.path``: this
    child runs ``-I -S``) or ``P.READABLE``; only ``root``'s directories are opened (the open
    event does not show ``dir_fd=``: with the cwd fixed and no symlinks, a path relative to
    one of them resolves where the hook resolved it, or deeper)."""
    refused, frame_events, frame_attrs = P.REFUSED, P.FRAME_EVENTS, P.FRAME_ATTRS
    sockets, refused_imports, path_args = P.SOCKET_EVENTS, P.REFUSED_IMPORTS, P.PATH_ARGS
    function_attrs, no_fd, listing = P.FUNCTION_ATTRS, P.NO_FD, P.LISTING
    refused_prefixes, extensions = P.REFUSED_PREFIXES, P.EXTENSIONS
    import _imp
    real_create_builtin, create_event = _imp.create_builtin, _CREATE_EVENT
    module_spec = sys.modules["_frozen_importlib"].ModuleSpec
    list_ = list
    write_flags, str_, bytes_, int_, len_ = P.WRITE_FLAGS, str, bytes, int, len
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
    readable_files = tuple(resolve(p) for p in P.READABLE)

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

    # A module imported before the guard stays reachable under every name it has in
    # sys.modules (ctypes' submodules hold ctypes' functions): each one off the policy goes.
    for name in list(sys.modules):
        top = name.partition(".")[0]
        if top in P.PURGED or top.startswith(P.REFUSED_PREFIXES):
            sys.modules[name] = None  # comes back as ImportError
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
    import gc
    for module_name, names in P.NO_EVENT.items():
        for name in names:
            if hasattr(sys.modules[module_name], name):
                refuse = refusal(name)
                for module in (sys.modules[module_name], sys.modules[P.ALIASES[module_name]]):
                    setattr(module, name, refuse)
    os.readlink = posix.readlink = _no_readlink
    # After the preloads: later imports compile from source (no .pyc, no marshal.loads).
    for name in P.PRELOAD:
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
