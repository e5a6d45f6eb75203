"""JustGRPO (arXiv 2601.15165; LeapLabTHU/JustGRPO ``grpo.py``): plain GRPO on the exact
autoregressive factorisation of a masked diffusion LM.

Rollouts decode in autoregressive order (``sample``: LLaDA's sampler with block length 1
and steps = gen length, one token per step left to right). Their likelihood is then exact:

  log pi(o) = sum_c log p(o_c | prompt, o_<c, [MASK] at every position >= c),

one forward per completion position with the future masked (``logprob_loss``). Here the C
positions go K at a time (``ar_logps``): one batched forward of the B x K masked copies
inside a ``lax.map`` whose body is rematerialised, so the backward keeps one chunk's
activations whatever C; the last layer runs only the chunk's K rows of each copy
(``sliced_hidden``) and the head only the one position each copy predicts.

Loss as ``logprob_loss`` writes it: per token -min(r A, clip(r, 1 - eps, 1 + eps) A) with
r = exp(logp - old) (their old is the detached current: mu = 1, r = 1), over every
completion position (no EOS mask: tokens after the first EOS count too), summed over rows
and positions and scaled by gain / (C (n_valid + 1e-5)), n_valid the rows with A != 0.
Their step sums the losses of ``grad_accumulation`` (8) accumulation steps and averages
over processes; one step here holds all of them: the sum over the batch divided by C times
the batch's valid rows (+ 1e-5) equals that with ``gain`` = their gain 1.0 x 8 (their n_valid
is the mean over processes of each one's group count; pooled over the step here).

Shape letters: B rows, P prompt, C completion, L = P + C, K positions per chunk, D width.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.knobs import frozen, group_of, knob, shared, zero_is_none

from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import logprob, losses, masking

Array = jax.Array

# Token budget of one chunk's forward (rows x K x L) when ``position_chunk`` is None.
CPU_CHUNK_TOKENS = 4096
ACCELERATOR_CHUNK_TOKENS = 65536


@frozen
class JustGRPOConfig:
    """JustGRPO knobs; defaults from its ``train.py`` (gain 1.0 x grad_accumulation 8). Its
    knobs (``knob``) are config.grpo.justgrpo, where position_chunk 0 is this config's None."""

    gain: float = knob(8.0, "Loss multiplier: its logprob_loss gain 1.0 x its 8 summed "
                       "accumulation steps (train.py).")
    position_chunk: int | None = knob(
        0, "K: completion positions per batched, rematerialised forward of the likelihood (0: "
        "auto by a token budget).", low=0, held_as=zero_is_none)
    use_attention_mask: bool = True  # False attends to prompt padding (they never pad: 1 prompt a GPU).

    def __post_init__(self):
        if self.gain <= 0:
            raise ValueError(f"gain={self.gain} must be > 0")
        if self.position_chunk is not None and self.position_chunk < 1:
            raise ValueError(f"position_chunk={self.position_chunk} must be >= 1 (None: auto)")


def auto_position_chunk(rows: int, prompt: int, completion: int,
                        budget: int | None = None) -> int:
    """Largest divisor K of ``completion`` whose chunk forward, rows x K sequences of
    prompt + completion tokens, fits ``budget`` tokens (default by backend)."""
    if budget is None:
        budget = (CPU_CHUNK_TOKENS if jax.default_backend() == "cpu"
                  else ACCELERATOR_CHUNK_TOKENS)
    best = 1
    for k in range(1, completion + 1):
        if completion % k == 0 and rows * k * (prompt + completion) <= budget:
            best = k
    return best


def ar_inputs(prompt_ids_bp: Array, completion_ids_bc: Array, t_k: Array, mask_id: int
              ) -> Array:
    """[B, K, L]: copy k of each row keeps completion positions < t_k[k], masks the rest."""
    b, p = prompt_ids_bp.shape
    c = completion_ids_bc.shape[1]
    keep_kc = jnp.arange(c)[None, :] < t_k[:, None]
    comp_bkc = jnp.where(keep_kc[None], completion_ids_bc[:, None, :], mask_id)
    prompt_bkp = jnp.broadcast_to(prompt_ids_bp[:, None, :], (b, t_k.shape[0], p))
    return jnp.concatenate([prompt_bkp, comp_bkc], axis=-1)


def ar_logps(model: MaskPredictor, params: Any, prompt_ids_bp: Array, completion_ids_bc: Array,
             attention_mask_bl: Array | None = None, *, position_chunk: int | None = None,
             use_lora: bool = True, dropout_rng: Array | None = None) -> Array:
    """[B, C] float32 log p(o_c | prompt, o_<c, [MASK] at positions >= c) for every c.

    ``position_chunk`` K (must divide C; None: ``auto_position_chunk``): positions per
    forward of B x K rows; the chunks run one after another (``lax.map``), each
    rematerialised in the backward pass, so peak memory is one chunk's. ``dropout_rng``:
    LoRA dropout, one draw per chunk (None: deterministic).
    """
    b, p = prompt_ids_bp.shape
    c = completion_ids_bc.shape[1]
    k = position_chunk or auto_position_chunk(b, p, c)
    if c % k:
        raise ValueError(f"position_chunk={k} must divide the completion length {c}")
    mask_id = model.config.mask_token_id
    head, scale = logprob.model_head(model, params)
    attn_nl = None if attention_mask_bl is None else jnp.repeat(attention_mask_bl, k, axis=0)
    diag = jnp.arange(k)

    def chunk(t0):
        ids_nl = ar_inputs(prompt_ids_bp, completion_ids_bc, t0 + diag, mask_id).reshape(b * k, -1)
        rngs = {} if dropout_rng is None else {"dropout": jax.random.fold_in(dropout_rng, t0)}
        # Rows p + t0 .. p + t0 + K - 1 of every copy; copy k reads its own row k.
        h_bkkd = model.apply({"params": params}, ids_nl, attn_nl, slice_start=p + t0,
                             slice_len=k, use_lora=use_lora, deterministic=dropout_rng is None,
                             method=type(model).sliced_hidden, rngs=rngs).reshape(b, k, k, -1)
        targets_bk = jax.lax.dynamic_slice_in_dim(completion_ids_bc, t0, k, axis=1)
        return logprob.head_logps(h_bkkd[:, diag, diag], head, targets_bk, scale=scale,
                                  seq_chunk=0)

    body = jax.checkpoint(chunk, prevent_cse=False,
                          policy=jax.checkpoint_policies.nothing_saveable)
    out_nbk = jax.lax.map(body, jnp.arange(0, c, k))
    return out_nbk.transpose(1, 0, 2).reshape(b, c)


def loss_scale(advantages_b: Array, completion_len: int, gain: float) -> Array:
    """[B] each row's weight: gain B / (C (n_valid + 1e-5)), counted on the whole batch;
    a micro-batch's loss is the mean over its rows of row sum x weight (see module doc)."""
    n_valid = jnp.sum(advantages_b != 0).astype(jnp.float32)
    b = advantages_b.shape[0]
    return jnp.full((b,), gain * b / (completion_len * (n_valid + 1e-5)), jnp.float32)


def justgrpo_objective(logps_bc: Array, old_logps_bc: Array | None, ref_logps_bc: Array | None,
                       advantages_b: Array, scale_b: Array, *, epsilon: float, beta: float = 0.0,
                       old_is_current: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """``logprob_loss`` on per-token log-probs [B, C]: mean over rows of
    scale_b x sum_c -min(r A, clip(r) A) (+ beta k3 KL, which JustGRPO does not have).

    old_logps_bc None (their code, mu = 1): the detached current ones, r = 1.
    ``old_is_current``: as ``losses.grpo_loss``. ``scale_b``: ``loss_scale``'s weights.
    """
    ratio = jnp.exp(logps_bc - losses.old_or_current(logps_bc, old_logps_bc, old_is_current))
    loss1, loss2 = losses.clipped_terms(ratio, advantages_b, epsilon)
    per_token = -jnp.minimum(loss1, loss2)
    metrics = {}
    if beta != 0.0:
        if ref_logps_bc is None:
            raise ValueError("beta != 0 needs ref_logps (computed once per rollout)")
        kl = losses.k3_kl(ref_logps_bc, logps_bc)
        per_token = per_token + beta * kl
        metrics["kl"] = jnp.mean(kl)
    loss = jnp.mean(jnp.sum(per_token, axis=1) * scale_b)
    metrics.update(clip_ratio=jnp.mean((loss1 < loss2).astype(jnp.float32)),
                   ratio_mean=jnp.mean(ratio), ratio_min=jnp.min(ratio),
                   ratio_max=jnp.max(ratio), ar_logp=jnp.mean(logps_bc),
                   valid_rows=jnp.mean((advantages_b != 0).astype(jnp.float32)))
    return loss, metrics


def justgrpo_loss(model: MaskPredictor, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
                  completion_ids_bc: Array, advantages_b: Array, scale_b: Array,
                  cfg: JustGRPOConfig, *, epsilon: float, beta: float = 0.0,
                  old_logps_bc: Array | None = None, ref_logps_bc: Array | None = None,
                  dropout_rng: Array | None = None, old_is_current: Array | None = None
                  ) -> tuple[Array, dict[str, Array]]:
    """JustGRPO's ``logprob_loss`` on rows: ``ar_logps`` of the current params, then
    ``justgrpo_objective``. ``scale_b`` [B]: ``loss_scale`` of the whole batch.

    Returns (loss, metrics: clip_ratio, ratio_mean/min/max, ar_logp (mean per-token
    log-prob), valid_rows (share with A != 0), kl with beta != 0)."""
    attn_bl = masking.attention_mask(prompt_mask_bp, completion_ids_bc.shape[1],
                                     cfg.use_attention_mask)
    logps_bc = ar_logps(model, params, prompt_ids_bp, completion_ids_bc, attn_bl,
                        position_chunk=cfg.position_chunk, dropout_rng=dropout_rng)
    return justgrpo_objective(logps_bc, old_logps_bc, ref_logps_bc, advantages_b, scale_b,
                              epsilon=epsilon, beta=beta, old_is_current=old_is_current)


# config.grpo.justgrpo: JustGRPOConfig's knobs, the ConfigDict group and the spec's.
JustGRPOKnobs = group_of(JustGRPOConfig, "JustGRPO's knobs: config.grpo.justgrpo.")


def hparams_from(g, s) -> JustGRPOConfig:
    """config.grpo.justgrpo (position_chunk 0: automatic) with the loop's attention mask."""
    return shared(JustGRPOConfig, g.justgrpo, use_attention_mask=s.use_attention_mask)
