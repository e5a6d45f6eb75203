"""wd1: ratio-free weighted likelihood (arXiv 2507.08838; xiaohangt/wd1
``wd1/trainers/rev_grpo_trainer.py``, ``RevDiffuGRPOTrainer.compute_loss``).

For a group of G completions o_i of one prompt with advantages A_i, and the current policy's
sequence log-likelihood l_i = sum_c m_ic log pi(o_ic) (d1's one-step estimator,
``logprob.per_token_logps``: completion fully masked, prompt masked with probability p):

  w+_i = softmax_i(A),   w-_i = softmax_i(-A),
  L_group = - sum_i w+_i l_i + sum_i w-_i l_i,

and the loss is the mean of L_group over the batch's groups. No ratio, no old-policy or
reference pass: one likelihood of the current policy per update. ``negative=False`` drops the
second term (the authors' ``wll_d1_pos_only`` trainer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from d1jax.knobs import frozen, group_of, knob, shared

Array = jax.Array


@frozen
class WD1Config:
    """wd1 knobs; defaults from the authors' ``wd1/train.yaml`` and ``run/wll_NP_*.sh``. Its
    knobs (``knob``) are config.grpo.wd1; the other fields the run sets from the loop's."""

    group_size: int = 6  # G: completions per prompt, contiguous in the batch (softmax span).
    negative: bool = knob(True, "Keep the negative-advantage term - sum w- log pi (False: the "
                          "authors' positive-only variant, wll_d1_pos_only).")
    use_attention_mask: bool = True  # False attends to prompt padding, as the authors do.
    seq_chunk: int | None = None  # Completion positions per head chunk (None: automatic).

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"group_size={self.group_size} must be >= 1")


def wd1_weights(advantages_b: Array, group_size: int) -> tuple[Array, Array]:
    """(w+ [B], w- [B]): softmax of A and of -A within each contiguous group of G."""
    b = advantages_b.shape[0]
    if b % group_size:
        raise ValueError(f"batch of {b} rows does not split into groups of {group_size}: "
                         "keep each prompt's G completions together and B a multiple of G")
    a_ng = advantages_b.astype(jnp.float32).reshape(-1, group_size)
    return (jax.nn.softmax(a_ng, axis=-1).reshape(b),
            jax.nn.softmax(-a_ng, axis=-1).reshape(b))


def wd1_weighted_loss(logps_bc: Array, completion_mask_bc: Array, w_pos_b: Array,
                      w_neg_b: Array, n_groups: float, *, negative: bool = True
                      ) -> tuple[Array, dict[str, Array]]:
    """The wd1 loss (see module doc) with the weights given: (- sum w+ l + sum w- l) / n_groups.

    For rows that are not whole groups (a strided micro-batch): weights taken from the
    whole batch (``wd1_weights``) and ``n_groups`` = rows / G, so the mean over micro-batches
    equals the whole batch's loss.
    """
    seq_b = jnp.sum(logps_bc * completion_mask_bc.astype(jnp.float32), axis=-1)
    pos = -jnp.sum(w_pos_b * seq_b) / n_groups
    neg = jnp.sum(w_neg_b * seq_b) / n_groups
    loss = pos + neg if negative else pos
    return loss, {"positive_loss": pos, "negative_loss": neg, "seq_logp_mean": seq_b.mean()}


# config.grpo.wd1: WD1Config's knobs, the ConfigDict group and the spec's.
WD1Knobs = group_of(WD1Config, "wd1's knobs: config.grpo.wd1.")


def hparams_from(g, s) -> WD1Config:
    """config.grpo.wd1 with the loop's G (wd1's group) and attention mask."""
    return shared(WD1Config, g.wd1, group_size=g.num_generations,
                  use_attention_mask=s.use_attention_mask)
