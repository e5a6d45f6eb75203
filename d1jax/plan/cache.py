"""What a plan compiled, kept for the next one.

A repeat plan reads each program's figures from here instead of compiling it again: the
key is the lowered program itself (its StableHLO, shardings included), the topology, the
jaxlib and libtpu versions, ``XLA_FLAGS`` / ``LIBTPU_INIT_ARGS`` and the planner's own
code that reads the compiled program, so any change to the config that reaches the
program, to the compiler or to the planner compiles again. XLA's executables also go to
JAX's persistent compilation cache (``<dir>/xla``) for the run itself to reuse: a
compile-only client writes those entries but cannot load them (no TPU to load them on),
hence the planner's own record.

Directory: ``--cache_dir`` of ``python -m d1jax.plan``, else ``$D1JAX_PLAN_CACHE``, else
``~/.cache/d1jax/plan``; "" or "off" plans without a cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import warnings
from pathlib import Path

ENV = "D1JAX_PLAN_CACHE"
DEFAULT_DIR = "~/.cache/d1jax/plan"
_OFF = ("", "off", "none")
# The planner code that turns a compiled program into figures: a change to it is a miss.
_CODE_FILES = ("cache.py", "compile.py", "hlo.py")
MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                 "temp_size_in_bytes", "generated_code_size_in_bytes")


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the planner reads of one compiled program; ``refused``: XLA refused the program
    for lack of HBM (``memory`` then holds, as temporaries, the total its message named;
    ``vocab_tensor_bytes`` is None)."""

    memory: dict  # MEMORY_FIELDS -> bytes per chip (memory_analysis)
    optimal_seconds: float  # cost_analysis()["optimal_seconds"], loop bodies once
    unpriced_calls: int  # custom calls libtpu's cost model books at -1 s
    vocab_tensor_bytes: int | None
    refused: bool = False


def cache_dir(value: str | None = None) -> Path | None:
    """The cache directory: ``value`` (a flag) if given, else $D1JAX_PLAN_CACHE, else
    ``~/.cache/d1jax/plan``; None when it is "" or "off"."""
    raw = os.environ.get(ENV, DEFAULT_DIR) if value is None else value
    return None if raw.strip().lower() in _OFF else Path(raw).expanduser()


def use_jax_cache(root: Path) -> None:
    """Send XLA's executables to JAX's persistent compilation cache under ``root/xla``
    (unless the process chose its own directory)."""
    import jax
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(root / "xla"))
        # Programs that took a second or more to compile, whatever their size (the
        # planner's own small host-side jits stay out).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # A compile-only client finds an entry but cannot load it; it then compiles, as wanted.
    warnings.filterwarnings("ignore", message=r"Error reading persistent compilation cache "
                            r"entry.*DeserializeLoadedExecutable")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def key(lowered, topology: str) -> str:
    """sha256 of everything the compiled figures depend on (module docstring)."""
    here = Path(__file__).parent
    parts = [lowered.as_text(), topology, _version("jaxlib"), _version("libtpu"),
             os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", "")]
    parts += [(here / name).read_text() for name in _CODE_FILES]
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def read(root: Path, name: str) -> Compiled | None:
    try:
        row = json.loads((root / "figures" / f"{name}.json").read_text())
        return Compiled(**row)
    except (OSError, ValueError, TypeError):
        return None  # absent, or written by another version: compile


def write(root: Path, name: str, compiled: Compiled) -> None:
    """Atomically (concurrent plans may write the same entry)."""
    folder = root / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{name}.{os.getpid()}.{id(compiled)}.tmp"
    tmp.write_text(json.dumps(dataclasses.asdict(compiled)))  # NaN kept as JSON's NaN
    os.replace(tmp, folder / f"{name}.json")
