"""Dream through d1's sampler, estimator, SFT loss and objectives, and the family's configs
run stopped, resumed and exported.

References are independent of the model code under test: ``np_predict`` (tests/test_dream.py)
is Dream's forward in float64 numpy with ``_sample``'s shift and ``tok_idx`` positions, and the
sampler reference is the LLaDA ``generate.py`` loop of tests/test_sampler.py fed those logits.
The GRPO loop that learns (a trained tiny Dream, its resume and export) is
tests/test_dream_train.py.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import config as config_lib
from d1jax import sampling as smp
from d1jax.config import ConfigError
from d1jax.metrics import read_jsonl
from d1jax.model import family as family_lib
from d1jax.model import dream
from d1jax.model.dream import Dream
from d1jax.model.dream import load_hf_checkpoint as load_dream_checkpoint
from d1jax.objectives import advantages, logprob, losses
from d1jax.run import spec as spec_lib
from d1jax.run.context import RunStopped
from d1jax.train import grpo, sft
from tests.objective_checks import grpo_batch, training_loss
from tests.test_dream import CFG, hf_state, np_predict, write_hf_dir
from tests.test_sampler import cfg_for, make_prompts, reference_generate

from d1jax.objectives.table import GRPOConfig

# Compile-bound (tiny programs, a few steps, no trained numbers): compiled unoptimized
# (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """A tiny Dream whose head is sharpened (logits far apart: float32 against float64 flips
    no argmax), its float64 state dict and its d1jax params."""
    sd = hf_state(CFG, seed=3)
    sd["lm_head.weight"] = sd["lm_head.weight"] * 8.0
    _, params = load_dream_checkpoint(write_hf_dir(tmp_path_factory.mktemp("dream") / "c", CFG, sd))
    return sd, params


class NumpyDream:
    """``model.apply`` of the float64 numpy Dream (row i predicts token i), for the reference
    loop (which jits it: the numpy forward runs as a host callback, its result rounded to
    float32 once)."""

    def __init__(self, sd):
        self.sd = sd

    def apply(self, variables, ids, mask):
        def host(ids, mask):
            return np_predict(self.sd, CFG, np.asarray(ids), np.asarray(mask)).astype(np.float32)
        mask = jnp.ones_like(ids) if mask is None else mask
        out = jax.ShapeDtypeStruct((*ids.shape, CFG.vocab_size), jnp.float32)
        return jax.pure_callback(host, out, ids, mask)


def _dream_cfg(**kw):
    return cfg_for(CFG, **kw)


@pytest.mark.parametrize("kw", [
    dict(block_length=8, steps=8),
    dict(block_length=4, steps=8, temperature=0.8),
], ids=["greedy_2blocks", "T0.8_4blocks"])
def test_d1_sampler_on_dream_matches_the_numpy_loop_token_by_token(peaked, kw):
    """d1's semi-autoregressive sampler on Dream reads row i-1 for token i (the shift) with
    left-padded prompts (``tok_idx`` positions), at T = 0 and on the same noise at T > 0."""
    sd, params = peaked
    cfg = _dream_cfg(**kw)
    ids, mask = make_prompts(CFG.vocab_size, CFG.pad_token_id, lp=8)
    rng = jax.random.key(5)
    out = smp.generate(smp.model_fns(Dream(CFG)), params, ids, mask, rng, cfg)
    ref = reference_generate(NumpyDream(sd), None, ids, mask, cfg, rng)
    np.testing.assert_array_equal(np.asarray(out.ids), ref)


def test_dream_samples_with_the_fast_settings(peaked):
    """Fast-dLLM's dual cache, refreshed every 8 tokens, tau 0.99 (SamplerConfig.fast): every
    position decoded (tests/test_dream_cache.py checks the tokens)."""
    _, params = peaked
    ids, mask = make_prompts(CFG.vocab_size, CFG.pad_token_id, lp=8)
    cfg = dataclasses.replace(_dream_cfg(block_length=8, steps=8), **smp.FAST_DEFAULTS)
    out = smp.generate(smp.model_fns(Dream(CFG)), params, ids, mask, jax.random.key(0), cfg)
    assert cfg.kv_cache == "dual" and not (np.asarray(out.ids) == CFG.mask_token_id).any()


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_estimator_on_dream_reads_the_row_before_each_completion_token(peaked):
    """d1's one-step estimator (completion fully masked, prompt unmasked here) on Dream: the
    log-prob of completion token j comes from raw row P+j-1, the first from the last prompt
    row; left padding counts positions from the first real token."""
    sd, params = peaked
    prompt, pmask = make_prompts(CFG.vocab_size, CFG.pad_token_id, lp=8)
    comp = np.random.RandomState(1).randint(0, 100, (3, 6)).astype(np.int32)
    attn = np.concatenate([pmask, np.ones_like(comp)], 1)
    got = logprob.per_token_logps(Dream(CFG), params, jnp.asarray(prompt), jnp.asarray(comp),
                                  jnp.array([0]), p_mask_prompt=0.0,
                                  attention_mask_bl=jnp.asarray(attn), seq_chunk=0)[0]
    ids = np.concatenate([prompt, np.full_like(comp, CFG.mask_token_id)], 1)
    lp = _log_softmax(np_predict(sd, CFG, ids, attn))[:, 8:]
    want = np.take_along_axis(lp, comp[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_sft_loss_on_dream_is_d1s_formula_on_the_shifted_predictions(peaked):
    """sum over masked completion tokens of CE / t, over the completion positions; the CE of
    token i read from raw row i-1."""
    sd, params = peaked
    rs = np.random.RandomState(2)
    ids = rs.randint(0, 100, (2, 12)).astype(np.int32)
    plen = np.array([4, 6], np.int32)
    key = jax.random.key(9)
    loss, _ = losses.sft_loss(Dream(CFG), params, jnp.asarray(ids), jnp.asarray(plen), key,
                              seq_chunk=0)
    noisy, is_mask, t = (np.asarray(a) for a in losses.sft_noise(
        key, jnp.asarray(ids), jnp.asarray(plen), CFG.mask_token_id))
    assert is_mask.any()
    ce = -np.take_along_axis(_log_softmax(np_predict(sd, CFG, noisy, np.ones_like(noisy))),
                             ids[..., None], -1)[..., 0]
    want = (ce * is_mask / t[:, None]).sum() / (ids.size - plen.sum())
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)


@pytest.mark.parametrize("objective", ["diffu_grpo", "wd1", "spg", "coupled_grpo"])
def test_each_objective_on_dream_has_a_finite_loss_and_a_gradient_on_the_adapters(
        peaked, objective):
    """The table's prepare + loss (what the GRPO update differentiates) on a Dream with LoRA
    on Dream's projection names: finite, and a nonzero gradient reaches the adapters."""
    from d1jax.model import init_params, lora as lora_lib
    from d1jax.model.lora import LoraConfig
    _, params = peaked
    c = config_lib.grpo("sudoku", "tiny", objective=objective, checkpoint="dream")
    c.sampler.gen_length, c.sampler.block_length = 8, 4
    cfg = GRPOConfig(num_iterations=2, beta=c.grpo.beta, epsilon=0.5, p_mask_prompt=0.0,
                     objective=objective,
                     hparams=spec_lib.from_config(c, weights=False).grpo.hparams)
    model = Dream(CFG, lora=LoraConfig(rank=4, alpha=8.0, dropout=0.0,
                                       targets=dream.LORA_TARGETS))
    full = lora_lib.join(params, init_params(model, jax.random.key(1), adapters_only=True))
    prompt, pmask = make_prompts(CFG.vocab_size, CFG.pad_token_id, b=4, lp=6, pad=(0, 2, 0, 1))
    comp = np.random.RandomState(4).randint(0, 100, (4, 8)).astype(np.int32)
    batch = grpo_batch(prompt, pmask, comp, np.ones_like(comp), [1.0, -1.0, 0.5, -0.5])
    seeds = jnp.array([0, 1])
    old = logprob.per_token_logps(model, full, batch.prompt_ids, batch.completion_ids, seeds,
                                  p_mask_prompt=0.0, attention_mask_bl=jnp.concatenate(
                                      [batch.prompt_mask, batch.completion_mask], 1))
    batch = batch.replace(mask_seeds=seeds, old_logps=old,
                          ref_logps=old + 0.1 if cfg.beta else None)
    loss, grads = jax.value_and_grad(lambda p: training_loss(model, cfg, p, batch, 0)[0])(full)
    assert np.isfinite(float(loss))
    norms = [float(jnp.abs(g).sum()) for g in jax.tree.leaves(lora_lib.split(grads)[1])]
    assert norms and max(norms) > 0 and all(np.isfinite(norms))


# --------------------------------------------------------------------------- configs

def test_family_is_checked_against_the_checkpoint_and_lora_names(tmp_path):
    d = tmp_path / "dream"
    write_hf_dir(d, CFG, hf_state(CFG))
    assert family_lib.detect(d) == "dream"
    c = config_lib.grpo("sudoku", "tiny")  # family llada
    c.model.path = str(d)
    with pytest.raises(ConfigError, match="holds a Dream checkpoint but config.model.family='llada'"):
        spec_lib.from_config(c)
    c = config_lib.grpo("sudoku", "tiny", checkpoint="dream")
    assert set(spec_lib.from_config(c).model.lora.targets) == set(
        ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"))
    c.lora.targets = ("q_proj", "attn_out")  # a LLaDA name
    with pytest.raises(ConfigError, match="unknown 'attn_out'; choose among Dream's"):
        spec_lib.from_config(c)
    c = config_lib.grpo("sudoku", "tiny", checkpoint="dream")
    c.model.random_init = "test-tiny"
    with pytest.raises(ConfigError, match="not a Dream preset"):
        spec_lib.from_config(c)
    c = config_lib.grpo("sudoku", "tiny", checkpoint="dream")
    c.sampler.kv_cache = "prefix"  # Dream's rollouts take the Fast-dLLM cache too
    assert spec_lib.from_config(c).sampler.kv_cache == "prefix"


def test_diffucoder_authors_variant_is_its_recipe():
    """recipes/config_coupled_code.yaml (apple/ml-diffucoder): beta 0.01, mu 2, epsilon 0.5,
    G 10, lr 1e-6, cosine to 0.1 x lr, temperature 1.0, 256 tokens in 256 steps, p_mask 0,
    full fine-tuning with a reference synced every 64 steps, unscaled RLOO advantages."""
    c = config_lib.grpo("sudoku", "authors", objective="coupled_grpo", checkpoint="diffucoder")
    g = c.grpo
    assert (g.beta, g.num_iterations, g.epsilon, g.num_generations) == (0.01, 2, 0.5, 10)
    assert (g.advantage, g.sync_ref_model, g.ref_model_sync_steps) == ("leave_one_out", True, 64)
    assert (c.optim.learning_rate, c.optim.lr_schedule, c.optim.min_lr_rate) == (
        1e-6, "cosine_with_min_lr", 0.1)
    assert (c.sampler.temperature, c.sampler.gen_length, c.sampler.steps) == (1.0, 256, 256)
    assert not c.lora.enabled and c.model.family == "dream"
    assert c.model.remat and not c.model.unroll_layers  # the layout the planner fits at 7B
    assert config_lib.grpo("sudoku", "authors", objective="spg").grpo.num_iterations == 4
    with pytest.raises(ConfigError, match="no ':authors' variant"):
        config_lib.grpo("sudoku", "authors", objective="diffu_grpo")


def test_leave_one_out_advantage_against_its_definition():
    r = np.array([1.0, 0.0, 0.5, 0.25, 3.0, 3.0, 1.0, 0.0], np.float32)
    got = advantages.compute("leave_one_out", r, 4)
    want = [r[i] - np.mean([r[j] for j in range(4 * (i // 4), 4 * (i // 4) + 4) if j != i])
            for i in range(8)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, advantages.compute("group_mean", r, 4) * 4 / 3, rtol=1e-6)
    np.testing.assert_array_equal(advantages.compute("leave_one_out", r, 1), np.zeros(8))


def test_cosine_with_min_lr_is_hfs_schedule():
    from d1jax.run import optim
    cfg = optim.OptimConfig(learning_rate=1.0, warmup_steps=2, total_steps=12,
                            schedule="cosine_with_min_lr", min_lr_rate=0.1)
    sched = optim.lr_schedule(cfg)
    for s in range(13):  # transformers' _get_cosine_schedule_with_warmup_lr_lambda, min_lr_rate
        if s < 2:
            want = s / 2
        else:
            p = (s - 2) / 10
            want = 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * p))
        np.testing.assert_allclose(float(sched(s)), want, rtol=1e-6, atol=1e-7)



# --------------------------------------------------------------------------- the configs run

@pytest.mark.parametrize("config_file,arg,changes", [
    ("configs/dream/sft_s1k.py", "tiny", {}),
    ("configs/dream/grpo_sudoku.py", "tiny", {"objective": "wd1", "beta": 0.0}),
    ("configs/dream/grpo_sudoku.py", "tiny", {"objective": "spg", "beta": 0.0}),
    ("configs/diffucoder/coupled_grpo_sudoku.py", "authors,tiny", {}),
], ids=["sft", "wd1", "spg", "coupled_grpo_authors"])
def test_dream_configs_save_resume_and_export(config_file, arg, changes, tmp_path):
    """The family's configs as d1jax.main runs them: stopped (with a save) after the first
    rollout's mu = 2 steps (SFT: after step 1), resumed from the workdir to the end, then
    exported as a Dream checkpoint."""
    from tests.config_files import load_module
    mod = load_module(config_file)

    first = 1 if mod.get_config(arg).stage == "sft" else 2
    steps = 2 * first

    def config(**train):
        c = mod.get_config(arg)
        for k, v in {"num_steps": steps, **train}.items():
            setattr(c.train, k, v)
        for k, v in changes.items():
            setattr(c.grpo, k, v)
        return c
    stage = sft if mod.get_config(arg).stage == "sft" else grpo
    with pytest.raises(RunStopped, match=f"stopped at step {first} of {steps}"):
        stage.run(config(stop_after=first), str(tmp_path))
    assert (tmp_path / "checkpoints" / str(first)).is_dir() and not (tmp_path / "hf").exists()
    stage.run(config(), str(tmp_path))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, steps + 1))
    assert (tmp_path / "checkpoints" / str(steps)).is_dir()
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "Dream"
