"""LLaDA2's decoding loops on d1jax's LLaDA2 model, token for token against numpy ports of the
authors' loops written here from their source (not from d1jax's):

- dInfer's ``BlockDiffusionLLM`` + ``ThresholdParallelDecoder`` (inclusionAI/dInfer
  ``python/dinfer/decoding/generate_uniform.py``, ``parallel_strategy.py``
  ``get_transfer_index_threshold``, ``utils.py`` ``add_gumbel_noise``/``BlockIterator``)
  against ``d1jax.sampling.threshold``: greedy and at temperature 1 (the same uniforms u),
  with a threshold and without one (1.0: one token a step and its near ties), the block cache
  and a full forward each step, a batch of two rows whose prompt ends inside a block;
- LLaDA2.1's token editing, SGLang's ``JointThreshold`` (sgl-project/sglang
  ``python/sglang/srt/dllm/algorithm/joint_threshold.py``) on dInfer's blocks, against
  ``threshold.decode`` with ``edit_threshold`` set, greedy;
- the Hugging Face file's ``LLaDA2MoeModelLM.generate`` (inclusionAI/LLaDA2.0-mini
  ``modeling_llada2_moe.py``: block_length, steps, threshold; greedy) against the existing
  block-diffusion loop (``loop="sdar"``, ``low_confidence_dynamic``).

The model runs in bfloat16 (params and compute, as runs use); the ports call its plain
block-causal forward on the window ``x[:, :block_end]`` (their ``BlockDiffusionLLMAttnmask`` /
HF path), the samplers the cached entry points. Its output head is scaled up so that
confidences straddle the threshold and the EOS column raised so that rows stop early.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sampling as smp
from d1jax.model.llada2 import LLaDA2, preset
from d1jax.model.predictor import init_params
from d1jax.sampling import block_diffusion, threshold

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

BLOCK, GEN, MASK, EOS = 4, 16, 127, 126
PROMPTS = np.array([[102, 76, 61, 32, 36, 4], [9, 1, 21, 97, 77, 109]])  # 6: a partial block


@pytest.fixture(scope="module")
def llada2():
    """(model, {head: bf16 params}, logits: (params, ids [B, L]) -> float32 [B, L, V]). Two
    output heads: "eos" (EOS where the model says 73: row 1 stops in its first block) and
    "mask" (EOS for 59, the mask id a runner-up to 73: the mask id is predicted and skipped)."""
    cfg = preset("llada2-tiny", block_size=BLOCK)
    model = LLaDA2(cfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    base = init_params(LLaDA2(cfg), jax.random.key(0))
    head = base["lm_head"]["kernel"] * 40.0
    heads = {"eos": head.at[:, EOS].set(1.05 * head[:, 73]).at[:, MASK].set(1.02 * head[:, 59]),
             "mask": head.at[:, EOS].set(1.05 * head[:, 59]).at[:, MASK].set(1.02 * head[:, 73])}
    params = {k: jax.tree.map(lambda a: a.astype(jnp.bfloat16), {**base, "lm_head": {"kernel": h}})
              for k, h in heads.items()}
    fwd = jax.jit(lambda p, x: model.apply({"params": p}, x))
    return model, params, lambda p, x: np.asarray(fwd(p, jnp.asarray(x)), np.float32)


def uniforms(rng, block_id: int, step: int, shape) -> np.ndarray:
    """The shared noise: u of step ``step`` of block ``block_id`` (torch.rand_like's role)."""
    key = jax.random.fold_in(jax.random.fold_in(rng, block_id), step)
    u = jax.random.uniform(key, shape, jnp.float32, minval=np.finfo(np.float32).tiny)
    return np.asarray(u, np.float64)


SEEN = {"mask predicted": False}  # set by the port: a masked position's x0 was the mask id


def dinfer_port(logits_fn, prompt, gen_length, block, temperature, thr, rng=None, cap=64):
    """BlockDiffusionLLM.generate with ThresholdParallelDecoder (use_float64 False, early_stop
    True): the buffer x [B, total] and the steps each block ran."""
    b, p = prompt.shape
    total = (p + gen_length + block - 1) // block * block
    x = np.full((b, total), MASK, np.int64)
    x[:, :p] = prompt
    first = (p // block) * block  # BlockDiffusionIterator._get_first_block_start
    steps = []
    for block_id, s in enumerate(range(first, total, block)):
        e = min(s + block, total)
        k = 0
        while (x[:, s:e] == MASK).sum() > 0:  # BlockDiffusionRunner.decode
            assert k < cap, "their loop would not end"
            logits = logits_fn(x)[:, s:e]
            mask_index = x[:, s:e] == MASK
            if temperature == 0:  # add_gumbel_noise returns the logits
                x0 = logits.argmax(-1)
            else:
                u = uniforms(rng, block_id, k, logits.shape)
                x0 = (np.exp(logits.astype(np.float64)) / (-np.log(u)) ** temperature).argmax(-1)
            z = np.exp(logits - logits.max(-1, keepdims=True))
            prob = z / z.sum(-1, keepdims=True)
            x0_p = np.take_along_axis(prob, x0[..., None], -1)[..., 0]
            mi = mask_index & (x0 != MASK)  # rm_mask
            SEEN["mask predicted"] |= bool((mask_index & (x0 == MASK)).any())
            cur = x[:, s:e]
            x0 = np.where(mi, x0, cur)
            conf = np.where(mi, x0_p, -np.inf)
            bar = np.clip(conf.max(1) - 1e-5, -1000, thr)[:, None]
            put = (conf >= bar) & mask_index
            x[:, s:e] = np.where(put, x0, cur)
            k += 1
        steps.append(k)
        eos = (x[:, s:e] == EOS).any(1)
        x[eos, e:] = EOS
        if eos.all():
            break
    return x, steps


def sampler(**kw) -> smp.SamplerConfig:
    """The tests' SamplerConfig (``threshold.decode`` reads no ``parallel_rule``)."""
    base = dict(gen_length=GEN, block_length=BLOCK, steps=GEN, loop="sdar", mask_id=MASK,
                eos_id=EOS, remasking="low_confidence_dynamic", top_k=0, kv_cache="prefix")
    return smp.SamplerConfig(**{**base, **kw})


_COMPILED: dict = {}


def compiled(model, fn, cfg):
    """One jitted sampler per (function, config), shared by the tests (params are traced)."""
    if (fn, cfg) not in _COMPILED:
        fns = smp.model_fns(model)
        _COMPILED[fn, cfg] = jax.jit(lambda p, x, r: fn(fns, p, x, None, r, cfg))
    return _COMPILED[fn, cfg]


@pytest.mark.parametrize("temperature,thr,cache,head", [
    (0.0, 0.9, "prefix", "eos"), (1.0, 0.9, "prefix", "mask"), (0.0, 1.0, "none", "eos")])
def test_threshold_decoder_matches_dinfer(llada2, temperature, thr, cache, head):
    model, params, logits = llada2
    rng = jax.random.key(7)
    cfg = sampler(temperature=temperature, threshold=thr, kv_cache=cache)
    got = compiled(model, threshold.decode, cfg)(params[head], jnp.asarray(PROMPTS), rng)
    SEEN["mask predicted"] = False
    want, steps = dinfer_port(lambda x: logits(params[head], x), PROMPTS, GEN, BLOCK,
                              temperature, thr, rng)
    p = PROMPTS.shape[1]
    assert np.all(np.asarray(got.completion_start) == p)  # unpadded: their positions
    np.testing.assert_array_equal(np.asarray(got.ids)[:, p:want.shape[1]], want[:, p:])
    assert list(np.asarray(got.block_steps)[:len(steps)]) == steps
    # The cases the comparison rests on: a row stopped by EOS and one not; with a threshold a
    # step that committed several tokens; with the "mask" head, the mask id predicted.
    stopped = (want[:, p:] == EOS).any(1)
    assert stopped.any() and not stopped.all()
    at = np.asarray(got.decoded_at)[:, p:]
    assert any(len(set(r[r >= 0])) < (r >= 0).sum() for r in at) == (thr < 1)
    assert SEEN["mask predicted"] == (head == "mask")


def test_a_block_whose_positions_all_predict_the_mask_stops(llada2):
    """Greedy on the "mask" head: every open position of a block keeps predicting the mask
    id, where their loop would run for ever (the port refuses); here the block stops after
    max_steps (4 x block) with those positions still masked, and the row goes on."""
    model, params, logits = llada2
    cfg = sampler(temperature=0.0, threshold=0.9)
    with pytest.raises(AssertionError, match="would not end"):
        dinfer_port(lambda x: logits(params["mask"], x), PROMPTS, GEN, BLOCK, 0.0, 0.9)
    got = compiled(model, threshold.decode, cfg)(params["mask"], jnp.asarray(PROMPTS),
                                                 jax.random.key(0))
    assert 4 * BLOCK in list(np.asarray(got.block_steps))
    assert (np.asarray(got.ids) == MASK).any()


def hf_port(logits_fn, prompt, gen_length, block, steps, thr):
    """LLaDA2MoeModelLM.generate (temperature 0, no top-k/top-p, eos_early_stop False, batch
    1): the completion up to and including the first EOS."""
    p = prompt.shape[1]
    num_blocks = (p + gen_length + block - 1) // block
    x = np.full((1, num_blocks * block), MASK, np.int64)
    x[:, :p] = prompt
    base, rem = divmod(block, steps)
    schedule = [base + (i < rem) for i in range(steps)]
    for nb in range(p // block, num_blocks):
        end = (nb + 1) * block
        for step in range(steps):
            active = x[:, end - block:end] == MASK
            if active.sum() == 0:
                break
            logits = logits_fn(x)[:, end - block:end]
            x0 = logits.argmax(-1)
            z = np.exp(logits - logits.max(-1, keepdims=True))
            x0_p = np.take_along_axis(z / z.sum(-1, keepdims=True), x0[..., None], -1)[..., 0]
            conf = np.where(active, x0_p, -np.inf)[0]
            high = conf > thr
            if high.sum() >= schedule[step]:
                put = high
            else:
                put = np.zeros(block, bool)
                put[np.argsort(-conf, kind="stable")[:min(schedule[step], active.sum())]] = True
            x[0, end - block:end][put] = x0[0][put]
        if (x[0, p:end] == EOS).any():
            break
    comp = x[0, p:p + gen_length]
    stop = np.flatnonzero(comp == EOS)
    return comp[:stop[0] + 1] if len(stop) else comp


@pytest.mark.parametrize("steps,thr,cache", [(BLOCK, 0.9, "prefix"), (BLOCK // 2, 1.0, "none")])
def test_sdar_loop_matches_the_hf_generate(llada2, steps, thr, cache):
    model, params, logits = llada2
    cfg = sampler(threshold=thr, steps=steps * GEN // BLOCK, kv_cache=cache)
    ids = compiled(model, block_diffusion.generate, cfg)(
        params["eos"], jnp.asarray(PROMPTS), jax.random.key(0))[0]
    p = PROMPTS.shape[1]
    for row in range(len(PROMPTS)):
        want = hf_port(lambda x: logits(params["eos"], x), PROMPTS[row:row + 1], GEN, BLOCK,
                       steps, thr)
        np.testing.assert_array_equal(np.asarray(ids)[row, p:p + len(want)], want)


def joint_port(logits_fn, prompt, gen_length, block, thr, edit_thr, max_post):
    """SGLang's JointThreshold (LLaDA2.1: M2T above ``thr``, else the top one; T2T above
    ``edit_thr`` on the block's own decoded tokens; ``max_post`` steps after the block fills)
    run on dInfer's blocks with its EOS stop: the buffer and the steps each block ran."""
    b, p = prompt.shape
    total = (p + gen_length + block - 1) // block * block
    x = np.full((b, total), MASK, np.int64)
    x[:, :p] = prompt
    done, steps = np.zeros(b, bool), []
    for s in range(p // block * block, total, block):
        e = s + block
        states = [{"post": 0, "fin": bool(done[r]) or not (x[r, s:e] == MASK).any(),
                   "prompt": x[r, s:e] != MASK} for r in range(b)]
        k = 0
        while not all(st["fin"] for st in states) and k < block + max_post + 1:
            logits = logits_fn(x)[:, s:e]
            for r, st in enumerate(states):
                if st["fin"]:
                    continue
                cur, lg = x[r, s:e], logits[r]
                xr = lg.argmax(-1)
                z = np.exp(lg - lg.max(-1, keepdims=True))
                pr = np.take_along_axis(z / z.sum(-1, keepdims=True), xr[:, None], -1)[:, 0]
                mi = cur == MASK
                m2t = np.zeros(block, bool)
                if mi.any():
                    conf = np.where(mi, pr, -np.inf)
                    m2t = conf > thr
                    if not m2t.any():
                        m2t[conf.argmax()] = True
                else:
                    st["post"] += 1
                    if st["post"] > max_post:
                        st["fin"] = True
                        continue
                t2t = (pr > edit_thr) & (cur != xr) & ~mi & ~st["prompt"]
                SEEN["edited"] |= bool(t2t.any())
                put = m2t | t2t
                if not put.any():
                    st["fin"] = True
                    continue
                cur[put] = xr[put]
            k += 1
        steps.append(k)
        eos = (x[:, s:e] == EOS).any(1) & ~done
        x[eos, e:] = EOS
        done |= eos | (e - p >= gen_length)
        if done.all():
            break
    return x, steps


def test_token_editing_matches_sglangs_joint_threshold(llada2):
    model, params, logits = llada2
    cfg = sampler(threshold=0.9, parallel_rule="dinfer", edit_threshold=0.5,
                  max_post_edit_steps=2)
    got = compiled(model, threshold.decode, cfg)(params["eos"], jnp.asarray(PROMPTS),
                                                 jax.random.key(0))
    SEEN["edited"] = False
    want, steps = joint_port(lambda x: logits(params["eos"], x), PROMPTS, GEN, BLOCK, 0.9, 0.5,
                             2)
    p = PROMPTS.shape[1]
    np.testing.assert_array_equal(np.asarray(got.ids)[:, p:want.shape[1]], want[:, p:])
    assert list(np.asarray(got.block_steps)[:len(steps)]) == steps
    assert SEEN["edited"]  # a decoded token was rewritten (T2T)
