"""The optimizer of d1 (HF Trainer's AdamW) and the pieces of an update step around it.

``make_optimizer``: global-norm clipping then AdamW with a constant-with-warmup schedule
(d1 GRPO: lr 3e-6, betas 0.9/0.99, weight decay 0.1, clip 0.2, ``constant_with_warmup``).
``accumulate_gradients``: mean loss and gradient over micro-batches (HF's accumulation: each
micro-batch its own loss, averaged). ``apply_gradients``: one optimizer update that is
skipped, leaving params and optimizer state untouched, when the gradient is not finite.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from d1jax.config.groups import OptimKnobs
from d1jax.knobs import frozen, of

Array = jax.Array
# loss_fn(params, micro_batch, micro_index) -> (loss, metrics)
LossFn = Callable[[Any, dict, Array], tuple[Array, dict]]


@frozen
class OptimConfig:
    """AdamW as HF Trainer runs it for d1 (``train.yaml``). Its knobs are config.optim's,
    declared there once (``d1jax.config.groups.OptimKnobs``: the config layer lies below
    this one); warmup_steps and total_steps the run computes."""

    learning_rate: float = of(OptimKnobs)
    b1: float = of(OptimKnobs)
    b2: float = of(OptimKnobs)
    eps: float = of(OptimKnobs)
    weight_decay: float = of(OptimKnobs)  # norms excluded (``make_optimizer``)
    max_grad_norm: float = of(OptimKnobs)  # before AdamW
    warmup_steps: int = 0  # Linear warmup from 0 over this many optimizer steps.
    # "linear" and the cosine end at ``total_steps``.
    schedule: str = of(OptimKnobs, "lr_schedule")
    total_steps: int = 0  # Optimizer steps of the run; "linear" and the cosine need it.
    min_lr_rate: float = of(OptimKnobs)

    def __post_init__(self):
        if self.learning_rate <= 0 or self.warmup_steps < 0 or self.max_grad_norm < 0:
            raise ValueError(f"invalid optimizer config {self}: learning_rate must be > 0, "
                             "warmup_steps and max_grad_norm >= 0")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: choose one of {', '.join(SCHEDULES)}")


SCHEDULES = ("constant_with_warmup", "linear", "cosine_with_min_lr")


def lr_schedule(cfg: OptimConfig) -> optax.Schedule:
    """HF's schedules on the optimizer step s (0 at the first update): lr x s / warmup during
    the warmup, then ``constant_with_warmup``: lr; ``linear``: lr x (total - s) / (total -
    warmup), floored at 0; ``cosine_with_min_lr``: lr x (m + (1 - m) (1 + cos(pi p)) / 2) with
    p = (s - warmup) / (total - warmup) and m = ``min_lr_rate`` (HF's
    ``get_cosine_with_min_lr_schedule_with_warmup``, one half cycle)."""
    w = cfg.warmup_steps
    if cfg.schedule != "constant_with_warmup" and cfg.total_steps < 1:
        raise ValueError(f"schedule={cfg.schedule!r} needs total_steps={cfg.total_steps} >= 1")
    # HF divides by max(1, total - warmup): a run no longer than its warmup (one step at a 3%
    # warmup ratio) never leaves the warmup, and is not refused.
    n = max(1, cfg.total_steps - w)
    if cfg.schedule == "linear":
        after = optax.linear_schedule(cfg.learning_rate, 0.0, n)
    elif cfg.schedule == "cosine_with_min_lr":
        lr, m = cfg.learning_rate, cfg.min_lr_rate

        def after(s):
            p = jnp.clip(s / n, 0.0, 1.0)
            return lr * (m + (1.0 - m) * 0.5 * (1.0 + jnp.cos(jnp.pi * p)))
    else:
        after = optax.constant_schedule(cfg.learning_rate)
    if w == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.learning_rate, w), after], [w])


# Leaves that are buffers, not trained weights: LLaDA2's router ``expert_bias`` (selection
# only, no gradient; auxiliary-loss-free balancing updates it outside the optimizer). Without
# decay their update is exactly zero (Adam on a zero gradient moves nothing).
BUFFERS = ("expert_bias",)


def decay_mask(params: Any) -> Any:
    """True for leaves that get weight decay: every leaf outside a norm (attn_norm, ff_norm,
    ln_f; Dream's *_layernorm, norm), every bias (Dream's q/k/v), as HF excludes LayerNorm
    weights and biases, and every buffer (``BUFFERS``). LoRA adapters are decayed, as under
    PEFT."""
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {k: not (any("norm" in p or p == "ln_f" for p in k) or k[-1] == "bias"
                 or k[-1] in BUFFERS) for k in flat})


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Clip by global norm (``max_grad_norm``), then AdamW with the warmup schedule. Both
    record their hyperparameters in the state (``hyperparams``) for logging, in float32
    whatever the params' dtype: optax would infer bfloat16 from bfloat16 params, where
    b2 = 0.999 rounds to 1 and Adam's second moment and its bias correction are 0 (NaN)."""
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",),
                                     hyperparam_dtype=jnp.float32)(
        learning_rate=lr_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
        weight_decay=cfg.weight_decay, mask=decay_mask)
    if cfg.max_grad_norm > 0:
        clip = optax.inject_hyperparams(optax.clip_by_global_norm,
                                        hyperparam_dtype=jnp.float32)(max_norm=cfg.max_grad_norm)
        return optax.chain(clip, adamw)
    return optax.chain(optax.identity(), adamw)


def hyperparams(opt_state: Any) -> dict[str, Array]:
    """The injected hyperparameters in an optimizer state (learning_rate: that of the most
    recent update, ``schedule(0)`` before any; max_norm: the clipping threshold if any)."""
    kinds = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)
    out: dict[str, Array] = {}
    for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds)):
        if isinstance(s, kinds):
            out.update(s.hyperparams)
    return out


def current_learning_rate(opt_state: Any) -> Array:
    """The learning rate of the most recent update (``schedule(0)`` before any)."""
    hp = hyperparams(opt_state)
    if "learning_rate" not in hp:
        raise ValueError("optimizer state has no injected learning rate (use make_optimizer)")
    return hp["learning_rate"]


def split_micro(batch: dict, n_micro: int) -> dict:
    """[B, ...] leaves -> [n_micro, B / n_micro, ...]; micro-batch i takes rows i, i + n, ...

    Strided, so a batch sharded in contiguous blocks over devices gives every device an equal
    share of every micro-batch (no communication).
    """
    def one(x):
        if x.shape[0] % n_micro:
            raise ValueError(f"batch of {x.shape[0]} rows does not split into "
                             f"{n_micro} micro-batches (grad_accum)")
        return x.reshape((x.shape[0] // n_micro, n_micro) + x.shape[1:]).swapaxes(0, 1)
    return jax.tree.map(one, batch)


def accumulate_gradients(loss_fn: LossFn, params: Any, batch: dict, n_micro: int
                         ) -> tuple[Array, Any, dict]:
    """(loss, grads, metrics), each the mean over ``n_micro`` micro-batches of ``batch``.

    Gradients accumulate in float32 inside a ``lax.scan``, so only one micro-batch's
    activations are live at a time; their mean is returned in the params' dtype.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if n_micro == 1:
        (loss, metrics), grads = grad_fn(params, batch, jnp.int32(0))
        return loss, grads, metrics
    micro = split_micro(batch, n_micro)

    def body(acc, xs):
        i, mb = xs
        (loss, metrics), grads = grad_fn(params, mb, i)
        f32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), (loss, grads, metrics))
        return jax.tree.map(jnp.add, acc, f32), None

    shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), jnp.int32(0))
    (loss_s, metrics_s), grads_s = shapes
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), (loss_s, grads_s, metrics_s))
    (loss, grads, metrics), _ = jax.lax.scan(body, zero, (jnp.arange(n_micro), micro))
    # Back to each gradient's own dtype (the params'), as with one micro-batch: a bfloat16
    # adapter's update and optimizer state keep their dtype.
    grads = jax.tree.map(lambda g, s: (g / n_micro).astype(s.dtype), grads, grads_s)
    loss, metrics = jax.tree.map(lambda x: x / n_micro, (loss, metrics))
    return loss, grads, metrics


def apply_gradients(optimizer: optax.GradientTransformation, params: Any, opt_state: Any,
                    grads: Any) -> tuple[Any, Any, dict]:
    """One optimizer update; a non-finite gradient norm skips it (params and state kept).

    The arithmetic is float32 whatever the storage: params, moments and gradient are read
    as float32 and the results stored back in their own dtypes (a no-op for float32 master
    weights; with bfloat16 storage only the stored values round).

    Returns (params, opt_state, metrics): grad_norm (before clipping), grad_norm_clipped,
    lr (of this update; of the last applied one when skipped), update_skipped (1.0 if so).
    """
    grads = _as_f32(grads)
    gnorm = optax.tree.norm(grads)
    finite = jnp.isfinite(gnorm)

    def update(operand):
        p, s = operand
        updates, s32 = optimizer.update(grads, _as_f32(s), _as_f32(p))
        new = optax.apply_updates(_as_f32(p), updates)
        return _like(new, p), _like(s32, s)

    params, opt_state = jax.lax.cond(finite, update, lambda operand: operand,
                                     (params, opt_state))
    hp = hyperparams(opt_state)
    clipped = jnp.minimum(gnorm, hp["max_norm"]) if "max_norm" in hp else gnorm
    lr = current_learning_rate(opt_state)
    return params, opt_state, {"grad_norm": gnorm, "grad_norm_clipped": clipped, "lr": lr,
                               "update_skipped": (~finite).astype(jnp.float32)}


def _as_f32(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(jnp.float32)
                        if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _like(tree: Any, like: Any) -> Any:
    return jax.tree.map(lambda x, y: x.astype(y.dtype), tree, like)
