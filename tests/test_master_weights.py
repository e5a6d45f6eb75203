"""Float32 master weights for full fine-tuning (d1jax/train/state.py, ``optim.master_weights``):
a bfloat16 model trains on a float32 copy of its weights and AdamW moments, as DeepSpeed's
bf16 optimizer and MaxText keep them; the reference is a float64 AdamW written in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util
from safetensors import safe_open

import d1jax
from d1jax import checkpoint as ckpt_lib
from d1jax import config as config_lib
from d1jax import sharding as shd
from d1jax.metrics import read_jsonl
from d1jax.model import LoraConfig
from d1jax.model import lora as lora_lib
from d1jax.objectives import losses, table
from d1jax.run import optim
from d1jax.run import spec as spec_lib
from d1jax.train import jit_steps as steps_lib

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
LR, B1, B2, EPS, WD, CLIP = 1e-6, 0.9, 0.99, 1e-8, 0.1, 0.2  # DiffuCoder's lr, d1's AdamW


@pytest.fixture(scope="module")
def bf16_setup():
    """The tiny LLaDA computing and storing in bfloat16 (the 8B setting), its weights, and
    one SFT batch."""
    cfg = d1jax.preset("test-tiny")
    model = d1jax.LLaDA(cfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    p32 = d1jax.init_params(d1jax.LLaDA(cfg), jax.random.key(0))
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), p32)
    rng = np.random.default_rng(0)
    batch = {"input_ids": jnp.asarray(rng.integers(0, 100, (4, 24)), jnp.int32),
             "prompt_len": jnp.asarray([5, 8, 3, 10], jnp.int32)}
    return model, params, batch


def _flat64(tree) -> dict:
    return {k: np.asarray(v, np.float64)
            for k, v in traverse_util.flatten_dict(jax.device_get(tree)).items()}


def _adamw_f64(w0: dict, g: dict) -> dict:
    """One AdamW step from zero moments in float64 (Loshchilov & Hutter; torch.optim.AdamW):
    clip to global norm CLIP, m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected, then
    w - lr (m_hat / (sqrt(v_hat) + eps) + wd w), no decay on norms and biases (HF's rule)."""
    norm = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
    scale = min(1.0, CLIP / norm)
    out = {}
    for k, gk in g.items():
        gk = gk * scale
        m_hat = (1 - B1) * gk / (1 - B1)
        v_hat = (1 - B2) * gk ** 2 / (1 - B2)
        decayed = not any("norm" in p or p == "ln_f" for p in k) and k[-1] != "bias"
        out[k] = w0[k] - LR * (m_hat / (np.sqrt(v_hat) + EPS) + (WD * w0[k] if decayed else 0))
    return out


@pytest.mark.parametrize("master", [jnp.float32, None], ids=["float32", "none"])
def test_one_update_at_lr_1e6_moves_the_weights_as_float64_adamw(bf16_setup, master):
    """One masked-SFT update at lr 1e-6 with bfloat16 compute. The gradient is the bfloat16
    model's own (jax.grad of the same loss, key and weights, outside the step: what the update
    differentiates); AdamW on it is the numpy float64 reference. Compared: each weight's
    change w1 - w0 against the reference's, within one float32 step of w0 (the master's
    rounding) plus 0.1% of the change (float32 Adam arithmetic). With the master every one
    of the 26,784 weights matches; stored in bfloat16 (``none``) the change of most weights
    is below half a bfloat16 step and rounds away (about 91% miss), so the same check fails."""
    model, params, batch = bf16_setup
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=LR, b1=B1, b2=B2, eps=EPS,
                                                 weight_decay=WD, max_grad_norm=CLIP))
    sft = table.SFTConfig()
    key = jax.random.key(7)

    def loss(p):  # the step's loss with one micro-batch: noise key fold_in(rng, 0)
        return losses.sft_loss(model, p, batch["input_ids"], batch["prompt_len"],
                               jax.random.fold_in(key, 0), eps=sft.eps, seq_chunk=sft.seq_chunk)
    (want_loss, _), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    assert {x.dtype for x in jax.tree.leaves(grads)} == {BF16}  # bfloat16 compute
    w0 = _flat64(params)
    want = _adamw_f64(w0, _flat64(grads))

    steps = steps_lib.make_jitted_steps(model, None, opt, lora=False, sft=sft,
                                        master_dtype=master)
    state, m = steps.sft_update(steps.init(params), batch, key)
    assert float(m["loss"]) == pytest.approx(float(want_loss), rel=1e-5)
    got = _flat64(state.params)
    miss = total = 0
    for k in w0:
        tol = 2.0 ** -23 * np.abs(w0[k]) + 1e-3 * np.abs(want[k] - w0[k])
        miss += int(np.sum(np.abs((got[k] - w0[k]) - (want[k] - w0[k])) > tol))
        total += w0[k].size
    assert total == 26784
    if master is not None:
        assert miss == 0, f"{miss} of {total} weights off the float64 AdamW step"
    else:
        assert miss > 0.8 * total, f"bfloat16 storage matched {total - miss} of {total}"


def test_state_dtypes_and_shardings(bf16_setup):
    """Sharded over 8 devices: the master and both AdamW moments are float32 on the params'
    shardings; the policy (sampling, scoring, export) and the reference copy are bfloat16
    and equal the weights as loaded; ``abstract_state`` (what the planner compiles) agrees
    with the real state leaf by leaf. LoRA keeps float32 adapters on a bfloat16 base."""
    model, params, _ = bf16_setup
    mesh = shd.make_mesh((2, 4, 1))
    placed = jax.device_put(params, shd.param_shardings(model, mesh))
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=LR))
    steps = steps_lib.make_jitted_steps(model, mesh, opt, lora=False, keep_reference=True,
                                        grpo=table.GRPOConfig(beta=0.04))
    state = steps.init(placed)
    mu, nu = state.opt_state[1].inner_state[0].mu, state.opt_state[1].inner_state[0].nu
    for tree in (state.params, mu, nu):
        assert {x.dtype for x in jax.tree.leaves(tree)} == {F32}
        assert jax.tree.leaves(jax.tree.map(lambda a, b: a.sharding == b.sharding, tree,
                                            placed)) == [True] * len(jax.tree.leaves(placed))
    for tree in (state.policy_params(), state.ref):
        assert {x.dtype for x in jax.tree.leaves(tree)} == {BF16}
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                     tree, params)
    abstract = steps.abstract_state()
    for a, x in zip(jax.tree.leaves(abstract), jax.tree.leaves(state), strict=True):
        assert (a.shape, a.dtype, a.sharding) == (x.shape, x.dtype, x.sharding), (a, x)
    assert {x.dtype for x in jax.tree.leaves(abstract.policy_params())} == {BF16}

    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0)
    lmodel = d1jax.LLaDA(model.config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, lora=lora)
    lparams = d1jax.init_params(lmodel, jax.random.key(1))
    lstate = steps_lib.make_jitted_steps(lmodel, None, opt, lora=True).init(lparams)
    assert lstate.policy_dtype is None
    assert {x.dtype for x in jax.tree.leaves(lstate.params)} == {F32}
    assert {x.dtype for x in jax.tree.leaves(lstate.frozen)} == {BF16}
    base, adapters = lora_lib.split(lstate.policy_params())
    assert {x.dtype for x in jax.tree.leaves(base)} == {BF16}
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {F32}


def test_checkpoint_keeps_the_master_and_a_bfloat16_checkpoint_resumes(bf16_setup, tmp_path):
    """A saved master restores bit for bit in float32 (not rounded through bfloat16); a
    checkpoint with bfloat16 params and moments (``none``, or d1jax before master weights)
    restores into a master state upcast exactly, and the next update runs on it."""
    model, params, batch = bf16_setup
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=LR))
    sft = table.SFTConfig()
    master = steps_lib.make_jitted_steps(model, None, opt, lora=False, sft=sft)
    plain = steps_lib.make_jitted_steps(model, None, opt, lora=False, sft=sft, master_dtype=None)
    state, _ = master.sft_update(master.init(params), batch, jax.random.key(1))
    old, _ = plain.sft_update(plain.init(params), batch, jax.random.key(1))
    assert {x.dtype for x in jax.tree.leaves(old.params)} == {BF16}
    target = ckpt_lib.abstract_like(master.init(params))
    for name, saved in (("master", state), ("bf16", old)):
        ck = ckpt_lib.Checkpointer(tmp_path / name, save_every=1, async_save=False)
        ck.save(1, saved, {"data": {}})
        ck.wait()
        step, restored, _ = ck.restore(target)
        ck.close()
        assert step == 1 and restored.policy_dtype == BF16
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved), strict=True):
            assert a.dtype == (F32 if b.dtype == BF16 else b.dtype)
            np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert any(np.any(np.asarray(x, np.float32) != np.asarray(x.astype(jnp.bfloat16), np.float32))
               for x in jax.tree.leaves(state.params))  # the master is not bfloat16 in disguise
    after, m = master.sft_update(restored, batch, jax.random.key(2))
    assert int(after.step) == 2 and np.isfinite(float(m["loss"]))
    assert {x.dtype for x in jax.tree.leaves(after.params)} == {F32}


def test_master_weights_knob():
    c = config_lib.sft("tiny")
    assert spec_lib.from_config(c).optim.master_dtype == jnp.float32
    c.optim.master_weights = "none"
    assert spec_lib.from_config(c).optim.master_dtype is None
    c.optim.master_weights = "bfloat16"
    with pytest.raises(config_lib.ConfigError, match=r"^optim.master_weights='bfloat16': "
                                                     r"choose one of float32, none$"):
        spec_lib.from_config(c)
    assert "optim.master_weights" in spec_lib.RESUME_FIELDS


def _array_dtypes(step_dir) -> dict:
    meta = ocp.StandardCheckpointer().metadata(step_dir / "state")
    tree = getattr(meta, "item_metadata", meta)
    return {jax.tree_util.keystr(p): x.dtype for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def test_full_fine_tuning_run_resumes_a_bfloat16_checkpoint_and_exports_bfloat16(
        tmp_path, shared_d1):
    """Through ``sft.run`` with a bfloat16 model and no LoRA: 2 steps with
    ``master_weights=none`` write a bfloat16 checkpoint (as d1jax wrote before); the rerun to
    4 steps with the float32 master (the change accepted by name) resumes it, saves float32
    params and moments, and exports bfloat16 safetensors equal to the master rounded."""
    from d1jax.train import sft as sft_lib
    c = config_lib.sft("tiny")
    c.model.dtype = c.model.param_dtype = "bfloat16"
    c.lora.enabled = False
    c.optim.learning_rate, c.train.async_checkpoints = LR, False
    c.train.num_steps, c.train.save_every, c.optim.master_weights = 2, 2, "none"
    sft_lib.run(c, str(tmp_path))
    assert set(_array_dtypes(tmp_path / "checkpoints" / "2").values()) >= {BF16}
    assert not any(d == F32 and "['params']" in k
                   for k, d in _array_dtypes(tmp_path / "checkpoints" / "2").items())
    c.train.num_steps, c.optim.master_weights = 4, "float32"
    c.train.accept_changes = "optim.master_weights"
    sft_lib.run(c, str(tmp_path))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    dtypes = _array_dtypes(tmp_path / "checkpoints" / "4")
    floats = {k: d for k, d in dtypes.items() if "['params']" in k or ".mu" in k
              or ".nu" in k or "'mu'" in k or "'nu'" in k}
    assert len(floats) == 3 * len(saved_params := [k for k in floats if "['params']" in k])
    assert saved_params and set(floats.values()) == {F32}, floats
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
        exported = {k: f.get_tensor(k) for k in f.keys()}
    assert {a.dtype for a in exported.values()} == {BF16}
    saved = ocp.StandardCheckpointer().restore(tmp_path / "checkpoints" / "4" / "state")
    wte = np.asarray(saved["params"]["wte"]["embedding"])
    assert wte.dtype == F32
    np.testing.assert_array_equal(exported["model.transformer.wte.weight"],
                                  wte.astype(jnp.bfloat16))


def test_bfloat16_storage_keeps_adam_hyperparameters_in_float32(bf16_setup):
    """optax infers its hyperparameters' dtype from the params: in bfloat16, SFT's b2 = 0.999
    rounds to 1, Adam's second moment and its bias correction are 0 and the first update
    writes NaN into every weight. The hyperparameters are float32 and the update's
    arithmetic is float32, so even bfloat16 storage (``none``) takes a finite step."""
    model, params, batch = bf16_setup
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-3, b2=0.999))
    steps = steps_lib.make_jitted_steps(model, None, opt, lora=False, sft=table.SFTConfig(),
                                        master_dtype=None)
    state, m = steps.sft_update(steps.init(params), batch, jax.random.key(1))
    hp = optim.hyperparams(state.opt_state)
    assert hp["b2"].dtype == F32 and float(hp["b2"]) == np.float32(0.999)
    assert int(m["update_skipped"]) == 0
    assert all(np.all(np.isfinite(np.asarray(x, np.float32))) for x in jax.tree.leaves(state.params))
    nu = state.opt_state[1].inner_state[0].nu
    assert {x.dtype for x in jax.tree.leaves(nu)} == {BF16}
    assert any(np.any(np.asarray(x, np.float32) > 0) for x in jax.tree.leaves(nu))


@pytest.mark.parametrize("master,param_bytes", [("float32", 4), ("none", 2)])
def test_planner_counts_the_master(master, param_bytes):
    """The planner lowers the run's own update on ``abstract_state``: under full fine-tuning
    of a bfloat16 model its state holds 4-byte params and moments (2 with ``none``), while
    the weights a program reads stay the bfloat16 policy."""
    from d1jax.plan import compile as plan_lib, programs as plan_programs
    c = config_lib.sft("tiny")
    c.model.dtype = c.model.param_dtype = "bfloat16"
    c.lora.enabled, c.optim.master_weights = False, master
    spec = plan_programs.PlanSpec(plan_lib.as_spec(c), d1jax.preset("test-tiny"))
    (program,) = plan_programs.build_programs(spec, spec.run.mesh.build())
    state = program.args[0]
    n = sum(x.size for x in jax.tree.leaves(state.params))
    moments = state.opt_state[1].inner_state[0]
    assert sum(x.size * x.dtype.itemsize
               for x in jax.tree.leaves((state.params, moments.mu, moments.nu))) \
        == 3 * param_bytes * n
    assert program.weight_bytes == 2 * n


def test_a_bfloat16_moe_with_a_float32_buffer_trains_fully_with_master_weights():
    """LLaDA2 stores its router's ``expert_bias`` in float32 beside bfloat16 weights (their
    checkpoints do): full fine-tuning with float32 masters takes the bfloat16 weights as the
    policy dtype and leaves the buffer float32 in the policy it casts down, bit for bit."""
    from d1jax.model.llada2 import LLaDA2, preset
    from d1jax.train import state as state_lib
    model = LLaDA2(preset("llada2-tiny", num_hidden_layers=2), dtype=jnp.bfloat16,
                   param_dtype=jnp.bfloat16)
    params = d1jax.init_params(model, jax.random.key(0))
    flat = traverse_util.flatten_dict(params)
    bias_key = next(k for k in flat if k[-1] == "expert_bias")
    params = traverse_util.unflatten_dict({**flat, bias_key: (
        jnp.arange(flat[bias_key].size, dtype=jnp.float32).reshape(flat[bias_key].shape) / 3)})
    assert {str(x.dtype) for x in jax.tree.leaves(params)} == {"bfloat16", "float32"}
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-3, warmup_steps=0))
    state = state_lib.init_train_state(params, opt, lora=False, master_dtype=jnp.float32)
    assert state.policy_dtype == np.dtype("bfloat16")
    master = traverse_util.flatten_dict(state.params)
    assert all(v.dtype == jnp.float32 for v in master.values())
    policy = traverse_util.flatten_dict(state.policy_params())
    assert policy[bias_key].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(policy[bias_key]),
                                  np.asarray(traverse_util.flatten_dict(params)[bias_key]))
    assert all(v.dtype == jnp.bfloat16 for k, v in policy.items() if k != bias_key)
    ids = jnp.zeros((1, 8), jnp.int32)
    assert np.isfinite(np.asarray(model.apply({"params": state.policy_params()}, ids),
                                  np.float32)).all()  # the model runs on the cast policy
