"""dInfer's decoder and LLaDA2.1's token editing as config choices: ``configs/llada2/eval.py``
with ``--config.sampler.parallel_rule=dinfer`` (and ``edit_threshold``) builds, through the run
spec's ``sampler_config`` (the one builder eval and rollouts share), a SamplerConfig whose
``sampling.make_generate_fn`` (what eval and rollouts call) equals the direct
``threshold.generate`` call with those knobs set by hand, and differs from the
block-diffusion loop and from the decoder without editing; combinations that do not apply are
refused in one line naming the knobs. The decoders themselves are checked against numpy ports
of dInfer's and SGLang's loops in tests/test_llada2_sampler.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sampling as smp
from d1jax.config import ConfigError
from d1jax.run import spec
from d1jax.sampling import threshold
from tests.config_files import load_config
from tests.test_llada2_sampler import EOS, MASK, PROMPTS, llada2  # noqa: F401 (fixture)

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

CONFIG = "configs/llada2/eval.py:letters,tiny"


def eval_sampler(**sampler_fields) -> smp.SamplerConfig:
    """The eval config's sampler (its first gen length) under ``--config.sampler.*`` values,
    with the tiny model's token ids (``spec.with_tokens``, as a run binds them)."""
    c = load_config(CONFIG)
    for k, v in sampler_fields.items():
        setattr(c.sampler, k, v)
    return spec.with_tokens(spec._eval(c).samplers[0], {"mask": MASK, "eos": EOS})


def run(model, params, cfg, fn=None):
    """(ids, decoded_at, block_steps) as numpy: ``fn`` jitted, or the config path."""
    fns = smp.model_fns(model)
    if fn is None:
        out = smp.make_generate_fn(fns, cfg)(params, jnp.asarray(PROMPTS), None,
                                             jax.random.key(3))
    else:
        out = jax.jit(lambda p, x, r: fn(fns, p, x, None, r, cfg))(
            params, jnp.asarray(PROMPTS), jax.random.key(3))
    return [np.asarray(a) for a in out]


def by_hand(**kw) -> smp.SamplerConfig:
    """The same decoder's SamplerConfig written out (the eval config's tiny values)."""
    return smp.SamplerConfig(**{**dict(
        gen_length=32, steps=32, block_length=4, loop="sdar", kv_cache="prefix",
        remasking="low_confidence_dynamic", threshold=0.95, temperature=0.0, top_k=0,
        top_p=1.0, mask_id=MASK, eos_id=EOS, eot_id=EOS, parallel_rule="dinfer"), **kw})


@pytest.mark.parametrize("edit", [{}, dict(edit_threshold=0.5, max_post_edit_steps=2)])
def test_the_eval_config_selects_dinfers_decoder(llada2, edit):
    """The "mask" head (the mask id a runner-up: dInfer's decoder skips it, where block
    diffusion's loop commits it) tells the decoders apart; kv_cache "none" keeps the compile
    short (the cache is checked against it in tests/test_llada2_sampler.py)."""
    model, params, _ = llada2
    cfg = eval_sampler(parallel_rule="dinfer", kv_cache="none", **edit)
    assert (cfg.edit_threshold, cfg.max_post_edit_steps) == (
        edit.get("edit_threshold", -1.0), edit.get("max_post_edit_steps", 16))
    got = run(model, params["mask"], cfg)
    want = run(model, params["mask"], by_hand(kv_cache="none", **edit), threshold.generate)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # dInfer's blocks run past the config's 4 steps a block: not block diffusion's loop.
    assert got[2].max() > cfg.steps_per_block


@pytest.mark.parametrize("fields,named", [
    (dict(parallel_rule="dinfer", loop="llada", remasking="low_confidence", kv_cache="none",
          block_length=32), ("parallel_rule='dinfer'", "loop='llada'")),
    (dict(parallel_rule="dinfer", top_k=50), ("parallel_rule='dinfer'", "top_k=50")),
    (dict(edit_threshold=0.0), ("edit_threshold=0.0", "parallel_rule='budget'")),
    (dict(parallel_rule="dinfer", max_post_edit_steps=4),
     ("max_post_edit_steps=4", "edit_threshold=-1.0")),
])
def test_combinations_that_do_not_apply_are_refused_in_one_line(fields, named):
    with pytest.raises(ConfigError) as e:
        eval_sampler(**fields)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("sampler.") and all(n in msg for n in named), msg
