"""The update functions of d1jax.update, jitted for a run: explicit shardings, donation."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from d1jax import update as upd


def _shardings(tree):
    return jax.tree.map(lambda x: x.sharding, tree)


@dataclasses.dataclass
class Steps:
    """``init_state(params)``, ``update(state, batch, it|rng, ...)``, ``rollout_logps``, ``sync_reference``."""

    init_state: Callable
    update: Callable
    rollout_logps: Callable | None = None
    sync_reference: Callable | None = None


def _optimizer(config, total_steps: int):
    o = config.optim
    return upd.make_optimizer(o.learning_rate, total_steps, o.warmup_ratio, o.b1, o.b2,
                              o.weight_decay, o.max_grad_norm)


def _jit_with_state_shardings(fn, state_example, n_extra: int):
    """jit ``fn(state, *extra)`` with the state's shardings in and out, state donated."""
    sh = _shardings(state_example)
    return jax.jit(fn, in_shardings=(sh,) + (None,) * n_extra, out_shardings=(sh, None),
                   donate_argnums=(0,))


def make_grpo_steps(model, config, mesh, rules) -> Steps:
    g, o = config.grpo, config.optim
    hp = upd.GRPOHyper(
        num_iterations=g.num_iterations, beta=g.beta, epsilon=g.epsilon,
        p_mask_prompt=g.p_mask_prompt, mask_id=model.config.mask_token_id,
        cfg_scale=config.sampler.cfg_scale, use_attention_mask=config.sampler.use_attention_mask,
        grad_accum=o.grad_accum, max_grad_norm=o.max_grad_norm,
        use_lora=config.lora.enabled, lora_dropout=config.lora.enabled and config.lora.dropout > 0)
    opt = _optimizer(config, config.train.num_steps)
    keep_ref = g.beta != 0 and (g.sync_ref_model or not config.lora.enabled)
    init = jax.jit(lambda p: upd.init_state(p, opt, config.lora.enabled, keep_ref))
    compiled: dict[str, Any] = {}

    def update(state, batch, it, rng):
        if "update" not in compiled:
            compiled["update"] = _jit_with_state_shardings(
                functools.partial(upd.grpo_step, model, opt, hp), state, 3)
        return compiled["update"](state, batch, it, rng)

    logps = jax.jit(functools.partial(upd.rollout_logps, model, hp=hp))

    def sync(state, alpha):
        if "sync" not in compiled:
            sh = _shardings(state)
            compiled["sync"] = jax.jit(upd.sync_reference, static_argnums=1,
                                       in_shardings=(sh,), out_shardings=sh, donate_argnums=0)
        return compiled["sync"](state, alpha)

    return Steps(init, update, lambda state, batch, seeds: logps(state, batch, seeds), sync)


def make_sft_steps(model, config, mesh, rules, total_steps: int) -> Steps:
    o = config.optim
    opt = _optimizer(config, total_steps)
    init = jax.jit(lambda p: upd.init_state(p, opt, config.lora.enabled, False))
    step_fn = functools.partial(upd.sft_step, model, opt, mask_id=model.config.mask_token_id,
                                eps=config.sft.eps, grad_accum=o.grad_accum,
                                max_grad_norm=o.max_grad_norm,
                                lora_dropout=config.lora.enabled and config.lora.dropout > 0)
    compiled: dict[str, Any] = {}

    def update(state, batch, rng):
        if "update" not in compiled:
            compiled["update"] = _jit_with_state_shardings(step_fn, state, 2)
        return compiled["update"](state, batch, rng)

    return Steps(init, update)
