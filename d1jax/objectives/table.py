"""The built-in GRPO objectives, registered (``d1jax.objectives.registry``), and what the
update does around each.

``OBJECTIVES`` maps a name (``GRPOConfig.objective``) to an ``Objective``: its ``loss`` (the
function the training step differentiates, and the one the tests and parity checks call),
``prepare`` (the update's random draws: prompt masks, coupled masks, SPG's noisy copies, and
per-group weights, made on the whole batch from the inner iteration's mask key before
``run.optim.accumulate_gradients`` splits the rows into strided micro-batches, so a row's
draw and weight do not depend on ``grad_accum``), and ``logps``, the estimator of the
rollout's old and reference passes (None: ratio-free, no such pass), with the facts the
config, the spec and the planner read (the record's fields). The pure update steps
(``d1jax.train.pure_steps``) look objectives up here.

``cfg`` is the run's ``GRPOConfig``; ``cfg.hparams`` the objective's own config.
Shape letters: S mask seeds, B rows, J noisy copies, P prompt, C completion, L = P + C.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from d1jax.knobs import frozen, knob, negative_is_none
from d1jax.model.predictor import MaskPredictor
from d1jax.objectives import (blockwise, coupled_grpo, ebpo, justgrpo, logprob, losses, masking,
                              recipes, spg, tracerl, tracerl_full, wd1)
from d1jax.objectives.batch import GRPOBatch
from d1jax.objectives.registry import OBJECTIVES, Cost, Objective, get, register  # noqa: F401

Array = jax.Array
Params = Any


def mask_prompt_rows(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    """d1's prompt noise (each token masked with probability ``cfg.p_mask_prompt``)."""
    return rows.replace(prompt_ids=logprob.mask_prompt(
        key, rows.prompt_ids, cfg.p_mask_prompt, model.config.mask_token_id))


def with_group_tokens(cfg, rows: GRPOBatch) -> GRPOBatch:
    """With ``cfg.norm_group`` (d1's normalisation): each row's group token count [B] in
    ``per_row["group_tokens"]``, counted on the whole batch before the micro-batch split."""
    if cfg.norm_group is None:
        return rows
    n_b = losses.group_token_counts(rows.completion_mask, cfg.norm_group)
    return rows.replace(per_row={**(rows.per_row or {}), "group_tokens": n_b})


def _ratio_loss(cfg, logps_bc: Array, rows: GRPOBatch, old_is_current: Array | None
                ) -> tuple[Array, dict]:
    """``losses.grpo_loss`` on a micro-batch of prepared rows, normalised as ``cfg`` says."""
    tokens = None if cfg.norm_group is None else rows.per_row["group_tokens"]
    return losses.grpo_loss(logps_bc, rows.old_logps, rows.ref_logps, rows.advantages,
                            rows.completion_mask, epsilon=cfg.epsilon, beta=cfg.beta,
                            max_tokens=cfg.max_tokens, old_is_current=old_is_current,
                            group_tokens_b=tokens, group_size=cfg.norm_group)


# ---------------------------------------------------------------------------- diffu-GRPO
def _diffu_prepare(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    return with_group_tokens(cfg, mask_prompt_rows(model, cfg, rows, key))


def estimate_logps(model: MaskPredictor, cfg: GRPOConfig, params: Params, batch: GRPOBatch,
                   seeds_s: Array, use_lora: bool = True, dropout_rng: Array | None = None,
                   p_mask_prompt: float | None = None, with_metrics: bool = False
                   ) -> Array | tuple[Array, dict]:
    """d1's one-step per-token log-probs [S, B, C] of the completions, one row block per
    mask seed (``logprob.per_token_logps`` with this config's estimator settings); 0 past
    the batch's last completion-mask position, which no loss or metric reads.
    ``with_metrics`` (one seed): and the model's router summary of the forward."""
    p = cfg.p_mask_prompt if p_mask_prompt is None else p_mask_prompt
    return logprob.per_token_logps(
        model, params, batch.prompt_ids, batch.completion_ids, seeds_s, p_mask_prompt=p,
        attention_mask_bl=masking.attention_mask(batch.prompt_mask, batch.completion_ids.shape[1],
                                                  cfg.use_attention_mask),
        cfg_scale=cfg.cfg_scale, use_lora=use_lora, seq_chunk=cfg.seq_chunk,
        dropout_rng=dropout_rng, read_mask_bc=batch.completion_mask,
        narrow_last_layer=bool(cfg.narrow_last_layer), with_metrics=with_metrics)


def diffu_grpo_loss(model: MaskPredictor, cfg: GRPOConfig, params: Params, rows: GRPOBatch,
                    seed_1: Array, dropout_rng: Array | None,
                    old_is_current: Array | None = None) -> tuple[Array, dict]:
    """d1's ``compute_loss``: clipped ratio to the old policy, k3 KL to the reference,
    token mean (``losses.grpo_loss``; per group with ``cfg.norm_group``), on this
    iteration's mask seed ``seed_1`` [1]; with an MoE's router summary in the metrics."""
    logps, router = estimate_logps(model, cfg, params, rows, seed_1, dropout_rng=dropout_rng,
                                   p_mask_prompt=0.0, with_metrics=True)
    loss, metrics = _ratio_loss(cfg, logps[0], rows, old_is_current)
    return loss, {**metrics, **router}


def _diffu_grpo_logps(model: MaskPredictor, cfg: GRPOConfig, params: Params, batch: GRPOBatch,
                      seeds_s: Array, use_lora: bool) -> Array:
    return estimate_logps(model, cfg, params, batch, seeds_s, use_lora=use_lora)


# ---------------------------------------------------------------------------- wd1
def _wd1_prepare(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    """Prompt noise, and w+/w- [B] from the softmax over each group of G contiguous rows:
    a strided micro-batch holds no whole group."""
    w_pos_b, w_neg_b = wd1.wd1_weights(rows.advantages, cfg.hparams.group_size)
    return mask_prompt_rows(model, cfg, rows, key).replace(
        per_row={"w_pos": w_pos_b, "w_neg": w_neg_b})


def _wd1_loss(model: MaskPredictor, cfg, params: Params, rows: GRPOBatch, seed_1: Array,
              dropout_rng: Array | None) -> tuple[Array, dict]:
    """wd1's loss (``wd1.wd1_weighted_loss``) on prepared rows: the prompt already noised
    (``cfg.p_mask_prompt``), the weights of whole groups; one current-policy pass."""
    h: wd1.WD1Config = cfg.hparams
    attn_bl = masking.attention_mask(rows.prompt_mask, rows.completion_ids.shape[1],
                                     h.use_attention_mask)
    logps_bc = logprob.per_token_logps(
        model, params, rows.prompt_ids, rows.completion_ids, seed_1, p_mask_prompt=0.0,
        attention_mask_bl=attn_bl, seq_chunk=h.seq_chunk, dropout_rng=dropout_rng,
        read_mask_bc=rows.completion_mask)[0]
    n_groups = rows.advantages.shape[0] / h.group_size
    return wd1.wd1_weighted_loss(logps_bc, rows.completion_mask, rows.per_row["w_pos"],
                                 rows.per_row["w_neg"], n_groups, negative=h.negative)


# ---------------------------------------------------------------------------- SPG
def _spg_prepare(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    """SPG's J block-masked noisy copies per row (their prompts noised independently)."""
    ids_bjl, is_mask_bjc = spg.spg_inputs(key, rows.prompt_ids, rows.completion_ids,
                                          rows.completion_mask, model.config.mask_token_id,
                                          cfg.hparams)
    return rows.replace(per_row={"ids": ids_bjl, "is_mask": is_mask_bjc})


def _spg_loss(model: MaskPredictor, cfg, params: Params, rows: GRPOBatch, seed_1: Array,
              dropout_rng: Array | None) -> tuple[Array, dict]:
    return spg.spg_copies_loss(model, params, rows.per_row["ids"], rows.per_row["is_mask"],
                               rows.prompt_mask, rows.completion_ids, rows.completion_mask,
                               rows.advantages, cfg.hparams, dropout_rng=dropout_rng)


# ---------------------------------------------------------------------------- coupled-GRPO
def _coupled_draw(cfg, key: Array, rows: int, completion_len: int) -> tuple[Array, Array]:
    h: coupled_grpo.CoupledGRPOConfig = cfg.hparams
    return masking.coupled_masks(key, rows, completion_len, t_min=h.t_min, t_max=h.t_max)


def _coupled_prepare(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    """The iteration's complementary masks, the same draw as ``_coupled_logps`` made."""
    is_mask_bc, t_b = _coupled_draw(cfg, key, *rows.completion_ids.shape)
    return with_group_tokens(cfg, rows.replace(per_row={"is_mask": is_mask_bc, "t": t_b}))


def _coupled_logps(model: MaskPredictor, cfg, params: Params, batch: GRPOBatch, seeds_s: Array,
                   use_lora: bool) -> Array:
    """[S, B, C] coupled log-probs, one mask draw per seed over the whole batch."""
    def one(seed):
        is_mask_bc, t_b = _coupled_draw(cfg, logprob.mask_key(seed), *batch.completion_ids.shape)
        return coupled_grpo.coupled_logps(model, params, batch.prompt_ids, batch.prompt_mask,
                                          batch.completion_ids, is_mask_bc, t_b, cfg.hparams,
                                          use_lora=use_lora)
    return jax.lax.map(one, seeds_s)


def _coupled_loss(model: MaskPredictor, cfg, params: Params, rows: GRPOBatch, seed_1: Array,
                  dropout_rng: Array | None, old_is_current: Array | None = None
                  ) -> tuple[Array, dict]:
    return coupled_grpo.coupled_grpo_loss(
        model, params, rows.prompt_ids, rows.prompt_mask, rows.completion_ids,
        rows.completion_mask, rows.advantages, rows.per_row["is_mask"], rows.per_row["t"],
        cfg.hparams, old_logps_bc=rows.old_logps, ref_logps_bc=rows.ref_logps,
        dropout_rng=dropout_rng, old_is_current=old_is_current,
        group_tokens_b=None if cfg.norm_group is None else rows.per_row["group_tokens"],
        group_size=cfg.norm_group)


# ---------------------------------------------------------------------------- JustGRPO
def _justgrpo_prepare(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    """Each row's loss weight, from the valid rows (A != 0) of the whole batch."""
    scale_b = justgrpo.loss_scale(rows.advantages, rows.completion_ids.shape[1], cfg.hparams.gain)
    return rows.replace(per_row={**(rows.per_row or {}), "scale": scale_b})


def _justgrpo_logps(model: MaskPredictor, cfg, params: Params, batch: GRPOBatch, seeds_s: Array,
                    use_lora: bool) -> Array:
    """[S, B, C]: the exact AR log-probs draw no mask, so every seed gets the same ones."""
    h: justgrpo.JustGRPOConfig = cfg.hparams
    attn_bl = masking.attention_mask(batch.prompt_mask, batch.completion_ids.shape[1],
                                     h.use_attention_mask)
    lp_bc = justgrpo.ar_logps(model, params, batch.prompt_ids, batch.completion_ids, attn_bl,
                              position_chunk=h.position_chunk, use_lora=use_lora)
    return jax.numpy.broadcast_to(lp_bc[None], (seeds_s.shape[0],) + lp_bc.shape)


def _justgrpo_loss(model: MaskPredictor, cfg, params: Params, rows: GRPOBatch, seed_1: Array,
                   dropout_rng: Array | None, old_is_current: Array | None = None
                   ) -> tuple[Array, dict]:
    return justgrpo.justgrpo_loss(
        model, params, rows.prompt_ids, rows.prompt_mask, rows.completion_ids, rows.advantages,
        rows.per_row["scale"], cfg.hparams, epsilon=cfg.epsilon, beta=cfg.beta,
        old_logps_bc=rows.old_logps, ref_logps_bc=rows.ref_logps, dropout_rng=dropout_rng,
        old_is_current=old_is_current)


# ---------------------------------------------------------------------------- TraceRL
# Block diffusion families (tracerl) and full-attention ones (tracerl_full, LLaDA and Dream).
def _tracerl_rounds(model: MaskPredictor, cfg, batch: GRPOBatch, key: Array) -> Array:
    h: tracerl.TraceRLConfig = cfg.hparams
    dec = (batch.per_row or {}).get("decoded_at")
    if tracerl_full.is_full_attention(model, h):
        return tracerl_full.draw_rounds(h, key, dec, batch.completion_ids.shape)
    return tracerl.draw_rounds(h, key, dec, batch.completion_ids.shape, tracerl.block_of(model, h))


def _tracerl_prepare(model: MaskPredictor, cfg, rows: GRPOBatch, key: Array) -> GRPOBatch:
    """Each token's round (the trace's, or the random variants' draw, the one
    ``_tracerl_logps`` made from the same seed) and each row's weight, on the whole batch."""
    h: tracerl.TraceRLConfig = cfg.hparams
    rnd = _tracerl_rounds(model, cfg, rows, key)
    pad = model.config.pad_token_id
    if tracerl_full.is_full_attention(model, h):
        scale = tracerl_full.row_scale(h, rows.completion_ids, rnd, rows.advantages,
                                       tracerl_full.num_rounds(h, rows.completion_ids.shape[1]),
                                       pad)
    else:
        scale = tracerl.row_scale(h, rows.completion_ids, rnd, rows.advantages,
                                  tracerl.num_rounds(h, tracerl.block_of(model, h)), pad)
    return rows.replace(per_row={**(rows.per_row or {}), "round": rnd, "scale": scale})


def _tracerl_logps(model: MaskPredictor, cfg, params: Params, batch: GRPOBatch, seeds_s: Array,
                   use_lora: bool) -> Array:
    """[S, B, C] each token's log-prob in its round; the trace draws nothing, so every seed
    gets the same ones."""
    impl = tracerl_full if tracerl_full.is_full_attention(model, cfg.hparams) else tracerl

    def one(seed):
        rnd = _tracerl_rounds(model, cfg, batch, logprob.mask_key(seed))
        return impl.round_logps(model, params, batch.prompt_ids, batch.prompt_mask,
                                batch.completion_ids, rnd, cfg.hparams, use_lora=use_lora)
    if cfg.hparams.method == "TraceRL":
        lp = one(seeds_s[0])
        return jax.numpy.broadcast_to(lp[None], (seeds_s.shape[0],) + lp.shape)
    return jax.lax.map(one, seeds_s)


def _tracerl_loss(model: MaskPredictor, cfg, params: Params, rows: GRPOBatch, seed_1: Array,
                  dropout_rng: Array | None, old_is_current: Array | None = None
                  ) -> tuple[Array, dict]:
    args = (model, params, rows.prompt_ids, rows.prompt_mask, rows.completion_ids,
            rows.advantages, rows.per_row["round"], rows.per_row["scale"], cfg.hparams)
    if tracerl_full.is_full_attention(model, cfg.hparams):
        return tracerl_full.tracerl_loss(*args, epsilon=cfg.epsilon, old_logps_bc=rows.old_logps,
                                         dropout_rng=dropout_rng, old_is_current=old_is_current)
    return tracerl.tracerl_loss(*args, epsilon=cfg.epsilon, pad_id=model.config.pad_token_id,
                                old_logps_bc=rows.old_logps, dropout_rng=dropout_rng,
                                old_is_current=old_is_current)


# ---------------------------------------------------------------------------- planner facts
def _justgrpo_rows(cfg, completion: int | None) -> int:
    if completion is None:
        raise ValueError("justgrpo runs one forward per completion position: pass "
                         "completion (the sampler's gen_length) to estimator_rows")
    return completion


def _justgrpo_accelerator(h: justgrpo.JustGRPOConfig, rows: int, prompt: int,
                          completion: int) -> justgrpo.JustGRPOConfig:
    if h.position_chunk is not None:
        return h
    return dataclasses.replace(h, position_chunk=justgrpo.auto_position_chunk(
        rows, prompt, completion, justgrpo.ACCELERATOR_CHUNK_TOKENS))


def _tracerl_cost(model: MaskPredictor, cfg, completion: int) -> Cost:
    h = cfg.hparams
    if tracerl_full.is_full_attention(model, h):  # R forwards of P + C, one per copy
        return Cost("estimator", tracerl_full.num_rounds(h, completion))
    # the clean row and its R noised copies, one forward
    return Cost("stream", tracerl.num_rounds(h, tracerl.block_of(model, h)))


# ---------------------------------------------------------------------------- the records
# d1's estimator is not adapted to block diffusion's layout, and neither are these four.
_FULL_ATTENTION = ("llada", "dream")

register(Objective("diffu_grpo", diffu_grpo_loss, _diffu_prepare, _diffu_grpo_logps,
                   paper="2504.12216"))
register(Objective(
    "wd1", _wd1_loss, _wd1_prepare, None, wd1.WD1Config, knobs=wd1.WD1Knobs,
    doc="wd1 (arXiv 2507.08838); its group is G = num_generations.",
    make_hparams=wd1.hparams_from, families=_FULL_ATTENTION, paper="2507.08838"))
register(Objective(
    "spg", _spg_loss, _spg_prepare, None, spg.SPGConfig, knobs=spg.SPGKnobs,
    doc="SPG (arXiv 2510.09541); block masks use sampler.block_length.",
    make_hparams=spg.hparams_from, authors=recipes.spg, families=_FULL_ATTENTION,
    rows=lambda cfg, completion: cfg.hparams.num_t, paper="2510.09541"))  # J noisy copies
register(Objective(
    "coupled_grpo", _coupled_loss, _coupled_prepare, _coupled_logps,
    coupled_grpo.CoupledGRPOConfig, knobs=coupled_grpo.CoupledGRPOKnobs,
    doc="coupled-GRPO (DiffuCoder, arXiv 2506.20639); beta and epsilon above.",
    make_hparams=coupled_grpo.hparams_from, check=coupled_grpo.check_shared,
    authors=recipes.coupled_grpo, families=_FULL_ATTENTION,
    rows=lambda cfg, completion: 3, paper="2506.20639"))  # x_full, x_M, x_~M
register(Objective(
    "justgrpo", _justgrpo_loss, _justgrpo_prepare, _justgrpo_logps, justgrpo.JustGRPOConfig,
    default_hparams=True, knobs=justgrpo.JustGRPOKnobs,
    doc="JustGRPO (arXiv 2601.15165): exact AR likelihood, one forward per completion "
        "position (objectives.justgrpo).",
    make_hparams=justgrpo.hparams_from, authors=recipes.justgrpo, families=_FULL_ATTENTION,
    rows=_justgrpo_rows,
    cost=lambda model, cfg, completion: Cost("ar", completion, cfg.hparams.position_chunk),
    on_accelerator=_justgrpo_accelerator, paper="2601.15165"))
register(Objective(
    "tracerl", _tracerl_loss, _tracerl_prepare, _tracerl_logps, tracerl.TraceRLConfig,
    default_hparams=True, knobs=tracerl.TraceRLKnobs,
    doc="TraceRL (dLLM-RL: SDAR, TraDo, LLaDA, Dream); epsilon above.",
    make_hparams=tracerl.hparams_from, check=tracerl.check_shared,
    beta=0.0,  # its KL is to the old policy (grpo.tracerl.beta): no reference term
    trace=True, cost=_tracerl_cost, paper="2509.06949"))
register(ebpo.OBJECTIVE)  # LLaDA2.1's EBPO: its record is in its module


def check_hparams(entry: Objective, hparams: Any, beta: float, epsilon: float) -> None:
    """ValueError unless ``hparams`` fits ``entry`` and shared knobs agree with them."""
    want = entry.hparams
    if (want is None and hparams is not None) or (want is not None
                                                   and not isinstance(hparams, want)):
        raise ValueError(f"objective={entry.name!r} takes hparams of type "
                         f"{getattr(want, '__name__', None)}, got {type(hparams).__name__}")
    if entry.ratio_free and beta != 0.0:
        raise ValueError(f"beta={beta}: {entry.name} has no reference term; set beta=0")
    if entry.check is not None:
        entry.check(hparams, beta, epsilon)


# ---------------------------------------------------------------------------- configs
@frozen
class GRPOConfig:
    """diffu-GRPO knobs (static under jit); symbols as in d1 (arXiv 2504.12216). Its knobs
    (``knob``) are config.grpo's; the other fields the run sets from other groups."""

    num_iterations: int = knob(12, "mu: inner updates per rollout, each with a fresh mask seed "
                               "(d1: 12 gsm8k, math500; 8 sudoku, countdown).", tiny=2, low=1)
    beta: float = knob(0.04, "beta: weight of the k3 KL to the reference policy (0: no "
                       "reference pass; wd1, spg: 0, they have none).")
    epsilon: float = knob(0.5, "epsilon: PPO ratio clipping.")
    p_mask_prompt: float = knob(0.15, "p_mask: probability of masking each prompt token in "
                                "the log-prob estimator.")
    cfg_scale: float = 0.0  # Classifier-free guidance inside the estimator (d1: 0).
    use_attention_mask: bool = True  # False attends to prompt padding, as d1 does.
    grad_accum: int = 1  # Micro-batches per optimizer step (each its own token mean).
    lora_dropout: bool = False  # LoRA dropout in the policy pass of the update.
    seq_chunk: int | None = None  # Completion positions per head chunk (None: automatic).
    max_tokens: int | None = None  # None: a token mean; int: Dr. GRPO constant normaliser.
    # The token mean of diffu-GRPO's and coupled-GRPO's loss. G (d1, config grpo.token_mean
    # "group"): within each prompt's group of G contiguous rows, then the mean over groups,
    # as d1's GPU micro-batch (per_device_train_batch_size 6 = num_generations) holds one
    # group. None ("step"): one token mean over each micro-batch's rows on all devices.
    norm_group: int | None = None
    # LLaDA's last layer runs only the completion rows up to the batch's last completion-mask
    # position (``logprob.per_token_logps``' ``narrow_last_layer``). None: on where the
    # jitted steps run on one device. Off on a mesh: XLA's SPMD partitioner mispartitions
    # its switch under the gradient on a (2, 2, 2) mesh (tests/test_update.py).
    narrow_last_layer: bool | None = None
    objective: str = knob("diffu_grpo", "Policy loss: diffu_grpo, wd1, spg, coupled_grpo, "
                          "justgrpo, tracerl or ebpo (d1jax.objectives.table.OBJECTIVES); knobs "
                          "of each below.")
    # The objective's own config, its record's ``hparams`` class: wd1.WD1Config,
    # spg.SPGConfig, coupled_grpo.CoupledGRPOConfig (its beta and epsilon equal to the fields
    # above), justgrpo.JustGRPOConfig or tracerl.TraceRLConfig (None: their defaults where the
    # record says so); None for diffu_grpo.
    hparams: Any = None

    def __post_init__(self):
        if self.num_iterations < 1 or self.grad_accum < 1 or not 0 <= self.p_mask_prompt <= 1:
            raise ValueError(f"invalid GRPO config {self}: num_iterations, grad_accum >= 1 and "
                             "0 <= p_mask_prompt <= 1 are required")
        entry = get(self.objective)
        if self.hparams is None and entry.default_hparams:
            object.__setattr__(self, "hparams", entry.hparams())
        check_hparams(entry, self.hparams, self.beta, self.epsilon)
        if self.norm_group is not None and (self.norm_group < 1 or self.max_tokens is not None):
            raise ValueError(f"norm_group={self.norm_group} must be >= 1 and excludes "
                             f"max_tokens={self.max_tokens}")


SFT_LOSSES = ("masked", *blockwise.RECIPES)


@frozen
class SFTConfig:
    """SFT knobs: d1's masked SFT trainer, or block SFT (dLLM-RL sft_sdar.py). Its knobs
    (``knob``) are config.sft's, where post_num -1 is this config's None."""

    eps: float = knob(1e-3, "masked: lower bound of the mask ratio t ~ U(eps, 1).")
    # "masked" (losses.sft_loss), "block" or "block_dfactory" (blockwise.sft_stage_loss's
    # recipes); config.sft.loss also takes "family", which the spec resolves to one of these.
    loss: str = "masked"
    lower_p: float = knob(0.1, "block: each completion position masked with its own p ~ "
                          "U(lower_p, upper_p) (sft_sdar.yaml: 0.1); block_dfactory: one t per "
                          "row from that range (llada2_mini_bd_sft.yaml: 0.3-0.8).")
    upper_p: float = knob(0.9, "block: upper end of that p (sft_sdar.yaml: 0.9).")
    post_num: int | None = knob(
        0, "block: padding tokens after the completion trained on per row (sft_sdar.yaml: 0; "
        "-1: all).", low=-1, held_as=negative_is_none)
    grad_accum: int = 1  # Micro-batches per optimizer step.
    lora_dropout: bool = False  # LoRA dropout in the forward pass.
    seq_chunk: int | None = None  # Positions per head chunk (None: automatic).

    def __post_init__(self):
        if self.loss not in SFT_LOSSES:
            raise ValueError(f"loss={self.loss!r}: one of {', '.join(SFT_LOSSES)}")
        if self.loss != "masked" and not 0.0 <= self.lower_p <= self.upper_p <= 1.0:
            raise ValueError(f"lower_p={self.lower_p}, upper_p={self.upper_p}: need "
                             "0 <= lower_p <= upper_p <= 1")
