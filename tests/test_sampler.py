"""The sampler against a straightforward loop of LLaDA's generate.py written here in numpy.

The reference loop gets its logits from the same model (full sequence, all positions), and
does everything else (budgets, Gumbel-free argmax, confidence over the whole sequence with
-inf beyond the block, per-row top-k, CFG, padding) in numpy, as generate.py does.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sampler as smp
from d1jax import sharding


def ref_budget(mask_count, steps):
    base, rem = mask_count // steps, mask_count % steps
    out = np.full(steps, base)
    out[:rem] += 1
    return out


def reference_generate(model, params, prompt, mask, cfg: smp.SamplerConfig, rng=None):
    """LLaDA generate.py, step by step, in numpy (random remasking draws via step_keys)."""
    full = jax.jit(lambda ids, m: model.apply({"params": params}, ids, m))
    b, lp = prompt.shape
    x = np.concatenate([prompt, np.full((b, cfg.gen_length), cfg.mask_id)], 1)
    attn = None
    if cfg.use_attention_mask and mask is not None:
        attn = np.concatenate([mask, np.ones((b, cfg.gen_length), mask.dtype)], 1)
    prompt_index = x != cfg.mask_id
    nb = cfg.gen_length // cfg.block_length
    spb = cfg.steps // nb
    for blk in range(nb):
        s, e = lp + blk * cfg.block_length, lp + (blk + 1) * cfg.block_length
        budget = ref_budget((x[:, s:e] == cfg.mask_id).sum(1)[0], spb)
        for i in range(spb):
            mask_index = x == cfg.mask_id
            if cfg.cfg_scale > 0:
                un_x = np.where(prompt_index, cfg.mask_id, x)
                a2 = None if attn is None else np.concatenate([attn, attn])
                lg = np.asarray(full(np.concatenate([x, un_x]), a2), np.float64)
                cond, unc = lg[:b], lg[b:]
                logits = unc + (cfg.cfg_scale + 1) * (cond - unc)
            else:
                logits = np.asarray(full(x, attn), np.float64)
            if cfg.logits_eos_inf:
                logits[:, :, cfg.eos_id] = -np.inf
            x0 = logits.argmax(-1)
            if cfg.remasking == "low_confidence":
                p = np.exp(logits - logits.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
                x0_p = np.take_along_axis(p, x0[..., None], -1)[..., 0]
            else:
                _, key_r = smp.step_keys(rng, blk * spb + i)
                draw = np.asarray(jax.random.uniform(key_r, (b, cfg.block_length)))
                x0_p = np.full(x.shape, -np.inf)
                x0_p[:, s:e] = draw
            x0_p[:, e:] = -np.inf
            x0 = np.where(mask_index, x0, x)
            conf = np.where(mask_index, x0_p, -np.inf)
            for j in range(b):
                sel = np.argsort(-conf[j], kind="stable")[:budget[i]]
                x[j, sel] = x0[j, sel]
    return x


@pytest.fixture(scope="module")
def peaked_params(tiny_params):
    """Random weights with a sharper head: logits far apart, so the reference's full-sequence
    forward and the sampler's block-sliced head cannot flip a near-tie (REFERENCE_NOTES)."""
    return {**tiny_params, "ff_out": {"kernel": tiny_params["ff_out"]["kernel"] * 40.0}}


def make_prompts(vocab, mask_id, pad_id, b=3, lp=10, pad=(0, 3, 6), seed=0):
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
    base.update(kw)
    return smp.SamplerConfig(**base)


CASES = {
    "1block_full_steps": dict(block_length=16, steps=16),
    "4blocks_half_steps": dict(block_length=4, steps=8),
    "4blocks_full_steps": dict(block_length=4, steps=16),
    "1block_half_steps": dict(block_length=16, steps=8),
    "no_mask_d1_mode": dict(block_length=4, steps=8, use_attention_mask=False),
    "cfg": dict(block_length=8, steps=8, cfg_scale=1.5),
    "eos_inf": dict(block_length=8, steps=8, logits_eos_inf=True),
    "random_remasking": dict(block_length=4, steps=8, remasking="random"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_temperature0_matches_reference_loop(name, tiny_model, peaked_params, tiny_config):
    tiny_params = peaked_params
    c = tiny_config
    cfg = cfg_for(c, **CASES[name])
    ids, mask = make_prompts(c.vocab_size, c.mask_token_id, c.pad_token_id)
    rng = jax.random.key(7)
    out = smp.generate(smp.llada_apply_fn(tiny_model), tiny_params, ids, mask, rng, cfg)
    ref = reference_generate(tiny_model, tiny_params, ids, mask, cfg, rng)
    np.testing.assert_array_equal(np.asarray(out.ids), ref)


def test_budgets_and_no_mask_left(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    cfg = cfg_for(c, gen_length=24, block_length=8, steps=9, temperature=0.7)
    ids, mask = make_prompts(c.vocab_size, c.mask_token_id, c.pad_token_id)
    out = smp.generate(smp.llada_apply_fn(tiny_model), tiny_params, ids, mask,
                       jax.random.key(0), cfg)
    comp = np.asarray(out.ids)[:, ids.shape[1]:]
    assert not (comp == c.mask_token_id).any()
    at = np.asarray(out.decoded_at)
    want = np.tile(smp.num_transfer_tokens(8, 3), 3)  # [3, 3, 2] per block
    for row in at:
        np.testing.assert_array_equal(np.bincount(row, minlength=9), want)
        # Block k is decoded in steps 3k..3k+2 only.
        assert all(3 * (p // 8) <= row[p] < 3 * (p // 8 + 1) for p in range(24))


def test_steps_beyond_gen_length_follow_the_reference_budget(tiny_model, peaked_params,
                                                           tiny_config):
    tiny_params = peaked_params
    c = tiny_config
    cfg = cfg_for(c, gen_length=8, block_length=8, steps=12)
    ids, mask = make_prompts(c.vocab_size, c.mask_token_id, c.pad_token_id)
    out = smp.generate(smp.llada_apply_fn(tiny_model), tiny_params, ids, mask,
                       jax.random.key(0), cfg)
    np.testing.assert_array_equal(np.asarray(out.ids),
                                  reference_generate(tiny_model, tiny_params, ids, mask, cfg))
    assert smp.num_transfer_tokens(8, 12).tolist() == [1] * 8 + [0] * 4


def test_rng_determinism_and_variety(tiny_model, tiny_params, tiny_config):
    c = tiny_config
    cfg = cfg_for(c, temperature=1.0)
    ids, mask = make_prompts(c.vocab_size, c.mask_token_id, c.pad_token_id)
    gen = smp.make_generate_fn(smp.llada_apply_fn(tiny_model), cfg)
    a = np.asarray(gen(tiny_params, ids, mask, jax.random.key(1)).ids)
    b = np.asarray(gen(tiny_params, ids, mask, jax.random.key(1)).ids)
    d = np.asarray(gen(tiny_params, ids, mask, jax.random.key(2)).ids)
    np.testing.assert_array_equal(a, b)
    assert (a != d).any()


def test_sharded_equals_unsharded(tiny_model, tiny_config):
    import d1jax
    c = tiny_config
    cfg = cfg_for(c, block_length=8, steps=8, temperature=0.5)
    ids, mask = make_prompts(c.vocab_size, c.mask_token_id, c.pad_token_id, b=8,
                             pad=(0, 2, 4, 6, 0, 1, 3, 5))
    params = d1jax.init_params(tiny_model, jax.random.key(0))
    gen = smp.make_generate_fn(smp.llada_apply_fn(tiny_model), cfg)
    want = np.asarray(gen(params, ids, mask, jax.random.key(3)).ids)
    mesh = sharding.make_mesh((2, 2, 2))
    sparams = d1jax.init_params(tiny_model, jax.random.key(0), mesh)
    bs = sharding.batch_sharding(mesh)
    with sharding.activate(mesh):
        got = gen(sparams, jax.device_put(ids, bs), jax.device_put(mask, bs), jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(got.ids), want)


def test_bad_settings_are_refused(tiny_config):
    with pytest.raises(ValueError, match="must divide gen_length"):
        smp.SamplerConfig(gen_length=30, block_length=8)
    with pytest.raises(ValueError, match="multiple of the number of blocks"):
        smp.SamplerConfig(gen_length=32, block_length=8, steps=6)
    with pytest.raises(ValueError, match="remasking"):
        smp.SamplerConfig(remasking="entropy")
    with pytest.raises(ValueError, match="exceeds the model's max_sequence_length"):
        smp.generate(None, None, jnp.zeros((1, 250), jnp.int32), None, jax.random.key(0),
                     smp.SamplerConfig(gen_length=16, block_length=16, steps=16), max_length=256)
