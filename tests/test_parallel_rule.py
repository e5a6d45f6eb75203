"""The two parallel-decoding rules' properties (the token-exact comparisons against a
Fast-dLLM reference loop are in test_fast_sampler.py): "fast_dllm" unmasks at least one
token per step with no step budget, so at tau >= 1 it is the one-token-per-step exact
sampler, and a fully confident model decodes a block in one step."""

import jax
import numpy as np
import pytest

from d1jax import sampling as smp

import test_fast_sampler as fast_tests  # noqa: E402  (tests/ is on sys.path)
from test_fast_sampler import prompts  # noqa: E402

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def sampler_cfg(c, **kw):
    """test_fast_sampler's config with blocks of 8 and 4 steps in all."""
    return fast_tests.sampler_cfg(c, **{"block_length": 8, "steps": 4, **kw})


MODES = {"no_cache": dict(), "dual": dict(kv_cache="dual"),
         "dual_masked": dict(kv_cache="dual", recompute="masked")}


@pytest.mark.parametrize("mode", list(MODES))
def test_fast_dllm_tau_at_least_1_decodes_one_token_per_step(mode, tiny_model, tiny_params,
                                                             tiny_config):
    """Random weights (confidences far below 1): every step unmasks exactly one token, past
    the 2 steps per block of ``steps``, until no mask is left."""
    c = tiny_config
    ids, mask = prompts(c)
    cfg = sampler_cfg(c, parallel_rule="fast_dllm", threshold=1.0, temperature=0.7,
                      **MODES[mode])
    out = smp.generate(smp.model_fns(tiny_model), tiny_params, ids, mask, jax.random.key(2), cfg)
    assert not (np.asarray(out.ids)[:, 10:] == c.mask_token_id).any()
    np.testing.assert_array_equal(np.asarray(out.block_steps), [8, 8])
    for row in np.asarray(out.decoded_at):  # block b's step i is global step 8 b + i
        np.testing.assert_array_equal(np.sort(row), np.arange(16))
        assert (row[:8] < 8).all() and (row[8:] >= 8).all()


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_fast_dllm_tau_over_1_is_the_one_token_per_step_exact_sampler(remasking, tiny_model,
                                                                      tiny_params, tiny_config):
    """No confidence reaches tau = 1.5: one token per step, the exact sampler's schedule
    with as many steps as tokens (and the same step keys)."""
    c = tiny_config
    ids, mask = prompts(c)
    run = lambda **kw: smp.generate(smp.model_apply_fn(tiny_model), tiny_params, ids, mask,
                                    jax.random.key(3),
                                    sampler_cfg(c, temperature=0.7, remasking=remasking, **kw))
    fast, exact = run(parallel_rule="fast_dllm", threshold=1.5), run(steps=16)
    np.testing.assert_array_equal(np.asarray(fast.ids), np.asarray(exact.ids))
    np.testing.assert_array_equal(np.asarray(fast.decoded_at), np.asarray(exact.decoded_at))


def confident(fns: smp.ModelFns, token: int) -> smp.ModelFns:
    """The model with a +60 logit on ``token`` everywhere: its probability is ~1."""
    bonus = lambda logits: logits.at[..., token].add(60.0)
    return fns._replace(
        forward=lambda *a: bonus(fns.forward(*a)),
        prefill=lambda *a: (lambda out: (bonus(out[0]), out[1]))(fns.prefill(*a)),
        decode=lambda *a: bonus(fns.decode(*a)),
        head=lambda *a: bonus(fns.head(*a)))


@pytest.mark.parametrize("mode", list(MODES))
def test_fast_dllm_confident_model_decodes_a_block_in_one_step(mode, tiny_model, tiny_params,
                                                              tiny_config):
    c = tiny_config
    ids, mask = prompts(c)
    cfg = sampler_cfg(c, parallel_rule="fast_dllm", threshold=0.9, **MODES[mode])
    out = smp.generate(confident(smp.model_fns(tiny_model), 5), tiny_params, ids, mask,
                       jax.random.key(0), cfg)
    assert (np.asarray(out.ids)[:, 10:] == 5).all()
    np.testing.assert_array_equal(np.asarray(out.block_steps), [1, 1])
    np.testing.assert_array_equal(np.asarray(out.decoded_at), [[0] * 8 + [8] * 8] * 3)


def widths(cfg):
    """The head and recompute widths of each step: ([loop_steps], [loop_steps])."""
    (hw, hs), (rw, rs) = smp.head_sizes(cfg), smp.recompute_sizes(cfg)
    return [hs[w] for w in hw], [rs[w] for w in rw]


def test_widths_hold_the_positions_left_masked():
    """Before step i at most block_length - (tokens unmasked at least by steps < i) are
    masked: the budget's cumulative sum, or i under "fast_dllm"; widths round up to a
    multiple of block_length / 8. The recompute width of step i is the head width of i-1."""
    budget = smp.SamplerConfig(gen_length=16, block_length=8, steps=6, kv_cache="dual")
    assert widths(budget) == ([8, 5, 2], [8, 8, 5])  # budget [3, 3, 2]
    fast = smp.SamplerConfig(gen_length=16, block_length=8, steps=6, kv_cache="dual",
                             parallel_rule="fast_dllm", threshold=0.9)
    assert widths(fast) == ([8, 7, 6, 5, 4, 3, 2, 1], [8, 8, 7, 6, 5, 4, 3, 2])
    wide = smp.SamplerConfig(gen_length=64, block_length=32, steps=8, kv_cache="dual",
                             parallel_rule="fast_dllm")
    want = [4 * -(-(32 - i) // 4) for i in range(32)]
    assert widths(wide) == (want, want[:1] + want[:-1])


def test_rule_settings():
    with pytest.raises(ValueError, match="parallel_rule='fast-dllm': use 'budget'"):
        smp.SamplerConfig(parallel_rule="fast-dllm")
    fast = smp.SamplerConfig(gen_length=64, block_length=32, steps=8, parallel_rule="fast_dllm")
    assert (fast.loop_steps, fast.step_stride, fast.parallel) == (32, 32, True)
    budget = smp.SamplerConfig(gen_length=64, block_length=32, steps=8)
    assert (budget.loop_steps, budget.step_stride, budget.parallel) == (4, 4, False)
    assert smp.SamplerConfig.fast().parallel_rule == "budget"
