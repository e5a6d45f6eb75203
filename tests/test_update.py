"""Update steps: sharded equals single-device, skipped non-finite updates, the reference pass
only when beta != 0 and equal by value to the base model's, mask seeds per inner iteration
(drawn per iteration, used by value), AdamW against numpy, accumulation."""

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from d1jax import sharding as shd
import d1jax
from d1jax.model import LoraConfig
from d1jax.model import lora as lora_lib
from d1jax.objectives import coupled_grpo, logprob, masking, wd1
from d1jax.objectives import table
from d1jax.objectives.batch import GRPOBatch
from d1jax.run import optim
from d1jax.sampling import SamplerConfig
from d1jax.train import engine, pure_steps
from d1jax.train import jit_steps as steps_lib
from d1jax.train import state as state_lib

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def rollout_batch(b=8, p=6, c=5, mu=2, seed=0):
    rs = np.random.RandomState(seed)
    prompt_mask = np.ones((b, p), np.int32)
    prompt_mask[0, :2] = 0  # left padding
    return GRPOBatch(
        prompt_ids=rs.randint(0, 120, (b, p)).astype(np.int32), prompt_mask=prompt_mask,
        completion_ids=rs.randint(0, 120, (b, c)).astype(np.int32),
        completion_mask=(np.arange(c)[None] <= rs.randint(1, c, (b, 1))).astype(np.int32),
        advantages=rs.normal(size=b).astype(np.float32),
        mask_seeds=rs.randint(0, 4096, mu).astype(np.int32))


def test_sharded_update_equals_single_device(tiny_config):
    """Mesh (2, 2, 2) vs one device: rollout log-probs, two GRPO steps (grad accumulation 2,
    LoRA, a synced reference copy) agree within 1e-5."""
    model = d1jax.LLaDA(tiny_config, lora=LoraConfig(rank=4, alpha=8.0, dropout=0.0))
    params = jax.tree.map(np.asarray, d1jax.init_params(model, jax.random.key(0)))
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2))
    cfg = table.GRPOConfig(num_iterations=2, beta=0.04, grad_accum=2)
    results = []
    for mesh in (None, shd.make_mesh((2, 2, 2))):
        steps = steps_lib.make_jitted_steps(model, mesh, opt, lora=True, keep_reference=True,
                                            grpo=cfg)
        state = steps.init(jax.tree.map(jnp.asarray, params))
        batch = rollout_batch()
        batch = batch.replace(**steps.rollout_logps(state, batch))
        logps = np.asarray(batch.old_logps)
        metrics = []
        for i in range(2):
            state, m = steps.grpo_update(state, batch, jax.random.key(i))
            metrics.append(m)
        state = steps.sync_reference(state, 0.6)
        if mesh is not None:
            leaf = state.params["blocks"]["q_proj"]["lora_a"]
            assert leaf.sharding.spec == shd.param_shardings(model, mesh)["blocks"]["q_proj"][
                "lora_a"].spec
        results.append((logps, jax.device_get(metrics), jax.device_get(state.params),
                        jax.device_get(state.ref)))
    (l0, m0, p0, r0), (l1, m1, p1, r1) = results
    np.testing.assert_allclose(l0, l1, atol=1e-5)
    for a, b in zip(m0, m1):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], atol=1e-5, rtol=1e-5, err_msg=k)
    for t0, t1 in ((p0, p1), (r0, r1)):
        for a, b in zip(jax.tree.leaves(t0), jax.tree.leaves(t1)):
            np.testing.assert_allclose(a, b, atol=1e-5)
    start = lora_lib.split(params)[1]
    assert not np.allclose(p0["blocks"]["q_proj"]["lora_b"], start["blocks"]["q_proj"]["lora_b"])


@pytest.fixture(scope="module")
def full_ft(tiny_model, tiny_params):
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2))
    return tiny_model, tiny_params, opt


@pytest.fixture(scope="module")
def ft_steps(full_ft):
    """Full fine-tuning, mu = 3, beta = 0, p_mask = 0.5: compiled once for two tests."""
    model, params, opt = full_ft
    cfg = table.GRPOConfig(num_iterations=3, beta=0.0, p_mask_prompt=0.5)
    steps = steps_lib.make_jitted_steps(model, None, opt, lora=False, grpo=cfg)
    batch = rollout_batch(mu=3, p=12).replace(mask_seeds=np.array([1, 2, 3], np.int32))
    batch = batch.replace(**jax.device_get(steps.rollout_logps(steps.init(params), batch)))
    return steps, params, batch


def test_non_finite_gradient_skips_the_update_and_is_counted(ft_steps):
    steps, params, batch = ft_steps
    state = steps.init(params)
    before = jax.device_get((state.params, state.opt_state))
    bad = batch.replace(advantages=batch.advantages.copy(), iteration=np.int32(0))
    bad.advantages[3] = np.nan
    state, m = steps.grpo_update(state, bad, jax.random.key(0))
    assert float(m["update_skipped"]) == 1 and int(state.skipped) == 1 and int(state.step) == 1
    after = jax.device_get((state.params, state.opt_state))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)
    state, m = steps.grpo_update(state, batch.replace(iteration=np.int32(1)), jax.random.key(1))
    assert float(m["update_skipped"]) == 0 and int(m["skipped_updates"]) == 1
    assert np.isfinite(float(m["grad_norm"])) and int(state.step) == 2


def test_each_inner_iteration_uses_its_own_mask_seed(ft_steps):
    """At the first update the policy is the old policy: the ratio is exactly 1 iff the step
    pairs iteration i's old log-probs with iteration i's mask seed."""
    steps, params, batch = ft_steps
    for it in range(3):
        _, m = steps.grpo_update(steps.init(params), batch.replace(iteration=np.int32(it)),
                                 jax.random.key(0))
        assert abs(float(m["ratio_min"]) - 1) < 1e-6 and abs(float(m["ratio_max"]) - 1) < 1e-6
    rolled = batch.replace(old_logps=np.roll(batch.old_logps, 1, axis=0),
                           iteration=np.int32(1))
    _, m = steps.grpo_update(steps.init(params), rolled, jax.random.key(0))
    assert float(m["ratio_max"]) - float(m["ratio_min"]) > 1e-3


def test_default_iteration_is_step_mod_mu(full_ft):
    model, params, opt = full_ft
    cfg = table.GRPOConfig(num_iterations=3, beta=0.0)
    state = state_lib.init_train_state(params, opt, lora=False).replace(step=jnp.int32(4))
    batch = rollout_batch(mu=3).replace(old_logps=jnp.zeros((3, 8, 5)).at[1].set(1.0))
    seed, rows, current = pure_steps.iteration_rows(cfg, state, batch)  # 4 % 3 = 1
    assert int(seed[0]) == int(batch.mask_seeds[1]) and float(rows.old_logps.min()) == 1.0
    assert not bool(current)  # iteration 1: the rollout's old row, not the update's own


def test_reference_pass_only_when_beta_is_nonzero(full_ft, monkeypatch):
    model, params, opt = full_ft
    calls = []
    real = logprob.per_token_logps

    def counting(*args, **kwargs):
        calls.append(kwargs.get("use_lora", True))
        return real(*args, **kwargs)
    monkeypatch.setattr(logprob, "per_token_logps", counting)
    state = state_lib.init_train_state(params, opt, lora=False, keep_reference=True)
    for mu, beta, want_keys in ((2, 0.0, {"old_logps"}), (2, 0.04, {"old_logps", "ref_logps"}),
                                (1, 0.0, set()), (1, 0.04, {"ref_logps"})):
        cfg = table.GRPOConfig(num_iterations=mu, beta=beta)
        calls.clear()
        out = jax.eval_shape(lambda s, b: pure_steps.rollout_logps(model, cfg, s, b), state,
                             rollout_batch(mu=mu))
        assert set(out) == want_keys and len(calls) == len(want_keys), (mu, beta)
    # The update with beta = 0 needs no ref_logps and runs one estimator pass.
    cfg = table.GRPOConfig(num_iterations=1, beta=0.0)
    calls.clear()
    jax.eval_shape(lambda s, b: pure_steps.grpo_update_step(model, opt, cfg, s, b, jax.random.key(0)),
                   state, rollout_batch(mu=1))
    assert len(calls) == 1
    with pytest.raises(ValueError, match="keep_reference=True"):
        no_ref = state_lib.init_train_state(params, opt, lora=False)
        pure_steps.rollout_logps(model, table.GRPOConfig(num_iterations=2), no_ref,
                             rollout_batch(mu=2))


def test_adamw_with_clipping_and_warmup_matches_numpy():
    """HF Trainer order: clip the global norm, then torch AdamW (decoupled decay, no decay on
    norms), lr linear warmup from 0 then constant."""
    cfg = optim.OptimConfig(learning_rate=0.1, b1=0.9, b2=0.99, weight_decay=0.1,
                            max_grad_norm=0.2, warmup_steps=2)
    rs = np.random.RandomState(0)
    params = {"w": rs.normal(size=(3, 2)), "ln_f": {"weight": rs.normal(size=(2,))}}
    opt = optim.make_optimizer(cfg)
    p = jax.tree.map(jnp.asarray, params)
    state = opt.init(p)
    want = {k: np.array(v, np.float64) if k == "w" else np.array(v["weight"], np.float64)
            for k, v in params.items()}
    m = {k: 0.0 for k in want}
    v = {k: 0.0 for k in want}
    for t in range(1, 5):
        g = {"w": rs.normal(size=(3, 2)), "ln_f": {"weight": rs.normal(size=(2,))}}
        gn = {"w": g["w"], "ln_f": g["ln_f"]["weight"]}
        norm = np.sqrt(sum((x ** 2).sum() for x in gn.values()))
        lr = 0.1 * min(1.0, (t - 1) / 2)
        for k, x in gn.items():
            x = x * min(1.0, 0.2 / norm)
            m[k] = 0.9 * m[k] + 0.1 * x
            v[k] = 0.99 * v[k] + 0.01 * x * x
            step = (m[k] / (1 - 0.9 ** t)) / (np.sqrt(v[k] / (1 - 0.99 ** t)) + 1e-8)
            want[k] = want[k] - lr * step - (lr * 0.1 * want[k] if k == "w" else 0.0)
        updates, state = opt.update(jax.tree.map(jnp.asarray, g), state, p)
        assert abs(float(optim.current_learning_rate(state)) - lr) < 1e-7
        p = jax.tree.map(lambda a, b: a + b, p, updates)
    np.testing.assert_allclose(np.asarray(p["w"]), want["w"], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p["ln_f"]["weight"]), want["ln_f"], rtol=1e-5)


@pytest.mark.parametrize("warmup", [0, 3])
def test_linear_schedule_is_hf_get_linear_schedule_with_warmup(warmup):
    """d1's SFT (HF Trainer default): warmup, then linear decay to 0 at the last step; the
    rate each optimizer step uses, against HF's lambda written here."""
    total = 10
    cfg = optim.OptimConfig(learning_rate=0.1, warmup_steps=warmup, schedule="linear",
                            total_steps=total)
    opt = optim.make_optimizer(cfg)
    p = {"w": jnp.ones((2,))}
    state = opt.init(p)
    for s in range(12):
        hf = s / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
        _, state = opt.update({"w": jnp.ones((2,))}, state, p)
        assert abs(float(optim.current_learning_rate(state)) - 0.1 * hf) < 1e-7, s
    with pytest.raises(ValueError, match="total_steps"):
        optim.make_optimizer(optim.OptimConfig(schedule="linear", total_steps=0))
    with pytest.raises(ValueError, match="schedule"):
        optim.OptimConfig(schedule="cosine")


def test_gradient_accumulation_is_the_mean_over_strided_micro_batches():
    rs = np.random.RandomState(0)
    w = jnp.array(rs.normal(size=(3,)), jnp.float32)
    batch = {"x": jnp.array(rs.normal(size=(8, 3)), jnp.float32),
             "y": jnp.array(rs.normal(size=(8,)), jnp.float32)}

    def loss_fn(w, mb, i):
        loss = jnp.mean((mb["x"] @ w - mb["y"]) ** 2)
        return loss, {"first_y": mb["y"][0]}
    loss, g, m = optim.accumulate_gradients(loss_fn, w, batch, 4)
    micro = [{k: v[i::4] for k, v in batch.items()} for i in range(4)]  # rows i, i + 4
    want = [jax.value_and_grad(lambda w: loss_fn(w, mb, 0)[0])(w) for mb in micro]
    np.testing.assert_allclose(float(loss), np.mean([float(l) for l, _ in want]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g), np.mean([np.asarray(d) for _, d in want], 0),
                               rtol=1e-5)
    np.testing.assert_allclose(float(m["first_y"]), float(batch["y"][:4].mean()), rtol=1e-6)
    with pytest.raises(ValueError, match="micro-batches"):
        optim.accumulate_gradients(loss_fn, w, batch, 3)


def test_sync_reference_mixes_toward_the_policy(full_ft):
    model, params, opt = full_ft
    state = state_lib.init_train_state(params, opt, lora=False, keep_reference=True)
    moved = jax.tree.map(lambda x: x + 1.0, state.params)
    synced = pure_steps.sync_reference(state.replace(params=moved), 0.6)
    for p, r0, r in zip(*(jax.tree.leaves(t) for t in (moved, state.ref, synced.ref))):
        np.testing.assert_allclose(np.asarray(r), 0.6 * np.asarray(p) + 0.4 * np.asarray(r0),
                                   rtol=1e-6, atol=1e-6)
    no_ref = state_lib.init_train_state(params, opt, lora=False)
    assert pure_steps.sync_reference(no_ref, 0.6) is no_ref


def test_batch_shardings_come_from_the_field_axes():
    mesh = shd.make_mesh((2, 2, 2))
    batch = rollout_batch().replace(old_logps=np.zeros((2, 8, 5), np.float32))
    sh = batch.shardings(mesh)
    rows = P(("data", "fsdp"), None)
    assert sh.prompt_ids.spec == rows and sh.completion_mask.spec == rows
    assert sh.advantages.spec == P(("data", "fsdp"))
    assert sh.old_logps.spec == P(None, ("data", "fsdp"), None)
    assert sh.mask_seeds.spec == P(None) and sh.ref_logps is None


def test_update_compiled_from_abstract_inputs_is_the_one_training_calls(tiny_config):
    """The planner's path: lower the GRPO update from ShapeDtypeStructs with shardings,
    compile, run the executable on real inputs: same metrics as ``steps.grpo_update``."""
    model = d1jax.LLaDA(tiny_config, lora=LoraConfig(rank=4, alpha=8.0, dropout=0.0))
    params = d1jax.init_params(model, jax.random.key(0))
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2))
    mesh = shd.make_mesh((2, 2, 2))
    sampler = SamplerConfig(gen_length=4, block_length=4, steps=2,
                            mask_id=tiny_config.mask_token_id)
    steps = steps_lib.make_jitted_steps(model, mesh, opt, lora=True, sampler=sampler,
                                        grpo=table.GRPOConfig(num_iterations=2, beta=0.04))
    abstract, rng = steps.abstract_state(), steps.rng_like()
    like = steps.grpo_batch_like(rows=8, prompt_len=6, completion_len=5)
    compiled = steps.program("grpo_update", like).lower(abstract, like, rng).compile()
    assert compiled.memory_analysis() is not None
    rollout = steps.grpo_batch_like(8, 6, 5, for_update=False)
    assert rollout.old_logps is None and rollout.iteration is None
    steps.program("rollout_logps", rollout).lower(abstract, rollout).compile()
    prompt_ids, prompt_mask = steps.prompts_like(rows=8, prompt_len=6)
    steps.generate.lower(abstract.policy_params(), prompt_ids, prompt_mask, rng).compile()
    state = steps.init(params)
    batch = rollout_batch().replace(iteration=np.int32(1))
    batch = batch.replace(**steps.rollout_logps(state, batch))
    placed = jax.device_put(batch, batch.shardings(mesh))
    _, want = steps.grpo_update(state, batch, jax.random.key(3))
    state = steps.init(params)
    _, got = compiled(state.moving(), state.fixed(), placed, jax.random.key(3))
    for k in ("loss", "kl", "grad_norm"):
        np.testing.assert_allclose(float(got[k]), float(want[k]), rtol=1e-6, err_msg=k)
    assert not np.isclose(float(want["kl"]), 0.0) or float(want["grad_norm"]) > 0


def test_bfloat16_model_with_gradient_accumulation(tiny_config):
    """A bfloat16 model (the 8B setting) with two micro-batches: the update traces, the
    adapters and their Adam moments stay float32, and the adapters move like those of the
    float32 model (to bfloat16 forward precision)."""
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0)
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2))
    cfg = table.GRPOConfig(num_iterations=1, beta=0.0, grad_accum=2)
    moved = {}
    params32 = d1jax.init_params(d1jax.LLaDA(tiny_config, lora=lora), jax.random.key(0))
    for dtype in (jnp.float32, jnp.bfloat16):
        model = d1jax.LLaDA(tiny_config, dtype=dtype, param_dtype=dtype, lora=lora)
        base, adapters = lora_lib.split(params32)  # the same weights, base rounded to dtype
        params = lora_lib.join(jax.tree.map(lambda x: x.astype(dtype), base), adapters)
        steps = steps_lib.make_jitted_steps(model, None, opt, lora=True, grpo=cfg)
        state = steps.init(params)
        before = jax.device_get(state.params)
        state, m = steps.grpo_update(state, rollout_batch(mu=1), jax.random.key(1))
        assert np.isfinite(float(m["loss"])) and int(m["update_skipped"]) == 0
        dtypes = {x.dtype for x in jax.tree.leaves((state.params, state.opt_state))
                  if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim > 0}
        assert dtypes == {jnp.dtype(jnp.float32)}
        moved[dtype] = jax.tree.map(lambda a, b: np.asarray(a, np.float32)
                                    - np.asarray(b, np.float32),
                                    jax.device_get(state.params), before)
    # Adam's first step is lr * sign(g): every lora_b entry (the only ones with a gradient
    # while lora_b is zero) moves, mostly in the float32 run's direction (bfloat16
    # activations flip the sign of the smallest gradients).
    b32, b16 = (lora_lib.split(moved[d])[1] for d in (jnp.float32, jnp.bfloat16))
    agree = []
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(b32),
                                 jax.tree_util.tree_leaves_with_path(b16), strict=True):
        if "lora_b" in jax.tree_util.keystr(path):
            assert np.mean(b != 0) > 0.99
            agree.append(np.mean(np.sign(a) == np.sign(b)))
    assert len(agree) == 7 and np.mean(agree) > 0.8, agree


def test_unknown_objective_and_mismatched_hparams_are_refused():
    with pytest.raises(ValueError, match="objective='ppo'"):
        table.GRPOConfig(objective="ppo")
    with pytest.raises(ValueError, match="takes hparams of type WD1Config, got NoneType"):
        table.GRPOConfig(objective="wd1", beta=0.0)
    with pytest.raises(ValueError, match="differ from the GRPO config's beta=0.04"):
        table.GRPOConfig(objective="coupled_grpo", hparams=coupled_grpo.CoupledGRPOConfig())


def test_wd1_update_weights_whole_groups_under_strided_micro_batches(full_ft):
    """Strided micro-batches hold no whole group of G = 4: the loss still equals wd1's on the
    whole batch (independent call: prompt noise from the mask seed, softmax per group)."""
    model, params, opt = full_ft
    batch = rollout_batch(mu=1)
    seed = batch.mask_seeds
    logps_bc = logprob.per_token_logps(
        model, params, jnp.asarray(batch.prompt_ids), jnp.asarray(batch.completion_ids), seed,
        p_mask_prompt=0.15, attention_mask_bl=jnp.concatenate(
            [batch.prompt_mask, np.ones_like(batch.completion_ids)], axis=1))[0]
    seq_ng = (np.asarray(logps_bc, np.float64) * np.asarray(batch.completion_mask)).sum(-1)
    seq_ng, a_ng = seq_ng.reshape(-1, 4), np.asarray(batch.advantages, np.float64).reshape(-1, 4)
    softmax = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(
        x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
    want = np.mean(-(softmax(a_ng) * seq_ng).sum(-1) + (softmax(-a_ng) * seq_ng).sum(-1))
    for accum in (1, 2):
        cfg = table.GRPOConfig(num_iterations=1, beta=0.0, grad_accum=accum, objective="wd1",
                                hparams=wd1.WD1Config(group_size=4))
        state = state_lib.init_train_state(params, opt, lora=False)
        _, m = pure_steps.grpo_update_step(model, opt, cfg, state, batch, jax.random.key(0))
        np.testing.assert_allclose(float(m["loss"]), float(want), rtol=1e-5, err_msg=accum)
        assert pure_steps.rollout_logps(model, cfg, state, batch) == {}  # no old/ref pass


def test_coupled_old_and_reference_passes_score_the_update_masks(full_ft):
    """Coupled-GRPO's rollout pass equals ``coupled_logps`` on the seed's mask draw (old
    row 0 is the first update's own, not computed), and the updates on the rollout's policy
    see ratio exactly 1 under grad accumulation."""
    model, params, opt = full_ft
    cfg = table.GRPOConfig(num_iterations=2, beta=0.04, grad_accum=2, objective="coupled_grpo",
                            hparams=coupled_grpo.CoupledGRPOConfig(beta=0.04))
    state = state_lib.init_train_state(params, opt, lora=False, keep_reference=True)
    batch = rollout_batch(mu=2)
    out = pure_steps.rollout_logps(model, cfg, state, batch)
    for it in range(2):
        is_mask_bc, t_b = masking.coupled_masks(logprob.mask_key(batch.mask_seeds[it]), 8, 5)
        want = coupled_grpo.coupled_logps(model, params, batch.prompt_ids, batch.prompt_mask,
                                          batch.completion_ids, is_mask_bc, t_b, cfg.hparams)
        old = out["old_logps"][it]
        np.testing.assert_allclose(old, want if it else np.zeros_like(want), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["ref_logps"][it], want, rtol=1e-5, atol=1e-5)
        rows = batch.replace(iteration=np.int32(it), **out)
        _, m = pure_steps.grpo_update_step(model, opt, cfg, state, rows, jax.random.key(0))
        assert abs(float(m["ratio_min"]) - 1) < 1e-5 and abs(float(m["ratio_max"]) - 1) < 1e-5
        np.testing.assert_allclose(float(m["mask_ratio"]), float(t_b[0]), rtol=1e-6)


# ---------------------------------------------------------------------------- by value
def _np_one_step_logps(plain_model, params, batch: GRPOBatch, seed: int, p_mask_prompt: float):
    """d1's one-step estimator by hand, [B, C] float64: the prompt tokens masked where the
    seed's uniform draw falls below p, the completion fully masked, one full-sequence
    forward of the adapter-free model with the prompt padding masked out, log-softmax of
    the completion positions in float64."""
    mask_id = plain_model.config.mask_token_id
    b, c = batch.completion_ids.shape
    u = np.asarray(jax.random.uniform(logprob.mask_key(seed), batch.prompt_ids.shape))
    prompt = np.where(u < p_mask_prompt, mask_id, batch.prompt_ids)
    ids = np.concatenate([prompt, np.full((b, c), mask_id)], axis=1).astype(np.int32)
    attn = np.concatenate([batch.prompt_mask, np.ones((b, c), np.int32)], axis=1)
    logits = np.asarray(plain_model.apply({"params": params}, ids, attn), np.float64)[:, -c:]
    logits -= logits.max(-1, keepdims=True)
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return np.take_along_axis(lsm, batch.completion_ids[..., None], -1)[..., 0]


def _merged(base, adapters, lora: LoraConfig):
    """Plain params with every adapter merged in numpy: kernel + (alpha / r) A @ B."""
    flat, extra = (traverse_util.flatten_dict(t) for t in (base, adapters))
    out = {}
    for k, v in flat.items():
        a = extra.get(k[:-1] + ("lora_a",))
        if a is not None:
            b = np.asarray(extra[k[:-1] + ("lora_b",)], np.float64)
            ab = np.einsum("...ir,...ro->...io", np.asarray(a, np.float64), b)
            v = np.asarray(v, np.float64) + lora.alpha / lora.rank * ab
        out[k] = np.asarray(v, np.float32)
    return traverse_util.unflatten_dict(out)


@pytest.fixture(scope="module")
def lora_policy(tiny_config):
    """A LoRA model at init (lora_b = 0), adapters as after training (lora_b random) and the
    plain model that evaluates merged or base params."""
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0)
    model = d1jax.LLaDA(tiny_config, lora=lora)
    params = d1jax.init_params(model, jax.random.key(0))
    base, adapters = lora_lib.split(params)
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2))
    return model, d1jax.LLaDA(tiny_config), params, base, _trained(adapters), opt, lora


def _trained(adapters):
    """Adapters as after some training: lora_b random (0 at init), lora_a as initialised."""
    flat = traverse_util.flatten_dict(adapters)
    keys = dict(zip(flat, jax.random.split(jax.random.key(5), len(flat))))
    return traverse_util.unflatten_dict(
        {k: 0.3 * jax.random.normal(keys[k], v.shape) if k[-1] == "lora_b" else v
         for k, v in flat.items()})


@pytest.mark.parametrize("sync_ref_model", [False, True], ids=["d1_adapters_off", "synced_copy"])
def test_reference_logps_are_the_base_models_not_the_policys(lora_policy, sync_ref_model):
    """The reference of a LoRA run, as the run config sets it up (spec.keep_reference).
    Default (d1: PEFT's disable_adapter() at every step): no copy, the base weights with
    adapters off, whatever the adapters hold. grpo.sync_ref_model=True: a copy of the adapters
    at init (lora_b = 0, so again the base), mixed toward the policy by sync_reference, after
    which the reference follows the mixed copy. Checked by value against the plain model's
    one-step log-probs (numpy log-softmax) on base or numpy-merged weights, while the policy
    (non-zero adapters) scores differently."""
    from d1jax import config as config_lib
    from d1jax.run import spec as spec_lib
    c = config_lib.grpo("sudoku", "tiny")
    assert c.grpo.sync_ref_model is False  # d1's reference is the default
    c.grpo.sync_ref_model = sync_ref_model
    keep_reference = spec_lib.from_config(c).keep_reference
    assert keep_reference == sync_ref_model
    model, plain, params, base, trained, opt, lora = lora_policy
    cfg = table.GRPOConfig(num_iterations=2, beta=0.04, p_mask_prompt=0.0)
    steps = steps_lib.make_jitted_steps(model, None, opt, lora=True,
                                        keep_reference=keep_reference, grpo=cfg)
    state = steps.init(params).replace(params=trained)  # the policy after some training
    batch = rollout_batch(mu=2)
    out = jax.device_get(steps.rollout_logps(state, batch))
    want_ref = _np_one_step_logps(plain, base, batch, 0, 0.0)
    want_policy = _np_one_step_logps(plain, _merged(base, trained, lora), batch, 0, 0.0)
    assert np.abs(want_ref - want_policy).max() > 0.05  # the adapters matter
    for s in range(2):
        np.testing.assert_allclose(out["ref_logps"][s], want_ref, atol=2e-5, err_msg=s)
    # Old row 0 is the first update's own (not computed); row 1 is the policy's.
    np.testing.assert_allclose(out["old_logps"][1], want_policy, atol=2e-5)
    # sync_reference: ref adapters <- 0.6 policy + 0.4 ref, leaf by leaf (TRL's mixup); with
    # no copy (d1) a no-op, and the reference stays the base model.
    start = lora_lib.split(params)[1]
    mixed = jax.tree.map(lambda p, r: 0.6 * np.asarray(p) + 0.4 * np.asarray(r), trained, start)
    state = steps.sync_reference(state, 0.6)
    out = jax.device_get(steps.rollout_logps(state, batch))
    if not keep_reference:
        assert state.ref is None and state.reference_params()[1] is False  # adapters off
        np.testing.assert_allclose(out["ref_logps"][1], want_ref, atol=2e-5)
        return
    want_mixed = _np_one_step_logps(plain, _merged(base, mixed, lora), batch, 0, 0.0)
    assert np.abs(want_mixed - want_ref).max() > 0.01
    np.testing.assert_allclose(out["ref_logps"][1], want_mixed, atol=2e-5)


def test_mask_seeds_are_drawn_per_inner_iteration_and_update_it_uses_seed_it():
    """GRPOEngine: mu distinct seeds per rollout with random_masking (d1's randint(0, 2**12)
    per iteration), fresh ones next rollout, 42 for all without; update(batch, it) hands
    iteration ``it`` to the jitted step."""
    eng = engine.GRPOEngine.__new__(engine.GRPOEngine)
    eng.mu, eng.key = 12, jax.random.key(0)
    eng.spec = SimpleNamespace(grpo=SimpleNamespace(beta=0.0), grpo_run=SimpleNamespace(
        random_masking=True, sync_ref_model=False))
    draws = [eng._mask_seeds(jax.random.key(k)) for k in range(3)]
    for seeds in draws:
        assert seeds.shape == (12,) and seeds.dtype == np.int32
        assert len(set(seeds.tolist())) == 12 and seeds.min() >= 0 and seeds.max() < 4096
    assert len({tuple(s.tolist()) for s in draws}) == 3  # fresh per rollout
    eng.spec.grpo_run.random_masking = False
    np.testing.assert_array_equal(eng._mask_seeds(jax.random.key(0)), np.full(12, 42))

    seen = []

    def grpo_update(state, batch, rng):
        seen.append(int(batch.iteration))
        return state, {"loss": np.float32(0.0)}
    eng.steps, eng.state = SimpleNamespace(grpo_update=grpo_update), None
    for it in range(3):
        eng.update(rollout_batch(mu=12), it, step=it)
    assert seen == [0, 1, 2]


def test_update_of_iteration_i_scores_with_mask_seed_i(ft_steps, full_ft):
    """p_mask_prompt = 0.5, seeds (1, 2, 3): the rollout's old log-probs of row i > 0 equal
    the hand-computed estimator under seed i (and differ between seeds; row 0 is the first
    update's own); given those independent log-probs as old_logps, the first update
    (policy = old policy) has ratio exactly 1 at iteration i only: it masks the prompt with
    seed i and reads row i."""
    steps, params, batch = ft_steps
    model = full_ft[0]
    want = np.stack([_np_one_step_logps(model, params, batch, s, 0.5)
                     for s in batch.mask_seeds])
    assert np.abs(want[0] - want[1]).max() > 1e-2 and np.abs(want[1] - want[2]).max() > 1e-2
    np.testing.assert_allclose(batch.old_logps[1:], want[1:], atol=2e-5)
    np.testing.assert_array_equal(batch.old_logps[0], 0.0)
    mine = batch.replace(old_logps=want.astype(np.float32))
    for it in range(3):
        _, m = steps.grpo_update(steps.init(params), mine.replace(iteration=np.int32(it)),
                                 jax.random.key(0))
        assert abs(float(m["ratio_min"]) - 1) < 1e-4 and abs(float(m["ratio_max"]) - 1) < 1e-4
    # Iteration 1 paired with seed 0's log-probs: the ratio moves off 1.
    wrong = mine.replace(old_logps=want[[1, 0, 2]].astype(np.float32), iteration=np.int32(1))
    _, m = steps.grpo_update(steps.init(params), wrong, jax.random.key(0))
    assert float(m["ratio_max"]) - float(m["ratio_min"]) > 1e-2


def test_first_update_reads_its_own_old_logps_as_the_skipped_pass_would(full_ft, monkeypatch):
    """mu = 3, beta = 0.04, grad accumulation 2: the rollout skips the old pass of mask seed
    0 (2 old passes, 3 reference passes), and the first update, which reads its own
    detached log-probs, gives the params and metrics of the update given that pass (d1's
    order: every old pass before the first update)."""
    model, params, opt = full_ft
    cfg = table.GRPOConfig(num_iterations=3, beta=0.04, grad_accum=2, p_mask_prompt=0.5)
    state = state_lib.init_train_state(params, opt, lora=False, keep_reference=True)
    batch = rollout_batch(mu=3, p=12).replace(mask_seeds=np.array([1, 2, 3], np.int32))
    calls, real = [], logprob.per_token_logps

    def counting(*args, **kwargs):
        calls.append(np.shape(args[4])[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(logprob, "per_token_logps", counting)
    skipped = pure_steps.rollout_logps(model, cfg, state, batch)
    assert calls == [2, 3]  # old seeds 2, 3; reference seeds 1, 2, 3
    monkeypatch.setattr(pure_steps, "first_old_from_update", lambda cfg: False)
    full = pure_steps.rollout_logps(model, cfg, state, batch)
    np.testing.assert_array_equal(skipped["old_logps"][1:], full["old_logps"][1:])
    np.testing.assert_array_equal(skipped["ref_logps"], full["ref_logps"])
    assert np.abs(np.asarray(full["old_logps"][0])).min() > 0  # the pass d1 runs
    with_pass = pure_steps.grpo_update_step(model, opt, cfg, state, batch.replace(
        iteration=np.int32(0), **full), jax.random.key(0))
    monkeypatch.undo()
    own = pure_steps.grpo_update_step(model, opt, cfg, state, batch.replace(
        iteration=np.int32(0), **skipped), jax.random.key(0))
    # AdamW's first step moves each weight by about lr = 1e-2 whatever its gradient's size,
    # so the params agree to a fraction of it; the gradient norm agrees to rounding.
    for a, b in zip(jax.tree.leaves(own[0].params), jax.tree.leaves(with_pass[0].params)):
        np.testing.assert_allclose(a, b, rtol=0, atol=3e-4)
    for k in ("loss", "grad_norm", "kl", "ratio_min", "ratio_max", "clip_ratio"):
        np.testing.assert_allclose(own[1][k], with_pass[1][k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert float(own[1]["ratio_min"]) == float(own[1]["ratio_max"]) == 1.0


# ---------------------------------------------------------------------------- LoRA dropout
def _np_clipped_loss(logps, old, adv, mask, eps):
    """d1's compute_loss with beta = 0, by hand in float64: (loss, ratio min and max over
    the mask, d1's clip share)."""
    ratio = np.exp(np.asarray(logps, np.float64) - old)
    a = np.asarray(adv, np.float64)[:, None]
    l1, l2 = ratio * a, np.clip(ratio, 1 - eps, 1 + eps) * a
    m = np.asarray(mask, np.float64)
    loss = (-np.minimum(l1, l2) * m).sum() / m.sum()
    on = m > 0
    return loss, ratio[on].min(), ratio[on].max(), ((l1 < l2) * m).sum() / m.sum()


def test_with_lora_dropout_the_first_update_is_scored_against_a_dropout_free_old_pass(
        tiny_config):
    """LoRA dropout 0.5, mu = 2, p_mask = 0.5, the policy after some training. The shortcut
    (the first update reading its own log-probs as the skipped old pass) holds only without
    dropout: with it the update's log-probs are a dropout sample while the old pass is the
    deterministic network, so the rollout runs the old pass of every seed, row 0 included
    (equal to the numpy estimator on numpy-merged weights), and the first update's loss,
    ratios, clip share and gradient norm are d1's formula on the update's dropout
    log-probs against that row, by hand. With mu = 1 the old log-probs are the update's own,
    detached (d1's per_token_logps.detach()), so the ratio is exactly 1 even with dropout.

    d1's old pass (diffu_grpo_trainer.py _generate_and_score_completions, under
    torch.no_grad) runs in train mode, since HF's Trainer.training_step calls model.train()
    before _prepare_inputs: there PEFT's LoRA dropout is on in that pass too, with a draw of
    its own. d1jax's old pass is deterministic (docs/testing.md, "Slips an audit found
    surviving"), so the shortcut would be wrong under either choice."""
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.5)
    model, plain = d1jax.LLaDA(tiny_config, lora=lora), d1jax.LLaDA(tiny_config)
    params = d1jax.init_params(model, jax.random.key(0))
    base, adapters = lora_lib.split(params)
    trained = _trained(adapters)
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2))
    state = state_lib.init_train_state(params, opt, lora=True).replace(params=trained)
    cfg = table.GRPOConfig(num_iterations=2, beta=0.0, epsilon=0.2, p_mask_prompt=0.5,
                           lora_dropout=True)
    batch = rollout_batch(mu=2, p=12).replace(mask_seeds=np.array([1, 2], np.int32))
    merged = _merged(base, trained, lora)
    want_old = np.stack([_np_one_step_logps(plain, merged, batch, s, 0.5) for s in (1, 2)])
    old = np.asarray(jax.device_get(pure_steps.rollout_logps(model, cfg, state, batch))[
        "old_logps"])
    np.testing.assert_allclose(old, want_old, atol=2e-5)  # row 0 too: its pass was run

    # The update's own log-probs: the policy with dropout (its key for micro-batch 0 is
    # fold_in(rng, 0)) on the prompt masked with seed 1, p = 0.5, as the numpy estimator masks.
    rng, seed = jax.random.key(7), np.array([1], np.int32)
    u = np.asarray(jax.random.uniform(logprob.mask_key(1), batch.prompt_ids.shape))
    prompt = np.where(u < 0.5, tiny_config.mask_token_id, batch.prompt_ids).astype(np.int32)
    attn = np.concatenate([batch.prompt_mask, np.ones_like(batch.completion_ids)], axis=1)

    def dropout_logps(adapter_params):
        return logprob.per_token_logps(
            model, lora_lib.join(base, adapter_params), prompt, batch.completion_ids, seed,
            p_mask_prompt=0.0, attention_mask_bl=attn, dropout_rng=jax.random.fold_in(rng, 0))[0]

    mask = batch.completion_mask
    lp = np.asarray(dropout_logps(trained), np.float64)
    assert np.abs(lp - want_old[0])[mask > 0].max() > 1e-2  # dropout moves the log-probs
    loss, rmin, rmax, clipped = _np_clipped_loss(lp, want_old[0], batch.advantages, mask, 0.2)
    assert rmax > 1.2 or rmin < 0.8  # some tokens clipped: the ratio is far from 1

    def jnp_loss(adapter_params):  # the same formula, differentiable, for the gradient
        ratio = jnp.exp(dropout_logps(adapter_params) - want_old[0])
        a = batch.advantages[:, None]
        per = -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a)
        return jnp.sum(per * mask) / mask.sum()
    grads = jax.grad(jnp_loss)(trained)
    want_norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2)
                            for g in jax.tree.leaves(grads)))

    _, m = pure_steps.grpo_update_step(model, opt, cfg, state, batch.replace(
        iteration=np.int32(0), old_logps=old), rng)
    m = jax.device_get(m)
    np.testing.assert_allclose(float(m["loss"]), loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([float(m["ratio_min"]), float(m["ratio_max"])], [rmin, rmax],
                               rtol=1e-5)
    np.testing.assert_allclose(float(m["clip_ratio"]), clipped, atol=1e-7)
    np.testing.assert_allclose(float(m["grad_norm"]), want_norm, rtol=1e-4)

    # mu = 1: d1's detached current log-probs, the same dropout sample: ratio 1, loss -mean A.
    one = dataclasses.replace(cfg, num_iterations=1)
    single = batch.replace(mask_seeds=seed)
    assert pure_steps.rollout_logps(model, one, state, single) == {}
    _, m = pure_steps.grpo_update_step(model, opt, one, state, single, rng)
    assert float(m["ratio_min"]) == float(m["ratio_max"]) == 1.0
    a_tokens = (np.asarray(batch.advantages, np.float64)[:, None] * mask).sum() / mask.sum()
    np.testing.assert_allclose(float(m["loss"]), -a_tokens, rtol=1e-6)


@pytest.mark.parametrize("enabled, dropout, on", [(True, 0.05, True), (True, 0.0, False),
                                                  (False, 0.05, False)])
def test_the_run_config_turns_lora_dropout_on_in_the_update_and_off_the_shortcut(
        enabled, dropout, on):
    """d1's configs (lora_dropout 0.05): the update applies dropout, so the rollout keeps
    the first old pass; without adapters or with dropout 0 the shortcut holds."""
    from d1jax import config as config_lib
    from d1jax.run import spec as spec_lib
    c = config_lib.grpo("sudoku", "tiny")
    c.lora.enabled, c.lora.dropout = enabled, dropout
    if not enabled:
        c.grpo.beta = 0.0  # full fine-tuning without a reference copy
    cfg = spec_lib.from_config(c).grpo
    assert cfg.lora_dropout is on
    assert pure_steps.first_old_from_update(cfg) is (not on)
