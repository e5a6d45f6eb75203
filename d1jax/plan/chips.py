"""TPU chips the planner knows: memory, peak compute, interconnect, and how to get their
compile-only devices from libtpu on any host.

Figures are per chip, from the Google Cloud TPU system-architecture pages
(https://cloud.google.com/tpu/docs/v4, .../v5e, .../v5p, .../v6e). Capacities are the
documented HBM sizes; the runtime keeps a little for itself, hence ``USABLE_FRACTION``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile

GB = 10**9
GIB = 2**30

# Share of a chip's HBM a program may plan to use: the TPU runtime and XLA's own buffers
# (program binaries, collectives' scratch) take the rest.
USABLE_FRACTION = 0.95


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation as seen by a JAX program (one device per chip)."""

    name: str  # Cloud TPU version: v4, v5e, v5p, v6e.
    hbm_bytes: int  # HBM per chip.
    peak_bf16_flops: float  # Dense bf16 matmul peak per chip, FLOP/s.
    hbm_bytes_per_s: float  # HBM bandwidth per chip.
    ici_bits_per_s: float  # Inter-chip interconnect bandwidth per chip (as documented).
    megacore: bool  # Two TensorCores per chip run as one JAX device.
    chip_count_in_name: bool  # v5e-8 / v6e-8 count chips; v4-8 / v5p-8 count TensorCores.

    @property
    def usable_hbm_bytes(self) -> int:
        return int(self.hbm_bytes * USABLE_FRACTION)


# cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s, ICI 2400 Gbps.
V4 = Chip("v4", 32 * GIB, 275e12, 1200e9, 2400e9, megacore=True, chip_count_in_name=False)
# cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, ICI 1600 Gbps.
V5E = Chip("v5e", 16 * GB, 197e12, 819e9, 1600e9, megacore=False, chip_count_in_name=True)
# cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GB HBM2e at 2765 GB/s, ICI 4800 Gbps.
V5P = Chip("v5p", 95 * GB, 459e12, 2765e9, 4800e9, megacore=True, chip_count_in_name=False)
# cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GB HBM at 1640 GB/s, ICI 3584 Gbps.
V6E = Chip("v6e", 32 * GB, 918e12, 1640e9, 3584e9, megacore=False, chip_count_in_name=True)

CHIPS = {c.name: c for c in (V4, V5E, V5P, V6E)}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}

# Slice names (as `gcloud compute tpus` sells them) -> libtpu topology names.
SLICES = {
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4",
    "v5e-1": "v5e:1x1", "v5e-4": "v5e:2x2", "v5e-8": "v5e:2x4", "v5e-16": "v5e:4x4",
    "v5e-32": "v5e:4x8", "v5e-64": "v5e:8x8", "v5e-256": "v5e:16x16",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4",
    "v5p-64": "v5p:2x4x4", "v5p-128": "v5p:4x4x4",
    "v6e-1": "v6e:1x1", "v6e-4": "v6e:2x2", "v6e-8": "v6e:2x4", "v6e-16": "v6e:4x4",
}

_TOPOLOGY = re.compile(r"^(v[0-9a-z]+):([0-9]+(?:x[0-9]+){1,2})$")


def parse_topology(name: str) -> tuple[Chip, str, tuple[int, ...]]:
    """(chip, libtpu topology name, chip grid) of "v5p:2x2x1", "v5e:2x4" or a slice name
    such as "v5p-8" / "v5litepod-16"."""
    raw = name.strip().lower()
    for alias, real in _ALIASES.items():
        if raw.startswith(alias):
            raw = real + raw[len(alias):]
    raw = SLICES.get(raw, raw)
    m = _TOPOLOGY.match(raw)
    if m is None or m.group(1) not in CHIPS:
        raise ValueError(f"unknown TPU topology {name!r}: use VERSION:GRID such as 'v5p:2x2x1' "
                         f"or 'v5e:2x4' (versions {sorted(CHIPS)}), or a slice name from "
                         f"{sorted(SLICES)}")
    grid = tuple(int(x) for x in m.group(2).split("x"))
    return CHIPS[m.group(1)], raw, grid


@contextlib.contextmanager
def _libtpu_init_quiet():
    """libtpu, loaded on a host with no TPU, writes lines about the attached accelerator it
    cannot find to the process's stderr; none concern the topology compiled for. Shown only
    if loading fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def topology_devices(name: str) -> tuple[Chip, list]:
    """(chip, compile-only TPU devices, one per chip) of a topology, from libtpu on this host.

    Raises ImportError naming the fix when libtpu is missing, ValueError when libtpu
    refuses the topology (a grid it does not build, such as v5e:3x3).
    """
    chip, topo, grid = parse_topology(name)
    # Compiling touches no TPU, so several processes may load libtpu at once (by default
    # the first holds a lock file and the others fail).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    refused = None
    try:
        from jax.experimental import topologies
        # One host holds at most 2x2x1 chips; a smaller slice is one host.
        per_host = tuple(min(g, 2) if i < 2 else 1 for i, g in enumerate(grid))
        per_host = per_host + (1,) * (3 - len(per_host))
        with _libtpu_init_quiet():
            try:
                desc = topologies.get_topology_desc(
                    topology_name=topo, platform="tpu",
                    chip_config_name="megacore" if chip.megacore else "default",
                    chips_per_host_bounds=per_host, num_slices=1, wrap=(False, False, False))
            except RuntimeError as e:  # libtpu loaded and judged the topology itself
                if "INVALID_ARGUMENT" not in str(e):
                    raise
                refused = (str(e).strip().splitlines() or [""])[0]
    except (ImportError, RuntimeError) as e:
        raise ImportError(f"cannot build TPU topology {topo!r} ({e}); the planner needs libtpu: "
                          "pip install 'jax[tpu]' (or the libtpu version jax pins)") from e
    if refused is not None:
        raise ValueError(f"libtpu does not build TPU topology {name!r} ({refused}): use a "
                         f"grid a slice has, such as one of {sorted(SLICES)}")
    return chip, list(desc.devices)
