"""diffu-GRPO and masked-SFT update steps as pure functions of a ``TrainState``.

A rollout (prompts, G completions each, advantages) is used for mu optimizer steps (d1's
``num_iterations``), each with its own mask seed. Per rollout the loop calls
``rollout_logps`` once (old and reference log-probs for all mu seeds; the first seed's old
ones come from the first update itself), then
``grpo_update_step`` mu times. The reference is d1's under LoRA: the base model with the
adapters off, no copy; only with ``sync_ref_model`` (off by default) does the state hold a
reference copy, which the loop mixes toward the policy with ``sync_reference`` every
``ref_model_sync_steps`` steps. ``d1jax.train.jit_steps`` jits them for a mesh.

The GRPO loss is chosen by name (``GRPOConfig.objective``, see ``OBJECTIVES``: d1's
diffu-GRPO, wd1, SPG, coupled-GRPO); every objective shares the rollout, advantages,
optimizer, LoRA and sharding around it, and its own knobs ride in ``GRPOConfig.hparams``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import blockwise, logprob, losses
from d1jax.objectives.batch import GRPOBatch, SFTBatch
from d1jax.objectives.table import OBJECTIVES, GRPOConfig, SFTConfig
from d1jax.run import optim
from d1jax.train.state import Params, TrainState

Array = jax.Array


def rollout_logps(model: MaskPredictor, cfg: GRPOConfig, state: TrainState, batch: GRPOBatch
                  ) -> dict[str, Array]:
    """Old and reference per-token log-probs for all mu mask seeds, once per rollout.

    Returns {"old_logps": [mu, B, C]} when mu > 1 (and {"old_routing"}, the experts those
    passes chose, with an objective's routing replay) (d1 uses the detached current log-probs
    when mu == 1) and {"ref_logps": [mu, B, C]} when beta != 0 (no reference pass at all
    when beta == 0): the fields to ``batch.replace(**...)``. Row 0 of the old log-probs is
    not computed (0) when ``first_old_from_update``: the first update runs on the rollout's
    policy and reads its own detached log-probs instead, which the skipped pass would have
    given bit for bit (same params, same mask seed, no dropout). The reference is
    ``state.reference_params()``: under LoRA the base weights with ``use_lora=False``
    (d1), or the kept copy when the run syncs one. No gradient flows. Ratio-free
    objectives (wd1, SPG) get {}: they have neither pass.
    """
    seeds = batch.mask_seeds
    if seeds.shape != (cfg.num_iterations,):
        raise ValueError(f"mask_seeds {seeds.shape} must be [num_iterations={cfg.num_iterations}]")
    estimator = OBJECTIVES[cfg.objective].logps
    out: dict[str, Array] = {}
    if estimator is None:
        return out
    if cfg.num_iterations > 1:
        skip = first_old_from_update(cfg)
        old = estimator(model, cfg, state.policy_params(), batch, seeds[1:] if skip else seeds,
                        True)
        # Routing replay: the estimator also returns the experts each pass chose; a
        # skipped pass records none (-1: the update routes as its own forward does).
        old, routes = old if isinstance(old, tuple) else (old, None)
        out["old_logps"] = jnp.concatenate([jnp.zeros_like(old[:1]), old]) if skip else old
        if routes is not None:
            out["old_routing"] = (jnp.concatenate([jnp.full_like(routes[:1], -1), routes])
                                  if skip else routes)
    if cfg.beta != 0.0:
        ref = state.reference_params()
        if ref is None:
            raise ValueError("beta != 0 with full fine-tuning needs a reference copy: "
                             "init_train_state(..., keep_reference=True)")
        ref_lp = estimator(model, cfg, ref[0], batch, seeds, ref[1])
        out["ref_logps"] = ref_lp[0] if isinstance(ref_lp, tuple) else ref_lp
    return jax.lax.stop_gradient(out)


def first_old_from_update(cfg: GRPOConfig) -> bool:
    """Whether the first inner iteration's old log-probs are the update's own, detached
    (the rollout then skips that pass): with mu > 1, a ratio objective and no LoRA dropout
    (which the old pass does not apply and the update does)."""
    return (cfg.num_iterations > 1 and OBJECTIVES[cfg.objective].logps is not None
            and not cfg.lora_dropout)


def iteration_rows(cfg: GRPOConfig, state: TrainState, batch: GRPOBatch
                   ) -> tuple[Array, GRPOBatch, Array | None]:
    """(mask seed [1], the rows of this inner iteration: old/ref log-probs [B, C], and
    whether its old log-probs are the current ones: [] bool when ``first_old_from_update``,
    true at iteration 0, else None).

    The iteration is ``batch.iteration``, or d1's ``step % num_iterations`` when absent.
    """
    it = batch.iteration if batch.iteration is not None else state.step % cfg.num_iterations
    has_old = OBJECTIVES[cfg.objective].logps is not None  # ratio-free objectives: none
    if cfg.num_iterations > 1 and batch.old_logps is None and has_old:
        raise ValueError("mu > 1 needs old_logps [mu, B, C] from rollout_logps in the batch")
    if cfg.beta != 0.0 and batch.ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps [mu, B, C] from rollout_logps in the batch")

    def pick(x):
        return None if x is None else jax.lax.dynamic_index_in_dim(x, it, axis=0,
                                                                   keepdims=False)
    rows = batch.replace(mask_seeds=None, iteration=None, old_logps=pick(batch.old_logps),
                         ref_logps=pick(batch.ref_logps), old_routing=pick(batch.old_routing))
    current = jnp.asarray(it) == 0 if first_old_from_update(cfg) else None
    return jax.lax.dynamic_slice_in_dim(batch.mask_seeds, it, 1), rows, current


def _finish(optimizer, state: TrainState, loss, grads, metrics):
    params, opt_state, om = optim.apply_gradients(optimizer, state.params, state.opt_state,
                                                  grads)
    skipped = state.skipped + om["update_skipped"].astype(jnp.int32)
    state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                          skipped=skipped)
    return state, {"loss": loss, **metrics, **om, "skipped_updates": skipped}


def grpo_update_step(model: MaskPredictor, optimizer: optax.GradientTransformation, cfg: GRPOConfig,
                     state: TrainState, batch: GRPOBatch, rng: Array
                     ) -> tuple[TrainState, dict]:
    """One optimizer step of the configured objective on one inner iteration of a rollout.

    The objective's draws for this iteration are made on the whole batch; the loss is
    averaged over ``cfg.grad_accum`` micro-batches; then clipping and AdamW, skipped on a
    non-finite gradient. ``rng`` only drives LoRA dropout. Returns (new state, metrics: loss,
    grad_norm, grad_norm_clipped, lr, update_skipped, skipped_updates, and the objective's
    own: kl, clip_ratio, ratio_mean/min/max for diffu-GRPO and coupled-GRPO, see
    ``d1jax.objectives`` for wd1 and SPG).
    """
    seed_1, rows, old_is_current = iteration_rows(cfg, state, batch)
    objective = OBJECTIVES[cfg.objective]
    kw = {} if old_is_current is None else {"old_is_current": old_is_current}
    # Masks are drawn for the whole batch, as in rollout_logps, so a row's mask does not
    # depend on how the batch is split into micro-batches.
    rows = objective.prepare(model, cfg, rows, logprob.mask_key(seed_1[0]))

    def loss_fn(trainable, mb, i):
        params = state.as_policy(trainable)  # a float32 master: cast to the model's dtype
        drop = jax.random.fold_in(rng, i) if cfg.lora_dropout else None
        return objective.loss(model, cfg, params, mb, seed_1, drop, **kw)

    loss, grads, metrics = optim.accumulate_gradients(loss_fn, state.params, rows,
                                                      cfg.grad_accum)
    return _finish(optimizer, state, loss, grads, metrics)


def sft_update_step(model: MaskPredictor, optimizer: optax.GradientTransformation, cfg: SFTConfig,
                    state: TrainState, batch: SFTBatch, rng: Array) -> tuple[TrainState, dict]:
    """One SFT optimizer step with gradient accumulation: d1's masked SFT
    (``losses.sft_loss``) or block SFT (``blockwise.sft_stage_loss``, dLLM-RL's or dFactory's
    recipe), as ``cfg.loss`` says.

    rng: the masking noise (and LoRA dropout); fold the step in for a fresh draw per step.
    """
    def loss_fn(trainable, mb, i):
        params = state.as_policy(trainable)  # a float32 master: cast to the model's dtype
        key = jax.random.fold_in(rng, i)
        drop = jax.random.fold_in(key, 1) if cfg.lora_dropout else None
        if cfg.loss in blockwise.RECIPES:  # the rows are padded with the model's pad token
            return blockwise.sft_stage_loss(
                model, params, mb.input_ids, mb.prompt_len, key, lower=cfg.lower_p,
                upper=cfg.upper_p, post_num=cfg.post_num, pad_id=model.config.pad_token_id,
                recipe=cfg.loss, dropout_rng=drop)
        return losses.sft_loss(model, params, mb.input_ids, mb.prompt_len, key,
                               eps=cfg.eps, dropout_rng=drop, seq_chunk=cfg.seq_chunk)

    loss, grads, metrics = optim.accumulate_gradients(loss_fn, state.params, batch,
                                                      cfg.grad_accum)
    return _finish(optimizer, state, loss, grads, metrics)


def mix_reference(params: Params, ref: Params, alpha: Array | float) -> Params:
    """ref <- alpha * params + (1 - alpha) * ref, leaf by leaf, in float32, stored in
    the reference's dtype (the model's: a float32 master mixes into a bfloat16 copy)."""
    return jax.tree.map(lambda p, r: (alpha * p.astype(jnp.float32)
                                      + (1.0 - alpha) * r.astype(jnp.float32)).astype(r.dtype),
                        params, ref)


def sync_reference(state: TrainState, alpha: float) -> TrainState:
    """TRL's SyncRefModelCallback on the reference copy: ref <- alpha policy + (1 - alpha) ref.

    Only runs with ``sync_ref_model`` hold a copy to mix (off by default). Without one (the
    default under LoRA: the base model with adapters off is the reference) this is a no-op,
    which is d1's behaviour: its train.yaml sets sync_ref_model (64 steps, alpha 0.6), but
    under PEFT TRL has no reference model to mix and d1 scores the reference under
    ``disable_adapter()`` (diffu-grpo/diffu_grpo_trainer.py) at every step.
    """
    if state.ref is None:
        return state
    return state.replace(ref=mix_reference(state.params, state.ref, alpha))
