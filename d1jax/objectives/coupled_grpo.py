"""Coupled-GRPO (DiffuCoder, arXiv 2506.20639; apple/ml-diffucoder ``src/open_r1/coupled_grpo.py``).

The per-token log-prob estimate scores each completion token in three forward passes that
share one mask draw (``masking.coupled_masks``: ratio t, set M):

  x_full: the whole completion masked;   x_M: the tokens of M masked;   x_~M: the rest masked.

  log pi(o_c) ~= ( log p(o_c | x_full) + [c in M] log p(o_c | x_M) / t
                                       + [c not in M] log p(o_c | x_~M) / (1 - t) ) / 2

so every token is scored exactly once by the complementary pair, with the pair's mask-ratio
weights 1/t and 1/(1 - t), and averaged with the fully masked pass (the authors' weights
[1, 1/t, 1/(1-t)] and ``(p0 + weighted) / 2`` in ``selective_log_softmax``). The loss on top
is d1's clipped-ratio GRPO loss (``losses.grpo_loss``): old log-probs from the rollout policy
with the same mask key when mu > 1 (detached current ones when mu == 1), reference log-probs
only when beta != 0, token mean over the completion mask.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.knobs import frozen, group_of, knob, shared

from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import losses, masking

Array = jax.Array


@frozen
class CoupledGRPOConfig:
    """Coupled-GRPO knobs; defaults from DiffuCoder's ``recipes/config_coupled_code.yaml``.
    Its knobs (``knob``) are config.grpo.coupled_grpo; the other fields the run sets from the
    loop's (beta and epsilon: config.grpo's)."""

    epsilon: float = 0.5  # epsilon: ratio clip (the authors set epsilon_low = epsilon_high).
    beta: float = 0.01  # beta: weight of the k3 KL to the reference (0: no reference pass).
    t_min: float = knob(0.2, "t ~ U(t_min, t_max): mask ratio of the set M of the "
                        "complementary pair.")
    t_max: float = knob(0.8, "Upper end of t.")
    use_attention_mask: bool = True  # False attends to prompt padding, as the authors do.
    seq_chunk: int | None = None  # Completion positions per head chunk (None: automatic).

    def __post_init__(self):
        if not 0.0 < self.t_min <= self.t_max < 1.0:
            raise ValueError(f"mask ratio range [t_min={self.t_min}, t_max={self.t_max}] must "
                             "satisfy 0 < t_min <= t_max < 1 (both 1/t and 1/(1-t) weight tokens)")
        if self.epsilon <= 0 or self.beta < 0:
            raise ValueError(f"epsilon={self.epsilon} must be > 0 and beta={self.beta} >= 0")


def coupled_inputs(prompt_ids_bp: Array, completion_ids_bc: Array, is_mask_bc: Array,
                   mask_id: int) -> Array:
    """[3, B, L] the three noisy sequences of one draw: x_full, x_M, x_~M (M = ``is_mask_bc``).
    The prompt is never masked (the authors' ``prompt_index``)."""
    full_bc = jnp.full_like(completion_ids_bc, mask_id)
    comp_3bc = jnp.stack([full_bc, jnp.where(is_mask_bc, mask_id, completion_ids_bc),
                          jnp.where(is_mask_bc, completion_ids_bc, mask_id)])
    prompt_3bp = jnp.broadcast_to(prompt_ids_bp, (3,) + prompt_ids_bp.shape)
    return jnp.concatenate([prompt_3bp, comp_3bc], axis=-1)


def coupled_token_logps(full_bc: Array, pair_m_bc: Array, pair_c_bc: Array, is_mask_bc: Array,
                        t_b: Array) -> Array:
    """[B, C] the coupled estimate from the three passes' log p(o_c) (see module doc):
    (full + where(M, pair_m / t, pair_c / (1 - t))) / 2, t [B] per row."""
    t_b1 = t_b[:, None]
    pair_bc = jnp.where(is_mask_bc, pair_m_bc / t_b1, pair_c_bc / (1.0 - t_b1))
    return (full_bc + pair_bc) / 2.0


def coupled_logps(model: MaskPredictor, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
                  completion_ids_bc: Array, is_mask_bc: Array, t_b: Array,
                  cfg: CoupledGRPOConfig, *, use_lora: bool = True,
                  dropout_rng: Array | None = None) -> Array:
    """[B, C] float32 coupled per-token log-probs of the completion under ``params``.

    ``(is_mask_bc, t_b)`` is one ``masking.coupled_masks`` draw, made once per inner iteration
    on the whole rollout batch: the rollout's old and reference passes and the update's
    current pass must score the same masks, so micro-batches take slices of it. The three
    passes run as one forward of [3B, L]. ``use_lora=False`` evaluates the base model.
    """
    b, c = completion_ids_bc.shape
    ids_3bl = coupled_inputs(prompt_ids_bp, completion_ids_bc, is_mask_bc,
                             model.config.mask_token_id)
    attn_bl = masking.attention_mask(prompt_mask_bp, c, cfg.use_attention_mask)
    attn_nl = None if attn_bl is None else jnp.tile(attn_bl, (3, 1))
    lp_nc = masking.masked_logps(model, params, ids_3bl.reshape(3 * b, -1),
                                 jnp.tile(completion_ids_bc, (3, 1)), attn_nl,
                                 use_lora=use_lora, dropout_rng=dropout_rng,
                                 seq_chunk=cfg.seq_chunk)
    lp_3bc = lp_nc.reshape(3, b, c)
    return coupled_token_logps(lp_3bc[0], lp_3bc[1], lp_3bc[2], is_mask_bc, t_b)


def coupled_grpo_loss(model: MaskPredictor, params: Any, prompt_ids_bp: Array, prompt_mask_bp: Array,
                      completion_ids_bc: Array, completion_mask_bc: Array, advantages_b: Array,
                      is_mask_bc: Array, t_b: Array, cfg: CoupledGRPOConfig, *,
                      old_logps_bc: Array | None = None, ref_logps_bc: Array | None = None,
                      dropout_rng: Array | None = None, old_is_current: Array | None = None,
                      group_tokens_b: Array | None = None, group_size: int | None = None
                      ) -> tuple[Array, dict[str, Array]]:
    """DiffuCoder's ``compute_loss``: the clipped GRPO loss on coupled log-probs.

    Unlike wd1 and SPG (which take a key), the mask draw is an argument: it must be the one
    ``old_logps_bc`` and ``ref_logps_bc`` were computed with (see ``coupled_logps``).

    Args:
      prompt_ids_bp: [B, P] int. prompt_mask_bp: [B, P] (1 = real token).
      completion_ids_bc: [B, C] int. completion_mask_bc: [B, C], 1 up to the first EOS.
      advantages_b: [B] A_i.
      is_mask_bc: [B, C] bool, the set M. t_b: [B] its ratio (``masking.coupled_masks``).
      old_logps_bc: [B, C] rollout policy; None is mu == 1 (ratio 1, gradient A grad logp).
      ref_logps_bc: [B, C] reference policy, required when beta != 0.
      dropout_rng: LoRA dropout (None: deterministic).
      old_is_current: ``losses.grpo_loss``'s (the first inner iteration's old pass skipped).
      group_tokens_b, group_size: ``losses.grpo_loss``'s per-group token mean (None: one
        token mean over these rows).
    Returns:
      (loss, metrics): ``grpo_loss``'s (kl, clip_ratio, ratio_mean/min/max) and mask_ratio
      (the mean t).
    """
    logps_bc = coupled_logps(model, params, prompt_ids_bp, prompt_mask_bp, completion_ids_bc,
                             is_mask_bc, t_b, cfg, dropout_rng=dropout_rng)
    loss, metrics = losses.grpo_loss(logps_bc, old_logps_bc, ref_logps_bc, advantages_b,
                                     completion_mask_bc, epsilon=cfg.epsilon, beta=cfg.beta,
                                     old_is_current=old_is_current,
                                     group_tokens_b=group_tokens_b, group_size=group_size)
    return loss, {**metrics, "mask_ratio": jnp.mean(t_b)}


# config.grpo.coupled_grpo: CoupledGRPOConfig's knobs, the ConfigDict group and the spec's.
CoupledGRPOKnobs = group_of(CoupledGRPOConfig, "coupled-GRPO's knobs: config.grpo.coupled_grpo.")


def hparams_from(g, s) -> CoupledGRPOConfig:
    """config.grpo.coupled_grpo with the loop's beta, epsilon and attention mask."""
    return shared(CoupledGRPOConfig, g.coupled_grpo, epsilon=g.epsilon, beta=g.beta,
                  use_attention_mask=s.use_attention_mask)


def check_shared(h: CoupledGRPOConfig, beta: float, epsilon: float) -> None:
    """Its beta and epsilon are the GRPO config's."""
    if (h.beta, h.epsilon) != (beta, epsilon):
        raise ValueError(f"coupled_grpo hparams beta={h.beta}, epsilon={h.epsilon} "
                         f"differ from the GRPO config's beta={beta}, epsilon={epsilon}")
