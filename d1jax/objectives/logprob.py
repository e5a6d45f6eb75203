"""Log-probability estimators of a masked diffusion LM (pure functions of params and ids).

* ``per_token_logps``: d1's one-step estimator (``DiffuGRPOTrainer._get_per_token_logps``):
  the completion fully masked, each prompt token masked independently with probability
  ``p_mask_prompt`` (a draw fixed by the mask seed), one forward pass, log-softmax in
  float32 at completion positions only. All mask seeds (d1's mu inner iterations) go in one
  call; they run one after another, so peak memory is flat in mu.
* ``sequence_logps``: d1's mean-field sequence estimate, the sum over the completion mask.

Memory: the transformer runs on the whole sequence, but the output head only on completion
positions, ``seq_chunk`` of them at a time and rematerialised in the backward pass: never
[B, L, V] logits, a few [B, seq_chunk, V] float32 chunks live (8B: V = 126,464).

Shape letters: S mask seeds, B batch, P prompt length, C completion length, L = P + C,
D d_model, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from d1jax import sharding as shd
from d1jax.model import predictor
from d1jax.model.predictor import MaskPredictor

Array = jax.Array

# Budget for one chunk of float32 logits when ``seq_chunk`` is left to ``auto_chunk``: on
# CPU a cache-sized chunk (measured on bench-tiny: 2.5x faster head gradient than one
# [8, 128, 8192] block); on accelerators large chunks, bounded for 8B-scale vocabularies.
CPU_CHUNK_BYTES = 4 * 2**20
ACCELERATOR_CHUNK_BYTES = 256 * 2**20


def mask_key(seed: Array | int, mask_rng: Array | None = None) -> Array:
    """PRNG key of one mask seed: ``fold_in(mask_rng, seed)``, a function of the seed only
    for a fixed ``mask_rng`` (default ``key(0)``), like d1's ``set_seed(mask_seed)``."""
    base = jax.random.key(0) if mask_rng is None else mask_rng
    return jax.random.fold_in(base, seed)


def mask_prompt(key: Array, prompt_ids_bp: Array, p_mask_prompt: float, mask_id: int) -> Array:
    """[B, P]: each prompt token replaced by ``mask_id`` with probability p (d1 forward_process)."""
    u_bp = jax.random.uniform(key, prompt_ids_bp.shape)
    return jnp.where(u_bp < p_mask_prompt, mask_id, prompt_ids_bp)


def auto_chunk(batch: int, length: int, vocab: int, budget: int | None = None) -> int:
    """Largest divisor c of ``length`` whose float32 logits [batch, c, vocab] fit ``budget``
    (default: by backend, ``CPU_CHUNK_BYTES`` or ``ACCELERATOR_CHUNK_BYTES``)."""
    if budget is None:
        budget = CPU_CHUNK_BYTES if jax.default_backend() == "cpu" else ACCELERATOR_CHUNK_BYTES
    best = 1
    for c in range(1, length + 1):
        if length % c == 0 and batch * c * vocab * 4 <= budget:
            best = c
    return best


def head_logps(hidden_bcd: Array, head_dv: Array, targets_bc: Array, *,
               scale: float | None = None, seq_chunk: int | None = None,
               upto: Array | int | None = None) -> Array:
    """log p(target) [B, C] from final hidden states through the output head.

    Logits are ``hidden @ head`` accumulated in float32 (times ``scale`` when given), with a
    float32 log-softmax over the vocabulary. ``seq_chunk`` positions are done at a time
    (None: ``auto_chunk``; 0: all at once); each chunk is rematerialised for the gradient,
    so neither pass keeps more than about two chunks of logits. ``upto`` (may be traced):
    only positions below it are read, so a chunk that starts at or past it is skipped,
    forward and backward, and gives 0 (``read_upto``); its cond keeps one chunk more.
    """
    b, c, d = hidden_bcd.shape
    if head_dv.shape[0] != d:
        raise ValueError(f"head {head_dv.shape} does not match hidden size {d}")

    def chunk(h_bkd, t_bk):
        # One token axis: the head gradient is then one plain matmul on XLA CPU.
        logits = jnp.einsum("td,dv->tv", h_bkd.reshape(-1, d), head_dv.astype(h_bkd.dtype),
                            preferred_element_type=jnp.float32).reshape(*h_bkd.shape[:2], -1)
        if scale is not None:
            logits = logits * scale
        logits = nn.with_logical_constraint(logits, (shd.BATCH, shd.LENGTH, shd.ACT_VOCAB))
        picked = jnp.take_along_axis(logits, t_bk[..., None], axis=-1)[..., 0]
        return picked - jax.nn.logsumexp(logits, axis=-1)

    k = auto_chunk(b, c, head_dv.shape[1]) if seq_chunk is None else (seq_chunk or c)
    if k >= c:
        return chunk(hidden_bcd, targets_bc)
    if c % k:
        raise ValueError(f"seq_chunk={k} must divide the completion length {c}")
    h_nbkd = hidden_bcd.reshape(b, c // k, k, d).swapaxes(0, 1)
    t_nbk = targets_bc.reshape(b, c // k, k).swapaxes(0, 1)

    def body(h_bkd, t_bk, start):
        if upto is None:
            return chunk(h_bkd, t_bk)
        # The cond sits inside the checkpoint: outside it, its residuals would keep every
        # chunk's logits for the backward.
        return jax.lax.cond(start < upto, chunk, lambda h, t: jnp.zeros(t.shape, jnp.float32),
                            h_bkd, t_bk)
    out_nbk = jax.lax.map(lambda a: jax.checkpoint(body)(*a),
                          (h_nbkd, t_nbk, jnp.arange(0, c, k)))
    return out_nbk.swapaxes(0, 1).reshape(b, c)


def read_upto(read_mask_bc: Array) -> Array:
    """One past the last position any row reads (0 when none): ``head_logps``'s ``upto``
    for a mask of the positions whose log-probs are used, e.g. d1's completion mask."""
    c = read_mask_bc.shape[-1]
    # An integer max over the (sharded) rows: libtpu's cost model cannot price a boolean
    # all-reduce (``any`` over rows) and books it at -1 s.
    return jnp.max(jnp.where(read_mask_bc != 0, jnp.arange(1, c + 1), 0))


def model_head(model: MaskPredictor, params: Any) -> tuple[Array, float | None]:
    """(output head [D, V], logit scale or None) of ``model`` for ``head_logps``."""
    return predictor.output_head(model, params)


def completion_hidden(model: MaskPredictor, params: Any, ids_bl: Array, attention_mask_bl: Array | None,
                      completion_len: int, *, cfg_scale: float = 0.0, prompt_len: int = 0,
                      use_lora: bool = True, dropout_rng: Array | None = None,
                      read_upto: Array | int | None = None, with_metrics: bool = False
                      ) -> Array | tuple[Array, dict[str, Array]]:
    """Final hidden states [B, C, D] of the last ``completion_len`` positions of ``ids_bl``
    (``with_metrics``: and the model's ``step_metrics`` of the forward, an MoE's router
    summary; {} for a model without).

    ``read_upto`` (``read_upto`` of the positions the caller reads; may be traced): the
    model may leave the positions past it 0 (LLaDA's last layer runs only the rows read).

    With ``cfg_scale`` > 0 this is d1's/LLaDA's classifier-free guidance: the same input with
    its first ``prompt_len`` positions masked runs in the same forward pass (batch 2B), and
    ``h_un + (s + 1) (h - h_un)`` is returned: the head is linear, so its logits equal
    ``un + (s + 1) (cond - un)`` of d1's ``get_logits``.
    """
    b = ids_bl.shape[0]
    mask_id = model.config.mask_token_id
    if cfg_scale > 0:
        is_prompt = jnp.arange(ids_bl.shape[1]) < prompt_len
        ids_bl = jnp.concatenate([ids_bl, jnp.where(is_prompt, mask_id, ids_bl)], axis=0)
        if attention_mask_bl is not None:
            attention_mask_bl = jnp.concatenate([attention_mask_bl] * 2, axis=0)
    rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
    summarize = getattr(model, "step_metrics", None) if with_metrics else None
    h = model.apply({"params": params}, ids_bl, attention_mask_bl, method=type(model).hidden,
                    use_lora=use_lora, deterministic=dropout_rng is None, rngs=rngs,
                    keep_last=completion_len, read_upto=read_upto,
                    mutable=["intermediates"] if summarize else False)
    h, aux = (h[0], summarize(h[1].get("intermediates", {}))) if summarize else (h, {})
    if cfg_scale > 0:
        cond, un = h[:b].astype(jnp.float32), h[b:].astype(jnp.float32)
        h = (un + (cfg_scale + 1.0) * (cond - un)).astype(h.dtype)
    return (h, aux) if with_metrics else h


def _check_pair(prompt_ids_bp: Array, completion_ids_bc: Array, attention_mask_bl: Array | None):
    if prompt_ids_bp.ndim != 2 or completion_ids_bc.ndim != 2:
        raise ValueError(f"prompt_ids {prompt_ids_bp.shape} and completion_ids "
                         f"{completion_ids_bc.shape} must both be [B, length]")
    if prompt_ids_bp.shape[0] != completion_ids_bc.shape[0]:
        raise ValueError(f"batch mismatch: prompt_ids {prompt_ids_bp.shape}, "
                         f"completion_ids {completion_ids_bc.shape}")
    want = (prompt_ids_bp.shape[0], prompt_ids_bp.shape[1] + completion_ids_bc.shape[1])
    if attention_mask_bl is not None and tuple(attention_mask_bl.shape) != want:
        raise ValueError(f"attention_mask {attention_mask_bl.shape} must be [B, P + C] = {want}")


def per_token_logps(model: MaskPredictor, params: Any, prompt_ids_bp: Array, completion_ids_bc: Array,
                    mask_seeds_s: Array, *, p_mask_prompt: float, mask_rng: Array | None = None,
                    attention_mask_bl: Array | None = None, cfg_scale: float = 0.0,
                    use_lora: bool = True, seq_chunk: int | None = None,
                    dropout_rng: Array | None = None,
                    read_mask_bc: Array | None = None, narrow_last_layer: bool = False,
                    with_metrics: bool = False) -> Array | tuple[Array, dict[str, Array]]:
    """d1's one-step per-token log-probs of the completion, one row per mask seed.

    Args:
      model, params: the mask predictor and its (plain) params.
      prompt_ids_bp: [B, P] int. completion_ids_bc: [B, C] int.
      mask_seeds_s: [S] int, one per inner iteration (d1's ``mask_seeds``).
      p_mask_prompt: probability of masking each prompt token (d1: 0.15).
      mask_rng: base key of the prompt masks (``mask_key``); default ``key(0)``.
      attention_mask_bl: [B, P + C] (1 = attend) or None (d1 passes none: padding attended).
      cfg_scale: classifier-free guidance as d1's ``get_logits`` (0: off).
      use_lora: False evaluates the base model, adapters off (the reference policy).
      seq_chunk: completion positions per head chunk (None: automatic, 0: all at once).
      dropout_rng: enables LoRA dropout (training); None is deterministic.
      read_mask_bc: [B, C] the positions whose log-probs the caller reads (d1's completion
        mask, which every loss and metric applies): the output head skips the chunks past
        the last of them (``head_logps``' ``upto``), whose log-probs are then 0. None: all.
      narrow_last_layer: with ``read_mask_bc``, the model's last layer also runs only the
        rows up to that position (``LLaDA.hidden``'s ``read_upto``: a switch over three
        widths). Not on a mesh: XLA's SPMD partitioner gets that switch's gradient wrong
        on a (2, 2, 2) mesh.
      with_metrics: also return the model's ``step_metrics`` of the forward (an MoE's router
        summary; {} for a model without). One mask seed only (the update's).
    Returns:
      [S, B, C] float32 log p(completion token | completion masked, prompt partly masked)
      (with ``with_metrics``: and that summary).
    """
    _check_pair(prompt_ids_bp, completion_ids_bc, attention_mask_bl)
    mask_seeds_s = jnp.asarray(mask_seeds_s)
    if mask_seeds_s.ndim != 1:
        raise ValueError(f"mask_seeds must be a 1-D array [S], got shape {mask_seeds_s.shape}")
    if with_metrics and mask_seeds_s.shape[0] != 1:
        raise ValueError(f"with_metrics takes one mask seed (the update's), got "
                         f"{mask_seeds_s.shape[0]}")
    mask_id = model.config.mask_token_id
    p, c = prompt_ids_bp.shape[1], completion_ids_bc.shape[1]
    masked_bc = jnp.full_like(completion_ids_bc, mask_id)
    head, scale = model_head(model, params)
    upto = None if read_mask_bc is None else read_upto(read_mask_bc)
    narrow = upto if narrow_last_layer else None

    def one_seed(seed):
        noisy_bp = mask_prompt(mask_key(seed, mask_rng), prompt_ids_bp, p_mask_prompt, mask_id)
        ids_bl = jnp.concatenate([noisy_bp, masked_bc], axis=1)
        drop = None if dropout_rng is None else jax.random.fold_in(dropout_rng, seed)
        h_bcd = completion_hidden(model, params, ids_bl, attention_mask_bl, c,
                                  cfg_scale=cfg_scale, prompt_len=p, use_lora=use_lora,
                                  dropout_rng=drop, read_upto=narrow, with_metrics=with_metrics)
        h_bcd, aux = h_bcd if with_metrics else (h_bcd, None)
        lp = head_logps(h_bcd, head, completion_ids_bc, scale=scale, seq_chunk=seq_chunk,
                        upto=upto)
        return (lp, aux) if with_metrics else lp

    if mask_seeds_s.shape[0] == 1:  # the update step: no loop at all
        out = one_seed(mask_seeds_s[0])
        return (out[0][None], out[1]) if with_metrics else out[None]
    return jax.lax.map(one_seed, mask_seeds_s)  # one seed at a time: memory flat in S


def sequence_logps(per_token_bc: Array, completion_mask_bc: Array) -> Array:
    """d1's mean-field sequence log-prob: the sum over the completion mask. [..., C] -> [...]."""
    return jnp.sum(per_token_bc * completion_mask_bc, axis=-1)
