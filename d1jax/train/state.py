"""The train state: what an update changes, how it is created, and how it is sharded.

Under LoRA only the adapters train; the base weights sit in ``frozen`` (never copied,
never donated) and the base model with adapters off is the reference policy, as in d1
(PEFT's ``disable_adapter()`` at every step): no copy. A reference copy (``ref``) is kept
only for full fine-tuning with beta != 0, or when the run mixes its reference toward the
policy (``config.grpo.sync_ref_model``, off by default).

Full fine-tuning keeps float32 master weights (``master_dtype``, config
``optim.master_weights``): the trainable params and their AdamW moments are float32, and
every forward and backward runs on them cast to the model's ``param_dtype`` (bfloat16 at
size), as DeepSpeed's bf16 optimizer and MaxText's float32 weights do. Without the master a
bfloat16 weight cannot take an update below half its rounding step (about 2**-9 of the
weight): at lr 1e-6 most of AdamW's updates round away. LoRA adapters are float32 already
(``LoraConfig.param_dtype``) and the frozen base keeps its load dtype.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from d1jax import sharding as shd
from d1jax.model.predictor import MaskPredictor
from d1jax.model import lora as lora_lib
from d1jax.run import optim

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
    policy_dtype: static; the model's param dtype when ``params`` is a master copy in
      another dtype (float32 master weights of a bfloat16 model), else None.
    """

    step: Array
    params: Params
    frozen: Params
    opt_state: Any
    ref: Params | None
    skipped: Array
    policy_dtype: Any = flax.struct.field(pytree_node=False, default=None)

    @property
    def lora(self) -> bool:
        return bool(self.frozen)

    def as_policy(self, trainable: Params) -> Params:
        """Full params of the policy whose trainable leaves are ``trainable``: joined with the
        frozen base under LoRA, a master copy cast to the model's dtype. The update's loss
        differentiates through this, so its gradient arrives in the master's dtype."""
        if self.policy_dtype is not None:
            trainable = cast(trainable, self.policy_dtype)
        return lora_lib.join(self.frozen, trainable) if self.lora else trainable

    def policy_params(self) -> Params:
        """Full params of the current policy (base + adapters under LoRA), in the dtype the
        model stores them (the master cast down): what sampling, scoring and export see."""
        return self.as_policy(self.params)

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


def cast(tree: Any, dtype: Any) -> Any:
    """``tree``'s floating leaves in ``dtype``; ShapeDtypeStructs keep their shardings.
    Buffers (``optim.BUFFERS``: LLaDA2's float32 router ``expert_bias`` in a bfloat16 model)
    keep their own dtype: no optimizer moves them, and the model reads them as stored."""
    def one(path, x):
        if not jnp.issubdtype(x.dtype, jnp.floating) or _is_buffer(path):
            return x
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
        return x.astype(dtype)
    return jax.tree_util.tree_map_with_path(one, tree)


def _is_buffer(path) -> bool:
    last = path[-1] if path else None
    return getattr(last, "key", None) in optim.BUFFERS


def master_policy_dtype(param_dtype: Any, master_dtype: Any, lora: bool) -> Any:
    """The ``TrainState.policy_dtype`` of a model storing params in ``param_dtype``: that
    dtype when full fine-tuning keeps a master copy in another (``master_dtype``), else None
    (LoRA: float32 adapters, no master; ``master_dtype`` None: updates in ``param_dtype``)."""
    if lora or master_dtype is None or jnp.dtype(param_dtype) == jnp.dtype(master_dtype):
        return None
    return np.dtype(param_dtype)


def _param_dtype(params: Params) -> Any:
    """The one floating dtype of ``params``' weights (buffers, which keep theirs, aside)."""
    dtypes = {jnp.dtype(x.dtype) for path, x in jax.tree_util.tree_leaves_with_path(params)
              if jnp.issubdtype(x.dtype, jnp.floating) and not _is_buffer(path)}
    if len(dtypes) != 1:
        raise ValueError(f"full fine-tuning with master weights needs params of one dtype, got "
                         f"{sorted(map(str, dtypes))}: load them with one model.param_dtype")
    return dtypes.pop()


def init_train_state(params: Params, optimizer: optax.GradientTransformation, *, lora: bool,
                     keep_reference: bool = False, shardings: TrainState | None = None,
                     master_dtype: Any = jnp.float32) -> TrainState:
    """A TrainState for ``params`` (plain model params, with adapters when ``lora``).

    The trainable leaves are copied, since jitted updates donate them; the base leaves are
    kept as given. Under full fine-tuning the copy is a master in ``master_dtype`` (None: in
    the params' own dtype, no master) when that differs from the params'; the optimizer
    state follows it. keep_reference stores a copy of the trainable leaves as given (the
    model's dtype) as the reference (needed for full fine-tuning with beta != 0, or to mix
    a reference toward the policy, ``sync_ref_model``; a LoRA run without it scores the
    reference with adapters off). ``shardings`` (from ``state_shardings``) places everything
    and creates the optimizer state born sharded; its ``policy_dtype`` wins, so the state
    matches the jitted steps' structure.
    """
    if lora:
        frozen, trainable = lora_lib.split(params)
        if not trainable:
            raise ValueError("lora=True but params hold no lora_a/lora_b leaves: build the "
                             "model with LLaDA(config, lora=LoraConfig(...)) (or Dream(...))")
    else:
        frozen, trainable = {}, params
    if shardings is not None:
        policy_dtype = shardings.policy_dtype
    else:
        policy_dtype = None if lora or master_dtype is None else \
            master_policy_dtype(_param_dtype(trainable), master_dtype, lora)
    sh = shardings if shardings is not None else TrainState(None, None, None, None, None, None)
    if shardings is not None:  # a no-op for params already placed by the same rules
        frozen, trainable = jax.device_put((frozen, trainable), (sh.frozen, sh.params))
    copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=sh.params)
    to_master = jax.jit(lambda t: cast(t, master_dtype), out_shardings=sh.params)
    trainable_in, trainable = trainable, (to_master if policy_dtype else copy)(trainable)
    opt_state = jax.jit(optimizer.init, out_shardings=sh.opt_state)(trainable)

    def zero():  # two buffers: the state is donated, and a buffer cannot be donated twice
        return jax.device_put(jnp.zeros((), jnp.int32), sh.step)
    ref = None
    if keep_reference:  # in the model's dtype: only forward passes read it
        ref = copy(cast(trainable_in, policy_dtype) if policy_dtype else trainable_in)
    return TrainState(step=zero(), params=trainable, frozen=frozen, opt_state=opt_state,
                      ref=ref, skipped=zero(), policy_dtype=policy_dtype)


def state_shardings(model: MaskPredictor, mesh: Mesh, optimizer: optax.GradientTransformation, *,
                    lora: bool, keep_reference: bool, rules=shd.DEFAULT_RULES,
                    master_dtype: Any = jnp.float32) -> TrainState:
    """A TrainState of NamedShardings: params by the model's logical axes, optimizer
    moments like their params, counters and hyperparameters replicated; its static
    ``policy_dtype`` is that of a state of ``model``'s params (``master_policy_dtype``)."""
    full = shd.param_shardings(model, mesh, rules)
    frozen, trainable = lora_lib.split(full) if lora else ({}, full)
    rep = shd.replicated(mesh)
    params = shd.abstract_params(model)
    opt_abstract = jax.eval_shape(optimizer.init, lora_lib.split(params)[1] if lora else params)
    opt = optax.tree_map_params(optimizer, lambda _, s: s, opt_abstract, trainable,
                                transform_non_params=lambda _: rep,
                                is_leaf=lambda x: isinstance(x, NamedSharding))
    return TrainState(step=rep, params=trainable, frozen=frozen, opt_state=opt,
                      ref=trainable if keep_reference else None, skipped=rep,
                      policy_dtype=master_policy_dtype(model.param_dtype, master_dtype, lora))


def abstract_state(model: MaskPredictor, optimizer: optax.GradientTransformation, *, lora: bool,
                   keep_reference: bool, shardings: TrainState | None = None,
                   master_dtype: Any = jnp.float32) -> TrainState:
    """The TrainState as ShapeDtypeStructs (with ``shardings`` when given): what a compile
    for a topology needs, with no weights loaded (master weights counted in their dtype)."""
    params = shd.abstract_params(model)
    state = jax.eval_shape(lambda p: init_train_state(p, optimizer, lora=lora,
                                                      keep_reference=keep_reference,
                                                      master_dtype=master_dtype), params)
    if shardings is None:
        return state
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, shardings)
