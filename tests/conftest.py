"""Test setup: 8 fake CPU devices (for sharding tests) and shared tiny fixtures."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import atexit  # noqa: E402
import contextlib  # noqa: E402
import fcntl  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

# One folder for the session, made by the first process that loads this file (pytest, or
# pytest-xdist's controller before it starts its workers, which inherit the environment), and
# removed when that process exits. It holds:
# - the persistent compilation cache: the many `python -m d1jax.main` subprocesses
#   (test_faults, test_multihost, test_train, ...), the in-process runs and the xdist workers
#   compile the same tiny programs, and each cold start or new jit compiled them all again
#   (docs/testing.md, "Suite time"). Set before JAX is imported, so this process reads it too;
# - runs made once a session and shared by every worker (``session_shared``).
if "D1JAX_TEST_SESSION_DIR" not in os.environ:
    _SESSION = tempfile.mkdtemp(prefix="d1jax-tests-")
    atexit.register(shutil.rmtree, _SESSION, ignore_errors=True)
    os.environ["D1JAX_TEST_SESSION_DIR"] = _SESSION
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        os.environ.update(JAX_COMPILATION_CACHE_DIR=os.path.join(_SESSION, "xla-cache"),
                          JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
SESSION_DIR = Path(os.environ["D1JAX_TEST_SESSION_DIR"])

import jax  # noqa: E402
import pytest  # noqa: E402

# The programs the tests compile in this process are tiny: compiling them, not running them, is
# most of many files' time, and LLVM's optimizations are much of a CPU compile. A file that sets
# ``COMPILE_UNOPTIMIZED = True`` compiles without them (JAX's `jax_disable_most_optimizations`:
# XLA backend optimization level 0): a compile takes about 40% less CPU time, a step runs about
# twice as long, and results differ from an optimized program's in the last bits, so only
# files seen passing that way set it (docs/testing.md, "Suite time"; a bitwise comparison of
# two different programs, as test_sharding's born-sharded init makes, can fail unoptimized).
# The persistent cache keeps optimized and unoptimized programs apart (its key holds the compile
# options). The commands the tests start (`python -m d1jax.main`, benches) are compile-bound as
# well (a few steps, then a stop, a resume or an export), so they compile unoptimized too
# (JAX_DISABLE_MOST_OPTIMIZATIONS=1 in their environment: the files that start them run about
# 20% faster), except in the files that set ``COMMANDS_OPTIMIZED = True``: the runs that must
# learn within their steps (their rises were measured optimized, and their many steps would run
# slower) and every run of tests/learnable.py's task, which is compared bit for bit with the
# session's ``learnable_reference``. D1JAX_TEST_OPTIMIZE=1 compiles every program optimized.
OPTIMIZE_ALL = os.environ.get("D1JAX_TEST_OPTIMIZE") == "1"
COMMANDS_ENV = "JAX_DISABLE_MOST_OPTIMIZATIONS"

import d1jax  # noqa: E402

SHARED_D1 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "d1"
if SHARED_D1.is_dir():  # loaders read d1's files from here instead of downloading them
    os.environ.setdefault("D1JAX_DATA_DIR", str(SHARED_D1))


# The order pytest-xdist hands the files out in (`--dist loadfile`, pyproject's
# `--no-loadscope-reorder`): xdist's own, the files with the most tests first, except that the
# few long files with few tests, which that order hands out last (where a worker then runs one
# for minutes while the other has nothing left), start in the middle of the run. Handing out
# the longest files first was slower: the ones that start subprocesses then ran together and
# oversubscribed the two cores (docs/testing.md, "Suite time").
MID_RUN = ("test_train_code.py",)
MID_RUN_AT = 30  # files handed out before them


def pytest_collection_modifyitems(session, config, items):
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = sorted(files, key=lambda f: -len(files[f]))  # stable: xdist's reorder
    late = [f for f in order if f.rsplit("/", 1)[-1] in MID_RUN]
    order = [f for f in order if f not in late]
    order[MID_RUN_AT:MID_RUN_AT] = late
    items[:] = [item for f in order for item in files[f]]


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs(request):
    """Compiles the file's programs optimized or not (``COMPILE_UNOPTIMIZED``, above), and drops
    the in-memory compiled programs after it (a later file reads them back from the persistent
    cache): a pytest process otherwise holds every program of the files it ran (a full run
    once aborted in XLA while writing a cache entry at the 58th percent, which no file alone
    or subset reproduced)."""
    unoptimized = getattr(request.module, "COMPILE_UNOPTIMIZED", False) and not OPTIMIZE_ALL
    jax.config.update("jax_disable_most_optimizations", unoptimized)
    commands = getattr(request.module, "COMMANDS_OPTIMIZED", False) or OPTIMIZE_ALL
    os.environ[COMMANDS_ENV] = "0" if commands else "1"  # read by the commands it starts
    yield
    jax.clear_caches()


@pytest.fixture(scope="session")
def tiny_config():
    """Width-32 LLaDA with GQA (4 query heads, 2 kv heads), vocab 128."""
    return d1jax.preset("test-tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_config):
    return d1jax.LLaDA(tiny_config)


@pytest.fixture(scope="session")
def tiny_params(tiny_model):
    # Initialised optimized whichever file asks first: files compiled optimized compare it bit
    # for bit with parameters they initialise themselves (test_sharding's born-sharded init).
    from jax._src import compiler
    unoptimized = compiler._DISABLE_MOST_OPTIMIZATIONS.value
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        return d1jax.init_params(tiny_model, jax.random.key(0))
    finally:
        jax.config.update("jax_disable_most_optimizations", unoptimized)


@pytest.fixture
def shared_d1():
    """d1's official data in ../shared/data/d1 (never committed into the project)."""
    if not SHARED_D1.is_dir():
        pytest.skip(f"d1 data folder {SHARED_D1} is absent (it sits beside the repo in CI)")
    return SHARED_D1


@contextlib.contextmanager
def session_shared(name: str):
    """``(folder, done)`` for a run made once a session however many pytest-xdist workers ask
    for it: the first to enter (under a file lock) finds ``done`` False, makes the run in
    ``folder`` and returns; the others wait for it and find ``done`` True. A run that fails
    leaves ``done`` False, so the next one tries again (and fails the same way)."""
    folder, marker = SESSION_DIR / name, SESSION_DIR / f"{name}.done"
    with open(SESSION_DIR / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = marker.exists()
        if not done:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
        yield folder, done
        marker.touch()


@pytest.fixture(scope="session")
def learnable_reference():
    """The uninterrupted GRPO run of tests/learnable.py's task (30 steps, 8 devices) through
    ``python -m d1jax.main``, run once a session: test_faults resumes runs to equal it bit for
    bit and test_multihost finishes a 2-process run to match it. Never changed: a test that
    alters a run copies it first."""
    import subprocess
    import sys

    from tests import learnable
    with session_shared("learnable_reference") as (wd, done):
        if not done:
            env = {k: v for k, v in os.environ.items() if not k.startswith("D1JAX_PROCESS")}
            env[COMMANDS_ENV] = "0"  # as every other run of the task (COMMANDS_OPTIMIZED)
            r = subprocess.run([sys.executable, "-c", learnable.MAIN, *learnable.MAIN_FLAGS,
                                f"--workdir={wd}"], cwd=Path(__file__).resolve().parents[1],
                               capture_output=True, text=True, timeout=900, env=env)
            assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    return wd
