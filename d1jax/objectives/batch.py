"""Typed batches of the update steps; their shardings come from the field declarations.

Each field names its logical axes (``sharding.BATCH`` for rows); ``shardings(mesh, rules)``
maps them onto the mesh, so a new field is placed correctly by declaring its axes once.
Optional fields left as None are absent from the pytree (and from the compiled program).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import flax.struct
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from d1jax import sharding as shd

Array = Any  # jax.Array, numpy array or ShapeDtypeStruct
ROWS = (shd.BATCH, None)  # [B, L]
SEED_ROWS = (None, shd.BATCH, None)  # [mu, B, C]: one row block per mask seed


def _field(axes: tuple, optional: bool = False):
    kw = {"default": None} if optional else {}
    return flax.struct.field(metadata={"axes": axes}, **kw)


class _Typed:
    """Shared behaviour: shardings from the declared axes, construction from a mapping."""

    def shardings(self, mesh: Mesh, rules=shd.DEFAULT_RULES):
        """The same batch type holding a NamedSharding per present field."""
        out = {}
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is not None:
                spec = nn.logical_to_mesh_axes(f.metadata["axes"], list(rules))
                out[f.name] = NamedSharding(mesh, spec)
        return self.replace(**out)

    def abstract(self, mesh: Mesh | None = None, rules=shd.DEFAULT_RULES):
        """ShapeDtypeStructs of this batch, sharded on ``mesh`` when given."""
        sh = self.shardings(mesh, rules) if mesh is not None else None
        def one(name):
            x = getattr(self, name)
            s = getattr(sh, name) if sh is not None else None
            if isinstance(x, Mapping):  # per_row: each entry sharded by its rows
                return {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype, sharding=s)
                        for k, v in x.items()}
            return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)
        return self.replace(**{f.name: one(f.name) for f in dataclasses.fields(self)
                               if getattr(self, f.name) is not None})

    @classmethod
    def of(cls, batch):
        """``batch`` itself, or the batch type built from a mapping of its fields."""
        if isinstance(batch, cls):
            return batch
        if not isinstance(batch, Mapping):
            raise TypeError(f"expected a {cls.__name__} or a dict of its fields, got "
                            f"{type(batch).__name__}")
        return cls(**batch)


@flax.struct.dataclass
class GRPOBatch(_Typed):
    """One rollout for diffu-GRPO (B rows, P prompt, C completion tokens, mu mask seeds).

    prompt_ids [B, P] int32, left-padded; prompt_mask [B, P] (1 = real token);
    completion_ids [B, C] int32; completion_mask [B, C] (1 up to and including the first
    EOS); advantages [B] float32; mask_seeds [mu] int32; old_logps / ref_logps [mu, B, C]
    from ``rollout_logps`` (old only when mu > 1, ref only when beta != 0; old row 0 is
    neither computed nor read when ``pure_steps.first_old_from_update``); old_routing
    [mu, B, n_moe, N, K] int32: the experts the old passes chose (routing replay; -1 where
    not recorded); iteration []
    int32: which of the mu seeds an update uses (None: ``state.step % mu``, as d1);
    per_row {name: [B, ...]}: draws and weights an objective makes on the whole batch inside
    the update, before the micro-batch split (``table.Objective.prepare``).
    """

    prompt_ids: Array = _field(ROWS)
    prompt_mask: Array = _field(ROWS)
    completion_ids: Array = _field(ROWS)
    completion_mask: Array = _field(ROWS)
    advantages: Array = _field((shd.BATCH,))
    mask_seeds: Array = _field((None,))
    old_logps: Array | None = _field(SEED_ROWS, optional=True)
    ref_logps: Array | None = _field(SEED_ROWS, optional=True)
    old_routing: Array | None = _field((None, shd.BATCH, None, None, None), optional=True)
    iteration: Array | None = _field((), optional=True)
    per_row: dict[str, Array] | None = _field((shd.BATCH,), optional=True)


@flax.struct.dataclass
class SFTBatch(_Typed):
    """Masked SFT: input_ids [B, L] int32 (prompt + completion, EOS-padded) and
    prompt_len [B] int32 (positions the loss never masks)."""

    input_ids: Array = _field(ROWS)
    prompt_len: Array = _field((shd.BATCH,))
