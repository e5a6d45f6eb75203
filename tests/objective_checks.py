"""Shared references of the objective tests: brute-force log-probs and a one-step check."""

import functools

import jax
import numpy as np
import optax

from d1jax.objectives import logprob


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
    """The gradient of ``loss_of_params`` is finite, and one Adam step raises the ELBO (LLaDA's
    Monte Carlo bound, a fixed key) of completion 0 (advantage > 0) and lowers completion 1's
    (advantage < 0)."""
    grads = jax.jit(jax.grad(loss_of_params))(params)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    opt = optax.adam(3e-3)
    updates, _ = opt.update(grads, opt.init(params), params)
    new = optax.apply_updates(params, updates)
    elbo = jax.jit(lambda p: logprob.elbo_logps(model, p, prompt, comp, jax.random.key(7),
                                                mc_num=32, mc_batch=16))
    before, after = np.asarray(elbo(params)), np.asarray(elbo(new))
    assert after[0] > before[0] + 0.05 and after[1] < before[1] - 0.05, (before, after)
