"""Fast-dLLM decoding: the block KV cache (model methods) and confidence-threshold steps.

Model level: prefill's keys/values against a layer-by-layer recomputation with the plain
``Block``; cached logits against ``__call__``. Sampler level: every mode against a plain
numpy loop of Fast-dLLM's generate_with_prefix_cache / generate_with_dual_cache fed the
same model outputs, under both threshold rules: "budget" (also unmask every p > tau, at
least the step's budget) and "fast_dllm" (the most confident position and every other
p >= tau, until the block has no mask).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import d1jax
from d1jax.model.llada import model as model_lib
from d1jax import sampling as smp
from d1jax import sharding
from tests.test_sampler import assert_sharded_equals_unsharded, ref_budget

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


@pytest.fixture(scope="module")
def peaked_params(tiny_params):
    """Sharper head: confidences spread over (0, 1] and no near-ties (REFERENCE_NOTES)."""
    return {**tiny_params, "ff_out": {"kernel": tiny_params["ff_out"]["kernel"] * 40.0}}


def prompts(c, b=3, lp=10, pad=(0, 3, 6)):
    ids = np.random.RandomState(0).randint(0, c.vocab_size - 8, (b, lp)).astype(np.int32)
    mask = np.ones((b, lp), np.int32)
    for r, n in enumerate(pad[:b]):
        ids[r, :n], mask[r, :n] = c.pad_token_id, 0
    return ids, mask


def sampler_cfg(c, **kw):
    base = dict(gen_length=16, block_length=4, steps=8, mask_id=c.mask_token_id,
                eos_id=c.eos_token_id, eot_id=c.eos_token_id - 1)
    return smp.SamplerConfig(**{**base, **kw})


def reference_kv(model, params, ids, mask):
    """Keys/values [layers, B, L, K, H] layer by layer with the plain Block and numpy."""
    c = model.config
    b, l = ids.shape
    rope = model_lib.rope_tables(jnp.broadcast_to(jnp.arange(l), (b, l)), c.head_dim,
                                 c.rope_theta)
    x = params["wte"]["embedding"][ids]
    ks, vs = [], []
    for i in range(c.n_layers):
        lp = jax.tree_util.tree_map(lambda a: a[i], params["blocks"])
        xs = np.asarray(x, np.float64)
        xn = xs / np.sqrt((xs ** 2).mean(-1, keepdims=True) + c.rms_norm_eps)
        xn = xn * np.asarray(lp["attn_norm"]["weight"])
        k = (xn @ np.asarray(lp["k_proj"]["kernel"])).reshape(b, l, c.n_kv_heads, c.head_dim)
        ks.append(np.asarray(model_lib.apply_rope(jnp.asarray(k, jnp.float32), *rope)))
        vs.append((xn @ np.asarray(lp["v_proj"]["kernel"])).reshape(b, l, c.n_kv_heads, -1))
        x, _ = model_lib.Block(c, jnp.float32, jnp.float32).apply(
            {"params": lp}, x, rope, jnp.asarray(mask), True, True)
    return np.stack(ks), np.stack(vs)


def test_prefill_kv_equal_fresh_layer_by_layer(tiny_model, tiny_params, tiny_config):
    ids, mask = prompts(tiny_config, lp=24)
    _, cache = tiny_model.apply({"params": tiny_params}, ids, mask, method=tiny_model.prefill)
    want_k, want_v = reference_kv(tiny_model, tiny_params, ids, mask)
    np.testing.assert_allclose(cache.k, want_k, atol=2e-5)
    np.testing.assert_allclose(cache.v, want_v, atol=2e-5)


@pytest.mark.parametrize("q_end", [20, 32])  # dual: the block only; prefix: block + suffix
def test_cached_logits_equal_uncached(q_end, tiny_model, tiny_params, tiny_config):
    """Prompt + decoded block + partly decoded current block [16, 20) + masked suffix."""
    c = tiny_config
    ids, mask = prompts(c, lp=12)
    rs = np.random.RandomState(1)
    gen = rs.randint(0, c.vocab_size - 8, (3, 20)).astype(np.int32)
    gen[:, 6:8] = c.mask_token_id
    gen[:, 8:] = c.mask_token_id
    x = np.concatenate([ids, gen], 1)
    attn = np.concatenate([mask, np.ones((3, 20), np.int32)], 1)
    apply = lambda *a, **kw: tiny_model.apply({"params": tiny_params}, *a, **kw)
    full = apply(x, attn)
    logits0, cache = apply(x, attn, slice_start=16, slice_len=4, method=tiny_model.prefill)
    np.testing.assert_allclose(logits0, full[:, 16:20], atol=2e-5)
    decode = jax.jit(lambda s, ids_q: apply(ids_q, cache, s, attn, head_len=4,
                                            method=tiny_model.decode_slice))
    np.testing.assert_allclose(decode(16, x[:, 16:q_end]), full[:, 16:20], atol=2e-5)


def test_decode_at_equals_uncached(tiny_model, tiny_params, tiny_config):
    """Scattered rows of a window [16, 24) whose keys/values are fresh: their logits equal
    the full forward's, and the returned window holds the prefill's keys/values."""
    c = tiny_config
    ids, mask = prompts(c, lp=12)
    gen = np.random.RandomState(2).randint(0, c.vocab_size - 8, (3, 20)).astype(np.int32)
    gen[:, 9:] = c.mask_token_id
    x = np.concatenate([ids, gen], 1)
    attn = np.concatenate([mask, np.ones((3, 20), np.int32)], 1)
    apply = lambda *a, **kw: tiny_model.apply({"params": tiny_params}, *a, **kw)
    full = apply(x, attn)
    _, cache = apply(x, attn, method=tiny_model.prefill)
    window = jax.tree.map(lambda a: a[:, :, 16:24], cache)
    idx = np.array([[0, 3, 5], [7, 1, 2], [4, 6, 0]], np.int32)  # any order, per row
    h, new = apply(x, idx, cache, window, 16, attn,  # the sequence: the model reads the rows
                   method=tiny_model.decode_at)
    logits = apply(h, method=tiny_model.logits)
    want = np.take_along_axis(np.asarray(full)[:, 16:24], idx[..., None], 1)
    np.testing.assert_allclose(logits, want, atol=2e-5)
    np.testing.assert_allclose(new.k, window.k, atol=2e-5)
    np.testing.assert_allclose(new.v, window.v, atol=2e-5)
    # A stale window entry (keys/values of [MASK]) is replaced where recomputed, kept elsewhere.
    stale = x.copy()
    stale[:, 16:24] = c.mask_token_id
    _, stale_cache = apply(stale, attn, method=tiny_model.prefill)
    stale_win = jax.tree.map(lambda a: a[:, :, 16:24], stale_cache)
    _, upd = apply(x, idx, cache, stale_win, 16, attn,
                   method=tiny_model.decode_at)
    hit = np.zeros((3, 8), bool)
    np.put_along_axis(hit, idx, True, 1)
    for got, fresh, old in ((upd.k, window.k, stale_win.k), (upd.v, window.v, stale_win.v)):
        got, fresh, old = (np.asarray(a)[-1] for a in (got, fresh, old))  # last layer
        np.testing.assert_allclose(got[~hit], old[~hit], atol=0)
        assert not np.allclose(got[hit], old[hit], atol=1e-3)


def test_argmax_last_equals_argmax_with_ties():
    rs = np.random.RandomState(0)
    for v in (8192, 320, 126464 // 8, 4099):  # chunked, small, chunked, prime (plain)
        x = rs.randint(0, 5, (3, 7, v)).astype(np.float32)  # many ties
        x[0, 0, :] = 0.0
        x[1, 2, -1] = 9.0
        want = np.argmax(x, -1)
        np.testing.assert_array_equal(np.asarray(smp.argmax_last(jnp.asarray(x))), want)
        y = rs.randn(2, 5, v).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(smp.argmax_last(jnp.asarray(y))), y.argmax(-1))


def ref_step(x, logits, budget_i, s, cfg, conf_draw=None):
    """One temperature-0 step of the current block [s, s+blk) in numpy (float64);
    ``budget_i`` is None under the "fast_dllm" rule."""
    e = s + cfg.block_length
    lg = np.asarray(logits, np.float64)
    x0 = lg.argmax(-1)
    if conf_draw is None:
        p = np.exp(lg - lg.max(-1, keepdims=True))
        conf = np.take_along_axis(p / p.sum(-1, keepdims=True), x0[..., None], -1)[..., 0]
    else:
        conf = conf_draw
    masked = x[:, s:e] == cfg.mask_id
    for j in range(x.shape[0]):
        if budget_i is None:  # Fast-dLLM: the most confident, then every other p >= tau
            order = np.argsort(-np.where(masked[j], conf[j], -np.inf), kind="stable")
            order = order[:masked[j].sum()]
            keep = [p for n, p in enumerate(order) if n == 0 or conf[j, p] >= cfg.threshold]
            x[j, s + np.array(keep, int)] = x0[j, keep]
            continue
        k = budget_i
        if cfg.threshold < 1:
            k = max(k, int((masked[j] & (conf[j] > cfg.threshold)).sum()))
        order = np.argsort(-np.where(masked[j], conf[j], -np.inf), kind="stable")[:k]
        order = order[masked[j, order]]
        x[j, s + order] = x0[j, order]


@functools.lru_cache(maxsize=None)
def _reference_forwards(model, block_length):
    """The reference loop's model calls, jitted once per model and block length for every
    case (weights and attention mask are arguments, not constants of each case's programs)."""
    apply = lambda p, *a, **kw: model.apply({"params": p}, *a, **kw)
    full = jax.jit(lambda p, x, att, s: apply(p, x, att, slice_start=s, slice_len=block_length,
                                              method=model.prefill))
    decode = jax.jit(lambda p, q, cache, s, att: apply(p, q, cache, s, att, head_len=block_length,
                                                       method=model.decode_slice))
    @jax.jit
    def decode_at_row(p, x, idx, cache, window, j, s, att):
        """Row ``j`` alone: its positions ``s + idx`` recomputed; (their logits, its window)."""
        row = lambda a, axis: jax.lax.dynamic_slice_in_dim(a, j, 1, axis)
        one = jax.tree.map(lambda a: row(a, 1), (cache, window))
        h, win = apply(p, row(x, 0), idx, *one, s, row(att, 0), method=model.decode_at)
        return apply(p, h, method=model.logits)[0], win

    return full, decode, decode_at_row


def reference_fast(model, params, ids, mask, cfg, rng):
    """Fast-dLLM's loops: a full forward at each block start (its logits serve step 0),
    then cached steps; a block ends when it has no mask left or its steps are spent."""
    fwd = _reference_forwards(model, cfg.block_length)
    full = lambda x, s: fwd[0](params, x, jnp.asarray(attn), s)
    decode = lambda q, cache, s: fwd[1](params, q, cache, s, jnp.asarray(attn))
    b, lp = ids.shape
    x = np.concatenate([ids, np.full((b, cfg.gen_length), cfg.mask_id, np.int32)], 1)
    attn = np.concatenate([mask, np.ones((b, cfg.gen_length), np.int32)], 1)
    spb, blk = cfg.steps_per_block, cfg.block_length
    budget = ref_budget(blk, spb)  # LLaDA's get_num_transfer_tokens
    fast_dllm = cfg.parallel_rule == "fast_dllm"
    max_steps, stride = (blk, blk) if fast_dllm else (spb, spb)  # fast_dllm: no step cap
    steps_taken = []
    for nb in range(cfg.num_blocks):
        s = lp + nb * blk
        logits, cache = full(x, s)
        window = jax.tree.map(lambda a: a[:, :, s:s + blk], cache)
        masked_at_forward = prev = (x[:, s:s + blk] == cfg.mask_id)
        i = 0
        while i < max_steps and (x[:, s:s + blk] == cfg.mask_id).any():
            now = x[:, s:s + blk] == cfg.mask_id
            decoded_since = (masked_at_forward.sum(1) - now.sum(1)).max()
            if i > 0 and (cfg.kv_cache == "none" or (
                    cfg.cache_refresh and decoded_since >= cfg.cache_refresh)):
                logits, cache = full(x, s)
                window = jax.tree.map(lambda a: a[:, :, s:s + blk], cache)
                masked_at_forward = now
            elif i > 0 and cfg.recompute == "masked":  # rows masked before the last step
                logits = np.zeros((b, blk, model.config.embedding_size), np.float32)
                rows = []
                for j in range(b):  # each row alone, on the window as the last step left it
                    idx = np.nonzero(prev[j])[0][None].astype(np.int32)
                    row_logits, win_j = fwd[2](params, x, idx, cache, window, j, s, attn)
                    logits[j, idx[0]] = np.asarray(row_logits)
                    rows.append(win_j)
                window = jax.tree.map(lambda *w: jnp.concatenate(w, 1), *rows)
            elif i > 0:
                q_end = s + blk if cfg.kv_cache == "dual" else x.shape[1]
                logits = decode(x[:, s:q_end], cache, s)
            prev = now
            draw = None
            if cfg.remasking == "random":
                draw = np.asarray(jax.random.uniform(smp.step_keys(rng, nb * stride + i)[1],
                                                     (b, blk)))
            ref_step(x, logits, None if fast_dllm else budget[i], s, cfg, draw)
            i += 1
        steps_taken.append(i)
    return x, steps_taken


FAST_CASES = {  # 4 blocks of 4 unless said; parallel cases get 4 steps per block
    "exact_tau1": dict(threshold=1.0),
    "exact_tau1.5": dict(threshold=1.5),
    "exact_parallel": dict(threshold=0.3, steps=16),
    "prefix": dict(kv_cache="prefix", gen_length=12),
    "dual": dict(kv_cache="dual", block_length=8),
    "prefix_parallel": dict(kv_cache="prefix", threshold=0.3, steps=12, gen_length=12),
    "dual_parallel_random": dict(kv_cache="dual", threshold=0.5, remasking="random", steps=16),
    "dual_parallel_no_mask": dict(kv_cache="dual", threshold=0.3, steps=16,
                                  use_attention_mask=False),
    "dual_masked": dict(kv_cache="dual", recompute="masked", block_length=8),
    "dual_masked_parallel": dict(kv_cache="dual", recompute="masked", threshold=0.3, steps=16),
    "dual_masked_parallel_random": dict(kv_cache="dual", recompute="masked", threshold=0.5,
                                        remasking="random", steps=16, block_length=8),
    "dual_masked_padded_widths": dict(kv_cache="dual", recompute="masked", gen_length=24,
                                      block_length=12, steps=16),  # widths 11, 5 > needed
    "dual_masked_padded_parallel": dict(kv_cache="dual", recompute="masked", gen_length=24,
                                        block_length=12, steps=16, threshold=0.3),
    "dual_refresh": dict(kv_cache="dual", cache_refresh=3, block_length=8),
    "dual_masked_refresh_parallel": dict(kv_cache="dual", recompute="masked", cache_refresh=2,
                                         threshold=0.3, steps=16),
    # Fast-dLLM's rule: one step per block by ``steps``, which "fast_dllm" must exceed.
    "exact_fast_dllm": dict(parallel_rule="fast_dllm", threshold=0.3, steps=4),
    "exact_fast_dllm_tau1.5": dict(parallel_rule="fast_dllm", threshold=1.5),  # 1 per step
    "prefix_fast_dllm": dict(kv_cache="prefix", parallel_rule="fast_dllm", threshold=0.3,
                             steps=3, gen_length=12),
    "dual_fast_dllm_random": dict(kv_cache="dual", parallel_rule="fast_dllm", threshold=0.5,
                                  remasking="random", steps=2, block_length=8),
    "dual_masked_fast_dllm": dict(kv_cache="dual", recompute="masked", parallel_rule="fast_dllm",
                                  threshold=0.3, steps=2, block_length=8),
    "dual_masked_refresh_fast_dllm": dict(kv_cache="dual", recompute="masked", cache_refresh=2,
                                          parallel_rule="fast_dllm", threshold=0.5, steps=2,
                                          remasking="random", gen_length=24, block_length=12),
}


@pytest.mark.parametrize("name", list(FAST_CASES))
def test_matches_fast_dllm_reference_loop(name, tiny_model, peaked_params, tiny_config):
    c = tiny_config
    cfg = sampler_cfg(c, **FAST_CASES[name])
    ids, mask = prompts(c)
    rng = jax.random.key(5)
    out = smp.generate(smp.model_fns(tiny_model), peaked_params, ids, mask, rng, cfg)
    att = mask if cfg.use_attention_mask else np.ones_like(mask)
    want, steps = reference_fast(tiny_model, peaked_params, ids, att, cfg, rng)
    np.testing.assert_array_equal(np.asarray(out.ids), want)
    np.testing.assert_array_equal(np.asarray(out.block_steps), steps)
    if cfg.threshold < 1:  # the case exercises early block ends
        assert sum(steps) < cfg.num_blocks * cfg.loop_steps
    if cfg.parallel_rule == "fast_dllm":  # ... and blocks longer than the step budget
        assert max(steps) > cfg.steps_per_block


def test_no_cache_tau1_is_the_exact_sampler(tiny_model, peaked_params, tiny_config):
    c = tiny_config
    ids, mask = prompts(c)
    def run(fns, **kw):
        cfg = sampler_cfg(c, temperature=0.7, **kw)
        return np.asarray(smp.generate(fns, peaked_params, ids, mask, jax.random.key(0), cfg).ids)

    exact = run(smp.model_apply_fn(tiny_model))
    np.testing.assert_array_equal(run(smp.model_fns(tiny_model), threshold=1.0), exact)
    np.testing.assert_array_equal(run(smp.model_fns(tiny_model), threshold=2.0), exact)


@pytest.mark.parametrize("recompute", ["block", "masked"])
def test_proposals_of_the_mask_token_match_the_reference(recompute, tiny_model, tiny_params,
                                                         tiny_config):
    """A committed proposal equal to mask_id leaves its position masked (as the reference
    does), so more positions are masked than the schedule's bound: the head and recompute
    widths must widen rather than drop them."""
    c = tiny_config
    k = np.asarray(tiny_params["ff_out"]["kernel"]) * 40.0
    k[:, c.mask_token_id] = k[:, 51] * 1.01  # wins wherever token 51 would
    params = {**tiny_params, "ff_out": {"kernel": jnp.asarray(k)}}
    cfg = sampler_cfg(c, kv_cache="dual", recompute=recompute, block_length=8)
    ids, mask = prompts(c)
    rng = jax.random.key(0)
    out = smp.generate(smp.model_fns(tiny_model), params, ids, mask, rng, cfg)
    want, _ = reference_fast(tiny_model, params, ids, mask, cfg, rng)
    assert (want[:, 10:] == c.mask_token_id).sum() > 3  # the case happens
    np.testing.assert_array_equal(np.asarray(out.ids), want)


@pytest.mark.parametrize("recompute", ["block", "masked"])
def test_refresh_every_token_is_the_exact_sampler(recompute, tiny_model, peaked_params,
                                                  tiny_config):
    """cache_refresh=1: every step after a decoded token runs a full forward, so the cached
    sampler is the exact one (temperature and padding on)."""
    c = tiny_config
    ids, mask = prompts(c)
    run = lambda fns, **kw: np.asarray(smp.generate(
        fns, peaked_params, ids, mask, jax.random.key(4),
        sampler_cfg(c, temperature=0.7, block_length=8, **kw)).ids)
    exact = run(smp.model_apply_fn(tiny_model))
    np.testing.assert_array_equal(
        run(smp.model_fns(tiny_model), kv_cache="dual", recompute=recompute, cache_refresh=1),
        exact)


def test_parallel_composes_and_keeps_the_budget(tiny_model, peaked_params, tiny_config):
    """Temperature, random remasking and the EOS options with cache and threshold: no mask
    left, each step unmasks at least min(budget, masked left), blocks end early."""
    c = tiny_config
    ids, mask = prompts(c)
    cfg = sampler_cfg(c, block_length=8, steps=8, kv_cache="dual", threshold=0.2,
                      temperature=0.8, logits_eos_inf=True, confidence_eos_eot_inf=True)
    out = smp.generate(smp.model_fns(tiny_model), peaked_params, ids, mask, jax.random.key(1), cfg)
    comp = np.asarray(out.ids)[:, 10:]
    assert not (comp == c.mask_token_id).any() and not (comp == c.eos_token_id).any()
    steps = np.asarray(out.block_steps)
    assert (steps >= 1).all() and (steps <= 4).all() and steps.sum() < 8
    budget = ref_budget(8, 4)
    for row in np.asarray(out.decoded_at):
        for blk in range(2):
            local = row[blk * 8:(blk + 1) * 8] - blk * 4
            counts = np.bincount(local, minlength=steps[blk])
            left = 8 - np.concatenate([[0], np.cumsum(counts)[:-1]])
            assert (counts[:steps[blk]] >= np.minimum(budget[:steps[blk]], left[:steps[blk]])).all()


def test_dual_parallel_sharded_equals_unsharded(tiny_model, tiny_config):
    """On a (2, 2, 2) mesh, block recompute (masked recompute sharded: tests/test_dream_cache.py,
    through the same sampler loop)."""
    c = tiny_config
    cfg = sampler_cfg(c, kv_cache="dual", threshold=0.5, temperature=0.5, recompute="block",
                      block_length=8)
    ids, mask = prompts(c, b=8, pad=(0, 2, 4, 6, 0, 1, 3, 5))
    assert_sharded_equals_unsharded(tiny_model, smp.model_fns(tiny_model), cfg, ids, mask)


def test_fast_preset():
    cfg = smp.SamplerConfig.fast(gen_length=64, temperature=0.5)
    assert (cfg.kv_cache, cfg.recompute, cfg.threshold, cfg.cache_refresh) == (
        "dual", "block", 0.99, 8)
    assert (cfg.gen_length, cfg.temperature) == (64, 0.5)
    assert smp.SamplerConfig.fast(threshold=0.9).threshold == 0.9
    with pytest.raises(ValueError, match="cfg_scale=1.0 with kv_cache='dual'"):
        smp.SamplerConfig.fast(cfg_scale=1.0)


def test_fast_settings_refused(tiny_model):
    with pytest.raises(ValueError, match="cfg_scale=1.0 with kv_cache='dual'"):
        smp.SamplerConfig(kv_cache="dual", cfg_scale=1.0)
    with pytest.raises(ValueError, match="kv_cache='paged'"):
        smp.SamplerConfig(kv_cache="paged")
    with pytest.raises(ValueError, match="recompute='masked' needs kv_cache='dual'"):
        smp.SamplerConfig(kv_cache="prefix", recompute="masked")
    with pytest.raises(ValueError, match="recompute='all'"):
        smp.SamplerConfig(kv_cache="dual", recompute="all")
    with pytest.raises(ValueError, match="cache_refresh=2 needs a KV cache"):
        smp.SamplerConfig(cache_refresh=2)
    with pytest.raises(ValueError, match="cache_refresh=-1 must be >= 0"):
        smp.SamplerConfig(kv_cache="dual", cache_refresh=-1)
    with pytest.raises(ValueError, match="needs ModelFns with prefill and decode"):
        smp.generate(smp.model_apply_fn(tiny_model), None, jnp.zeros((1, 4), jnp.int32), None,
                     jax.random.key(0), smp.SamplerConfig(gen_length=8, block_length=8,
                                                          kv_cache="prefix"))
