"""Fast-dLLM's KV cache on Dream: the cached entry points and the cached sampler.

Independent references: the float64 numpy Dream forward of tests/test_dream.py (its cached
mode is Fast-dLLM's cached forward: the recomputed rows' keys/values in place of the
cache's), the exact sampler (a one-layer Dream's cache is never stale: a layer's keys/values
depend on their own token only), and a numpy port of Fast-dLLM's Dream block loop
(``dream/model/generation_utils_block.py``, ``alg="confidence_threshold"``) on that forward.
"""

import dataclasses

import jax
import numpy as np
import pytest

from d1jax import sampling as smp
from d1jax import sharding
from d1jax.model import init_params
from d1jax.model.dream import Dream
from d1jax.model.dream import load_hf_checkpoint as load_dream_checkpoint, preset as dream_preset
from tests.test_dream import CFG, hf_state, np_raw_logits, np_tok_idx, write_hf_dir
from tests.test_dream_train import peaked  # noqa: F401 (fixture: 2-layer Dream, sharp head)
from tests.test_sampler import cfg_for, make_prompts

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

CFG1 = dream_preset("dream-test-tiny", num_hidden_layers=1)


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    """A one-layer tiny Dream with a sharpened head: (float64 state dict, params)."""
    sd = hf_state(CFG1, seed=4)
    sd["lm_head.weight"] = sd["lm_head.weight"] * 8.0
    _, params = load_dream_checkpoint(write_hf_dir(tmp_path_factory.mktemp("d1") / "c", CFG1, sd))
    return sd, params


def sequence(c, lp=10, gen=20):
    """Left-padded prompts, then a completion decoded at [0, 6) and [8, 10) (the block
    [16, 20) partly decoded), masked elsewhere: (ids, mask) [3, lp + gen]."""
    ids, mask = make_prompts(c.vocab_size, c.pad_token_id, lp=lp)
    comp = np.random.RandomState(1).randint(0, c.vocab_size - 8, (3, gen)).astype(np.int32)
    comp[:, 6:8] = comp[:, 10:] = c.mask_token_id
    return (np.concatenate([ids, comp], 1),
            np.concatenate([mask, np.ones((3, gen), np.int32)], 1))


def test_prefill_is_the_float64_forward_at_tok_idx_positions(peaked):  # noqa: F811
    sd, params = peaked
    x, attn = sequence(CFG)
    model = Dream(CFG)
    logits, cache = model.apply({"params": params}, x, attn, slice_start=16, slice_len=4,
                                method=model.prefill)
    kv = []
    raw = np_raw_logits(sd, CFG, x, attn, np_tok_idx(attn), kv=kv)
    np.testing.assert_allclose(logits, raw[:, 15:19], rtol=1e-4, atol=2e-3)  # shifted
    for layer, (k, v) in enumerate(kv):  # numpy [B, K, L, H]
        np.testing.assert_allclose(cache.k[layer], k.transpose(0, 2, 1, 3), atol=1e-4)
        np.testing.assert_allclose(cache.v[layer], v.transpose(0, 2, 1, 3), atol=1e-4)


@pytest.mark.parametrize("q_len", [4, 14], ids=["dual", "prefix"])
def test_cached_rows_on_a_fresh_cache_are_the_full_forward(q_len, peaked):  # noqa: F811
    """Block [16, 20): its first position's prediction is raw row 15, outside the block (the
    query-only row before the slice). Through the sampler's ModelFns as well."""
    _, params = peaked
    x, attn = sequence(CFG)
    model, fns = Dream(CFG), smp.model_fns(Dream(CFG))
    full = np.asarray(model.apply({"params": params}, x, attn))
    _, cache = fns.prefill(params, x, attn, 16, 4)
    got = jax.jit(fns.decode, static_argnums=(4, 6))(params, x, cache, 16, q_len, attn, 4)
    np.testing.assert_allclose(got, full[:, 16:20], rtol=1e-5, atol=1e-4)
    at_start = fns.decode(params, x, cache, 0, 4, attn, 4)  # row 0 repeats itself (hidden)
    np.testing.assert_allclose(at_start, full[:, :4], rtol=1e-5, atol=1e-4)


def test_decode_at_on_a_fresh_window_is_the_full_forward(peaked):  # noqa: F811
    """Scattered rows of the window [16, 24), position 16 among them: logits as the full
    forward's, and the window comes back holding the prefill's keys/values."""
    _, params = peaked
    x, attn = sequence(CFG)
    fns = smp.model_fns(Dream(CFG))
    full = np.asarray(fns.forward(params, x, attn, None, None))
    _, cache = fns.prefill(params, x, attn, 0, None)
    window = jax.tree.map(lambda a: a[:, :, 16:24], cache)
    idx = np.array([[0, 3, 5], [7, 1, 2], [4, 6, 0]], np.int32)
    h, new = fns.decode_at(params, x, idx, cache, window, 16, attn)
    want = np.take_along_axis(full[:, 16:24], idx[..., None], 1)
    np.testing.assert_allclose(fns.head(params, h), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(new.k, window.k, atol=1e-5)
    np.testing.assert_allclose(new.v, window.v, atol=1e-5)


def exact(cfg: smp.SamplerConfig) -> smp.SamplerConfig:
    return dataclasses.replace(cfg, kv_cache="none", recompute="block", cache_refresh=0)


ONE_LAYER_CASES = {  # 2 blocks of 8, 4 steps each unless said
    "dual": dict(kv_cache="dual"),
    "prefix": dict(kv_cache="prefix"),
    "dual_masked": dict(kv_cache="dual", recompute="masked"),
    "dual_masked_T0.7": dict(kv_cache="dual", recompute="masked", temperature=0.7),
    "prefix_parallel": dict(kv_cache="prefix", threshold=0.9),
    "dual_fast_dllm": dict(kv_cache="dual", parallel_rule="fast_dllm", threshold=0.9),
}


@pytest.mark.parametrize("case", list(ONE_LAYER_CASES))
def test_one_layer_cache_is_the_exact_sampler(case, one_layer):
    """A one-layer Dream's cached keys/values are those of the current tokens, so every
    cached step must be the full forward, the block's first position (whose prediction
    reads the row before the block) included: token-exact with left-padded prompts."""
    _, params = one_layer
    cfg = cfg_for(CFG1, block_length=8, steps=8, **ONE_LAYER_CASES[case])
    ids, mask = make_prompts(CFG1.vocab_size, CFG1.pad_token_id, lp=8)
    model, rng = Dream(CFG1), jax.random.key(2)
    out = smp.generate(smp.model_fns(model), params, ids, mask, rng, cfg)
    want = smp.generate(smp.model_apply_fn(model), params, ids, mask, rng, exact(cfg))
    for got, ref in zip(out, want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    assert np.asarray(out.block_steps).sum() > cfg.num_blocks  # cached steps ran


@pytest.mark.parametrize("kw", [dict(kv_cache="dual"), dict(kv_cache="prefix"),
                                dict(kv_cache="dual", recompute="masked")],
                         ids=["dual", "prefix", "dual_masked"])
def test_refresh_every_token_is_the_exact_sampler(kw, peaked):  # noqa: F811
    """cache_refresh=1: a full forward after every decoded token (temperature and padding on)."""
    _, params = peaked
    cfg = cfg_for(CFG, block_length=8, steps=8, temperature=0.7, cache_refresh=1, **kw)
    ids, mask = make_prompts(CFG.vocab_size, CFG.pad_token_id, lp=8)
    model, rng = Dream(CFG), jax.random.key(4)
    out = smp.generate(smp.model_fns(model), params, ids, mask, rng, cfg)
    want = smp.generate(smp.model_apply_fn(model), params, ids, mask, rng, exact(cfg))
    np.testing.assert_array_equal(np.asarray(out.ids), np.asarray(want.ids))


def np_fast_dllm_dream(sd, cfg, ids, mask, gen_length, block_length, threshold, dual):
    """Fast-dLLM's Dream block loop at temperature 0 (``_sample``, confidence_threshold) in
    float64 numpy: (ids [B, Lp + gen_length], model evaluations per block).

    At each block start a full forward refreshes the cache and decodes the block's first
    position alone (its argmax); then the block ("dual") or everything from it ("prefix")
    is recomputed against the cache, the logits shifted within the recomputed rows (row 0
    repeats itself: never read, its position is decoded), and the most confident masked
    position of the block and every other one with p >= threshold are decoded, until the
    block has no mask. Its code runs one row (the batch-wide mask counts and
    ``transfer_index[0]``); here each row runs it. Positions are ``tok_idx`` and padding
    keys are masked (Fast-dLLM's DreamBaseModel overwrites the positions with 0..L-1 and its
    cached 4-D mask slice fails on padded rows; unpadded, the two are the same).
    """
    b, lp = ids.shape
    mask_id = cfg.mask_token_id
    x = np.concatenate([ids, np.full((b, gen_length), mask_id, np.int32)], 1)
    attn = np.concatenate([mask, np.ones((b, gen_length), np.int32)], 1)
    pos = np_tok_idx(attn)
    evals = []
    for nb in range(gen_length // block_length):
        s, e = lp + nb * block_length, lp + (nb + 1) * block_length
        kv = []
        raw = np_raw_logits(sd, cfg, x, attn, pos, kv=kv)
        x[:, s] = raw[:, s - 1].argmax(-1)  # the shifted logits of position s
        n = 1
        while (x[:, s:e] == mask_id).any():
            end = e if dual else x.shape[1]
            raw = np_raw_logits(sd, cfg, x[:, s:end], attn, pos[:, s:end], cache=kv, q_start=s)
            logits = np.concatenate([raw[:, :1], raw[:, :-1]], 1)[:, :block_length]
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            x0, conf = p.argmax(-1), p.max(-1)
            for j in range(b):
                masked = x[j, s:e] == mask_id
                order = np.argsort(-np.where(masked, conf[j], -np.inf), kind="stable")
                keep = [q for r, q in enumerate(order[:masked.sum()])
                        if r == 0 or conf[j, q] >= threshold]
                x[j, s + np.array(keep, int)] = x0[j, keep]
            n += 1
        evals.append(n)
    return x, evals


@pytest.mark.parametrize("dual", [True, False], ids=["dual", "prefix"])
@pytest.mark.parametrize("pad", [(0, 0, 0), (0, 3, 5)], ids=["unpadded", "left_padded"])
def test_matches_the_fast_dllm_dream_loop(dual, pad, peaked):  # noqa: F811
    sd, params = peaked
    tau = 0.6
    cfg = cfg_for(CFG, gen_length=16, block_length=8, steps=2, threshold=tau,
                  kv_cache="dual" if dual else "prefix", parallel_rule="fast_dllm",
                  first_position=True)
    ids, mask = make_prompts(CFG.vocab_size, CFG.pad_token_id, lp=8, pad=pad)
    out = smp.generate(smp.model_fns(Dream(CFG)), params, ids, mask, jax.random.key(0), cfg)
    want, evals = np_fast_dllm_dream(sd, CFG, ids, mask, 16, 8, tau, dual)
    assert not (want[:, 8:] == CFG.mask_token_id).any()
    np.testing.assert_array_equal(np.asarray(out.ids), want)
    np.testing.assert_array_equal(np.asarray(out.block_steps), evals)
    assert sum(evals) < 16  # some steps decode several positions


def test_first_position_needs_the_fast_dllm_rule():
    with pytest.raises(ValueError, match="first_position=True .* needs parallel_rule"):
        smp.SamplerConfig(kv_cache="dual", threshold=0.9, first_position=True)


def test_dual_parallel_sharded_equals_unsharded():
    """On a (2, 2, 2) mesh, masked recompute (block recompute sharded: tests/test_fast_sampler.py,
    through the same sampler loop)."""
    cfg = cfg_for(CFG, kv_cache="dual", threshold=0.5, temperature=0.5, recompute="masked",
                  block_length=8, steps=8)
    ids, mask = make_prompts(CFG.vocab_size, CFG.pad_token_id, b=8, pad=(0, 2, 4, 6, 0, 1, 3, 5))
    model = Dream(CFG)
    gen = smp.make_generate_fn(smp.model_fns(model), cfg)
    want = np.asarray(gen(init_params(model, jax.random.key(0)), ids, mask,
                          jax.random.key(3)).ids)
    mesh = sharding.make_mesh((2, 2, 2))
    sparams = init_params(model, jax.random.key(0), mesh)
    bs = sharding.batch_sharding(mesh)
    with sharding.activate(mesh):
        got = gen(sparams, jax.device_put(ids, bs), jax.device_put(mask, bs), jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(got.ids), want)
