"""LoRA adapter bookkeeping on plain param trees.

The adapters live inside the model (``Proj`` in layers.py: ``lora_a`` [in, r] he-uniform,
``lora_b`` [r, out] zeros, output ``x W + (alpha / r) (x A) B``, dropout on the adapter
input); ``use_lora=False`` runs the base weights alone, which is d1's reference policy
(PEFT's ``disable_adapter()``) with no second copy of the model. This module splits a param
tree into (base, adapters), joins them back, counts params,
merges adapters into the kernels for export, and checks the names of the projections LoRA
targets (each family's ``Family.lora_targets``; a run adapts the ones ``LoraConfig.targets``
names, and only those).

Why not qwix: qwix (PyPI ``qwix`` 0.1.8, the library Tunix uses) adds LoRA by intercepting
the einsum/dot_general calls of nnx or linen modules. Applied to our scanned linen model it
fails at init (its einsum hook sets attributes on our linen ``Proj``, which linen freezes
outside ``setup``), keeps its own param names, and has no switch to run the base weights
alone. Ours is ~10 lines in the model: a plain pytree with the Hugging Face names, sharded
by our logical rules, scanned over layers, with adapters toggled per call.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

from d1jax.knobs import frozen, knob
from d1jax.model import quant

Params = dict[str, Any]
# The leaves a LoRA-adapted projection adds beside its kernel.
ADAPTER_NAMES = ("lora_a", "lora_b")


def _names(value) -> tuple[str, ...]:
    """One name or several: a tuple."""
    return (value,) if isinstance(value, str) else tuple(value)


@frozen
class LoraConfig:
    """LoRA adapters (Hu et al. 2021) on the named projections: W x + (alpha/r) B A x. Its
    knobs are declared here once (``config.lora``; base_quant is ``config.model``'s)."""

    rank: int = knob(128, "r.", tiny=8, low=1)
    alpha: float = knob(64.0, "alpha; adapters scale by alpha / r (d1 SFT: 256).", tiny=16.0)
    dropout: float = knob(0.05, "Dropout on the adapter input.", tiny=0.0)
    targets: tuple[str, ...] = knob(
        ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"),
        "Projections that get adapters, by the family's module names (Family.lora_targets; "
        "the default is LLaDA's seven): LLaDA's q_proj, k_proj, v_proj, attn_out, ff_proj, "
        "up_proj, ff_out; Dream's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
        "down_proj. The builders set d1's: GRPO's on the family's names (its record's "
        "grpo_targets), SFT's q_proj, k_proj, v_proj.", kind=(tuple, list, str), parse=_names)
    # Storage dtype of lora_a / lora_b, whatever the model's param_dtype: a bfloat16 adapter
    # drops every update smaller than ~1/256 of its magnitude (PEFT keeps adapters float32).
    param_dtype: str = "float32"
    base_quant: str = knob(
        "none", 'Frozen base under LoRA: "none" (param_dtype), "int8" (per-channel absmax) or '
        '"nf4" (d1\'s bitsandbytes 4-bit NormalFloat) storage of the block projections '
        "(d1jax.model.quant).")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def check_targets(targets, allowed: tuple[str, ...], family: str) -> tuple[str, ...]:
    """``targets`` as a tuple of the ``family``'s projection names (``allowed``); ValueError
    naming any unknown one.

    Names are matched exactly, as PEFT's ``target_modules``: on LLaDA, PEFT's Llama names
    (o_proj, gate_proj, down_proj) match no module and are refused rather than mapped, so
    d1's GRPO list adapts q, k, v and up only; on Dream all seven exist.
    """
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    unknown = [t for t in targets if t not in allowed]
    if unknown or not targets or len(set(targets)) != len(targets):
        why = (f"unknown {', '.join(map(repr, unknown))}" if unknown
               else "empty" if not targets else "repeated names")
        raise ValueError(f"lora.targets={targets}: {why}; choose among {family}'s projections "
                         f"{', '.join(allowed)}")
    return targets


def is_adapter(path: tuple[str, ...]) -> bool:
    """True for the path of a LoRA leaf (``.../lora_a`` or ``.../lora_b``)."""
    return path[-1] in ADAPTER_NAMES


def split(params: Params) -> tuple[Params, Params]:
    """(base params, adapter params): two nested dicts with the original paths."""
    flat = traverse_util.flatten_dict(params)
    base = {k: v for k, v in flat.items() if not is_adapter(k)}
    adapters = {k: v for k, v in flat.items() if is_adapter(k)}
    return traverse_util.unflatten_dict(base), traverse_util.unflatten_dict(adapters)


def join(base: Params, adapters: Params | None) -> Params:
    """The inverse of ``split``: one tree with base and adapter leaves."""
    if not adapters:
        return base
    flat = traverse_util.flatten_dict(base)
    extra = traverse_util.flatten_dict(adapters)
    clash = set(flat) & set(extra)
    if clash:
        raise ValueError(f"join: paths present in both trees: {sorted(clash)[:3]}")
    flat.update(extra)
    return traverse_util.unflatten_dict(flat)


def merge(params: Params, lora: LoraConfig | None) -> Params:
    """Plain params for export: each targeted ``kernel + (alpha / r) A @ B``, adapters
    dropped (loadable by the family's module without ``lora``).

    Works on layer-stacked kernels ([layers, in, out] with A [layers, in, r]) and unstacked
    ones; the product is taken in float32 and cast to the kernel's dtype. A quantised base
    (``LoraConfig.base_quant``) is dequantised first, to the dtype of the base's other
    float leaves (``quant.dequantize_base``): the export holds ``dequant(W) + (alpha / r) A B``
    in the model's param_dtype, as PEFT's ``merge_and_unload`` of a 4-bit base gives.
    """
    params = quant.dequantize_base(params)
    flat = traverse_util.flatten_dict(params)
    if lora is None:
        if any(is_adapter(k) for k in flat):
            raise ValueError("merge: params hold adapters but lora config is None")
        return params
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


def count(tree: Any) -> int:
    """Number of scalars in a pytree."""
    return int(sum(x.size for x in jax.tree.leaves(tree)))


def param_counts(params: Params) -> dict[str, int]:
    """{"total", "base", "adapters"} scalar counts of a (possibly LoRA) param tree."""
    base, adapters = split(params)
    return {"total": count(params), "base": count(base), "adapters": count(adapters)}
