"""``SamplerConfig(loop="dream")``: the rollout sampler runs Dream's ``diffusion_generate``
(DiffuCoder's coupled-GRPO rollouts, apple/ml-diffucoder src/open_r1/coupled_grpo.py:419-429)
through ``sampling.generate``, checked token for token against the numpy port of Dream's
``generation_utils._sample`` in tests/test_dream.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sampling as smp
from d1jax.model.dream import Dream
from tests.test_dream import (denoise_step_map, generate_case, loaded, hf_dir,  # noqa: F401
                              no_mask_hook, np_sample, sd)

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def test_dream_loop_is_diffusion_generate_token_for_token(generate_case):  # noqa: F811
    """top_p 0.3, top_k 5 and alg "entropy" each change these tokens (top_p 1, top_k None or
    "maskgit_plus" alone gives 8, 1 and 8 other tokens), so each field must arrive."""
    cfg, params, prompt, mask, predict = generate_case
    apply = smp.model_apply_fn(Dream(cfg))

    def hooked(p, ids, m, start, length):  # as the numpy port's test keeps <|mask|> out
        return no_mask_hook(apply(p, ids, m, start, length), cfg.mask_token_id)
    sampler = smp.SamplerConfig(loop="dream", gen_length=10, block_length=10, steps=10,
                                temperature=0.0, alg="entropy", top_p=0.3, top_k=5,
                                mask_id=cfg.mask_token_id)
    out = jax.jit(lambda p, x, m, r: smp.generate(hooked, p, x, m, r, sampler))(
        params, jnp.asarray(prompt), jnp.asarray(mask), jax.random.key(3))
    from d1jax.sampling.dream import DreamGenerationConfig
    gen = DreamGenerationConfig(max_new_tokens=10, steps=10, alg="entropy", temperature=0.0,
                                top_p=0.3, top_k=5, mask_token_id=cfg.mask_token_id)
    history = []
    want = np_sample(lambda *a: no_mask_hook(predict(*a), cfg.mask_token_id), prompt, mask,
                     gen, uniforms=None, history=history)
    np.testing.assert_array_equal(np.asarray(out.ids), want)
    assert out.ids.shape == (2, 16)
    # the trace TraceRL reads: their denoise_step_map of the history
    np.testing.assert_array_equal(np.asarray(out.decoded_at),
                                  denoise_step_map(history, cfg.mask_token_id)[:, 6:])


@pytest.mark.parametrize("bad, match", [
    (dict(block_length=4), "runs no blocks"),
    (dict(kv_cache="dual"), "exact diffusion_generate"),
    (dict(alg="confidence"), "alg="),
    (dict(loop="vllm"), "loop="),
])
def test_dream_loop_refuses_what_it_does_not_run(bad, match):
    kw = {**dict(loop="dream", gen_length=8, block_length=8, steps=8), **bad}
    with pytest.raises(ValueError, match=match):
        smp.SamplerConfig(**kw)
