"""Out of device memory: one line naming the program, the bytes and the knob that shrinks it.

XLA reports an allocation that does not fit, when a program compiles or while it runs, as a
``jax.errors.JaxRuntimeError`` (GPU: "RESOURCE_EXHAUSTED: Out of memory while trying to
allocate N bytes"; TPU: "Ran out of memory in memory space hbm ... Used X of Y hbm", at
compile time after "XLA:TPU compile permanent error"). ``named(program, hint)`` turns one
raised inside it into ``OutOfMemory``, whose message is the line the commands print with
exit status 1 (``d1jax.cli.user_errors``). The loops' ``finally`` closes the checkpointer
(a save in flight completes) and releases the workdir's lock on the way out, so the last
checkpoint stays and a rerun with the knob changed resumes from it.
"""

from __future__ import annotations

import contextlib
import re
from typing import Callable

import jax

# libtpu's two messages for a program that does not fit in HBM, each naming what the
# program needs per chip in all (arguments and outputs included) as "15.84G", "8.32T"
# (``oom_bytes``; the planner reads them too).
_LIBTPU = (re.compile(r"HLO temporaries \(([0-9.]+)([KMGTPE]?)i?B?\) exceeds available HBM"),
           re.compile(r"memory space hbm\. Used ([0-9.]+)([KMGTPE]?)i?B? of "))
# Other sizes in XLA's messages: the bytes XLA:GPU failed to allocate, libtpu's "Requires X,
# has Y available" (compile-time early abort) and "Attempting to allocate X" (run time); and
# the capacity half of libtpu's figures.
_NEEDED = (re.compile(r"allocat\w* (?:request for )?(\d+) ?(?:bytes|B)\b"),
           re.compile(r"Failed to allocate request for [0-9.]+\w* \((\d+)B\)"),
           re.compile(r"Requires ([0-9.]+)([KMGTPE]?)i?B?, has"),
           re.compile(r"Attempting to allocate ([0-9.]+)([KMGTPE]?)i?B?\."))
_CAPACITY = (re.compile(r" of ([0-9.]+)([KMGTPE]?)i?B? hbm"),
             re.compile(r"has ([0-9.]+)([KMGTPE]?)i?B? available"),
             re.compile(r"exceeds available HBM \(([0-9.]+)([KMGTPE]?)i?B?\)"))
_GIB = 2 ** 30


class OutOfMemory(RuntimeError):
    """A program did not fit in device memory; the message is one line: the program, the
    bytes it needed against the device's (where known) and what to change."""

    def __init__(self, program: str, xla_message: str, hint: str):
        self.program, self.hint = program, hint
        self.needed, self.capacity = sizes(xla_message)
        if self.capacity is None:
            self.capacity = device_bytes()
        super().__init__(line(program, self.needed, self.capacity, hint))


def line(program: str, needed: int | None, capacity: int | None, hint: str) -> str:
    """``<program> ran out of device memory: needs 20.6 GiB, the device has 15.5 GiB; <hint>``."""
    figures = []
    if needed is not None:
        figures.append(f"needs {needed / _GIB:,.1f} GiB")
    if capacity is not None:
        figures.append(f"the device has {capacity / _GIB:,.1f} GiB")
    return (f"{program} ran out of device memory" + (f": {', '.join(figures)}" if figures else "")
            + f"; {hint}")


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` (or what it was raised from) is XLA refusing an allocation."""
    while e is not None:
        if isinstance(e, jax.errors.JaxRuntimeError):
            m = str(e)
            low = m.lower()
            if "out of memory" in low or ("RESOURCE_EXHAUSTED" in m
                                          and ("memory" in low or "alloc" in low)):
                return True
        e = e.__cause__ or e.__context__
    return False


def oom_bytes(message: str) -> int | None:
    """Bytes per chip a program needs, from libtpu's message refusing it for lack of HBM
    (binary units: "8.32T" is 8.32 TiB); None for any other message."""
    return _first(_LIBTPU, message)


def sizes(message: str) -> tuple[int | None, int | None]:
    """(bytes needed, bytes the device has) from XLA's message; None where it names none."""
    needed = oom_bytes(message)
    if needed is None:
        needed = _first(_NEEDED, message)
    return needed, _first(_CAPACITY, message)


def _first(patterns, message: str) -> int | None:
    for pattern in patterns:
        m = pattern.search(message)
        if m:
            unit = m.group(2) if m.re.groups > 1 else ""
            return int(float(m.group(1)) * 1024 ** ("KMGTPE".index(unit) + 1 if unit else 0))
    return None


def device_bytes() -> int | None:
    """What one local device can hold (the allocator's limit: GPU and TPU report one)."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - a backend without memory stats (CPU) or a dead one
        return None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


@contextlib.contextmanager
def named(program: str, hint: str | Callable[[], str]):
    """Turns an out-of-memory error raised inside into ``OutOfMemory(program, ..., hint)``
    (``hint`` may be a function, called only then); an ``OutOfMemory`` raised by an inner
    ``named`` passes through unchanged, as does any other error."""
    try:
        yield
    except OutOfMemory:
        raise
    except Exception as e:  # noqa: BLE001 - only OOMs are turned, the rest re-raised
        if not is_oom(e):
            raise
        raise OutOfMemory(program, _message(e), hint() if callable(hint) else hint) from None


def _message(e: BaseException) -> str:
    parts = []
    while e is not None:
        parts.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(parts)


# ---------------------------------------------------------------------- what to change
def hint(spec, program: str) -> str:
    """The change most likely to make ``program`` of the run ``spec`` (a ``RunSpec``) fit,
    as the flags a user sets: first those a rerun resumes under (remat, grad_accum, the mesh:
    not in ``spec.RESUME_FIELDS``), then those that start a new run."""
    mesh = _mesh(spec)
    if program in ("grpo_update", "sft_update"):
        if not spec.model.remat:
            return f"turn remat on: --config.model.remat=True, or {mesh}"
        accum = _more_micro_batches(spec)
        if accum:
            return (f"split the batch into more micro-batches: --config.optim.grad_accum={accum}"
                    f", or {mesh}")
        if spec.stage == "sft":
            return f"{mesh}, or a smaller --config.sft.batch_size (a new run)"
    if program == "rollout sampler":
        from d1jax import config as config_lib
        g = spec.grpo_run
        rows = g.prompts_per_step * g.num_generations
        shape = _mesh_shape(spec)
        k = config_lib.smaller_rollout_batch(rows, g.rollout_batch, shape[0] * shape[1])
        if k is not None:
            return (f"generate in smaller sampler calls: --config.grpo.rollout_batch={k} "
                    f"(now {g.rollout_batch or rows} rows a call), or {mesh}")
    if program.startswith("eval sampler"):
        return f"a smaller --config.eval.batch_size (now {spec.eval.batch_size}), or {mesh}"
    if program == "model setup":
        return f"shard the weights over more devices: {mesh}"
    if spec.stage == "grpo":
        return f"{mesh}, or fewer --config.grpo.prompts_per_step (a new run)"
    return mesh


def _mesh(spec) -> str:
    shape = tuple(spec.mesh.shape)
    n = jax.device_count()
    return f"a larger mesh: --config.mesh.shape (now {shape} on {n} device{'s' * (n > 1)})"


def _mesh_shape(spec) -> list[int]:
    """The run's (data, fsdp, tensor) on this process's devices (-1 resolved)."""
    shape, n = list(spec.mesh.shape), jax.device_count()
    if -1 in shape:
        known = 1
        for d in shape:
            known *= d if d != -1 else 1
        shape[shape.index(-1)] = max(n // known, 1)
    return shape


def _more_micro_batches(spec) -> int | None:
    """Twice ``optim.grad_accum`` where the step's rows per device split into that many."""
    from d1jax import config as config_lib
    if spec.stage == "grpo":
        rows, group = spec.grpo_run.prompts_per_step * spec.grpo_run.num_generations, \
            spec.grpo_run.num_generations
    else:
        rows, group = spec.sft_run.batch_size, 1
    shape = _mesh_shape(spec)
    accum = 2 * spec.optim.grad_accum
    try:
        config_lib.check_batch(rows, group, shape[0] * shape[1], "batch", accum)
    except config_lib.ConfigError:
        return None
    return accum
