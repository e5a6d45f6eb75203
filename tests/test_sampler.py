"""The exact sampler against a straightforward numpy loop of LLaDA's generate.py.

The reference loop gets its logits from the same model (a full forward over the whole
sequence, no slicing) and does everything else in numpy, as generate.py / d1 do: budgets
from the block's mask count, float64 Gumbel noise as ``exp(l) / (-log u)^T`` and float64
softmax over all positions, -inf beyond the block and for decoded positions, per-row top-k,
CFG, EOS options, padding. At T > 0 it is fed the sampler's own uniform draws (recomputed
from its per-step keys), so the two must agree token for token.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import d1jax
from d1jax import sampling as smp
from d1jax import sharding

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def ref_budget(mask_count: int, steps: int) -> np.ndarray:
    """LLaDA's get_num_transfer_tokens for one row."""
    out = np.full(steps, mask_count // steps)
    out[:mask_count % steps] += 1
    return out


def ref_logits(full, x, attn, prompt_index, cfg):
    """Float64 logits [B, L, V] of the whole sequence, with CFG and logits_eos_inf."""
    b = x.shape[0]
    if cfg.cfg_scale > 0:
        un_x = np.where(prompt_index, cfg.mask_id, x)
        a2 = None if attn is None else np.concatenate([attn, attn])
        lg = np.asarray(full(np.concatenate([x, un_x]), a2), np.float64)
        logits = lg[b:] + (cfg.cfg_scale + 1) * (lg[:b] - lg[b:])
    else:
        logits = np.asarray(full(x, attn), np.float64)
    if cfg.logits_eos_inf:
        logits[:, :, cfg.eos_id] = -np.inf
    return logits


def ref_confidence(logits, x0, cfg, rng, gstep, s, e):
    """x0_p [B, L] as generate.py: softmax p of x0, or a uniform draw (ours, for equality)."""
    b, total = x0.shape
    if cfg.remasking == "random":
        _, key_r = smp.step_keys(rng, gstep)
        x0_p = np.full((b, total), -np.inf)
        x0_p[:, s:e] = np.asarray(jax.random.uniform(key_r, (b, e - s)))
        return x0_p
    if cfg.confidence_eos_eot_inf:  # at T = 0 LLaDA's chained assignment hits both ids
        logits = logits.copy()
        logits[:, :, [cfg.eos_id, cfg.eot_id]] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.take_along_axis(p, x0[..., None], -1)[..., 0]


def ref_noise(rng, gstep, shape, s, e):
    """LLaDA's ``noise = torch.rand_like(logits)`` [B, L, V] (float64) of global step gstep,
    holding the sampler's draws on the block [s, e): 32 random bits per entry from the step's
    Gumbel key, v = min((bits + 0.5) / 2^32, 1 - 2^-24), u = 1 - v (the sampler's Gumbel is
    -log(-log1p(-v)) = -log(-log u)). Elsewhere any draw: those positions are decoded or
    beyond the block, so their proposals are never used."""
    b, _, v = shape
    noise = np.random.RandomState(gstep).uniform(size=shape)
    key_g, _ = smp.step_keys(rng, gstep)
    bits = np.asarray(jax.random.bits(key_g, (b, e - s, v), jnp.uint32), np.float64)
    noise[:, s:e] = 1.0 - np.minimum((bits + 0.5) * 2.0 ** -32, 1.0 - 2.0 ** -24)
    return noise


def ref_add_gumbel_noise(logits, temperature, noise):
    """LLaDA's add_gumbel_noise in float64, given its uniform draws."""
    return np.exp(logits) / (-np.log(noise)) ** temperature


def reference_generate(model, params, prompt, mask, cfg: smp.SamplerConfig, rng=None):
    """LLaDA generate.py / d1 DiffuGRPOTrainer.generate, step by step (T > 0: the sampler's
    uniform draws, from ``rng``)."""
    full = jax.jit(lambda ids, m: model.apply({"params": params}, ids, m))
    b, lp = prompt.shape
    x = np.concatenate([prompt, np.full((b, cfg.gen_length), cfg.mask_id)], 1)
    attn = None
    if cfg.use_attention_mask and mask is not None:
        attn = np.concatenate([mask, np.ones((b, cfg.gen_length), mask.dtype)], 1)
    prompt_index = x != cfg.mask_id
    nb = cfg.gen_length // cfg.block_length
    spb = max(1, cfg.steps // nb)  # d1
    for blk in range(nb):
        s, e = lp + blk * cfg.block_length, lp + (blk + 1) * cfg.block_length
        budgets = [ref_budget(int((x[j, s:e] == cfg.mask_id).sum()), spb) for j in range(b)]
        for i in range(spb):
            mask_index = x == cfg.mask_id
            logits = ref_logits(full, x, attn, prompt_index, cfg)
            if cfg.temperature > 0:
                noise = ref_noise(rng, blk * spb + i, logits.shape, s, e)
                x0 = ref_add_gumbel_noise(logits, cfg.temperature, noise).argmax(-1)
            else:  # (-log u)^0 = 1: the argmax of the logits
                x0 = logits.argmax(-1)
            x0_p = ref_confidence(logits, x0, cfg, rng, blk * spb + i, s, e)
            x0_p[:, e:] = -np.inf
            x0 = np.where(mask_index, x0, x)
            conf = np.where(mask_index, x0_p, -np.inf)
            for j in range(b):
                sel = np.argsort(-conf[j], kind="stable")[:budgets[j][i]]
                x[j, sel] = x0[j, sel]
    return x


@pytest.fixture(scope="module")
def peaked_params(tiny_params):
    """Random weights with a sharper head: logits far apart, so the reference's full-sequence
    forward and the sampler's block-sliced head cannot flip a near-tie (REFERENCE_NOTES)."""
    return {**tiny_params, "ff_out": {"kernel": tiny_params["ff_out"]["kernel"] * 40.0}}


def make_prompts(vocab, pad_id, b=3, lp=10, pad=(0, 3, 6), seed=0):
    rs = np.random.RandomState(seed)
    ids = rs.randint(0, vocab - 8, (b, lp)).astype(np.int32)
    mask = np.ones((b, lp), np.int32)
    for r, n in enumerate(pad[:b]):
        ids[r, :n] = pad_id
        mask[r, :n] = 0
    return ids, mask


def cfg_for(c, **kw):
    base = dict(gen_length=16, block_length=16, steps=16, mask_id=c.mask_token_id,
                eos_id=c.eos_token_id, eot_id=c.eos_token_id - 1)
    return smp.SamplerConfig(**{**base, **kw})


CASES = {
    "1block_full_steps": dict(block_length=16, steps=16),
    "1block_half_steps": dict(block_length=16, steps=8),
    "4blocks_full_steps": dict(block_length=4, steps=16),
    "4blocks_half_steps": dict(block_length=4, steps=8),
    "padding_attended_d1_mode": dict(block_length=4, steps=8, use_attention_mask=False),
    "cfg": dict(block_length=8, steps=8, cfg_scale=1.5),
    "cfg_d1_mode": dict(block_length=8, steps=8, cfg_scale=0.5, use_attention_mask=False),
    "logits_eos_inf": dict(block_length=8, steps=8, logits_eos_inf=True),
    "confidence_eos_eot_inf": dict(block_length=8, steps=8, confidence_eos_eot_inf=True),
    "random_remasking": dict(block_length=4, steps=8, remasking="random"),
    "steps_not_multiple_d1_floor": dict(block_length=4, steps=10),  # 2 per block
    "steps_beyond_gen_length": dict(gen_length=8, block_length=8, steps=12),
}


@pytest.mark.parametrize("name", list(CASES))
def test_temperature0_matches_reference_loop(name, tiny_model, peaked_params, tiny_config):
    c = tiny_config
    cfg = cfg_for(c, **CASES[name])
    ids, mask = make_prompts(c.vocab_size, c.pad_token_id)
    rng = jax.random.key(7)
    out = smp.generate(smp.model_apply_fn(tiny_model), peaked_params, ids, mask, rng, cfg)
    ref = reference_generate(tiny_model, peaked_params, ids, mask, cfg, rng)
    np.testing.assert_array_equal(np.asarray(out.ids), ref)


SAMPLED_CASES = {  # T != 1 tells T g from g / T or g; CFG and EOS change the logits fed in
    "1block_T0.7": dict(block_length=16, steps=16, temperature=0.7),
    "cfg_eos_inf_d1_mode_T1.3": dict(block_length=8, steps=8, temperature=1.3, cfg_scale=0.5,
                                     logits_eos_inf=True, use_attention_mask=False),
    "random_remasking_4blocks_T1": dict(block_length=4, steps=8, temperature=1.0,
                                        remasking="random"),  # its own key for the draw
}


@pytest.mark.parametrize("name", list(SAMPLED_CASES))
def test_temperature_matches_reference_loop_same_noise(name, tiny_model, peaked_params,
                                                       tiny_config):
    """T > 0: LLaDA's add_gumbel_noise (x0 = argmax exp(l) / (-log u)^T) and its confidence
    (softmax of the clean logits at x0), on the sampler's own uniform draws. Logits several
    units apart: the noise changes many argmaxes, and float32 against float64 changes none."""
    c = tiny_config
    cfg = cfg_for(c, **SAMPLED_CASES[name])
    ids, mask = make_prompts(c.vocab_size, c.pad_token_id)
    rng = jax.random.key(11)
    out = smp.generate(smp.model_apply_fn(tiny_model), peaked_params, ids, mask, rng, cfg)
    ref = reference_generate(tiny_model, peaked_params, ids, mask, cfg, rng)
    greedy = reference_generate(tiny_model, peaked_params, ids, mask,
                                dataclasses.replace(cfg, temperature=0.0), rng)
    assert (ref != greedy)[:, ids.shape[1]:].mean() > 0.2  # the noise decides many tokens
    np.testing.assert_array_equal(np.asarray(out.ids), ref)


def test_eos_options_steer_eos(tiny_model, tiny_params, tiny_config):
    """A model that strongly prefers EOS at even positions: logits_eos_inf never emits it;
    with confidence_eos_eot_inf, EOS positions are unmasked after all others of a block."""
    c = tiny_config
    base = smp.model_apply_fn(tiny_model)

    def eos_fn(params, ids, mask, start, n):
        bonus = jnp.where(jnp.arange(n) % 2 == 0, 50.0, 0.0)[None, :]
        return base(params, ids, mask, start, n).at[..., c.eos_token_id].add(bonus)

    ids, mask = make_prompts(c.vocab_size, c.pad_token_id)
    run = lambda **kw: smp.generate(eos_fn, tiny_params, ids, mask, jax.random.key(0),
                                    cfg_for(c, block_length=8, steps=8, **kw))
    is_eos = np.asarray(run().ids)[:, 10:] == c.eos_token_id
    assert is_eos[:, ::2].all() and not is_eos[:, 1::2].any()  # the construction works
    assert not (np.asarray(run(logits_eos_inf=True).ids)[:, 10:] == c.eos_token_id).any()
    out = run(confidence_eos_eot_inf=True)
    np.testing.assert_array_equal(np.asarray(out.ids)[:, 10:] == c.eos_token_id, is_eos)
    at = np.asarray(out.decoded_at).reshape(3, 2, 8)  # [row, block, position]
    assert (at[..., ::2].min(-1) > at[..., 1::2].max(-1)).all()


def test_budgets_and_no_mask_left(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    cfg = cfg_for(c, gen_length=24, block_length=8, steps=9, temperature=0.7)
    ids, mask = make_prompts(c.vocab_size, c.pad_token_id)
    out = smp.generate(smp.model_apply_fn(tiny_model), tiny_params, ids, mask,
                       jax.random.key(0), cfg)
    comp = np.asarray(out.ids)[:, ids.shape[1]:]
    assert not (comp == c.mask_token_id).any()
    np.testing.assert_array_equal(np.asarray(out.block_steps), [3, 3, 3])
    want = np.tile(ref_budget(8, 3), 3)  # [3, 3, 2] per block
    for row in np.asarray(out.decoded_at):
        np.testing.assert_array_equal(np.bincount(row, minlength=9), want)
        assert all(3 * (p // 8) <= row[p] < 3 * (p // 8 + 1) for p in range(24))
    hist = smp.history(out, ids.shape[1], c.mask_token_id)
    np.testing.assert_array_equal((hist != c.mask_token_id).sum(-1)[:, 0], np.cumsum(want))
    assert smp.num_transfer_tokens(8, 12).tolist() == [1] * 8 + [0] * 4


def test_rng_determinism_variety_and_one_compile(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    cfg = cfg_for(c, temperature=1.0, block_length=4, steps=8)
    ids, mask = make_prompts(c.vocab_size, c.pad_token_id)
    traces, base = [], smp.model_apply_fn(tiny_model)

    def counting_fn(*args):
        traces.append(1)  # runs only while tracing
        return base(*args)

    gen = smp.make_generate_fn(counting_fn, cfg)
    a = np.asarray(gen(tiny_params, ids, mask, jax.random.key(1)).ids)
    b = np.asarray(gen(tiny_params, ids, mask, jax.random.key(1)).ids)
    d = np.asarray(gen(tiny_params, ids[::-1].copy(), mask[::-1].copy(), jax.random.key(2)).ids)
    np.testing.assert_array_equal(a, b)
    assert (a[::-1] != d).any()
    assert len(traces) == 1  # blocks and steps are lax loops: one trace, one compile


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_gumbel_max_samples_softmax(temperature):
    """argmax(l + T g) with our float32 Gumbel noise is a sample of softmax(l / T)."""
    logits = jnp.array([2.0, 1.0, 0.0, -1.0, -3.0])
    g = smp.gumbel_noise(jax.random.key(0), (200_000, 5))
    freq = np.bincount(np.asarray(jnp.argmax(logits + temperature * g, -1)), minlength=5) / 2e5
    np.testing.assert_allclose(freq, jax.nn.softmax(logits / temperature), atol=4e-3)
    gs = np.asarray(g)
    assert abs(gs.mean() - np.euler_gamma) < 0.01 and abs(gs.var() - np.pi ** 2 / 6) < 0.02


def assert_sharded_equals_unsharded(model, fns, cfg, ids, mask):
    """The sampler's tokens on a (2, 2, 2) mesh (params and batch sharded) equal one device's."""
    params = d1jax.init_params(model, jax.random.key(0))
    gen = smp.make_generate_fn(fns, cfg)
    want = np.asarray(gen(params, ids, mask, jax.random.key(3)).ids)
    mesh = sharding.make_mesh((2, 2, 2))
    sparams = d1jax.init_params(model, jax.random.key(0), mesh)
    bs = sharding.batch_sharding(mesh)
    with sharding.activate(mesh):
        got = gen(sparams, jax.device_put(ids, bs), jax.device_put(mask, bs), jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(got.ids), want)


def test_sharded_equals_unsharded(tiny_model, tiny_config):
    c = tiny_config
    cfg = cfg_for(c, block_length=8, steps=8, temperature=0.5)
    ids, mask = make_prompts(c.vocab_size, c.pad_token_id, b=8, pad=(0, 2, 4, 6, 0, 1, 3, 5))
    assert_sharded_equals_unsharded(tiny_model, smp.model_apply_fn(tiny_model), cfg, ids, mask)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="block_length=8 must divide gen_length=30"):
        smp.SamplerConfig(gen_length=30, block_length=8)
    with pytest.raises(ValueError, match="remasking='entropy'"):
        smp.SamplerConfig(remasking="entropy")
    with pytest.raises(ValueError, match="steps=0 must be positive"):
        smp.SamplerConfig(steps=0)
    with pytest.raises(ValueError, match="temperature=-1"):
        smp.SamplerConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="exceeds the model's max_sequence_length 256"):
        smp.generate(None, None, jnp.zeros((1, 250), jnp.int32), None, jax.random.key(0),
                     smp.SamplerConfig(gen_length=16, block_length=16, steps=16), max_length=256)
    with pytest.raises(ValueError, match="prompt_mask shape"):
        smp.generate(None, None, jnp.zeros((2, 8), jnp.int32), jnp.ones((2, 7)),
                     jax.random.key(0), smp.SamplerConfig(gen_length=16, block_length=16))
