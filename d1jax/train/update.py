"""diffu-GRPO and masked-SFT update steps as pure functions of a small ``TrainState``.

A rollout (prompts, G completions each, advantages) is used for mu optimizer steps (d1's
``num_iterations``), each with its own mask seed. Per rollout the train loop calls
``rollout_logps`` once (old and reference log-probs for all mu seeds), then
``grpo_update_step`` mu times; every ``ref_model_sync_steps`` steps it may call
``sync_reference``. ``make_jitted_steps`` jits all of them for a mesh (explicit shardings,
donation).

The reference policy: under LoRA, the base weights with adapters off (d1: PEFT's
``disable_adapter()``; ``state.ref`` is None, no copy). With ``keep_reference=True``,
``state.ref`` is a copy of the trainable leaves (adapters under LoRA, all params for full
fine-tuning) that ``sync_reference`` mixes toward the policy (TRL's SyncRefModelCallback).

Batch of ``grpo_update_step`` (B rows, P prompt, C completion tokens, mu seeds):
  prompt_ids [B, P] int32, prompt_mask [B, P] (1 = real token), completion_ids [B, C] int32,
  completion_mask [B, C] (1 up to and including the first EOS), advantages [B] float32,
  mask_seeds [mu] int32, old_logps [mu, B, C] (only needed when mu > 1),
  ref_logps [mu, B, C] (only when beta != 0), and optionally iteration [] int32 (which of
  the mu seeds this step uses; default ``state.step % mu``, d1's ``_step % num_iterations``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.core
import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from d1jax.objectives import logprob
from d1jax.objectives import losses
from d1jax.train import optim
from d1jax.model import lora as lora_lib
from d1jax import sharding as shd
from d1jax.model import LLaDA

Array = jax.Array
Params = dict[str, Any]
ROW_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
SEED_KEYS = ("old_logps", "ref_logps")  # [mu, B, C]: one row per mask seed


@flax.struct.dataclass
class TrainState:
    """Everything an update changes. A pytree: jit it, shard it, checkpoint it.

    step: [] int32 optimizer steps taken (skipped ones included).
    params: the trainable leaves: LoRA adapters, or all params for full fine-tuning.
    frozen: the base params under LoRA ({} for full fine-tuning); never updated.
    opt_state: optax state of ``params``.
    ref: reference copy of the trainable leaves, or None (LoRA: the base model is the
      reference; full fine-tuning: no reference, so beta must be 0).
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
        """(full params, use_lora) of the reference policy, or None when there is none."""
        if self.ref is not None:
            return (lora_lib.join(self.frozen, self.ref), True) if self.lora else (self.ref, True)
        if self.lora:
            return self.policy_params(), False
        return None


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """diffu-GRPO knobs (static under jit); symbols as in d1 (arXiv 2504.12216)."""

    num_iterations: int = 12  # mu: updates per rollout, each with its own mask seed.
    beta: float = 0.04  # beta: weight of the k3 KL to the reference (0: no reference pass).
    epsilon: float = 0.5  # epsilon: ratio clip.
    p_mask_prompt: float = 0.15  # p_mask: probability of masking each prompt token.
    cfg_scale: float = 0.0  # Classifier-free guidance inside the estimator (d1: 0).
    use_attention_mask: bool = True  # False attends to prompt padding, as d1 does.
    grad_accum: int = 1  # Micro-batches per optimizer step (each its own token mean).
    lora_dropout: bool = False  # LoRA dropout in the policy pass of the update.
    seq_chunk: int | None = None  # Completion positions per head chunk (None: automatic).
    max_tokens: int | None = None  # None: d1's token mean; int: Dr. GRPO constant normaliser.

    def __post_init__(self):
        if self.num_iterations < 1 or self.grad_accum < 1 or not 0 <= self.p_mask_prompt <= 1:
            raise ValueError(f"invalid GRPO config {self}: num_iterations, grad_accum >= 1 and "
                             "0 <= p_mask_prompt <= 1 are required")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Masked SFT knobs (d1's SFT trainer)."""

    eps: float = 1e-3  # Lower bound of the mask ratio t ~ U(eps, 1).
    grad_accum: int = 1  # Micro-batches per optimizer step.
    lora_dropout: bool = False  # LoRA dropout in the forward pass.
    seq_chunk: int | None = None  # Positions per head chunk (None: automatic).


def init_train_state(params: Params, optimizer: optax.GradientTransformation, *, lora: bool,
                     keep_reference: bool = False, shardings: TrainState | None = None
                     ) -> TrainState:
    """A TrainState for ``params`` (plain LLaDA params, with adapters when ``lora``).

    Under LoRA only the adapters are trainable (and carry optimizer state); the base leaves
    are kept as given (not copied, never donated); the trainable leaves are copied, since
    jitted updates donate them. keep_reference stores a copy of the trainable leaves as
    the reference (needed for full fine-tuning with beta != 0, or to sync a LoRA
    reference); otherwise the LoRA reference is the base model. ``shardings`` (from
    ``state_shardings``) places everything and creates the optimizer state born sharded.
    """
    if lora:
        frozen, trainable = lora_lib.split(params)
        if not trainable:
            raise ValueError("lora=True but params hold no lora_a/lora_b leaves: build the "
                             "model with LLaDA(config, lora=LoraConfig(...))")
    else:
        frozen, trainable = {}, params
    sh = shardings if shardings is not None else TrainState(None, None, None, None, None, None)
    if shardings is not None:  # a no-op for params already placed by the same rules
        frozen, trainable = jax.device_put((frozen, trainable), (sh.frozen, sh.params))
    opt_state = jax.jit(optimizer.init, out_shardings=sh.opt_state)(trainable)
    copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=sh.params)
    trainable_in, trainable = trainable, copy(trainable)  # updates donate it: not the caller's

    def zero():  # two buffers: the state is donated, and a buffer cannot be donated twice
        return jax.device_put(jnp.zeros((), jnp.int32), sh.step)
    return TrainState(step=zero(), params=trainable, frozen=frozen, opt_state=opt_state,
                      ref=copy(trainable_in) if keep_reference else None, skipped=zero())


def _attention_mask(batch: dict, use_mask: bool) -> Array | None:
    """[B, P + C]: the prompt mask, completion always attended; None when not used."""
    if not use_mask:
        return None
    return jnp.concatenate([batch["prompt_mask"], jnp.ones_like(batch["completion_ids"])], axis=1)


def _estimate(model: LLaDA, cfg: GRPOConfig, params: Params, batch: dict, seeds_s: Array,
              use_lora: bool = True, dropout_rng: Array | None = None,
              p_mask_prompt: float | None = None) -> Array:
    p = cfg.p_mask_prompt if p_mask_prompt is None else p_mask_prompt
    return logprob.per_token_logps(
        model, params, batch["prompt_ids"], batch["completion_ids"], seeds_s,
        p_mask_prompt=p, attention_mask_bl=_attention_mask(
            batch, cfg.use_attention_mask), cfg_scale=cfg.cfg_scale, use_lora=use_lora,
        seq_chunk=cfg.seq_chunk, dropout_rng=dropout_rng)


def rollout_logps(model: LLaDA, cfg: GRPOConfig, state: TrainState, batch: dict
                  ) -> dict[str, Array]:
    """Old and reference per-token log-probs for all mu mask seeds, once per rollout.

    batch: prompt_ids, prompt_mask, completion_ids, mask_seeds [mu] (see module doc).
    Returns {"old_logps": [mu, B, C]} when mu > 1 (d1 uses the detached current log-probs
    when mu == 1) and {"ref_logps": [mu, B, C]} when beta != 0 (no reference pass at all
    when beta == 0). Each is one estimator call over all seeds; no gradient flows.
    """
    seeds = batch["mask_seeds"]
    if seeds.shape != (cfg.num_iterations,):
        raise ValueError(f"mask_seeds {seeds.shape} must be [num_iterations={cfg.num_iterations}]")
    out: dict[str, Array] = {}
    if cfg.num_iterations > 1:
        out["old_logps"] = _estimate(model, cfg, state.policy_params(), batch, seeds)
    if cfg.beta != 0.0:
        ref = state.reference_params()
        if ref is None:
            raise ValueError("beta != 0 with full fine-tuning needs a reference copy: "
                             "init_train_state(..., keep_reference=True)")
        out["ref_logps"] = _estimate(model, cfg, ref[0], batch, seeds, use_lora=ref[1])
    return jax.lax.stop_gradient(out)


def _iteration_rows(cfg: GRPOConfig, state: TrainState, batch: dict) -> tuple[Array, dict]:
    """(mask seed [1], per-row batch for this iteration: old/ref log-probs [B, C])."""
    it = batch.get("iteration", state.step % cfg.num_iterations)
    rows = {k: batch[k] for k in ROW_KEYS}
    for k in SEED_KEYS:
        if k in batch:
            rows[k] = jax.lax.dynamic_index_in_dim(batch[k], it, axis=0, keepdims=False)
    if cfg.num_iterations > 1 and "old_logps" not in rows:
        raise ValueError("mu > 1 needs old_logps [mu, B, C] from rollout_logps in the batch")
    if cfg.beta != 0.0 and "ref_logps" not in rows:
        raise ValueError("beta != 0 needs ref_logps [mu, B, C] from rollout_logps in the batch")
    return jax.lax.dynamic_slice_in_dim(batch["mask_seeds"], it, 1), rows


def _finish(optimizer, state: TrainState, loss, grads, metrics):
    params, opt_state, om = optim.apply_gradients(optimizer, state.params, state.opt_state,
                                                  grads)
    skipped = state.skipped + om["update_skipped"].astype(jnp.int32)
    state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                          skipped=skipped)
    return state, {"loss": loss, **metrics, **om, "skipped_updates": skipped}


def grpo_update_step(model: LLaDA, optimizer: optax.GradientTransformation, cfg: GRPOConfig,
                     state: TrainState, batch: dict, rng: Array) -> tuple[TrainState, dict]:
    """One diffu-GRPO optimizer step: one inner iteration on one rollout batch.

    The current policy's log-probs use this iteration's mask seed; the loss is d1's
    ``compute_loss`` (``losses.grpo_loss``), averaged over ``cfg.grad_accum`` micro-batches;
    then clipping and AdamW, skipped on a non-finite gradient. ``rng`` only drives LoRA
    dropout. Returns (new state, metrics: loss, kl, clip_ratio, ratio_mean/min/max,
    grad_norm, grad_norm_clipped, lr, update_skipped, skipped_updates).
    """
    seed_1, rows = _iteration_rows(cfg, state, batch)
    # The prompt mask is drawn for the whole batch, as in rollout_logps, so a row's mask does
    # not depend on how the batch is split into micro-batches.
    rows["prompt_ids"] = logprob.mask_prompt(logprob.mask_key(seed_1[0]), rows["prompt_ids"],
                                             cfg.p_mask_prompt, model.config.mask_token_id)

    def loss_fn(trainable, mb, i):
        params = lora_lib.join(state.frozen, trainable) if state.lora else trainable
        drop = jax.random.fold_in(rng, i) if cfg.lora_dropout else None
        logps_bc = _estimate(model, cfg, params, mb, seed_1, dropout_rng=drop,
                             p_mask_prompt=0.0)[0]
        return losses.grpo_loss(logps_bc, mb.get("old_logps"), mb.get("ref_logps"),
                                mb["advantages"], mb["completion_mask"], epsilon=cfg.epsilon,
                                beta=cfg.beta, max_tokens=cfg.max_tokens)

    loss, grads, metrics = optim.accumulate_gradients(loss_fn, state.params, rows,
                                                      cfg.grad_accum)
    return _finish(optimizer, state, loss, grads, metrics)


def sft_update_step(model: LLaDA, optimizer: optax.GradientTransformation, cfg: SFTConfig,
                    state: TrainState, batch: dict, rng: Array) -> tuple[TrainState, dict]:
    """One masked-SFT optimizer step (``losses.sft_loss``) with gradient accumulation.

    batch: input_ids [B, L] int32 (prompt + completion, EOS-padded), prompt_len [B] int32.
    rng: the masking noise (and LoRA dropout); fold the step in for a fresh draw per step.
    """
    def loss_fn(trainable, mb, i):
        params = lora_lib.join(state.frozen, trainable) if state.lora else trainable
        key = jax.random.fold_in(rng, i)
        drop = jax.random.fold_in(key, 1) if cfg.lora_dropout else None
        return losses.sft_loss(model, params, mb["input_ids"], mb["prompt_len"], key,
                               eps=cfg.eps, dropout_rng=drop, seq_chunk=cfg.seq_chunk)

    batch = {k: batch[k] for k in ("input_ids", "prompt_len")}
    loss, grads, metrics = optim.accumulate_gradients(loss_fn, state.params, batch,
                                                      cfg.grad_accum)
    return _finish(optimizer, state, loss, grads, metrics)


def mix_reference(params: Params, ref: Params, alpha: Array | float) -> Params:
    """ref <- alpha * params + (1 - alpha) * ref, leaf by leaf, in float32."""
    return jax.tree.map(lambda p, r: (alpha * p.astype(jnp.float32)
                                      + (1.0 - alpha) * r.astype(jnp.float32)).astype(r.dtype),
                        params, ref)


def sync_reference(state: TrainState, alpha: float) -> TrainState:
    """TRL's SyncRefModelCallback (d1: every 64 steps, alpha 0.6) on the reference copy.

    With no reference copy (LoRA with the base model as reference) this is a no-op, which is
    also what d1 does: under PEFT, TRL's reference model is None and the callback skips.
    """
    if state.ref is None:
        return state
    return state.replace(ref=mix_reference(state.params, state.ref, alpha))


# ----------------------------------------------------------------------------- jitting

def batch_shardings(mesh: Mesh, batch: dict, rules=shd.DEFAULT_RULES) -> dict:
    """NamedShardings of a batch dict: rows over the batch axes; [mu, B, C] log-probs on
    their second axis; mask_seeds, iteration and other 0/1-D scalars-per-step replicated."""
    def one(key, x):
        if key in SEED_KEYS:
            spec = nn.logical_to_mesh_axes((None, shd.BATCH, None), list(rules))
            return NamedSharding(mesh, spec)
        if key in ("mask_seeds", "iteration"):
            return shd.replicated(mesh)
        return shd.batch_sharding(mesh, x.ndim, rules)
    return {k: one(k, v) for k, v in batch.items()}


def state_shardings(model: LLaDA, mesh: Mesh, optimizer: optax.GradientTransformation, *,
                    lora: bool, keep_reference: bool, rules=shd.DEFAULT_RULES) -> TrainState:
    """A TrainState of NamedShardings: params by the model's logical axes, optimizer
    moments like their params, counters and hyperparameters replicated."""
    full = shd.param_shardings(model, mesh, rules)
    frozen, trainable = lora_lib.split(full) if lora else ({}, full)
    rep = shd.replicated(mesh)
    abstract = jax.eval_shape(optimizer.init, jax.eval_shape(
        lambda: lora_lib.split(_abstract_params(model))[1] if lora else _abstract_params(model)))
    opt = optax.tree_map_params(optimizer, lambda _, s: s, abstract, trainable,
                                transform_non_params=lambda _: rep,
                                is_leaf=lambda x: isinstance(x, NamedSharding))
    return TrainState(step=rep, params=trainable, frozen=frozen, opt_state=opt,
                      ref=trainable if keep_reference else None, skipped=rep)


def _abstract_params(model: LLaDA) -> Params:
    ids = jnp.zeros((1, 8), jnp.int32)
    return flax.core.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids)["params"])


@dataclasses.dataclass(frozen=True)
class JittedSteps:
    """The update functions jitted for one model, optimizer and mesh (``make_jitted_steps``).

    init(params) -> TrainState
    rollout_logps(state, batch) -> {"old_logps", "ref_logps"}: [mu, B, C] each, when needed
    grpo_update(state, batch, rng) -> (state, metrics)   state donated
    sft_update(state, batch, rng) -> (state, metrics)    state donated
    sync_reference(state, alpha) -> state                reference copy donated
    Batches may be numpy or device arrays; they are placed with ``batch_shardings``. The
    frozen base and the reference are inputs only (never copied, never donated).
    """

    init: Callable[[Params], TrainState]
    rollout_logps: Callable[[TrainState, dict], dict] | None
    grpo_update: Callable[[TrainState, dict, Array], tuple[TrainState, dict]] | None
    sft_update: Callable[[TrainState, dict, Array], tuple[TrainState, dict]] | None
    sync_reference: Callable[[TrainState, float], TrainState]


def _moving(state: TrainState) -> TrainState:
    return state.replace(frozen={}, ref=None)


def make_jitted_steps(model: LLaDA, mesh: Mesh | None, optimizer: optax.GradientTransformation,
                      *, lora: bool, keep_reference: bool = False, grpo: GRPOConfig | None = None,
                      sft: SFTConfig | None = None, rules=shd.DEFAULT_RULES) -> JittedSteps:
    """Jits init, rollout_logps, grpo/sft updates and sync_reference with explicit shardings
    (state by ``state_shardings``, batch by ``batch_shardings``, rng and metrics replicated)
    and the moving part of the state donated. ``mesh=None`` runs unsharded."""
    st_sh = (state_shardings(model, mesh, optimizer, lora=lora, keep_reference=keep_reference,
                             rules=rules) if mesh is not None else None)
    rep = shd.replicated(mesh) if mesh is not None else None
    mv_sh = _moving(st_sh) if st_sh is not None else None
    fixed_sh = (st_sh.frozen, st_sh.ref) if st_sh is not None else None

    def init(params):
        with shd.activate(mesh, rules):
            return init_train_state(params, optimizer, lora=lora, keep_reference=keep_reference,
                                    shardings=st_sh)

    def jit_update(step_fn):
        def inner(moving, fixed, batch, rng):
            state = moving.replace(frozen=fixed[0], ref=fixed[1])
            new, metrics = step_fn(model, optimizer, state, batch, rng)
            return _moving(new), metrics
        cache: dict = {}

        def call(state, batch, rng):
            key = tuple(sorted(batch))
            with shd.activate(mesh, rules):
                if mesh is not None:
                    bsh = batch_shardings(mesh, batch, rules)
                    batch = jax.device_put(batch, bsh)
                if key not in cache:
                    shardings = {} if mesh is None else dict(
                        in_shardings=(mv_sh, fixed_sh, bsh, rep), out_shardings=(mv_sh, rep))
                    cache[key] = jax.jit(inner, donate_argnums=(0,), **shardings)
                moving, metrics = cache[key](_moving(state), (state.frozen, state.ref), batch, rng)
            return moving.replace(frozen=state.frozen, ref=state.ref), metrics
        return call

    grpo_fn = sft_fn = logps_fn = None
    if grpo is not None:
        grpo_fn = jit_update(lambda m, o, s, b, r: grpo_update_step(m, o, grpo, s, b, r))
        logps_jit = jax.jit(lambda s, b: rollout_logps(model, grpo, s, b))

        def logps_fn(state, batch):
            with shd.activate(mesh, rules):
                if mesh is not None:
                    batch = jax.device_put(batch, batch_shardings(mesh, batch, rules))
                return logps_jit(state, batch)
    if sft is not None:
        sft_fn = jit_update(lambda m, o, s, b, r: sft_update_step(m, o, sft, s, b, r))
    mix = jax.jit(mix_reference, donate_argnums=(1,))

    def sync(state, alpha):
        if state.ref is None:
            return state
        return state.replace(ref=mix(state.params, state.ref, jnp.float32(alpha)))

    return JittedSteps(init, logps_fn, grpo_fn, sft_fn, sync)

