"""SPG: sandwiched policy gradient (arXiv 2510.09541; facebookresearch/SPG
``spg/spg_trainer.py``, ``SPGTrainer.compute_loss`` and ``_get_per_seq_logps``).

Each completion o_i (real length n_i) gets J block-wise noisy copies (``masking.block_masks``)
with S_ij the masked real positions, t_ij = |S_ij| / n_i, and p_ijc = pi(o_ic | copy j):

  ELBO_i = mean_j ( sum_{c in S_ij} log p_ijc / |S_ij| )                    (lower bound)
  EUBO_i = 1/(beta |U_i|) sum_{c in U_i} log( mean_j [c in S_ij] p_ijc^beta / t_ij )
                                                                            (upper bound)
with U_i the positions masked in at least one copy. Positive-advantage sequences use the
ELBO, the others the mixture  omega EUBO_i + (1 - omega) ELBO_i  (omega = 1: pure EUBO,
omega = 0: pure ELBO), and the loss is  - sum_i A_i l_i n_i / sum_i n_i : the per-token
averages times n_i, the ELBO's 1/t weighting. No ratio, no old-policy or reference pass.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.knobs import frozen, group_of, knob, shared

from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import logprob, masking

Array = jax.Array


@frozen
class SPGConfig:
    """SPG knobs; defaults from the authors' ``spg_mix`` GSM8K/MATH scripts (mix, beta 1.5).
    Its knobs (``knob``) are config.grpo.spg; the other fields the run sets from the loop's."""

    block_length: int = 32  # Block size of the masking (the sampler's block length).
    num_t: int = knob(2, "J: block-masked noisy copies per sequence (Monte Carlo samples of the "
                      "bounds); in [1, gen_length / block_length].", low=1)
    min_t: float = knob(0.0, "Masked share of the chosen block lies in [min_t, max_t].")
    max_t: float = knob(1.0, "Upper end of that share.")
    p_mask_prompt: float = 0.15  # p: noise on the prompt and the clean blocks before block k.
    # The authors: 1.0 on Sudoku, 2.0 on Countdown's EUBO.
    eubo_beta: float = knob(1.5, "beta: power of the upper bound (EUBO).")
    mix_weight: float = knob(0.5, "omega: EUBO share of the negative-advantage estimate (1: "
                             "pure EUBO).")
    use_attention_mask: bool = True  # The authors pass the prompt mask as attention mask.
    seq_chunk: int | None = None  # Completion positions per head chunk (None: automatic).

    def __post_init__(self):
        if not (0.0 <= self.min_t <= self.max_t <= 1.0 and 0.0 <= self.p_mask_prompt <= 1.0):
            raise ValueError(f"need 0 <= min_t={self.min_t} <= max_t={self.max_t} <= 1 and "
                             f"p_mask_prompt={self.p_mask_prompt} in [0, 1]")
        if self.block_length < 1 or self.num_t < 1 or self.eubo_beta <= 0:
            raise ValueError(f"block_length={self.block_length} and num_t={self.num_t} must be "
                             f">= 1 and eubo_beta={self.eubo_beta} > 0")
        if not 0.0 <= self.mix_weight <= 1.0:
            raise ValueError(f"mix_weight={self.mix_weight} must be in [0, 1] (1: pure EUBO)")


def _scored(scored_bjc: Array, completion_mask_bc: Array) -> Array:
    return scored_bjc & (completion_mask_bc[:, None, :] > 0)


def spg_elbo(logps_bjc: Array, scored_bjc: Array, completion_mask_bc: Array) -> Array:
    """[B] mean over copies of the mean log p over masked real tokens (0 for an empty copy)."""
    m = _scored(scored_bjc, completion_mask_bc)
    n_bj = jnp.sum(m, axis=-1)
    per_copy = jnp.sum(jnp.where(m, logps_bjc, 0.0), axis=-1) / jnp.maximum(n_bj, 1)
    return per_copy.mean(axis=-1)


def spg_eubo(logps_bjc: Array, scored_bjc: Array, completion_mask_bc: Array, beta: float
             ) -> Array:
    """[B] the EUBO of the module doc, the per-copy mean taken in log space."""
    m = _scored(scored_bjc, completion_mask_bc)
    n_b = jnp.maximum(jnp.sum(completion_mask_bc, axis=-1), 1).astype(jnp.float32)
    t_bj = jnp.sum(m, axis=-1) / n_b[:, None]
    x_bjc = jnp.where(m, beta * logps_bjc - jnp.log(jnp.maximum(t_bj, 1e-8))[..., None], -jnp.inf)
    union_bc = jnp.any(m, axis=1)
    # Positions masked in no copy get a finite dummy so neither value nor gradient is NaN.
    x_bjc = jnp.where(union_bc[:, None, :], x_bjc, 0.0)
    log_avg_bc = jax.nn.logsumexp(x_bjc, axis=1) - jnp.log(logps_bjc.shape[1])
    total_b = jnp.sum(jnp.where(union_bc, log_avg_bc, 0.0), axis=-1)
    return total_b / jnp.maximum(jnp.sum(union_bc, axis=-1), 1) / beta


def spg_objective(logps_bjc: Array, scored_bjc: Array, completion_mask_bc: Array,
                  advantages_b: Array, *, eubo_beta: float, mix_weight: float
                  ) -> tuple[Array, dict[str, Array]]:
    """The SPG loss from the copies' per-token log-probs (see module doc).

    Args:
      logps_bjc: [B, J, C] log p(o_c | noisy copy j) (differentiable).
      scored_bjc: [B, J, C] bool, the copies' masked completion positions.
      completion_mask_bc: [B, C], 1 up to and including the first EOS.
      advantages_b: [B] A_i.
    Returns:
      (loss, metrics): elbo_mean, eubo_mean (over all rows), positive_share (A > 0).
    """
    b, _, c = logps_bjc.shape
    if (scored_bjc.shape != logps_bjc.shape or completion_mask_bc.shape != (b, c)
            or advantages_b.shape != (b,)):
        raise ValueError(f"logps {logps_bjc.shape}, scored {scored_bjc.shape}, completion_mask "
                         f"{completion_mask_bc.shape} and advantages {advantages_b.shape} must "
                         "be [B, J, C], [B, J, C], [B, C] and [B]")
    advantages_b = jnp.asarray(advantages_b, jnp.float32)
    elbo_b = spg_elbo(logps_bjc, scored_bjc, completion_mask_bc)
    eubo_b = spg_eubo(logps_bjc, scored_bjc, completion_mask_bc, eubo_beta)
    positive_b = advantages_b > 0
    seq_b = jnp.where(positive_b, elbo_b, mix_weight * eubo_b + (1.0 - mix_weight) * elbo_b)
    len_b = jnp.sum(completion_mask_bc, axis=-1).astype(jnp.float32)
    loss = -jnp.sum(advantages_b * seq_b * len_b) / jnp.maximum(jnp.sum(len_b), 1.0)
    return loss, {"elbo_mean": elbo_b.mean(), "eubo_mean": eubo_b.mean(),
                  "positive_share": positive_b.mean()}


def spg_inputs(key: Array, prompt_ids_bp: Array, completion_ids_bc: Array,
               completion_mask_bc: Array, mask_id: int, cfg: SPGConfig) -> tuple[Array, Array]:
    """(noisy ids [B, J, L], masked completion positions [B, J, C]) of one draw; each copy's
    prompt is masked independently with probability ``p_mask_prompt``."""
    k_mask, k_prompt = jax.random.split(key)
    is_mask_bjc, _ = masking.block_masks(
        k_mask, completion_mask_bc, block_length=cfg.block_length, num_t=cfg.num_t,
        min_t=cfg.min_t, max_t=cfg.max_t, p_clean=cfg.p_mask_prompt)
    b, p = prompt_ids_bp.shape
    prompt_bjp = logprob.mask_prompt(k_prompt, jnp.broadcast_to(
        prompt_ids_bp[:, None], (b, cfg.num_t, p)), cfg.p_mask_prompt, mask_id)
    comp_bjc = jnp.where(is_mask_bjc, mask_id, completion_ids_bc[:, None])
    return jnp.concatenate([prompt_bjp, comp_bjc], axis=-1), is_mask_bjc


def spg_copies_loss(model: MaskPredictor, params: Any, ids_bjl: Array, is_mask_bjc: Array,
                    prompt_mask_bp: Array, completion_ids_bc: Array, completion_mask_bc: Array,
                    advantages_b: Array, cfg: SPGConfig, *, dropout_rng: Array | None = None
                    ) -> tuple[Array, dict[str, Array]]:
    """SPG's ``compute_loss`` on a given draw (``spg_inputs``: noisy ids [B, J, L], masked
    completion positions [B, J, C], drawn on the whole batch by the update and sliced into
    micro-batches): one forward of the B x J noisy copies, then ``spg_objective``."""
    b, c = completion_ids_bc.shape
    j = cfg.num_t
    attn_bl = masking.attention_mask(prompt_mask_bp, c, cfg.use_attention_mask)
    attn_nl = None if attn_bl is None else jnp.repeat(attn_bl, j, axis=0)
    lp_nc = masking.masked_logps(model, params, ids_bjl.reshape(b * j, -1),
                                 jnp.repeat(completion_ids_bc, j, axis=0), attn_nl,
                                 dropout_rng=dropout_rng, seq_chunk=cfg.seq_chunk)
    return spg_objective(lp_nc.reshape(b, j, c), is_mask_bjc, completion_mask_bc, advantages_b,
                         eubo_beta=cfg.eubo_beta, mix_weight=cfg.mix_weight)


# config.grpo.spg: SPGConfig's knobs, the ConfigDict group and the spec's.
SPGKnobs = group_of(SPGConfig, "SPG's knobs: config.grpo.spg.")


def hparams_from(g, s) -> SPGConfig:
    """config.grpo.spg with the sampler's block length, the loop's prompt noise and
    attention mask; J within the completion's blocks."""
    blocks = s.gen_length // s.block_length
    if not 1 <= g.spg.num_t <= blocks:
        raise ValueError(f"spg.num_t={g.spg.num_t} must be in [1, {blocks}] (the blocks of "
                         "sampler.gen_length / sampler.block_length)")
    return shared(SPGConfig, g.spg, block_length=s.block_length, p_mask_prompt=g.p_mask_prompt,
                  use_attention_mask=s.use_attention_mask)
