"""TraceRL (Wang et al. 2025, "Revolutionizing Reinforcement Learning Framework for Diffusion
Large Language Models"; Gen-Verse/dLLM-RL ``train/rl_sdar.py``, ``train/train_sdar_policy.py``,
``configs/rl_trado.yaml``) for block diffusion models (SDAR, TraDo); LLaDA and Dream (their
``rl_llada.py``, ``rl_dream.py``): ``d1jax.objectives.tracerl_full``, on this config.

The policy is scored on the rollout's own trace. ``decoded_at`` (the block sampler's step at
which each completion token was committed; -1 past the stop, read as one step after the
row's last, their ``max(step_map) + 1`` for padding) is cut into the training blocks of
``block_size`` tokens from the completion's start. Inside each block the distinct steps are
ranked; ``shrink`` merges ranks k at a time (their ``collapse_k_unique``: a group's steps all
take its last one). Round r is their r-th ``one_round_vectorized``: in every block the
tokens of rank r are scored (p_mask) given a noised copy where every token of rank >= r is
masked, the earlier ones clean, and the clean preceding blocks in view
(``blockwise.stream_mask``). A token is scored in exactly one round, so its log-prob is one
number [B, C]; the rounds of a row ride as copies in one forward
(``blockwise.copy_logps``), their rows one copy each.

The variants their ``training.method`` names: ``random_masking`` (one copy, each position
masked and scored with probability p ~ U(lower_p, upper_p)) and ``coupled`` (that copy and
its complement). Padding tokens of the completion (``pad_id``) are scored only for the first
``post_num`` of each row.

Loss per row (their ``forward_process``), with r = exp(clamp(p_mask (logp - old), -10, 10)):

  -sum_c p_mask min(r A, clip(r, 1 - eps, 1 + eps) A) / L1
  + beta sum_c p_mask (exp(clamp(old - logp, -10, 10)) - 1 + logp - old) / L1   (k3)

then the mean over rows, rows with an empty p_mask dropped. The KL is to the OLD policy (the
rollout's, their ``logp_old_tok``), not a reference model: ``TraceRLConfig.beta``, and the
GRPO config's ``beta`` stays 0. L1 is the completion length C (their padded response
length). Groups whose accuracy lies outside [0.2, 0.8] are dropped before training
(``reward/rl_reward.py``): here the ``zscore_filtered`` advantages (of correctness,
``Task.correct_reward``) are 0 for them and rows with A = 0 are left out of the row count
and the scored tokens (KL included), which is the same mean.

Shape letters: B completions, P prompt, C completion, R rounds (copies).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.knobs import frozen, group_of, knob, negative_is_none, shared, zero_is_none

from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import blockwise, losses

Array = jax.Array
METHODS = ("TraceRL", "random_masking", "coupled")


@frozen
class TraceRLConfig:
    """dLLM-RL's ``training`` knobs (configs/rl_trado.yaml values). Its knobs (``knob``) are
    config.grpo.tracerl, where post_num -1 and block_size 0 are this config's None."""

    method: str = knob("TraceRL", "TraceRL scores the rollout's trace; random_masking, coupled: "
                       "their random-mask variants (dLLM-RL training.method).", choices=METHODS)
    # collapse_k_unique's k.
    shrink: int = knob(1, "s: trace steps merged into one training round (rl_trado.yaml: 1).",
                       low=1)
    post_num: int | None = knob(0, "Padding tokens after the response scored per row (-1: all).",
                                low=-1, held_as=negative_is_none)
    lower_p: float = knob(0.1, "random_masking/coupled: p ~ U(lower_p, upper_p) per position.")
    upper_p: float = knob(0.9, "random_masking/coupled: upper end of that p.")
    beta: float = knob(0.01, "beta: weight of the k3 KL to the OLD (rollout) policy, their "
                       "training.beta; grpo.beta stays 0.")
    use_kl_estimator_k3: bool = knob(True, "k3 estimator of that KL (False: the log-ratio).")
    block_size: int | None = knob(0, "Training block of the rounds and the mask (0: the model's; "
                                  "LLaDA, Dream: none, leave 0).", low=0, held_as=zero_is_none)
    seq_chunk: int | None = None  # Copy positions per head chunk (None: automatic).
    # Full-attention families (LLaDA, Dream; d1jax.objectives.tracerl_full) only:
    use_attention_mask: bool = True  # Mask the prompt's padding keys (the sampler's knob).
    their_dream_forward: bool = knob(False, "Dream: rl_dream.py's training forward (RoPE "
                                     "positions 0..L-1 across prompt padding; the rollout's "
                                     "count real tokens; tracerl_full's doc).")

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r}: one of {METHODS}")
        if self.shrink < 1 or not 0 <= self.lower_p <= self.upper_p <= 1:
            raise ValueError(f"shrink={self.shrink} must be >= 1 and 0 <= lower_p={self.lower_p}"
                             f" <= upper_p={self.upper_p} <= 1")


def block_of(model: MaskPredictor, cfg: TraceRLConfig) -> int:
    """The training block size: ``cfg.block_size`` or the model's (a block diffusion family)."""
    if cfg.block_size is not None:
        return cfg.block_size
    size = getattr(model.config, "block_size", None)
    if size is None:
        raise ValueError(f"TraceRL needs a block diffusion model (config.block_size); "
                         f"{type(model).__name__} has none: set hparams.block_size")
    return size


def num_rounds(cfg: TraceRLConfig, block: int) -> int:
    """R, the copies of a row: ceil(block / shrink) for the trace (a block has at most
    ``block`` distinct steps), 1 for random_masking, 2 for coupled."""
    return {"TraceRL": -(-block // cfg.shrink), "random_masking": 1, "coupled": 2}[cfg.method]


def trace_rounds(decoded_at_bc: Array, block: int, shrink: int) -> Array:
    """[B, C] int32: each token's round, (dense rank of its step among its training block's
    distinct steps) // shrink; -1 (past the stop) reads as the row's last step + 1."""
    b, c = decoded_at_bc.shape
    d = jnp.asarray(decoded_at_bc, jnp.int32)
    d = jnp.where(d < 0, jnp.max(d, axis=1, keepdims=True) + 1, d)
    nb = -(-c // block)
    big = jnp.iinfo(jnp.int32).max
    s = jnp.pad(d, ((0, 0), (0, nb * block - c)), constant_values=big).reshape(b, nb, block)
    i = jnp.arange(block)
    same_before = (s[..., None, :] == s[..., :, None]) & (i[None, :] < i[:, None])
    first = ~jnp.any(same_before, axis=-1) & (s != big)  # [B, nb, block]
    rank = jnp.sum(first[..., None, :] & (s[..., None, :] < s[..., :, None]), axis=-1)
    return (rank // shrink).reshape(b, nb * block)[:, :c].astype(jnp.int32)


def draw_rounds(cfg: TraceRLConfig, key: Array, decoded_at_bc: Array | None, shape: tuple,
                block: int) -> Array:
    """[B, C] int32 rounds of ``cfg.method`` (-1: never scored)."""
    if cfg.method == "TraceRL":
        if decoded_at_bc is None:
            raise ValueError("TraceRL needs the rollout's trace: per_row['decoded_at'] [B, C] "
                             "(the block sampler's decoded_at)")
        return trace_rounds(decoded_at_bc, block, cfg.shrink)
    noise = blockwise.random_noise(key, shape, cfg.lower_p, cfg.upper_p)
    return jnp.where(noise, 0, 1 if cfg.method == "coupled" else -1).astype(jnp.int32)


def copies(cfg: TraceRLConfig, completion_bc: Array, round_bc: Array, rounds: int,
           mask_id: int) -> tuple[Array, Array]:
    """(noised copies [B, R, C], p_mask [B, R, C]): copy r scores round r; the trace masks
    every round >= r (later steps), the random variants the scored positions only."""
    r = jnp.arange(rounds)[None, :, None]
    scored = round_bc[:, None, :] == r
    masked = (round_bc[:, None, :] >= r) if cfg.method == "TraceRL" else scored
    return jnp.where(masked, mask_id, completion_bc[:, None, :]).astype(jnp.int32), scored


def scored_mask(cfg: TraceRLConfig, completion_bc: Array, round_bc: Array, rounds: int,
                pad_id: int) -> tuple[Array, Array]:
    """(p_mask [B, R, C] after ``post_num``, kept rows [B, R]: p_mask not empty)."""
    _, pm = copies(cfg, completion_bc, round_bc, rounds, 0)
    pm = blockwise.post_num_filter(pm, completion_bc, pad_id, cfg.post_num)
    return pm, jnp.any(pm, axis=-1)


def row_scale(cfg: TraceRLConfig, completion_bc: Array, round_bc: Array, advantages_b: Array,
              rounds: int, pad_id: int) -> Array:
    """[B] B / (C n_rows): n_rows the kept rows of completions with A != 0, counted on the
    whole batch (a micro-batch's loss is the mean over its completions of sum x scale)."""
    _, kept = scored_mask(cfg, completion_bc, round_bc, rounds, pad_id)
    n = jnp.sum(kept & (advantages_b != 0)[:, None]).astype(jnp.float32)
    b, c = completion_bc.shape
    return jnp.full((b,), b / (c * jnp.maximum(n, 1.0)), jnp.float32)


def round_logps(model: MaskPredictor, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
                completion_bc: Array, round_bc: Array, cfg: TraceRLConfig, *,
                use_lora: bool = True, dropout_rng: Array | None = None,
                with_metrics: bool = False) -> Array | tuple[Array, dict[str, Array]]:
    """[B, C] log p of each completion token in its own round's copy (0 where never scored);
    ``with_metrics``: (that, the model's ``step_metrics`` of the forward: an MoE's router
    summary, {} for a model without)."""
    block = block_of(model, cfg)
    rounds = num_rounds(cfg, block)
    noised, scored = copies(cfg, completion_bc, round_bc, rounds, model.config.mask_token_id)
    b, p = prompt_ids_bp.shape
    ids = jnp.concatenate([prompt_ids_bp, completion_bc], axis=1)
    real = jnp.concatenate([prompt_mask_bp, jnp.ones_like(completion_bc)], axis=1)
    lp = blockwise.copy_logps(model, params, ids, real, jnp.full((b,), p), noised, block=block,
                              use_lora=use_lora, dropout_rng=dropout_rng,
                              seq_chunk=cfg.seq_chunk, with_metrics=with_metrics)
    lp, aux = lp if with_metrics else (lp, None)
    lp = jnp.sum(jnp.where(scored, lp, 0.0), axis=1)
    return (lp, aux) if with_metrics else lp


def tracerl_objective(logps_bc: Array, old_logps_bc: Array | None, advantages_b: Array,
                      scored_bc: Array, scale_b: Array, *, epsilon: float, beta: float,
                      k3: bool = True, old_is_current: Array | None = None,
                      policy_weight_bc: Array | None = None, clamp: float | None = 10.0
                      ) -> tuple[Array, dict[str, Array]]:
    """Their ``forward_process`` on per-token log-probs [B, C]; ``scored_bc``: the tokens in
    a kept row's p_mask; the loss is mean_b scale_b sum_c (w policy + beta KL) (module doc),
    w = ``policy_weight_bc`` (None: 1). ``clamp``: the bound on the log-ratios inside exp
    (rl_sdar.py's 10; None: none, as rl_llada.py / rl_dream.py).
    ``old_logps_bc`` None, or ``old_is_current`` true: the detached current ones."""
    old_logps_bc = losses.old_or_current(logps_bc, old_logps_bc, old_is_current)
    diff = jnp.where(scored_bc, logps_bc - old_logps_bc, 0.0)
    bound = (lambda x: x) if clamp is None else (lambda x: jnp.clip(x, -clamp, clamp))
    ratio = jnp.exp(bound(diff))
    s1, s2 = losses.clipped_terms(ratio, advantages_b, epsilon)
    policy = jnp.minimum(s1, s2) if policy_weight_bc is None else (
        jnp.minimum(s1, s2) * policy_weight_bc)
    per_token = -jnp.where(scored_bc, policy, 0.0)
    metrics = {}
    if beta > 0:
        kl = jnp.exp(bound(-diff)) - 1.0 + diff if k3 else diff
        kl = jnp.where(scored_bc, kl, 0.0)
        per_token = per_token + beta * kl
        metrics["kl"] = jnp.sum(kl) / jnp.maximum(jnp.sum(scored_bc), 1)
    loss = jnp.mean(jnp.sum(per_token, axis=1) * scale_b)
    n = jnp.maximum(jnp.sum(scored_bc), 1)
    metrics.update(clip_ratio=jnp.sum(scored_bc & (s2 < s1)) / n,
                   ratio_mean=jnp.sum(jnp.where(scored_bc, ratio, 0.0)) / n,
                   ratio_max=jnp.max(jnp.where(scored_bc, ratio, 0.0)),
                   scored_tokens=jnp.mean(jnp.sum(scored_bc, axis=1).astype(jnp.float32)))
    return loss, metrics


def tracerl_loss(model: MaskPredictor, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
                 completion_bc: Array, advantages_b: Array, round_bc: Array, scale_b: Array,
                 cfg: TraceRLConfig, *, epsilon: float, pad_id: int,
                 old_logps_bc: Array | None = None, dropout_rng: Array | None = None,
                 old_is_current: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """``round_logps`` of the current params, then ``tracerl_objective`` on the tokens of
    kept rows. ``round_bc``: ``draw_rounds``; ``scale_b``: ``row_scale`` of the whole batch.
    The metrics include the model's router summary of the forward (an MoE's)."""
    rounds = num_rounds(cfg, block_of(model, cfg))
    lp, router = round_logps(model, params, prompt_ids_bp, prompt_mask_bp, completion_bc,
                             round_bc, cfg, dropout_rng=dropout_rng, with_metrics=True)
    pm, _ = scored_mask(cfg, completion_bc, round_bc, rounds, pad_id)
    scored = jnp.any(pm, axis=1) & (advantages_b != 0)[:, None]  # A = 0: a dropped group
    loss, metrics = tracerl_objective(lp, old_logps_bc, advantages_b, scored, scale_b,
                                      epsilon=epsilon, beta=cfg.beta,
                                      k3=cfg.use_kl_estimator_k3, old_is_current=old_is_current)
    return loss, {**metrics, **router}


# config.grpo.tracerl: TraceRLConfig's knobs, the ConfigDict group and the spec's.
TraceRLKnobs = group_of(TraceRLConfig, "TraceRL's knobs: config.grpo.tracerl.")


def hparams_from(g, s) -> TraceRLConfig:
    """config.grpo.tracerl (translated: block_size 0 and post_num -1 are None) with the
    loop's attention mask."""
    return shared(TraceRLConfig, g.tracerl, use_attention_mask=s.use_attention_mask)


def check_shared(h: TraceRLConfig, beta: float, epsilon: float) -> None:
    """The GRPO beta stays 0: TraceRL's KL is to the old policy (``h.beta``)."""
    if beta != 0.0:
        raise ValueError(f"beta={beta}: TraceRL's KL is to the old policy, weighted by "
                         "hparams.beta (their training.beta); set the GRPO beta to 0")
