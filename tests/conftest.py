"""Test setup: 8 fake CPU devices (for sharding tests) and shared tiny fixtures."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

# One persistent compilation cache for the session, in a fresh temporary folder: the many
# `python -m d1jax.main` subprocesses (test_faults, test_multihost, test_train, ...) and the
# in-process runs (test_train_objectives' resumes) compile the same tiny programs, and each
# cold start or new jit compiled them all again (docs/testing.md, "Suite time"). Set before
# JAX is imported, so this process reads it too; subprocesses inherit the environment.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _XLA_CACHE = tempfile.mkdtemp(prefix="d1jax-tests-xla-")
    atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_XLA_CACHE,
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

import jax  # noqa: E402
import pytest  # noqa: E402

import d1jax  # noqa: E402

SHARED_D1 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "d1"
if SHARED_D1.is_dir():  # loaders read d1's files from here instead of downloading them
    os.environ.setdefault("D1JAX_DATA_DIR", str(SHARED_D1))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops the in-memory compiled programs after each test file (a later file reads them
    back from the persistent cache): the suite's one process otherwise holds every program
    of its 780 tests (a full run once aborted in XLA while writing a cache entry at the
    58th percent, which no file alone or subset reproduced)."""
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
    return d1jax.init_params(tiny_model, jax.random.key(0))


@pytest.fixture
def shared_d1():
    """d1's official data in ../shared/data/d1 (never committed into the project)."""
    if not SHARED_D1.is_dir():
        pytest.skip(f"d1 data folder {SHARED_D1} is absent (it sits beside the repo in CI)")
    return SHARED_D1


@pytest.fixture(scope="session")
def learnable_reference(tmp_path_factory):
    """The uninterrupted GRPO run of tests/learnable.py's task (30 steps, 8 devices) through
    ``python -m d1jax.main``, run once a session: test_faults resumes runs to equal it bit for
    bit and test_multihost finishes a 2-process run to match it. Never changed: a test that
    alters a run copies it first."""
    import subprocess
    import sys

    from tests import learnable
    wd = tmp_path_factory.mktemp("learnable_reference")
    env = {k: v for k, v in os.environ.items() if not k.startswith("D1JAX_PROCESS")}
    r = subprocess.run([sys.executable, "-c", learnable.MAIN, *learnable.MAIN_FLAGS,
                        f"--workdir={wd}"], cwd=Path(__file__).resolve().parents[1],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    return wd
