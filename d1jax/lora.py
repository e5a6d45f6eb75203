"""LoRA adapter bookkeeping on plain param trees.

The adapters live inside the model (``Proj`` in model.py: ``lora_a`` [in, r], ``lora_b``
[r, out], zero-initialised B, output ``x W + (alpha / r) (x A) B``). This module splits a
param tree into (base, adapters), joins them back, and merges adapters into the kernels
for export. We use this small explicit implementation rather than qwix: qwix's LoRA works
by intercepting modules (nnx, or linen via its provider) and keeps its own param layout,
while ours must stay a plain pytree with the Hugging Face names, sharded by our logical
rules and scanned over layers; 60 lines here do that with nothing to keep in sync.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

from d1jax.model import LoraConfig

ADAPTER_NAMES = ("lora_a", "lora_b")


def is_adapter(path: tuple[str, ...]) -> bool:
    return path[-1] in ADAPTER_NAMES


def split(params: dict) -> tuple[dict, dict]:
    """(base params, adapter params), both nested dicts with the original paths."""
    flat = traverse_util.flatten_dict(params)
    base = {k: v for k, v in flat.items() if not is_adapter(k)}
    adapters = {k: v for k, v in flat.items() if is_adapter(k)}
    return traverse_util.unflatten_dict(base), traverse_util.unflatten_dict(adapters)


def join(base: dict, adapters: dict | None) -> dict:
    """The inverse of ``split``."""
    if not adapters:
        return base
    flat = traverse_util.flatten_dict(base)
    flat.update(traverse_util.flatten_dict(adapters))
    return traverse_util.unflatten_dict(flat)


def merge(params: dict, lora: LoraConfig | None) -> dict:
    """Plain LLaDA params: every ``kernel += (alpha / r) A @ B``, adapters dropped.

    Works on layer-stacked kernels ([layers, in, out]) and unstacked ones.
    """
    if lora is None:
        return split(params)[0]
    flat = traverse_util.flatten_dict(params)
    out = {}
    for k, v in flat.items():
        if is_adapter(k):
            continue
        a, b = flat.get(k[:-1] + ("lora_a",)), flat.get(k[:-1] + ("lora_b",))
        if k[-1] == "kernel" and a is not None:
            delta = jnp.einsum("...ir,...ro->...io", a.astype(jnp.float32), b.astype(jnp.float32))
            v = (v.astype(jnp.float32) + lora.scale * delta).astype(v.dtype)
        out[k] = v
    return traverse_util.unflatten_dict(out)


def count(params: dict) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def trainable_mask(params: dict, lora_enabled: bool) -> Any:
    """Pytree of bools: True where the optimizer updates (adapters only under LoRA)."""
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict({k: (is_adapter(k) or not lora_enabled) for k in flat})
