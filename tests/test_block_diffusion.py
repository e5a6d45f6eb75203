"""Block diffusion's sampler (``d1jax.sampling.block_diffusion``, ``loop="sdar"``) and SDAR's
cache entry points.

Independent reference: ``np_block_diffusion`` ports the authors' sampler to numpy, one
unpadded prompt at a time (JetAstra/SDAR generate.py's ``block_diffusion_generate`` with the
step rules, commit and trace of Gen-Verse/dLLM-RL's engine, ``sample/jetengine_ext``
``engine/scheduler.py`` and ``engine/sequence.py``), and recomputes every step's logits with
``tests/test_sdar.py``'s float64 forward over the whole sequence under generate.py's
block-causal mask: no cache. It shares with d1jax only the Gumbel noise of each (block,
step), as the draw's random numbers.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sampling as smp
from d1jax.model import sdar
from d1jax.sampling import block_diffusion as bd
from tests.test_sdar import CFG, generate_mask, hf_state, loaded, np_logits, sd  # noqa: F401

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

BS = CFG.block_size
PROMPT_LENS = (7, 5, 2, 9)  # remainders 3, 1, 2, 1; the 2-token prompt has no whole block


def prompts(seed=3):
    rng = np.random.default_rng(seed)
    lp = max(PROMPT_LENS)
    ids = np.full((len(PROMPT_LENS), lp), CFG.pad_token_id)
    mask = np.zeros_like(ids)
    rows = []
    for r, n in enumerate(PROMPT_LENS):
        row = rng.integers(0, CFG.vocab_size - 2, n)
        ids[r, lp - n:], mask[r, lp - n:] = row, 1
        rows.append(row)
    return ids, mask, rows


def np_filter(logits, cfg):
    """generate.py's temperature, top_k_logits, top_p_logits on float64 logits [S, V]."""
    x = logits / (cfg.temperature if cfg.temperature > 0 else 1.0)
    if cfg.top_k > 0:
        kth = np.sort(x, -1)[:, -cfg.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    if cfg.top_p < 1.0:
        order = np.argsort(-x, -1, kind="stable")
        srt = np.take_along_axis(x, order, -1)
        e = np.exp(srt - srt[:, :1])
        cum = np.cumsum(e / e.sum(-1, keepdims=True), -1)
        drop = np.concatenate([np.zeros_like(cum[:, :1], bool), cum[:, :-1] > cfg.top_p], -1)
        out = np.zeros_like(drop)
        np.put_along_axis(out, order, drop, -1)
        x = np.where(out, -np.inf, x)
    return x


def np_block_diffusion(sd, prompt, cfg, noise):
    """One prompt through the authors' loop: (completion tokens, first_unmask_times)."""
    steps = max(1, cfg.steps // (cfg.gen_length // cfg.block_length))
    base, rem = divmod(BS, steps)
    budget = [base + (i < rem) for i in range(steps)]
    committed = list(prompt[:len(prompt) // BS * BS])
    cur = list(prompt[len(committed):]) + [cfg.mask_id] * (BS - len(prompt) % BS)
    completion, times, global_step, blk = [], [], 0, 0
    while True:
        first = [0] * BS
        for step in range(steps):
            masked = np.array(cur) == cfg.mask_id
            if not masked.any():
                break
            seq = np.array(committed + cur)[None]
            mask = generate_mask(np.ones_like(seq), BS)
            logits = np_logits(sd, CFG, seq, mask, np.arange(seq.shape[1])[None])[0, -BS:]
            x = np_filter(logits, cfg)
            logp = x - x.max(-1, keepdims=True)
            logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
            g = noise(blk, step)
            x0 = np.argmax(logp + g if cfg.temperature > 0 else x, -1)
            p0 = np.exp(logp[np.arange(BS), x0])
            conf = np.where(masked, p0, -np.inf)
            order = np.argsort(-conf, kind="stable")[:min(budget[step], masked.sum())]
            put = np.zeros(BS, bool)
            put[order] = True
            if cfg.remasking == "low_confidence_dynamic":
                high = conf > cfg.threshold
                put = high if high.sum() >= budget[step] else put | high
            for i in np.nonzero(put)[0]:
                cur[i] = int(x0[i])
                first[i] = first[i] or global_step + 1
            global_step += 1
        # commit_block: the completion part of the block, up to EOS or gen_length
        start = len(prompt) - len(committed) if len(committed) < len(prompt) else 0
        for tok, t in zip(cur[start:], first[start:]):
            if len(completion) == cfg.gen_length:
                return completion, times
            completion.append(tok)
            times.append(t)
            if tok == cfg.eos_id:
                return completion, times
        if len(completion) == cfg.gen_length:
            return completion, times
        committed += cur
        cur, blk = [cfg.mask_id] * BS, blk + 1


def sampler(**kw):
    base = dict(gen_length=8, block_length=BS, steps=8, temperature=1.0, top_k=0, top_p=1.0,
                mask_id=CFG.mask_token_id, eos_id=CFG.eos_token_id, loop="sdar",
                kv_cache="prefix", remasking="low_confidence_static", threshold=0.9)
    return smp.SamplerConfig(**{**base, **kw})


def run(loaded, cfg, rng=jax.random.PRNGKey(7)):
    config, params = loaded
    ids, mask, _ = prompts()
    fn = smp.make_generate_fn(smp.model_fns(sdar.SDAR(config)), cfg)
    return fn(params, jnp.asarray(ids), jnp.asarray(mask), rng)


def check_against_numpy(loaded, sd, cfg, rng=jax.random.PRNGKey(7)):
    out = run(loaded, cfg, rng)
    ids, _, rows = prompts()
    b, lp = ids.shape

    def noise(blk, step):
        g = jax.random.gumbel(bd.step_key(rng, blk, step), (b, BS, CFG.vocab_size), jnp.float32)
        return np.asarray(g, np.float64)
    got_ids, got_at = np.asarray(out.ids)[:, lp:], np.asarray(out.decoded_at)
    np.testing.assert_array_equal(np.asarray(out.ids)[:, :lp], ids)
    for r, prompt in enumerate(rows):
        want, times = np_block_diffusion(sd, list(prompt), cfg, lambda i, k: noise(i, k)[r])
        n = len(want)
        assert got_ids[r, :n].tolist() == want, f"row {r}"
        assert (got_at[r, :n] + 1).tolist() == times, f"row {r}"
        assert (got_ids[r, n:] == cfg.eos_id).all() and (got_at[r, n:] == -1).all()
    return out


@pytest.mark.parametrize("cfg", [
    sampler(),  # TraDo's rollout: 4 steps a block of 4, static
    sampler(steps=4, temperature=0.8, top_k=20, top_p=0.9),  # 2 steps a block: 2 tokens each
    sampler(remasking="low_confidence_dynamic", threshold=0.3, temperature=0.7, top_p=0.95),
    sampler(remasking="low_confidence_dynamic", threshold=0.15, temperature=0.0),
], ids=["static", "static-topk-topp", "dynamic", "dynamic-greedy"])
def test_tokens_and_trace_match_a_numpy_port_of_their_sampler(loaded, sd, cfg):
    out = check_against_numpy(loaded, sd, cfg)
    if cfg.remasking == "low_confidence_dynamic":  # the threshold passed more than a budget
        at = np.asarray(out.decoded_at)
        most = max(np.bincount(row[row >= 0]).max() for row in at)
        assert most > -(-BS // cfg.steps_per_block)


def test_stops_at_eos_as_their_commit_block(loaded, sd):
    cfg = sampler(temperature=0.0, gen_length=12)
    first = np.asarray(run(loaded, cfg).ids)[:, max(PROMPT_LENS):]
    eos = int(first[0, 5])  # a token row 0 writes in its second block: its EOS now
    out = check_against_numpy(loaded, sd, dataclasses.replace(cfg, eos_id=eos))
    assert (np.asarray(out.ids)[0, max(PROMPT_LENS) + 6:] == eos).all()


@pytest.mark.parametrize("remasking", ["low_confidence_static", "low_confidence_dynamic"])
def test_the_committed_block_cache_changes_no_token(loaded, remasking):
    cfg = sampler(remasking=remasking, threshold=0.3, gen_length=16)
    with_cache = run(loaded, cfg)
    without = run(loaded, dataclasses.replace(cfg, kv_cache="none"))
    for a, b in zip(with_cache, without):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_cache_entry_points_equal_the_block_causal_forward(loaded):
    config, params = loaded
    model = sdar.SDAR(config)
    ids, mask, _ = prompts()
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    apply = lambda *a, **k: model.apply({"params": params}, *a, **k)  # noqa: E731
    full = apply(ids, mask)
    logits, cache = apply(ids, mask, method=model.prefill)
    np.testing.assert_allclose(logits, full, atol=1e-5)
    at = ids.shape[1] - 2 * BS  # a whole block on the default grid (counted from the end)
    stale = jax.tree.map(lambda c: c.at[:, :, at:].set(0.0), cache)  # it and later ones unset
    h = apply(ids, stale, at, mask, slice_len=BS, method=model.decode_hidden)
    np.testing.assert_allclose(apply(h, method=model.logits), full[:, at:at + BS], atol=1e-5)
    window = jax.tree.map(lambda c: c[:, :, at:at + BS], stale)
    idx = jnp.broadcast_to(jnp.arange(BS)[None], (ids.shape[0], BS))
    _, window = apply(ids, idx, stale, window, at, mask, method=model.decode_at)
    for w, c in zip(window, cache):
        np.testing.assert_allclose(w, c[:, :, at:at + BS], atol=1e-5)


def test_config_refuses_what_block_diffusion_does_not_run():
    with pytest.raises(ValueError, match="low_confidence_static"):
        sampler(remasking="low_confidence")
    with pytest.raises(ValueError, match="loop='llada'"):
        smp.SamplerConfig(remasking="low_confidence_static")
    with pytest.raises(ValueError, match="kv_cache='prefix'"):
        sampler(kv_cache="dual")
    with pytest.raises(ValueError, match="block_size"):
        run((CFG, None), sampler(block_length=8))


def _upcast(fns):
    """The same model functions with their logits read as float32 (exact for bfloat16)."""
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    return fns._replace(forward=lambda *a: f32(fns.forward(*a)),
                        decode=lambda *a: f32(fns.decode(*a)),
                        head=lambda *a: f32(fns.head(*a)))


@pytest.mark.parametrize("cfg", [
    sampler(gen_length=16, temperature=1.0, top_k=40, top_p=0.9),
    sampler(gen_length=16, remasking="low_confidence_dynamic", threshold=0.3, temperature=0.7),
    sampler(gen_length=16, remasking="low_confidence_dynamic", threshold=0.2, temperature=0.0),
], ids=["static-topk-topp", "dynamic", "dynamic-greedy"])
def test_a_bfloat16_model_draws_and_ranks_as_the_float32_path(loaded, cfg):
    """A bfloat16 SDAR (bfloat16 weights and compute, bfloat16 logits out) is sampled with
    its confidences, filters and draws in float32, as the float32 path (checked against the
    numpy port above) computes them on the same logits: every token, trace entry and block
    step count equals the run whose model functions hand the sampler those logits upcast."""
    config, params = loaded
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    fns = smp.model_fns(sdar.SDAR(config, dtype=jnp.bfloat16))
    ids, mask, _ = (jnp.asarray(x) if i < 2 else x for i, x in enumerate(prompts()))
    rng = jax.random.PRNGKey(11)
    assert fns.forward(bf16, ids, mask, 0, BS).dtype == jnp.bfloat16  # what users run
    got = smp.make_generate_fn(fns, cfg)(bf16, ids, mask, rng)
    want = smp.make_generate_fn(_upcast(fns), cfg)(bf16, ids, mask, rng)
    for name, a, b in zip(got._fields, got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
