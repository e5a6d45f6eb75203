"""Jitted update steps: diffu-GRPO (one inner iteration) and masked SFT.

State is a small pytree (``TrainState``). Under LoRA only the adapters are trained and
carry optimizer state; the base weights are frozen. The reference policy is the base
model with adapters off (no copy) or, with ``sync_ref_model``, base + a reference copy
of the adapters that ``sync_reference`` mixes toward the policy (alpha).

A step: gradients averaged over ``grad_accum`` micro-batches (each its own token mean, as
HF Trainer's accumulation), global-norm clipping, AdamW; a non-finite gradient skips the
update (params and optimizer state unchanged) and counts in ``state.skipped``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from d1jax import logprob, lora as lora_lib, losses

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    step: Array
    trainable: Any  # adapters (LoRA) or all params
    frozen: Any  # base params under LoRA, {} for full fine-tuning
    opt_state: Any
    ref: Any  # reference adapters / params, or None (LoRA: base model is the reference)
    skipped: Array  # updates skipped for a non-finite gradient

    def policy_params(self) -> dict:
        return lora_lib.join(self.frozen, self.trainable) if self.frozen else self.trainable

    def reference_params(self) -> dict | None:
        if self.ref is None:
            return None
        return lora_lib.join(self.frozen, self.ref) if self.frozen else self.ref


def make_optimizer(learning_rate: float, total_steps: int, warmup_ratio: float = 0.0,
                   b1: float = 0.9, b2: float = 0.99, weight_decay: float = 0.1,
                   max_grad_norm: float = 0.2) -> optax.GradientTransformation:
    """AdamW with a constant-with-warmup schedule (HF ``constant_with_warmup``); clipping is
    done in the step (so the norm before and after clipping can be logged)."""
    del max_grad_norm
    warmup = math.ceil(warmup_ratio * total_steps)
    sched = optax.constant_schedule(learning_rate)
    if warmup > 0:
        sched = optax.join_schedules(
            [optax.linear_schedule(0.0, learning_rate, warmup), sched], [warmup])
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=sched, b1=b1, b2=b2, weight_decay=weight_decay)


def init_state(params: dict, optimizer: optax.GradientTransformation, use_lora: bool,
               keep_reference: bool) -> TrainState:
    """TrainState from params; ``keep_reference`` stores a reference copy (sync or full FT)."""
    if use_lora:
        frozen, trainable = lora_lib.split(params)
    else:
        frozen, trainable = {}, params
    ref = jax.tree.map(jnp.copy, trainable) if keep_reference else None
    return TrainState(step=jnp.int32(0), trainable=trainable, frozen=frozen,
                      opt_state=optimizer.init(trainable), ref=ref, skipped=jnp.int32(0))


def _accumulate(loss_fn: Callable, trainable, batch: dict, n_micro: int):
    """Mean loss, grads and metrics over ``n_micro`` equal splits of the batch axis."""
    if n_micro == 1:
        (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(trainable, batch, 0)
        return loss, g, m
    micro = jax.tree.map(lambda x: x.reshape((n_micro, x.shape[0] // n_micro) + x.shape[1:]), batch)

    def body(carry, xs):
        i, mb = xs
        (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(trainable, mb, i)
        acc = jax.tree.map(jnp.add, carry, (loss, g, m))
        return acc, None
    zero = jax.tree.map(jnp.zeros_like, jax.eval_shape(
        lambda: jax.value_and_grad(loss_fn, has_aux=True)(
            trainable, jax.tree.map(lambda x: x[0], micro), 0)))
    zero = (zero[0][0], zero[1], zero[0][1])
    (loss, g, m), _ = jax.lax.scan(body, zero, (jnp.arange(n_micro), micro))
    return jax.tree.map(lambda x: x / n_micro, (loss, g, m))


def apply_gradients(state: TrainState, grads, optimizer, max_grad_norm: float):
    """Clip, AdamW, skip on non-finite; returns (state, metrics)."""
    gnorm = optax.global_norm(grads)
    finite = jnp.isfinite(gnorm)
    scale = jnp.minimum(1.0, max_grad_norm / (gnorm + 1e-6)) if max_grad_norm > 0 else 1.0
    grads = jax.tree.map(lambda g: g * scale, grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.trainable)
    trainable = optax.apply_updates(state.trainable, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new = state.replace(step=state.step + 1, trainable=keep(trainable, state.trainable),
                        opt_state=keep(opt_state, state.opt_state),
                        skipped=state.skipped + (~finite).astype(jnp.int32))
    lr = state.opt_state.hyperparams["learning_rate"]
    return new, {"grad_norm": gnorm, "grad_norm_clipped": gnorm * scale, "lr": lr,
                 "skipped_updates": new.skipped}


@dataclasses.dataclass(frozen=True)
class GRPOHyper:
    """diffu-GRPO knobs (static)."""

    num_iterations: int = 12  # mu
    beta: float = 0.04
    epsilon: float = 0.5
    p_mask_prompt: float = 0.15
    mask_id: int = 126336
    cfg_scale: float = 0.0
    use_attention_mask: bool = True  # False: padding attended, as d1
    grad_accum: int = 1
    max_grad_norm: float = 0.2
    use_lora: bool = True
    lora_dropout: bool = False


def _attn(batch: dict, use_mask: bool):
    if not use_mask:
        return None
    return jnp.concatenate([batch["prompt_mask"], jnp.ones_like(batch["completion_ids"])], axis=1)


def rollout_logps(model, state: TrainState, batch: dict, mask_seeds: Array,
                  hp: GRPOHyper) -> dict[str, Array]:
    """Old and reference per-token log-probs [mu, B, Lc] for all mask seeds, once per rollout.

    ``old_logps`` is skipped when mu == 1 (d1 then uses the detached current log-probs) and
    ``ref_logps`` when beta == 0 (no reference pass at all).
    """
    kw = dict(p_mask_prompt=hp.p_mask_prompt, mask_id=hp.mask_id, cfg_scale=hp.cfg_scale,
              attention_mask=_attn(batch, hp.use_attention_mask))
    args = (batch["prompt_ids"], batch["completion_ids"], mask_seeds)
    out = {"mask_seeds": mask_seeds}
    if hp.num_iterations > 1:
        out["old_logps"] = logprob.per_token_logps(model, state.policy_params(), *args, **kw)
    if hp.beta != 0.0:
        ref = state.reference_params()
        if ref is None:  # LoRA without sync: the base model, adapters off
            out["ref_logps"] = logprob.per_token_logps(model, state.policy_params(), *args,
                                                       use_lora=False, **kw)
        else:
            out["ref_logps"] = logprob.per_token_logps(model, ref, *args, **kw)
    return jax.lax.stop_gradient(out)


def grpo_step(model, optimizer, hp: GRPOHyper, state: TrainState, batch: dict, it: Array,
              rng: Array) -> tuple[TrainState, dict]:
    """One optimizer step of inner iteration ``it`` on a rollout batch.

    batch: prompt_ids [B, Lp], prompt_mask [B, Lp], completion_ids [B, Lc],
    completion_mask [B, Lc], advantages [B], mask_seeds [mu], and old_logps / ref_logps
    [mu, B, Lc] from ``rollout_logps`` (when computed).
    """
    seed = batch["mask_seeds"][it]
    per_row = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                      "completion_mask", "advantages")}
    for k in ("old_logps", "ref_logps"):
        if k in batch:
            per_row[k] = batch[k][it]

    def loss_fn(trainable, mb, i):
        params = lora_lib.join(state.frozen, trainable) if state.frozen else trainable
        drop = jax.random.fold_in(rng, i) if hp.lora_dropout else None
        logps = logprob.per_token_logps(
            model, params, mb["prompt_ids"], mb["completion_ids"], seed[None],
            p_mask_prompt=hp.p_mask_prompt, mask_id=hp.mask_id, cfg_scale=hp.cfg_scale,
            attention_mask=_attn(mb, hp.use_attention_mask), dropout_rng=drop)[0]
        old = mb["old_logps"] if "old_logps" in mb else jax.lax.stop_gradient(logps)
        return losses.grpo_loss(logps, old, mb.get("ref_logps"), mb["advantages"],
                                mb["completion_mask"], epsilon=hp.epsilon, beta=hp.beta)

    loss, grads, m = _accumulate(loss_fn, state.trainable, per_row, hp.grad_accum)
    state, om = apply_gradients(state, grads, optimizer, hp.max_grad_norm)
    return state, {"loss": loss, **m, **om}


def sync_reference(state: TrainState, alpha: float) -> TrainState:
    """TRL's SyncRefModelCallback: ref <- alpha * policy + (1 - alpha) * ref."""
    if state.ref is None:
        return state
    ref = jax.tree.map(lambda p, r: (alpha * p + (1 - alpha) * r).astype(r.dtype),
                       state.trainable, state.ref)
    return state.replace(ref=ref)


def sft_step(model, optimizer, state: TrainState, batch: dict, rng: Array, *, mask_id: int,
             eps: float, grad_accum: int, max_grad_norm: float, lora_dropout: bool = False):
    """One masked-SFT optimizer step. batch: input_ids [B, L], prompt_len [B]."""
    def loss_fn(trainable, mb, i):
        params = lora_lib.join(state.frozen, trainable) if state.frozen else trainable
        k = jax.random.fold_in(rng, i)
        drop = jax.random.fold_in(k, 1) if lora_dropout else None
        return losses.sft_loss(model, params, mb["input_ids"], mb["prompt_len"], k,
                               mask_id=mask_id, eps=eps, dropout_rng=drop)
    loss, grads, m = _accumulate(loss_fn, state.trainable, batch, grad_accum)
    state, om = apply_gradients(state, grads, optimizer, max_grad_norm)
    return state, {**m, "loss": loss, **om}
