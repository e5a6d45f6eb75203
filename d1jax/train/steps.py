"""The update functions of d1jax.train.update, configured and jitted for a run.

Each jitted step takes the state with its shardings in and out and donates it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from d1jax.train import optim
from d1jax.train import update as upd


@dataclasses.dataclass
class Steps:
    """``init_state(params)``, ``update(...)``, and for GRPO ``rollout_logps``, ``sync_reference``."""

    init_state: Callable
    update: Callable
    rollout_logps: Callable | None = None
    sync_reference: Callable | None = None


def _optimizer(config, total_steps: int):
    return optim.make_optimizer(optim.OptimConfig.from_config(config.optim, total_steps))


def _lazy_jit(fn: Callable, donate_state: bool = True) -> Callable:
    """jit ``fn(state, ...)`` on first call with the state's own shardings in and out."""
    compiled: dict[str, Any] = {}

    def call(state, *args):
        if "fn" not in compiled:
            sh = jax.tree.map(lambda x: x.sharding, state)
            compiled["fn"] = jax.jit(fn, in_shardings=(sh,) + (None,) * len(args),
                                     out_shardings=(sh, None),
                                     donate_argnums=(0,) if donate_state else ())
        return compiled["fn"](state, *args)
    return call


def grpo_config(config, model) -> upd.GRPOConfig:
    g, o = config.grpo, config.optim
    return upd.GRPOConfig(
        num_iterations=g.num_iterations, beta=g.beta, epsilon=g.epsilon,
        p_mask_prompt=g.p_mask_prompt, cfg_scale=config.sampler.cfg_scale,
        use_attention_mask=config.sampler.use_attention_mask, grad_accum=o.grad_accum,
        lora_dropout=config.lora.enabled and config.lora.dropout > 0)


def _init(model, opt, mesh, rules, lora: bool, keep_ref: bool) -> Callable:
    """init_train_state with every leaf placed by the rules (counters replicated)."""
    sh = upd.state_shardings(model, mesh, opt, lora=lora, keep_reference=keep_ref, rules=rules)
    return functools.partial(upd.init_train_state, optimizer=opt, lora=lora,
                             keep_reference=keep_ref, shardings=sh)


def make_grpo_steps(model, config, mesh, rules) -> Steps:
    g = config.grpo
    cfg = grpo_config(config, model)
    opt = _optimizer(config, config.train.num_steps)
    keep_ref = g.beta != 0 and (g.sync_ref_model or not config.lora.enabled)
    init = _init(model, opt, mesh, rules, config.lora.enabled, keep_ref)

    def step(state, batch, it, rng):
        return upd.grpo_update_step(model, opt, cfg, state, {**batch, "iteration": it}, rng)

    logps = jax.jit(lambda state, batch: upd.rollout_logps(model, cfg, state, batch))

    def sync_fn(state, alpha):
        return upd.sync_reference(state, alpha), None
    sync = _lazy_jit(sync_fn)
    return Steps(init, _lazy_jit(step), logps,
                 lambda state, alpha: sync(state, jnp.float32(alpha))[0])


def make_sft_steps(model, config, mesh, rules, total_steps: int) -> Steps:
    opt = _optimizer(config, total_steps)
    cfg = upd.SFTConfig(eps=config.sft.eps, grad_accum=config.optim.grad_accum,
                        lora_dropout=config.lora.enabled and config.lora.dropout > 0)
    init = _init(model, opt, mesh, rules, config.lora.enabled, False)

    def step(state, batch, rng):
        return upd.sft_update_step(model, opt, cfg, state, batch, rng)
    return Steps(init, _lazy_jit(step))
