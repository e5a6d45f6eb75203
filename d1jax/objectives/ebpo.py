"""EBPO, ELBO-based block-level policy optimisation (LLaDA2.1 tech report, Bie et al. 2026,
arXiv 2602.08676, section 3.2, equations (4)-(5); inclusionAI/LLaDA2.X
``llada2_1_tech_report.pdf``). The authors' RL code (an extension of AReaL) is not public:
this is the report's two equations, with the choices they leave open named below.

(4)  J(theta) = E_{x, y ~ pi_old} [ min(rho(y|x) A, clip(rho(y|x), 1 - eps_low, 1 + eps_high) A) ]
(5)  log rho(y|x) ~= sum_n w_n sum_b [ log p_theta(y_b | z_n, x; M) - log p_old(y_b | z_n, x; M) ]

over discretised timesteps t_1..t_N with weights w_n, the composite input z_n = y_{t_n} (+) y_0
(the completion noised at t_n beside the clean one) and the block-causal mask M: block b of
the noised copy sees the prompt, the clean blocks before b and itself (``blockwise``'s
layout, the one TraceRL's block variant trains on, all N copies in one forward). The loss is
-J, the mean over rows; rho is one number per sequence, clipped as a whole.

Open in the report, chosen here (docs/objectives.md, "EBPO"):
- t_n = t_min + n (t_max - t_min) / N (n = 1..N), w_n = ((t_max - t_min) / N) / t_n: the
  right Riemann sum of the masked-diffusion ELBO's integral of 1/t, so that
  sum_n w_n sum_b log p(y_b | z_n) estimates log pi(y|x) (t_min 0, t_max 1: w_n = 1/n);
- y_{t_n}: every completion position masked independently with probability t_n, one draw
  per copy per inner iteration (the old and current passes see the same draw);
- log p(y_b | z_n) is the ELBO's block term: the sum of log p over the masked positions of
  block b inside the completion mask (past the first EOS: noised, never scored);
- blocks counted from the completion's start (as TraceRL's block variant and dLLM-RL);
- the log-ratio is bounded to +-``LOG_RATIO_BOUND`` inside exp (a sum of C token terms
  overflows float32 where the equations give inf); no KL term, no prompt noise.

Shape letters: B rows, P prompt, C completion, N timesteps (noised copies).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.knobs import frozen, group_of, knob, shared, zero_is_none
from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import blockwise, logprob, losses
from d1jax.objectives.batch import GRPOBatch
from d1jax.objectives.registry import Cost, Objective

Array = jax.Array
LOG_RATIO_BOUND = 20.0  # |log rho| inside exp: e^20 ~ 5e8, far past any clip


@frozen
class EBPOConfig:
    """EBPO's knobs (config.grpo.ebpo). The report gives none of their values: the defaults
    are ours (docs/objectives.md, "EBPO")."""

    num_t: int = knob(4, "N: discretised timesteps t_n, one noised copy of the completion "
                      "each, all in one forward (report: not given).", tiny=2, low=1)
    t_min: float = knob(0.0, "Timestep grid t_n = t_min + n (t_max - t_min) / N, n = 1..N; "
                        "weights w_n = ((t_max - t_min) / N) / t_n.")
    t_max: float = knob(1.0, "Upper end of that grid (t_N; 1: the last copy fully masked).")
    eps_low: float = knob(0.2, "eps_low: rho clipped below at 1 - eps_low (report: not "
                          "given; PPO's 0.2).")
    eps_high: float = knob(0.28, "eps_high: rho clipped above at 1 + eps_high (report: not "
                           "given; DAPO's clip-higher 0.28).")
    block_size: int | None = knob(0, "Training block of the block-causal mask (0: the "
                                  "model's).", low=0, held_as=zero_is_none)
    routing_replay: bool = knob(False, "Routing replay (MoE models): the update routes by "
                                "the experts its old-policy pass chose, weighed by the "
                                "current router; logs router_changed.")
    seq_chunk: int | None = None  # Copy positions per head chunk (None: automatic).

    def __post_init__(self):
        if not 0.0 <= self.t_min < self.t_max <= 1.0:
            raise ValueError(f"t_min={self.t_min}, t_max={self.t_max}: need "
                             "0 <= t_min < t_max <= 1")
        if not (0.0 <= self.eps_low < 1.0 and self.eps_high >= 0.0):
            raise ValueError(f"eps_low={self.eps_low}, eps_high={self.eps_high}: need "
                             "0 <= eps_low < 1 and eps_high >= 0")


def timesteps(cfg: EBPOConfig) -> tuple[np.ndarray, np.ndarray]:
    """(t [N], w [N]) float32: the grid and the weights of equation (5) (module doc)."""
    step = (cfg.t_max - cfg.t_min) / cfg.num_t
    t = cfg.t_min + step * np.arange(1, cfg.num_t + 1, dtype=np.float64)
    return t.astype(np.float32), (step / t).astype(np.float32)


def draw_masks(key: Array, shape_bc: tuple[int, int], t_n: np.ndarray) -> Array:
    """bool [B, N, C]: y_{t_n}'s masked positions, each with probability t_n."""
    b, c = shape_bc
    u = jax.random.uniform(key, (b, len(t_n), c))
    return u < jnp.asarray(t_n)[None, :, None]


def elbo_token_logps(lp_bnc: Array, masked_bnc: Array, w_n: Array) -> Array:
    """[B, C]: sum_n w_n [masked in copy n] log p, each token's share of equation (5)'s
    sum_n w_n sum_b log p(y_b | z_n) (a row's sum over scored tokens is that sum)."""
    w = jnp.asarray(w_n, jnp.float32)[None, :, None]
    return jnp.sum(jnp.where(masked_bnc, w * lp_bnc, 0.0), axis=1)


def ebpo_objective(logps_bc: Array, old_logps_bc: Array | None, advantages_b: Array,
                   scored_bc: Array, *, eps_low: float, eps_high: float,
                   old_is_current: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """-J of equation (4) on ``elbo_token_logps`` of the current and old policies: log rho
    [B] the sum over scored tokens of their difference; the mean over rows of
    -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A). ``old_logps_bc`` None, or
    ``old_is_current`` true: the detached current ones (rho = 1)."""
    old = losses.old_or_current(logps_bc, old_logps_bc, old_is_current)
    log_rho_b = jnp.sum(jnp.where(scored_bc, logps_bc - old, 0.0), axis=1)
    rho_b = jnp.exp(jnp.clip(log_rho_b, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    a_b = advantages_b.astype(jnp.float32)
    s1 = rho_b * a_b
    s2 = jnp.clip(rho_b, 1.0 - eps_low, 1.0 + eps_high) * a_b
    loss = -jnp.mean(jnp.minimum(s1, s2))
    clipped = s2 < s1
    f32 = lambda x: jnp.mean(x.astype(jnp.float32))  # noqa: E731
    return loss, {"clip_ratio": f32(clipped), "clip_low": f32(clipped & (a_b < 0)),
                  "clip_high": f32(clipped & (a_b > 0)), "ratio_mean": jnp.mean(rho_b),
                  "ratio_min": jnp.min(rho_b), "ratio_max": jnp.max(rho_b),
                  "log_ratio_abs": jnp.mean(jnp.abs(log_rho_b)),
                  "scored_tokens": f32(jnp.sum(scored_bc, axis=1))}


def block_of(model: MaskPredictor, cfg: EBPOConfig) -> int:
    """The training block: ``cfg.block_size`` or the model's (a block diffusion family)."""
    size = cfg.block_size or getattr(model.config, "block_size", None)
    if size is None:
        raise ValueError(f"EBPO needs a block diffusion model (config.block_size); "
                         f"{type(model).__name__} has none")
    return size


def elbo_logps(model: MaskPredictor, params: Any, rows: GRPOBatch, masked_bnc: Array,
               cfg: EBPOConfig, *, use_lora: bool = True, dropout_rng: Array | None = None,
               **replay: Any) -> Any:
    """[B, C] ``elbo_token_logps`` of ``params``: the N noised copies beside the clean row
    under the block-causal mask, one forward (``blockwise.copy_logps``). ``replay``:
    ``copy_logps``' routing arguments (``record_routing`` or ``routing`` with
    ``with_metrics``), whose second output is returned beside the log-probs."""
    comp = rows.completion_ids
    noised = jnp.where(masked_bnc, model.config.mask_token_id, comp[:, None, :])
    b, p = rows.prompt_ids.shape
    ids = jnp.concatenate([rows.prompt_ids, comp], axis=1)
    real = jnp.concatenate([rows.prompt_mask, jnp.ones_like(comp)], axis=1)
    lp = blockwise.copy_logps(model, params, ids, real, jnp.full((b,), p), noised,
                              block=block_of(model, cfg), use_lora=use_lora,
                              dropout_rng=dropout_rng, seq_chunk=cfg.seq_chunk, **replay)
    lp, aux = lp if replay else (lp, None)
    out = elbo_token_logps(lp, masked_bnc, timesteps(cfg)[1])
    return (out, aux) if replay else out


# ---------------------------------------------------------------------------- the record
def _prepare(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    """This iteration's N masks on the whole batch (the draw ``_logps`` made from its seed)."""
    masked = draw_masks(key, rows.completion_ids.shape, timesteps(cfg.hparams)[0])
    return rows.replace(per_row={**(rows.per_row or {}), "masked": masked})


def _logps(model: MaskPredictor, cfg, params: Any, batch: GRPOBatch, seeds_s: Array,
           use_lora: bool) -> Array | tuple[Array, Array]:
    """[S, B, C] the old policy's ``elbo_logps``, one mask draw per seed; with routing
    replay, also the experts each pass chose, [S, B, n_moe, N, K] (``copy_logps``)."""
    t_n = timesteps(cfg.hparams)[0]
    record = {"record_routing": True} if cfg.hparams.routing_replay else {}

    def one(seed):
        masked = draw_masks(logprob.mask_key(seed), batch.completion_ids.shape, t_n)
        return elbo_logps(model, params, batch, masked, cfg.hparams, use_lora=use_lora,
                          **record)
    return jax.lax.map(one, seeds_s)


def _loss(model: MaskPredictor, cfg, params: Any, rows: GRPOBatch, seed_1: Array,
          dropout_rng: Array | None, old_is_current: Array | None = None
          ) -> tuple[Array, dict]:
    h: EBPOConfig = cfg.hparams
    replay = {"with_metrics": True}  # an MoE's router summary ({} for a model without)
    if h.routing_replay and rows.old_routing is not None:  # mu > 1: the old pass recorded
        replay["routing"] = rows.old_routing
    lp, router = elbo_logps(model, params, rows, rows.per_row["masked"], h,
                            dropout_rng=dropout_rng, **replay)
    loss, m = ebpo_objective(lp, rows.old_logps, rows.advantages,
                             rows.completion_mask.astype(bool), eps_low=h.eps_low,
                             eps_high=h.eps_high, old_is_current=old_is_current)
    return loss, {**m, **router}


def _check(h: EBPOConfig, beta: float, epsilon: float) -> None:
    if beta != 0.0:
        raise ValueError(f"beta={beta}: EBPO (LLaDA2.1 report, equation (4)) has no KL term; "
                         "set the GRPO beta to 0")


# config.grpo.ebpo: EBPOConfig's knobs, the ConfigDict group and the spec's.
EBPOKnobs = group_of(EBPOConfig, "EBPO's knobs: config.grpo.ebpo.")

OBJECTIVE = Objective(
    "ebpo", _loss, _prepare, _logps, EBPOConfig, default_hparams=True, knobs=EBPOKnobs,
    doc="EBPO (LLaDA2.1, arXiv 2602.08676): block-level ELBO ratio over N timesteps; its "
        "clip is eps_low/eps_high below, not grpo.epsilon.",
    make_hparams=lambda g, s: shared(EBPOConfig, g.ebpo), check=_check, beta=0.0,
    families=("sdar", "llada2"),
    cost=lambda model, cfg, completion: Cost("stream", cfg.hparams.num_t), paper="2602.08676")
