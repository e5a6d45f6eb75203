"""Shared references of the objective tests: brute-force log-probs and a one-step check."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from d1jax.objectives import logprob, masking
from d1jax.objectives.batch import GRPOBatch
from d1jax.objectives.table import OBJECTIVES


@functools.lru_cache(maxsize=None)
def _forward(model):
    return jax.jit(lambda params, ids, attn: model.apply({"params": params}, ids, attn))


def brute_logps(model, params, noisy_nl, targets_nc, attn_nl=None):
    """[N, C] float64 log p(target) at the last C positions, from the full [N, L, V] logits."""
    logits = np.asarray(_forward(model)(params, np.asarray(noisy_nl), attn_nl), np.float64)
    logits -= logits.max(-1, keepdims=True)
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    lsm = lsm[:, -targets_nc.shape[1]:]
    return np.take_along_axis(lsm, np.asarray(targets_nc)[..., None], -1)[..., 0]


def group_batch(config, c=8, p=5, seed=0):
    """One prompt (G = 2 rows) with two random completions; row 1 ends at an EOS."""
    rs = np.random.RandomState(seed)
    prompt = np.repeat(rs.randint(0, config.vocab_size - 4, (1, p)), 2, 0).astype(np.int32)
    comp = rs.randint(0, config.vocab_size - 4, (2, c)).astype(np.int32)
    comp[1, c - 3] = config.eos_token_id
    comp_mask = (np.arange(c)[None] <= np.array([[c], [c - 3]])).astype(np.int32)
    return prompt, np.ones_like(prompt), comp, comp_mask


def assert_step_moves_likelihoods(model, params, loss_of_params, prompt, comp):
    """The gradient of ``loss_of_params`` is finite, and one Adam step raises a Monte Carlo
    likelihood bound (``likelihood_bound``, fixed masks) of completion 0 (advantage > 0) and
    lowers completion 1's (advantage < 0)."""
    grads = jax.jit(jax.grad(loss_of_params))(params)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    opt = optax.adam(3e-3)
    updates, _ = opt.update(grads, opt.init(params), params)
    new = optax.apply_updates(params, updates)
    elbo = jax.jit(lambda p: likelihood_bound(model, p, prompt, comp, jax.random.key(7)))
    before, after = np.asarray(elbo(params)), np.asarray(elbo(new))
    assert after[0] > before[0] + 0.05 and after[1] < before[1] - 0.05, (before, after)


def likelihood_bound(model, params, prompt, comp, key, num=32):
    """[B] LLaDA's Monte Carlo bound on log p(completion | prompt), written here: ``num``
    copies, mask ratio t ~ U(0.05, 1), each completion token masked with probability t,
    sum of masked log-probs / t, averaged over copies."""
    b, c = comp.shape
    k_t, k_m = jax.random.split(key)
    t_n = jax.random.uniform(k_t, (num,), minval=0.05, maxval=1.0)
    is_mask_nbc = jax.random.uniform(k_m, (num, b, c)) < t_n[:, None, None]
    mask_id = model.config.mask_token_id
    noisy = jnp.where(is_mask_nbc, mask_id, jnp.asarray(comp)[None])
    ids = jnp.concatenate([jnp.broadcast_to(jnp.asarray(prompt), (num,) + prompt.shape), noisy], -1)
    lp = masking.masked_logps(model, params, ids.reshape(num * b, -1),
                              jnp.tile(jnp.asarray(comp), (num, 1)), None).reshape(num, b, c)
    return jnp.mean(jnp.sum(jnp.where(is_mask_nbc, lp, 0.0), -1) / t_n[:, None], 0)


def training_loss(model, cfg, params, batch, seed):
    """The loss the GRPO update differentiates for objective ``cfg.objective`` on ``batch`` at
    mask seed ``seed`` (one micro-batch): the table's ``prepare`` on the whole batch from the
    iteration's mask key, then its ``loss`` (``d1jax.train.pure_steps.grpo_update_step``)."""
    objective = OBJECTIVES[cfg.objective]
    rows = objective.prepare(model, cfg, batch, logprob.mask_key(seed))
    return objective.loss(model, cfg, params, rows, jnp.array([seed], jnp.int32), None)


def grpo_batch(prompt, prompt_mask, comp, comp_mask, adv):
    """A rollout's rows as the update takes them (mask seeds are passed to ``training_loss``)."""
    return GRPOBatch(prompt_ids=jnp.asarray(prompt), prompt_mask=jnp.asarray(prompt_mask),
                     completion_ids=jnp.asarray(comp), completion_mask=jnp.asarray(comp_mask),
                     advantages=jnp.asarray(adv, jnp.float32),
                     mask_seeds=jnp.zeros((1,), jnp.int32))
