"""LoRA: zero adapters are the base model, adapters off are the reference, merge for export,
updates touch only adapters, and the bookkeeping (split, join, counts)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import d1jax
from d1jax.model import LoraConfig
from d1jax.model import llada, lora as lora_lib
from d1jax.model.layers import Proj
from d1jax.objectives import table
from d1jax.run import optim
from d1jax.train import jit_steps as steps_lib

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.0)


class Apply:
    """model.apply jitted once per (model, use_lora)."""

    def __init__(self, model):
        self.model = model
        self.fns = {u: jax.jit(lambda p, ids, u=u: model.apply({"params": p}, ids, use_lora=u))
                    for u in (True, False)}

    def __call__(self, params, ids, use_lora=True):
        return np.asarray(self.fns[use_lora](params, ids))


@pytest.fixture(scope="module")
def lora_setup(tiny_config):
    model = d1jax.LLaDA(tiny_config, lora=LORA)
    params = d1jax.init_params(model, jax.random.key(0))
    ids = np.random.RandomState(0).randint(0, 120, (2, 10)).astype(np.int32)
    plain = d1jax.LLaDA(tiny_config)
    return model, plain, params, ids, Apply(model), Apply(plain)


def _with_random_b(params, scale=0.3):
    """Adapters as after training: lora_b no longer zero."""
    flat = traverse_util.flatten_dict(params)
    keys = jax.random.split(jax.random.key(7), len(flat))
    flat = {k: (scale * jax.random.normal(kk, v.shape, v.dtype) if k[-1] == "lora_b" else v)
            for kk, (k, v) in zip(keys, flat.items())}
    return traverse_util.unflatten_dict(flat)


def test_zero_initialised_adapters_give_the_base_logits_exactly(lora_setup):
    _, _, params, ids, apply, apply_plain = lora_setup
    base, adapters = lora_lib.split(params)
    assert all(float(jnp.abs(b).max()) == 0 for b in jax.tree.leaves(adapters["blocks"])
               if b.shape[-2] == LORA.rank)  # every lora_b starts at zero
    want = apply_plain(base, ids)
    np.testing.assert_array_equal(apply(params, ids), want)
    np.testing.assert_array_equal(apply(params, ids, use_lora=False), want)


def test_adapters_off_is_the_base_and_merge_equals_the_adapter_model(lora_setup):
    _, _, params, ids, apply, apply_plain = lora_setup
    trained = _with_random_b(params)
    with_lora = apply(trained, ids)
    base_only = apply_plain(lora_lib.split(trained)[0], ids)
    assert np.abs(with_lora - base_only).max() > 1e-2  # the adapters matter
    np.testing.assert_array_equal(apply(trained, ids, use_lora=False), base_only)
    merged = lora_lib.merge(trained, LORA)
    assert not any(lora_lib.is_adapter(k) for k in traverse_util.flatten_dict(merged))
    np.testing.assert_allclose(apply_plain(merged, ids), with_lora, atol=1e-5)


def test_split_join_and_counts(lora_setup, tiny_config):
    params = lora_setup[2]
    base, adapters = lora_lib.split(params)
    joined = lora_lib.join(base, adapters)
    assert jax.tree.structure(joined) == jax.tree.structure(params)
    c = tiny_config
    d, f, kvd, r = c.d_model, c.mlp_hidden_size, c.n_kv_heads * c.head_dim, LORA.rank
    shapes = {"q_proj": (d, d), "k_proj": (d, kvd), "v_proj": (d, kvd), "attn_out": (d, d),
              "ff_proj": (d, f), "up_proj": (d, f), "ff_out": (f, d)}
    want = c.n_layers * sum(i * r + r * o for i, o in shapes.values())
    counts = lora_lib.param_counts(params)
    assert counts == {"total": c.num_params() + want, "base": c.num_params(), "adapters": want}
    with pytest.raises(ValueError, match="adapters"):
        lora_lib.merge(params, None)


def test_a_grpo_step_changes_only_adapters(lora_setup):
    model, _, params = lora_setup[:3]
    opt = optim.make_optimizer(optim.OptimConfig(learning_rate=1e-2))
    cfg = table.GRPOConfig(num_iterations=1, beta=0.04, grad_accum=1)
    steps = steps_lib.make_jitted_steps(model, None, opt, lora=True, grpo=cfg)
    state = steps.init(params)
    assert state.ref is None  # the reference is the base model, adapters off: no copy
    assert lora_lib.count(state.params) == lora_lib.param_counts(params)["adapters"]
    before = traverse_util.flatten_dict(jax.tree.map(np.asarray, params))
    rs = np.random.RandomState(0)
    batch = dict(prompt_ids=rs.randint(0, 120, (4, 6)).astype(np.int32),
                 prompt_mask=np.ones((4, 6), np.int32),
                 completion_ids=rs.randint(0, 120, (4, 5)).astype(np.int32),
                 completion_mask=np.ones((4, 5), np.int32),
                 advantages=np.array([1.0, -1.0, 0.5, -0.5], np.float32),
                 mask_seeds=np.array([11], np.int32))
    batch.update(steps.rollout_logps(state, batch))
    state, metrics = steps.grpo_update(state, batch, jax.random.key(0))
    assert float(metrics["update_skipped"]) == 0 and float(metrics["kl"]) == 0.0
    after = traverse_util.flatten_dict(state.policy_params())
    for k, v in before.items():
        changed = not np.array_equal(v, np.asarray(after[k]))
        assert changed == (k[-1] == "lora_b") or k[-1] == "lora_a", k  # A: weight decay only
        if k[-1] == "lora_b":
            assert changed, k


def _np_merge(params, lora: LoraConfig):
    """Each targeted kernel + (alpha / r) A @ B in float64 numpy, adapters dropped (PEFT's
    ``merge_and_unload`` with its default scaling alpha / r, not rsLoRA's alpha / sqrt(r))."""
    flat = {k: np.asarray(v, np.float64) for k, v in traverse_util.flatten_dict(params).items()}
    out = {}
    for k, v in flat.items():
        if lora_lib.is_adapter(k):
            continue
        if k[:-1] + ("lora_a",) in flat:
            a, b = flat[k[:-1] + ("lora_a",)], flat[k[:-1] + ("lora_b",)]
            v = v + (lora.alpha / lora.rank) * np.einsum("...ir,...ro->...io", a, b)
        out[k] = v.astype(np.float32)
    return traverse_util.unflatten_dict(out)


@pytest.mark.parametrize("rank, alpha", [(4, 6.0), (8, 2.0)])
def test_lora_scale_is_alpha_over_rank_against_numpy(rank, alpha):
    """One projection: x W + (alpha / r) (x A) B, computed in numpy; alpha / r differs from
    alpha, r / alpha and alpha / sqrt(r) in both cases."""
    cfg = LoraConfig(rank=rank, alpha=alpha, dropout=0.0)
    rs = np.random.RandomState(rank)
    d_in, d_out = 6, 5
    w, a, b = (rs.normal(size=s).astype(np.float32)
               for s in ((d_in, d_out), (d_in, rank), (rank, d_out)))
    x = rs.normal(size=(2, 3, d_in)).astype(np.float32)
    proj = Proj(d_out, ("embed", "mlp"), jnp.float32, jnp.float32, lora=cfg)
    variables = {"params": {"kernel": w, "lora_a": a, "lora_b": b}}
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ w64 + (alpha / rank) * (x64 @ a.astype(np.float64)) @ b.astype(np.float64)
    np.testing.assert_allclose(np.asarray(proj.apply(variables, x)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(proj.apply(variables, x, use_lora=False)), x64 @ w64,
                               rtol=1e-5, atol=1e-5)
    merged = lora_lib.merge({"p": variables["params"]}, cfg)["p"]["kernel"]
    np.testing.assert_allclose(np.asarray(merged), w64 + (alpha / rank) * a @ b, rtol=1e-5,
                               atol=1e-5)


def test_lora_model_equals_the_plain_model_on_numpy_merged_kernels(lora_setup):
    """The whole LoRA model (every target, stacked layers) equals the plain model whose
    kernels are merged in numpy with alpha / r: the scale reaches every projection."""
    _, _, params, ids, apply, apply_plain = lora_setup
    trained = _with_random_b(params)
    np.testing.assert_allclose(apply_plain(_np_merge(trained, LORA), ids), apply(trained, ids),
                               atol=1e-5)


@pytest.mark.parametrize("targets", [("q_proj", "k_proj", "v_proj", "up_proj"),
                                     ("q_proj", "k_proj", "v_proj")], ids=["d1_grpo", "d1_sft"])
def test_only_the_named_targets_get_adapters_and_exports_merge_them(tiny_config, tmp_path,
                                                                    targets):
    """d1's effective target sets (GRPO: q, k, v, up; SFT: q, k, v): adapters exist on those
    projections alone, the other kernels pass merge untouched, and an HF export of the merged
    params loads back as the plain model that reproduces the adapter model's logits."""
    from d1jax.model.llada import weights
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0, targets=targets)
    model, plain = d1jax.LLaDA(tiny_config, lora=lora), d1jax.LLaDA(tiny_config)
    trained = _with_random_b(d1jax.init_params(model, jax.random.key(1)))
    adapted = {k[-2] for k in traverse_util.flatten_dict(trained) if lora_lib.is_adapter(k)}
    assert adapted == set(targets)
    merged = lora_lib.merge(trained, lora)
    base = traverse_util.flatten_dict(lora_lib.split(trained)[0])
    for k, v in traverse_util.flatten_dict(merged).items():
        touched = k[-1] == "kernel" and len(k) > 1 and k[-2] in targets
        assert np.array_equal(np.asarray(v), np.asarray(base[k])) != touched, k
    ids = np.random.RandomState(3).randint(0, 120, (2, 10)).astype(np.int32)
    want = Apply(model)(trained, ids)
    weights.save_hf_checkpoint(tmp_path / "hf", tiny_config, trained, lora=lora)
    _, loaded = weights.load_hf_checkpoint(tmp_path / "hf")
    np.testing.assert_allclose(Apply(plain)(loaded, ids), want, atol=1e-5)


def test_unknown_targets_are_a_config_error():
    """PEFT's Llama names match no LLaDA module (d1's o/gate/down_proj adapt nothing): refused
    by name, in lora.check_targets and in the run config."""
    from d1jax import config as config_lib
    from d1jax.run import spec as spec_lib
    targets = (llada.LORA_TARGETS, "LLaDA")
    assert lora_lib.check_targets(["q_proj", "ff_out"], *targets) == ("q_proj", "ff_out")
    for bad, why in ((("q_proj", "o_proj"), "unknown 'o_proj'"), ((), "empty"),
                     (("q_proj", "q_proj"), "repeated")):
        with pytest.raises(ValueError, match=why):
            lora_lib.check_targets(bad, *targets)
    c = config_lib.grpo("sudoku", "tiny")
    c.lora.targets = ("q_proj", "gate_proj")
    with pytest.raises(config_lib.ConfigError, match="unknown 'gate_proj'.*attn_out, ff_proj"):
        spec_lib.from_config(c)
