"""Log-probability estimators of a masked diffusion LM.

* ``per_token_logps``: d1's one-step estimator (``DiffuGRPOTrainer._get_per_token_logps``):
  the completion fully masked, each prompt token masked with probability
  ``p_mask_prompt`` (a draw fixed by the mask seed), one forward pass, log-softmax in
  float32 at completion positions only. Several mask seeds (d1's mu iterations) are
  evaluated in one call, one after another, so peak memory does not grow with mu.
* ``sequence_logps``: d1's mean-field sequence estimate, the sum over the completion mask.
* ``elbo_logps``: LLaDA's Monte Carlo likelihood bound (``get_log_likelihood.py``).

The output head runs on completion positions only and, with ``seq_chunk``, a chunk of
them at a time: no [B, L, V] logits, at most [B, seq_chunk, V] float32 at once.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from d1jax.model import LLaDA

Array = jax.Array


def mask_key(seed: Array | int) -> Array:
    """The PRNG key of one mask seed: like d1's ``set_seed(seed)``, a function of the seed only."""
    return jax.random.key(seed)


def mask_prompt(key: Array, prompt_ids: Array, p_mask_prompt: float, mask_id: int) -> Array:
    """[B, Lp]: each prompt token replaced by ``mask_id`` with probability p (d1's forward_process)."""
    u = jax.random.uniform(key, prompt_ids.shape)
    return jnp.where(u < p_mask_prompt, mask_id, prompt_ids)


def token_logps(model: LLaDA, params: Any, hidden_bld: Array, targets_bl: Array,
                seq_chunk: int = 0) -> Array:
    """log p(target) [B, L] from final hidden states, float32 log-softmax, chunked over L."""
    def chunk_logps(h, t):
        logits = model.apply({"params": params}, h, method=LLaDA.logits).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return picked - jax.nn.logsumexp(logits, axis=-1)
    b, l, d = hidden_bld.shape
    if not seq_chunk or seq_chunk >= l:
        return chunk_logps(hidden_bld, targets_bl)
    if l % seq_chunk:
        raise ValueError(f"seq_chunk={seq_chunk} must divide the completion length {l}")
    n = l // seq_chunk
    hs = hidden_bld.reshape(b, n, seq_chunk, d).swapaxes(0, 1)
    ts = targets_bl.reshape(b, n, seq_chunk).swapaxes(0, 1)
    out = jax.lax.map(lambda a: chunk_logps(*a), (hs, ts))
    return out.swapaxes(0, 1).reshape(b, l)


def _completion_hidden(model, params, ids, attn, lc, use_lora, cfg_scale, mask_id, lp,
                       dropout_rng=None):
    """Final hidden states [B, Lc, D] of the completion (CFG mixes hidden via logits below)."""
    kw = dict(use_lora=use_lora, deterministic=dropout_rng is None)
    rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
    h = model.apply({"params": params}, ids, attn, method=LLaDA.hidden, rngs=rngs, **kw)
    return h[:, lp:lp + lc]


def per_token_logps(model: LLaDA, params: Any, prompt_ids: Array, completion_ids: Array,
                    mask_seeds: Array, *, p_mask_prompt: float, mask_id: int,
                    attention_mask: Array | None = None, cfg_scale: float = 0.0,
                    use_lora: bool = True, seq_chunk: int = 0,
                    dropout_rng: Array | None = None) -> Array:
    """d1's one-step per-token log-probs of the completion, one row per mask seed.

    Args:
      model, params: the mask predictor and its params.
      prompt_ids: [B, Lp] int. completion_ids: [B, Lc] int.
      mask_seeds: [S] int, one per inner iteration (d1's ``mask_seeds``).
      p_mask_prompt: probability of masking each prompt token (d1: 0.15).
      attention_mask: [B, Lp + Lc] or None. d1 passes none (padding attended).
      cfg_scale: classifier-free guidance as d1's ``get_logits`` (prompt fully masked).
      use_lora: False evaluates the base model (the reference policy).
      seq_chunk: compute the head on this many completion positions at a time (0: all).
      dropout_rng: enables LoRA dropout (training); None is deterministic.
    Returns:
      [S, B, Lc] float32 log p(completion token | masked input).
    """
    if prompt_ids.shape[0] != completion_ids.shape[0]:
        raise ValueError(f"batch mismatch: prompt {prompt_ids.shape}, completion {completion_ids.shape}")
    lp, lc = prompt_ids.shape[1], completion_ids.shape[1]
    masked_completion = jnp.full_like(completion_ids, mask_id)

    def one_seed(seed):
        noisy_prompt = mask_prompt(mask_key(seed), prompt_ids, p_mask_prompt, mask_id)
        ids = jnp.concatenate([noisy_prompt, masked_completion], axis=1)
        h = _completion_hidden(model, params, ids, attention_mask, lc, use_lora, cfg_scale,
                               mask_id, lp, dropout_rng)
        if cfg_scale <= 0:
            return token_logps(model, params, h, completion_ids, seq_chunk)
        un_ids = jnp.concatenate([jnp.full_like(prompt_ids, mask_id), masked_completion], axis=1)
        hu = _completion_hidden(model, params, un_ids, attention_mask, lc, use_lora, cfg_scale,
                                mask_id, lp, dropout_rng)
        return _cfg_logps(model, params, h, hu, completion_ids, cfg_scale)

    return jax.lax.map(one_seed, jnp.asarray(mask_seeds))


def _cfg_logps(model, params, h, hu, targets, cfg_scale):
    """log-softmax of ``un + (s + 1) (cond - un)`` logits (d1's get_logits with CFG)."""
    cond = model.apply({"params": params}, h, method=LLaDA.logits).astype(jnp.float32)
    un = model.apply({"params": params}, hu, method=LLaDA.logits).astype(jnp.float32)
    logits = un + (cfg_scale + 1.0) * (cond - un)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def sequence_logps(per_token: Array, completion_mask: Array) -> Array:
    """d1's mean-field sequence log-prob: sum over the completion mask. [..., Lc] -> [...]."""
    return jnp.sum(per_token * completion_mask, axis=-1)


def elbo_mask(key: Array, batch: int, length: int) -> tuple[Array, Array]:
    """LLaDA get_log_likelihood's stratified masks: ([batch, length] bool, t [batch]).

    One draw k in [1, length]; row i masks ``x_i = ((k + i * length / batch) - 1) % length + 1``
    tokens (rounded), at uniformly random positions.
    """
    k1, k2 = jax.random.split(key)
    k = jax.random.randint(k1, (), 1, length + 1).astype(jnp.float32)
    x = jnp.round(k + jnp.arange(batch) * (length / batch)).astype(jnp.int32)
    x = (x - 1) % length + 1
    ranks = jnp.argsort(jax.random.uniform(k2, (batch, length)), axis=-1)
    is_mask = ranks < x[:, None]
    return is_mask, x.astype(jnp.float32) / length


def elbo_logps(model: LLaDA, params: Any, prompt_ids: Array, completion_ids: Array,
               key: Array, *, mask_id: int, mc_num: int = 128, mc_batch: int = 16,
               attention_mask: Array | None = None, use_lora: bool = True) -> Array:
    """LLaDA's Monte Carlo lower bound on log p(completion | prompt), per sequence [B].

    For each sequence, ``mc_num`` noisy copies (in groups of ``mc_batch`` with stratified
    mask ratios t) give ``-sum_masked CE / t``, averaged. Prompt tokens are never masked.
    """
    if mc_num % mc_batch:
        raise ValueError(f"mc_num={mc_num} must be a multiple of mc_batch={mc_batch}")
    b, lp = prompt_ids.shape
    lc = completion_ids.shape[1]

    def one_group(gkey):
        def one_row(rkey, p, c, am):
            is_mask, t = elbo_mask(rkey, mc_batch, lc)
            noisy = jnp.where(is_mask, mask_id, c[None])
            ids = jnp.concatenate([jnp.broadcast_to(p, (mc_batch, lp)), noisy], axis=1)
            a = None if am is None else jnp.broadcast_to(am, (mc_batch, lp + lc))
            h = model.apply({"params": params}, ids, a, method=LLaDA.hidden,
                            use_lora=use_lora)[:, lp:]
            lps = token_logps(model, params, h, jnp.broadcast_to(c, (mc_batch, lc)))
            return jnp.sum(jnp.where(is_mask, lps, 0.0) / t[:, None]) / mc_batch
        keys = jax.random.split(gkey, b)
        if attention_mask is None:
            return jax.vmap(lambda k, p, c: one_row(k, p, c, None))(keys, prompt_ids, completion_ids)
        return jax.vmap(one_row)(keys, prompt_ids, completion_ids, attention_mask)

    groups = jax.lax.map(one_group, jax.random.split(key, mc_num // mc_batch))
    return groups.mean(0)
