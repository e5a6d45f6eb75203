"""The train state: what an update changes, how it is created, and how it is sharded.

Under LoRA only the adapters train; the base weights sit in ``frozen`` (never copied,
never donated) and the base model with adapters off is the reference policy, as in d1
(PEFT's ``disable_adapter()`` at every step): no copy. A reference copy (``ref``) is kept
only for full fine-tuning with beta != 0, or when the run mixes its reference toward the
policy (``config.grpo.sync_ref_model``, off by default).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from d1jax import sharding as shd
from d1jax.model.predictor import MaskPredictor
from d1jax.model import lora as lora_lib

Array = jax.Array
Params = dict[str, Any]


@flax.struct.dataclass
class TrainState:
    """Everything an update changes. A pytree: jit it, shard it, checkpoint it.

    step: [] int32 optimizer steps taken (skipped ones included).
    params: the trainable leaves: LoRA adapters, or all params for full fine-tuning.
    frozen: the base params under LoRA ({} for full fine-tuning); never updated.
    opt_state: optax state of ``params``.
    ref: reference copy of the trainable leaves, or None (LoRA: the base model with adapters
      off is the reference, d1's; full fine-tuning: no reference, so beta must be 0).
    skipped: [] int32 updates skipped for a non-finite gradient.
    """

    step: Array
    params: Params
    frozen: Params
    opt_state: Any
    ref: Params | None
    skipped: Array

    @property
    def lora(self) -> bool:
        return bool(self.frozen)

    def policy_params(self) -> Params:
        """Full params of the current policy (base + adapters under LoRA)."""
        return lora_lib.join(self.frozen, self.params) if self.lora else self.params

    def reference_params(self) -> tuple[Params, bool] | None:
        """(full params, use_lora) of the reference policy, or None when there is none: the
        copy when one is kept (its adapters on, under LoRA), else under LoRA the base
        weights with ``use_lora=False`` (d1's reference)."""
        if self.ref is not None:
            return (lora_lib.join(self.frozen, self.ref), True) if self.lora else (self.ref, True)
        if self.lora:
            return self.policy_params(), False
        return None

    def moving(self) -> "TrainState":
        """The part an update donates and returns: everything but ``frozen`` and ``ref``."""
        return self.replace(frozen={}, ref=None)

    def fixed(self) -> tuple[Params, Params | None]:
        """(frozen, ref): inputs of an update, never donated."""
        return self.frozen, self.ref


def init_train_state(params: Params, optimizer: optax.GradientTransformation, *, lora: bool,
                     keep_reference: bool = False, shardings: TrainState | None = None
                     ) -> TrainState:
    """A TrainState for ``params`` (plain model params, with adapters when ``lora``).

    The trainable leaves are copied, since jitted updates donate them; the base leaves are
    kept as given. keep_reference stores a copy of the trainable leaves as the reference
    (needed for full fine-tuning with beta != 0, or to mix a reference toward the policy,
    ``sync_ref_model``; a LoRA run without it scores the reference with adapters off). ``shardings``
    (from ``state_shardings``) places everything and creates the optimizer state born sharded.
    """
    if lora:
        frozen, trainable = lora_lib.split(params)
        if not trainable:
            raise ValueError("lora=True but params hold no lora_a/lora_b leaves: build the "
                             "model with LLaDA(config, lora=LoraConfig(...)) (or Dream(...))")
    else:
        frozen, trainable = {}, params
    sh = shardings if shardings is not None else TrainState(None, None, None, None, None, None)
    if shardings is not None:  # a no-op for params already placed by the same rules
        frozen, trainable = jax.device_put((frozen, trainable), (sh.frozen, sh.params))
    opt_state = jax.jit(optimizer.init, out_shardings=sh.opt_state)(trainable)
    copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=sh.params)
    trainable_in, trainable = trainable, copy(trainable)

    def zero():  # two buffers: the state is donated, and a buffer cannot be donated twice
        return jax.device_put(jnp.zeros((), jnp.int32), sh.step)
    return TrainState(step=zero(), params=trainable, frozen=frozen, opt_state=opt_state,
                      ref=copy(trainable_in) if keep_reference else None, skipped=zero())


def state_shardings(model: MaskPredictor, mesh: Mesh, optimizer: optax.GradientTransformation, *,
                    lora: bool, keep_reference: bool, rules=shd.DEFAULT_RULES) -> TrainState:
    """A TrainState of NamedShardings: params by the model's logical axes, optimizer
    moments like their params, counters and hyperparameters replicated."""
    full = shd.param_shardings(model, mesh, rules)
    frozen, trainable = lora_lib.split(full) if lora else ({}, full)
    rep = shd.replicated(mesh)
    params = shd.abstract_params(model)
    opt_abstract = jax.eval_shape(optimizer.init, lora_lib.split(params)[1] if lora else params)
    opt = optax.tree_map_params(optimizer, lambda _, s: s, opt_abstract, trainable,
                                transform_non_params=lambda _: rep,
                                is_leaf=lambda x: isinstance(x, NamedSharding))
    return TrainState(step=rep, params=trainable, frozen=frozen, opt_state=opt,
                      ref=trainable if keep_reference else None, skipped=rep)


def abstract_state(model: MaskPredictor, optimizer: optax.GradientTransformation, *, lora: bool,
                   keep_reference: bool, shardings: TrainState | None = None) -> TrainState:
    """The TrainState as ShapeDtypeStructs (with ``shardings`` when given): what a compile
    for a topology needs, with no weights loaded."""
    params = shd.abstract_params(model)
    state = jax.eval_shape(lambda p: init_train_state(p, optimizer, lora=lora,
                                                      keep_reference=keep_reference), params)
    if shardings is None:
        return state
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, shardings)
