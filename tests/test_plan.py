"""d1jax.plan: analytic FLOPs against hand counts, the loop-aware HLO walk against loops of
known trip counts, and tiny programs compiled for a 4-chip TPU v5e topology (skipped
without libtpu)."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import config as config_lib
from d1jax.model import LoraConfig, preset
from d1jax.plan import chips, flops, grid, hlo

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]


def _tpu_available() -> str:
    try:
        chips.topology_devices("v5e:2x2")
    except ImportError as e:
        return str(e)
    return ""


_NO_TPU = _tpu_available()
needs_tpu = pytest.mark.skipif(bool(_NO_TPU), reason=f"no compile-only TPU topology: {_NO_TPU}")


@pytest.fixture(autouse=True, scope="module")
def _plan_cache(tmp_path_factory):
    """Plans here (and the commands they start) compile into a fresh cache, not ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("D1JAX_PLAN_CACHE", str(tmp_path_factory.mktemp("plan_cache")))
        yield


def test_forward_flops_match_a_hand_count():
    # d 4, 2 heads of 2 (kv 1 head), mlp 6, vocab 8, one layer.
    cfg = preset("test-tiny", d_model=4, n_heads=2, n_kv_heads=1, n_layers=1,
                 mlp_hidden_size=6, vocab_size=8, embedding_size=8, mask_token_id=7,
                 eos_token_id=6, pad_token_id=6)
    f = flops.forward(cfg, batch=2, q_len=3, kv_len=3, head_positions=1)
    # per token: q 4x4, k 4x2, v 4x2, out 4x4, gate/up/down 3 x 4x6 = 16+8+8+16+72 = 120 MACs
    assert f.base - f.head == 2 * 120 * 2 * 3
    assert f.head == 2 * 4 * 8 * 2 * 1
    assert f.attention == 2 * (2 * 3 * 3 * 4) * 2  # scores and sum: 3x3 keys x 4 dims, 2 rows
    lora = flops.forward(cfg, 2, 3, 3, 1, LoraConfig(rank=1, targets=("q_proj",)))
    assert lora.lora == 2 * (4 + 4) * 2 * 3


def test_last_layer_rows_count_queries_and_mlp_only_for_those_rows():
    # One layer of the hand count above: k and v (16 MACs a token) for all 3 positions, the
    # rest (104 MACs) and attention for the last_rows = 1 position the output reads.
    cfg = preset("test-tiny", d_model=4, n_heads=2, n_kv_heads=1, n_layers=1,
                 mlp_hidden_size=6, vocab_size=8, embedding_size=8, mask_token_id=7,
                 eos_token_id=6, pad_token_id=6)
    f = flops.forward(cfg, batch=2, q_len=3, kv_len=3, head_positions=1, last_rows=1,
                      lora=LoraConfig(rank=1, targets=("q_proj", "k_proj")))
    assert f.base - f.head == 2 * 2 * (16 * 3 + 104 * 1)
    assert f.attention == 2 * (2 * 1 * 3 * 4) * 2
    assert f.lora == 2 * 2 * ((4 + 2) * 3 + (4 + 4) * 1)
    deep = preset("test-tiny", n_layers=3)
    full, trimmed = (flops.forward(deep, 2, 10, 10, 4, last_rows=r) for r in (None, 4))
    assert trimmed.total < full.total
    assert flops.forward(deep, 2, 10, 10, 4, last_rows=10) == full


def test_train_step_counts_backward_and_recompute():
    f = flops.Forward(base=10.0, head=4.0, lora=1.0, attention=2.0)
    assert flops.train_step(f, lora=False, remat=False, head_remat=False) == (10 * 3 + 3 + 6,) * 2
    model, hw = flops.train_step(f, lora=True, remat=True, head_remat=True)
    assert model == 10 * 2 + 1 * 3 + 2 * 3
    assert hw == model + (13 - 4) + 4  # layers and head once more
    g = flops.Forward(base=10.0, head=4.0, lora=1.0, attention=2.0, first_qkv=0.5)
    # Under LoRA the first layer's q/k/v input gradient is neither model work nor run.
    assert flops.train_step(g, lora=True, remat=False, head_remat=False) == (28.5, 28.5)
    assert flops.train_step(g, lora=False, remat=False, head_remat=False) == (39.0, 39.0)


def test_exact_sampler_is_a_forward_per_step():
    from d1jax.sampling import SamplerConfig
    cfg = preset("test-tiny")
    # 2 blocks of 8 in 2 steps of 4 tokens: the head on the positions that can still be
    # masked, 8 then 4; every layer on the 21 positions, the last one's queries on the block.
    scfg = SamplerConfig(gen_length=16, block_length=8, steps=4)
    layers = flops.forward(cfg, 3, 5 + 16, 5 + 16, 0, last_rows=8)
    got = flops.sampler(cfg, scfg, 3, 5)
    assert got.head == 2 * cfg.d_model * cfg.embedding_size * 3 * 2 * (8 + 4)
    assert got.total == pytest.approx(4 * layers.total + got.head)


def test_exact_sampler_head_runs_on_the_masked_widths():
    """The head's FLOPs are the sum over steps of the masked positions' static width (the
    smallest ceil(12 j / 8) holding them); with CFG the head takes the whole block on both
    passes."""
    from d1jax.sampling import SamplerConfig
    cfg = preset("test-tiny")
    scfg = SamplerConfig(gen_length=24, block_length=12, steps=10)
    per_row = 2 * cfg.d_model * cfg.embedding_size
    # LLaDA's schedule of 12 tokens in 5 steps: 3, 3, 2, 2, 2; at most 12, 9, 6, 4, 2
    # positions masked before each step, widths from 2, 3, 5, 6, 8, 9, 11, 12.
    take = [3, 3, 2, 2, 2]
    assert list(scfg.min_transfer()) == take
    bound = [12 - sum(take[:i]) for i in range(5)]
    width = [min(w for w in (-(-12 * j // 8) for j in range(1, 9)) if w >= b) for b in bound]
    assert width == [12, 9, 6, 5, 2]
    got = flops.sampler(cfg, scfg, 3, 5)
    assert got.head == per_row * 3 * 2 * sum(width)
    layers = flops.forward(cfg, 3, 5 + 24, 5 + 24, 0, last_rows=12)
    assert got.total == pytest.approx(10 * layers.total + got.head)
    guided = flops.sampler(cfg, SamplerConfig(gen_length=24, block_length=12, steps=10,
                                              cfg_scale=1.0), 3, 5)
    assert guided.head == per_row * 6 * 2 * 5 * 12


def test_dual_cache_refreshes_as_configured():
    from d1jax.sampling import SamplerConfig
    cfg = preset("test-tiny")
    # one block of 8, 8 steps of one token; refresh after 4 decoded: full forwards at
    # steps 0 and 4, six cached steps over the 8 block positions.
    scfg = SamplerConfig(gen_length=8, block_length=8, steps=8, kv_cache="dual",
                         cache_refresh=4)
    full = flops.forward(cfg, 1, 10, 10, 8)
    got = flops.sampler(cfg, scfg, 1, 2)
    assert got.attention == pytest.approx(2 * full.attention + 6 * full.attention * 8 / 10)


def test_hlo_walk_multiplies_loops_by_their_trip_counts():
    a = jnp.ones((4, 8), jnp.float32)
    w = jnp.ones((8, 8), jnp.float32)

    def f(a, w):
        def inner(x, _):
            return x @ w, None

        def outer(i, x):
            return jax.lax.scan(inner, x, None, length=5)[0]
        x = jax.lax.fori_loop(0, 3, outer, a)

        def cond(s):
            return (s[1] < 4) & (jnp.sum(s[0]) > -1.0)  # data-dependent, bounded by 4
        x = jax.lax.while_loop(cond, lambda s: (s[0] @ w, s[1] + 1), (x, 0))[0]
        return jax.lax.while_loop(lambda s: s[1] < 7, lambda s: (s[0] @ w, s[1] + 1), (x, 2))[0]
    text = jax.jit(f).lower(a, w).as_text(dialect="hlo")
    walk = hlo.LoopFlops(text)
    one = 2 * 4 * 8 * 8
    assert walk.total() == one * (3 * 5 + 4 + 5)
    assert walk.once() == one * 3
    assert walk.unknown_loops == 0


@needs_tpu
def test_model_forward_hlo_matches_the_analytic_count(tiny_config):
    from d1jax.model import LLaDA
    model = LLaDA(tiny_config, lora=LoraConfig(rank=4))
    ids = jnp.zeros((2, 12), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), ids)
    text = jax.jit(lambda p, x: model.apply(p, x)).lower(params, ids).as_text(dialect="hlo")
    want = flops.forward(tiny_config, 2, 12, 12, 12, model.lora).total
    assert hlo.LoopFlops(text).total() == pytest.approx(want)


def _head_at_the_widest_branch(model_config, scfg, rows: int) -> float:
    """What XLA's loop-aware walk counts beyond the analytic count of an exact sampler (no
    CFG): each step's head switch at its widest branch, the whole block, where the step runs
    at the smallest ceil(block j / 8) (j = 1..8) holding the positions that can still be
    masked (the block less the tokens the earlier steps take)."""
    blk = scfg.block_length
    sizes = sorted({-(-blk * j // 8) for j in range(1, 9)})
    masked = blk - np.concatenate([[0], np.cumsum(scfg.min_transfer())[:-1]])
    widths = [min(w for w in sizes if w >= max(n, 1)) for n in masked]
    return 2.0 * model_config.width * model_config.output_vocab * rows * scfg.num_blocks \
        * sum(blk - w for w in widths)


def _eval_config(batch: int = 8, vocab: int = 0):
    c = config_lib.eval_config("sudoku,tiny")
    # width 512: sharded four ways, kernels keep a 128-wide minor dimension (no tile padding)
    c.model.width, c.model.n_layers, c.model.vocab_size = 512, 1, vocab
    c.eval.gen_lengths, c.sampler.block_length = (16,), 8
    c.eval.batch_size = batch
    c.max_prompt_length = 16
    return c


@pytest.fixture(scope="module")
def sampler_by_fsdp():
    from d1jax.plan import compile as plan_lib
    # vocab 1152: no other axis of the program has that size (the MLP's is 1024)
    return {f: plan_lib.plan(_eval_config(vocab=1152), "v5e:2x2", (4 // f, f, 1))[0]
            for f in (1, 4)}


@needs_tpu
def test_argument_bytes_follow_the_rules(sampler_by_fsdp):
    for e in sampler_by_fsdp.values():  # XLA pads small arrays (ids, norms) to whole tiles
        assert e.argument_bytes_by_rules <= e.argument_bytes <= 1.05 * e.argument_bytes_by_rules
    replicated, sharded = sampler_by_fsdp[1], sampler_by_fsdp[4]
    assert replicated.weights_replicated and not sharded.weights_replicated
    # params dominate the arguments: fsdp 4 keeps about a quarter per chip (norm scales
    # and the batch are not sharded over fsdp alone)
    assert 3.0 < replicated.argument_bytes / sharded.argument_bytes <= 4.0


@needs_tpu
def test_a_repeat_plan_reads_the_cache_and_a_changed_config_compiles(tmp_path):
    """The second plan of a config reads every figure the first compiled; a config whose
    programs differ (a larger batch) compiles again."""
    from d1jax.plan import compile as plan_lib
    c = _eval_config(vocab=1152)
    plan = lambda: plan_lib.plan(c, "v5e:2x2", (1, 4, 1), cache_dir=str(tmp_path))[0]  # noqa: E731
    figures = lambda e: {k: v for k, v in e.row().items() if k not in ("compile_s", "cached")}  # noqa: E731
    first, again = plan(), plan()
    assert not first.cached and again.cached
    assert figures(again) == figures(first)
    c.eval.batch_size = 16
    changed = plan()
    assert not changed.cached
    assert len(list((tmp_path / "figures").glob("*.json"))) == 2
    assert plan_lib.plan(c, "v5e:2x2", (1, 4, 1), cache_dir="")[0].cached is False  # no cache


def test_largest_tensor_with_the_vocab_axis_is_read_from_the_hlo():
    from d1jax.plan import hlo
    text = ("  %a = bf16[4,16,1000]{2,1,0} dot(%x, %w)\n"
            "  %b = f32[2,1000]{1,0} reduce(%a, %c)\n"
            "  %t = (f32[8,1000], s32[]) tuple(%p, %q)\n  %w = f32[64,999] parameter(0)\n"
            "  %v = f32[128,1000]{1,0:T(8,128)S(1)} slice-done(%s)")  # on-chip memory: out
    assert hlo.largest_with_dim(text, 1000) == 4 * 16 * 1000 * 2  # bf16 beats f32[8, 1000]
    assert hlo.largest_with_dim(text, 999) == 64 * 999 * 4
    assert hlo.largest_with_dim(text, 7) == 0
    # a weight's shape (here a's, also as its transpose with a unit axis) is left out
    skip = frozenset({hlo.shape_key((1000, 16, 4, 1))})
    assert hlo.largest_with_dim(text, 1000, skip) == 8 * 1000 * 4
    assert hlo.largest_with_dim(text, {7, 999}) == 64 * 999 * 4  # any of several sizes
    # a gathered weight copy is left out in the weight's dtype only
    typed = frozenset({("bf16", hlo.shape_key((4, 16, 1000)))})
    assert hlo.largest_with_dim(text, 1000, skip_typed=typed) == 8 * 1000 * 4
    assert hlo.largest_with_dim(
        text, 1000, skip_typed=frozenset({("f32", hlo.shape_key((4, 16, 1000)))})) \
        == 4 * 16 * 1000 * 2
    small = "%p = pred[3,50] a\n%q = u8[2,50] b\n%r = f8e4m3fn[4,50] c\n%s = s4[8,50] d"
    assert hlo.largest_with_dim(small, 50) == 4 * 50  # pred, u8, f8: a byte; s4: half


@needs_tpu
def test_unpriced_custom_calls_are_given_back_to_the_time_estimate():
    """libtpu's v5e cost model books -1 s for each ConcatBitcast (here one, in the gradient
    of a 2-step matmul scan sharded over 4 chips); with it given back, the estimate is a
    rate between a fifth of the chip's peak and the peak."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    from d1jax.plan import compile as plan_lib
    chip, devices = chips.topology_devices("v5e:2x2")
    mesh = jax.sharding.Mesh(devices[:4], ("x",))
    x = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))
    w = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P(None, "x")))

    def loss(x, w):
        step = lambda h, wi: ((h @ wi).astype(h.dtype), None)
        return jax.lax.scan(step, x, jnp.stack([w, w]))[0].astype(jnp.float32).sum()
    compiled = jax.jit(jax.grad(loss, argnums=1)).lower(x, w).compile()
    cost, text = compiled.cost_analysis(), compiled.as_text()
    assert hlo.unpriced_custom_calls(text) >= 1 and cost["optimal_seconds"] < 0
    seconds = plan_lib._xla_seconds(cost, text, cost["flops"] / chip.peak_bf16_flops)
    # cost_analysis counts one chip's share of the SPMD program
    assert 0.2 * chip.peak_bf16_flops < cost["flops"] / seconds < chip.peak_bf16_flops
    assert hlo.unpriced_custom_calls('x = f32[2] custom-call(), custom_call_target="Other"') \
        == 0
    # MoE programs' gathers (a tiny LLaDA2 SFT update on v5p-8: six, -5.996 s)
    assert hlo.unpriced_custom_calls('custom_call_target="AssumeGatherIndicesInBound"') == 1
    # of 3 such calls only as many are given back as bring the rate within the peak
    three = 'custom_call_target="ConcatBitcast"\n' * 3
    assert plan_lib._xla_seconds({"optimal_seconds": -1.75}, three, 0.1) == 0.25
    assert plan_lib._xla_seconds({"optimal_seconds": -9.75}, three, 0.1) == -6.75  # at most 3
    assert plan_lib._xla_seconds({"optimal_seconds": 0.5}, three, 0.1) == 0.5
    assert plan_lib._xla_seconds({"optimal_seconds": -1.75}, "", 0.1) == -1.75  # none: as is


@needs_tpu
def test_sampler_holds_the_block_logits_not_the_sequence(sampler_by_fsdp):
    """The exact sampler's head runs on the block: its largest vocab-axis tensor is
    logits of the block's rows, well under the chip's [B, L, V] (L = prompt + gen)."""
    for e in sampler_by_fsdp.values():
        assert 0 < e.vocab_tensor_bytes < 0.5 * e.logits_bytes_per_chip
        assert e.logits_materialised is False


@needs_tpu
def test_sft_head_gathered_over_fsdp_is_not_taken_for_logits():
    """SFT with a tensor axis (the grid's 8 rows on 32 chips): the head, gathered over fsdp
    and still sharded over tensor, is the largest vocab-axis array; it is a weight, and the
    chunked head holds no [B, L, V] logits."""
    from d1jax.plan import compile as plan_lib
    c = config_lib.sft("tiny")
    c.model.width, c.model.n_layers, c.model.vocab_size = 10240, 1, 17408
    c.model.dtype = c.model.param_dtype = "bfloat16"
    c.sft.max_length = 2048  # 8 x 2048 x 17408 float32 logits: 1.1 GiB, in chunks of 256
    (e,) = plan_lib.plan(c, "v5e:2x2", (1, 2, 2))
    head_gathered = 17408 // 2 * 10240 * 2  # bf16 [V / tensor, D]
    assert head_gathered >= 0.5 * e.logits_bytes_per_chip  # what the check must skip
    assert 0 < e.vocab_tensor_bytes < 0.5 * e.logits_bytes_per_chip
    assert e.logits_materialised is False


@needs_tpu
def test_loop_aware_flops_match_the_analytic_count(sampler_by_fsdp):
    """XLA's count walks the sampler's head switch at its widest branch, the whole block of
    8 (``hlo.LoopFlops``: a conditional's costliest branch); the analytic count takes the
    static width of each step, here 8, 6, 4, 2 (2 tokens a step): the difference is the
    head on the other 0 + 2 + 4 + 6 positions of each of 2 blocks, 8 rows."""
    e = sampler_by_fsdp[4]
    widest = 2 * 512 * 1152 * 8 * 2 * (0 + 2 + 4 + 6)
    assert e.flops_xla == pytest.approx(e.flops_hardware + widest, rel=0.01)
    assert e.flops_xla_once < e.flops_xla / 3  # 2 blocks x 4 steps, counted once by XLA
    assert 0 < e.seconds and 0 < e.mfu < 1


# The tiny eval sampler on v5e:2x2 (4 chips, mesh 4,1,1) with a batch no chip can hold:
# 2^21 rows, vocab 2^16, blocks of 8. The block's float32 logits alone are
# 2^21 / 4 x 8 x 2^16 x 4 bytes = 1 TiB a chip, and XLA refuses to compile it: "Ran out of
# memory on HBM, the total memory required for HLO temporaries (2.00T) exceeds ...".
_TOO_LARGE = ["--config=configs/eval.py:sudoku,tiny", "--config.eval.batch_size=2097152",
              "--config.model.vocab_size=65536", "--config.eval.gen_lengths=(16,)",
              "--config.max_prompt_length=16", "--config.sampler.block_length=8",
              "--config.model.n_layers=1"]
_BLOCK_LOGITS_PER_CHIP = 2**21 // 4 * 8 * 2**16 * 4


def test_xla_refusals_for_memory_are_read_in_every_unit():
    """libtpu's two messages for a program over HBM, binary units (its "32.00G" for a
    program of 32 GiB of arguments); any other message is not a refusal for memory."""
    from d1jax.plan.compile import oom_bytes
    msg = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
           "temporaries ({}) exceeds available HBM (95.74G).")
    assert oom_bytes(msg.format("8.32T")) == int(8.32 * 2**40)
    assert oom_bytes(msg.format("32.00G")) == 32 * 2**30
    assert oom_bytes(msg.format("1.50P")) == int(1.5 * 2**50)
    assert oom_bytes(msg.format("512B")) == 512
    assert oom_bytes("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory "
                     "in memory space hbm. Used 17.25G of 15.75G hbm. Exceeded hbm capacity "
                     "by 1.50G.") == int(17.25 * 2**30)
    assert oom_bytes("Ran out of memory in memory space vmem. Used 130.00M of 128.00M vmem.") \
        is None  # on-chip scratch, not HBM: a compile failure of its own
    assert oom_bytes("INVALID_ARGUMENT: Custom emitter for foo not found") is None


def test_weights_replicated_reads_the_weights_shardings_not_the_argument_bytes():
    """Full fine-tuning in bfloat16 on 4 chips (CPU devices; nothing compiled): fsdp 4 holds
    a quarter of the float32 master weights and AdamW moments a chip, more bytes than the
    bfloat16 weights (what the column once compared), and is no replicated copy; data 4
    holds every element of them on every chip, and is."""
    import dataclasses as dc
    from d1jax.plan import compile as plan_lib
    from d1jax.plan.programs import PlanSpec, build_programs
    c = config_lib.grpo("sudoku", "tiny")
    c.lora.enabled, c.model.param_dtype = False, "bfloat16"
    spec = PlanSpec.of(plan_lib.as_spec(c))
    assert spec.run.optim.master_dtype == jnp.float32

    def estimates(shape):
        mesh = dc.replace(spec.run.mesh, shape=shape).build(jax.devices()[:4])
        fields = {f.name: 0 for f in dc.fields(plan_lib.Estimate)}
        out = {}
        for p in build_programs(spec, mesh):
            fields.update(program=p.name, mesh=dict(mesh.shape), weight_bytes=p.weight_bytes,
                          argument_bytes=plan_lib._per_chip_bytes(p.args),
                          weight_share=plan_lib.weight_share(p.weight_args))
            out[p.name] = plan_lib.Estimate(**fields)
        return out

    sharded, replicated = estimates((1, 4, 1)), estimates((4, 1, 1))
    update = sharded["grpo_update"]
    assert update.argument_bytes >= update.weight_bytes  # the old test's YES
    for name in ("rollout", "rollout_logps", "grpo_update"):
        assert sharded[name].weight_share < 0.3, name  # a quarter (norm scales whole)
        assert not sharded[name].weights_replicated, name
        assert replicated[name].weight_share == 1.0 and replicated[name].weights_replicated
    # one chip holds everything, and that is no waste
    one = dc.replace(replicated["rollout"], mesh={"data": 1, "fsdp": 1, "tensor": 1})
    assert not one.weights_replicated


@needs_tpu
def test_plan_only_the_programs_named(sampler_by_fsdp):
    from d1jax.plan import compile as plan_lib
    c = _eval_config(vocab=1152)
    c.eval.gen_lengths = (16, 32)
    only = plan_lib.plan(c, "v5e:2x2", (1, 4, 1), programs=("eval_sampler_16",))
    assert [e.program for e in only] == ["eval_sampler_16"]
    assert only[0].cached  # the fixture's program: read back, not compiled again
    with pytest.raises(ValueError, match="no program 'rollout' in this run: its programs are "
                                         "eval_sampler_16, eval_sampler_32"):
        plan_lib.plan(c, "v5e:2x2", (1, 4, 1), programs=("rollout",))


@needs_tpu
def test_oversized_config_is_refused_with_one_line(tmp_path):
    from d1jax.plan import compile as plan_lib
    big = _eval_config(batch=2**15, vocab=2**16)  # 16 GiB of block logits per chip
    with pytest.raises(plan_lib.DoesNotFit) as err:
        plan_lib.check_fits(big, "v5e:2x2", (1, 4, 1))
    line = str(err.value)
    assert "\n" not in line and line.startswith("eval_sampler_16 does not fit on v5e:2x2")
    assert "GiB per chip" in line and "usable" in line


@needs_tpu
def test_cli_reports_a_program_xla_refuses_for_memory(tmp_path):
    """A program XLA refuses to compile for lack of HBM (terabytes a chip) is a row of the
    table marked NO (XLA), with XLA's total, and a line with the advice; exit 1, no
    traceback."""
    import json
    cmd = [sys.executable, "-m", "d1jax.plan", *_TOO_LARGE, "--topology=v5e:2x2",
           "--mesh=4,1,1", f"--json={tmp_path / 'plan.json'}"]
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # a user's shell
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    *progress, last = out.stderr.strip().splitlines()
    assert last.startswith("eval_sampler_16 does not fit on v5e:2x2 (v5e): needs ") \
        and "(XLA's figure: it refused to compile it)" in last \
        and "--config.mesh.shape='(1,4,1)' (d1jax.plan: --mesh=1,4,1)" in last, last
    (row,) = json.loads((tmp_path / "plan.json").read_text())
    assert row["refused"] and not row["fits"]
    assert row["total_bytes"] >= _BLOCK_LOGITS_PER_CHIP  # XLA's figure: at least the logits
    gib = row["total_bytes"] / 2**30
    assert f"needs {gib:,.1f} GiB per chip" in last
    cells = next(ln for ln in out.stdout.splitlines() if ln.startswith("| eval_sampler_16 |"))
    cells = [c.strip() for c in cells.strip("|").split("|")]
    assert cells[1:3] == ["4,1,1", "off"] and cells[5] == f"{gib:,.2f}" \
        and cells[7] == "NO (XLA)" and cells[10:12] == ["-", "-"], cells  # no time estimate
    # Nothing but the planner's own lines: libtpu's complaints about the absent TPU are muted.
    assert all(ln.startswith("compiled ") for ln in progress), out.stderr[-2000:]


@needs_tpu
def test_a_refused_program_leaves_the_others_planned(monkeypatch):
    """XLA's refusal is an estimate like any other: the programs beside it (here a small
    one added to the run's) are still compiled and returned, in order."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    from d1jax.plan import compile as plan_lib
    from d1jax.plan.programs import PlannedProgram as Program
    real = plan_lib.build_programs

    def with_a_small_program(spec, mesh):
        x = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P()))
        small = Program("small", lambda: jax.jit(lambda a: a * 2).lower(x), (x,), 0.0, 0.0,
                        loop_bound=1, weight_bytes=0, logits_bytes=0)
        return real(spec, mesh) + [small]
    monkeypatch.setattr(plan_lib, "build_programs", with_a_small_program)
    big = _eval_config(batch=2**21, vocab=2**16)
    refused, small = plan_lib.plan(big, "v5e:2x2", (4, 1, 1), cache_dir="")
    assert refused.program == "eval_sampler_16" and refused.refused and not refused.fits
    assert refused.total_bytes >= _BLOCK_LOGITS_PER_CHIP > refused.capacity_bytes
    assert small.program == "small" and small.fits and not small.refused
    assert 8 * 128 * 4 <= small.total_bytes < 2**20


@needs_tpu
def test_main_check_fits_stops_before_the_run(tmp_path):
    """``d1jax.main --check_fits`` refuses a run whose programs do not fit (here XLA refuses
    to compile it), with the planner's line, before anything is written to its workdir."""
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "d1jax.main", *_TOO_LARGE, f"--workdir={workdir}",
           "--check_fits=v5e:2x2", "--config.mesh.shape=(4,1,1)"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: eval_sampler_16 does not fit on v5e:2x2 (v5e): needs "), last
    assert "(XLA's figure: it refused to compile it)" in last
    assert not workdir.exists()


@needs_tpu
@pytest.mark.parametrize("topology, mesh, says", [
    ("v5e:3x3", "(1,4,1)", "error: libtpu does not build TPU topology 'v5e:3x3' "),
    ("v5e:2x2", "(3,1,1)", "error: mesh.shape=(3, 1, 1): mesh shape (3, 1, 1) needs 3 devices, "
                           "have 4")])
def test_main_check_fits_names_a_topology_or_mesh_it_cannot_plan(tmp_path, topology, mesh,
                                                                 says):
    cmd = [sys.executable, "-m", "d1jax.main", "--config=configs/eval.py:sudoku,tiny",
           f"--workdir={tmp_path / 'run'}", f"--check_fits={topology}",
           f"--config.mesh.shape={mesh}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(says), out.stderr[-2000:]


@needs_tpu
def test_a_program_xla_cannot_compile_is_one_line_naming_it(monkeypatch):
    """A compile failure other than memory (here libtpu has no emitter for a custom call)
    ends the plan with one DoesNotFit line naming the program and XLA's reason."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    from d1jax.plan import compile as plan_lib
    from d1jax.plan.programs import PlannedProgram as Program
    real = plan_lib.build_programs

    def with_a_custom_call(spec, mesh):
        x = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P()))
        call = jax.ffi.ffi_call("d1jax_no_such_target", x)
        bad = Program("custom_call", lambda: jax.jit(call).lower(x), (x,), 0.0, 0.0,
                      loop_bound=1, weight_bytes=0, logits_bytes=0)
        return real(spec, mesh) + [bad]
    monkeypatch.setattr(plan_lib, "build_programs", with_a_custom_call)
    with pytest.raises(plan_lib.DoesNotFit) as err:
        plan_lib.plan(_eval_config(), "v5e:2x2", (1, 4, 1), cache_dir="")
    assert str(err.value) == ("custom_call does not compile for v5e:2x2: INVALID_ARGUMENT: "
                              "Custom emitter for d1jax_no_such_target not found")


@needs_tpu
@pytest.mark.parametrize("stage, names", [
    ("grpo", ["rollout", "rollout_logps", "grpo_update"]), ("sft", ["sft_update"]),
    ("grpo-loop", ["rollout", "rollout_logps", "grpo_update"])])
def test_training_programs_compile_and_match_the_analytic_count(stage, names):
    from d1jax.plan import compile as plan_lib
    from d1jax.plan.programs import PlanSpec
    c = config_lib.grpo("gsm8k", "tiny") if stage.startswith("grpo") else \
        config_lib.sft("tiny")
    # bfloat16 params with accumulated micro-batches: the default 8B run's update path
    c.model.dtype, c.model.param_dtype, c.optim.grad_accum = "bfloat16", "bfloat16", 2
    if stage == "grpo-loop":  # 8B's layout: first and last layer around a loop of 2
        c.model.n_layers, c.model.unroll_layers = 4, False
    estimates = plan_lib.plan(c, "v5e:2x2", (1, 4, 1))
    assert [e.program for e in estimates] == names
    spec = PlanSpec.of(plan_lib.as_spec(c)) if stage.startswith("grpo") else None
    for e in estimates:
        assert e.fits and e.flops_hardware > 0
        widest = 0  # the rollout's head switch, walked at its widest branch
        if e.program == "rollout":
            widest = _head_at_the_widest_branch(spec.model_config, spec.run.sampler,
                                                e.sequences)
        assert e.flops_xla == pytest.approx(e.flops_hardware + widest, rel=0.01), e.program


@needs_tpu
def test_skipped_head_chunks_keep_the_programs_priced(monkeypatch):
    """Head chunks past the completion mask are skipped under a cond whose predicate is
    reduced over the rows, which the (1, 4, 1) mesh shards: XLA's TPU cost model must still
    price the log-prob and update programs (a boolean all-reduce there was booked at -1 s,
    and the plan showed NaN seconds). A 1-byte chunk budget gives the tiny programs a head
    chunk per position."""
    from d1jax.objectives import logprob
    from d1jax.plan import compile as plan_lib
    monkeypatch.setattr(logprob, "ACCELERATOR_CHUNK_BYTES", 1)
    for e in plan_lib.plan(config_lib.grpo("gsm8k", "tiny"), "v5e:2x2", (1, 4, 1)):
        assert np.isfinite(e.seconds) and e.seconds > 0, (e.program, e.xla_seconds_once)


def test_advice_names_only_changes_the_batch_checks_accept():
    """An SFT update that does not fit with remat, 8 rows on 8 chips: one row a chip cannot
    split into micro-batches, so the advice is a shorter sequence; GRPO's 96 rows on 4 chips
    (24 a chip, 2 micro-batches) can take 4."""
    import dataclasses as dc
    from d1jax.plan import compile as plan_lib
    fields = {f.name: 0 for f in dc.fields(plan_lib.Estimate)}
    fields.update(program="sft_update", topology="v5e-8", chip="v5e", remat=True,
                  mesh={"data": 1, "fsdp": 8, "tensor": 1}, weight_bytes=1)
    e = plan_lib.Estimate(**fields)
    sft_config = config_lib.sft(None)
    sft_config.sft.batch_size, sft_config.sft.max_length = 8, 4096
    sft_config.optim.grad_accum = 4
    sft = plan_lib.as_spec(sft_config)  # the advice reads the run's spec, not its config
    assert plan_lib.advice(e, sft) == ("use more chips, a chip with more HBM, or shorter "
                                       "sequences (--config.sft.max_length=2048)")
    sft_config.optim.grad_accum = 1
    sft = plan_lib.as_spec(sft_config)
    # 16 chips: fsdp 16 would leave half the chips without a row; fsdp 2 gives 4 rows a chip
    small = dc.replace(e, mesh={"data": 1, "fsdp": 2, "tensor": 8})
    assert plan_lib.advice(small, sft) == ("split the batch into more micro-batches: "
                                           "--config.optim.grad_accum=2")
    gsm8k = plan_lib.as_spec(config_lib.grpo("gsm8k", None))
    grpo = dc.replace(e, program="grpo_update", mesh={"data": 1, "fsdp": 4, "tensor": 1})
    assert plan_lib.advice(grpo, gsm8k).endswith("--config.optim.grad_accum=4")
    assert plan_lib.advice(dc.replace(grpo, remat=False), gsm8k) == \
        "turn remat on: --config.model.remat=True"
    # the old/ref log-prob pass sees every row of the step at once: micro-batches do not help
    assert plan_lib.advice(dc.replace(grpo, program="rollout_logps"), gsm8k) == \
        "fewer prompts per step (--config.grpo.prompts_per_step), more chips or a chip with " \
        "more HBM"
    # the rollout: smaller sampler calls (TraDo's 1,024 rows, fsdp 4), then a shorter completion
    trado = plan_lib.as_spec(grid.load_config("configs/sdar/tracerl_math.py"))
    rollout = dc.replace(grpo, program="rollout")
    assert plan_lib.advice(rollout, dc.replace(trado, grpo_run=dc.replace(
        trado.grpo_run, rollout_batch=0))).startswith(
        "generate in smaller sampler calls: --config.grpo.rollout_batch=512 (now 1024 rows")
    assert plan_lib.advice(rollout, trado).startswith(
        f"generate in smaller sampler calls: --config.grpo.rollout_batch="
        f"{trado.grpo_run.rollout_batch // 2} (now {trado.grpo_run.rollout_batch} rows")
    smallest = dc.replace(trado, grpo_run=dc.replace(trado.grpo_run, rollout_batch=4))
    assert plan_lib.advice(rollout, smallest).startswith(
        "generate a shorter completion (--config.sampler.gen_length=1000)")


def test_topology_names():
    assert chips.parse_topology("v5p-8")[1:] == ("v5p:2x2x1", (2, 2, 1))
    assert chips.parse_topology("v5litepod-16")[1:] == ("v5e:4x4", (4, 4))
    with pytest.raises(ValueError, match="unknown TPU topology 'v9:2x2'"):
        chips.parse_topology("v9:2x2")
    assert np.isclose(chips.V5P.peak_bf16_flops, 459e12)


def test_grid_mesh_covers_every_chip_with_the_rows_it_has():
    from d1jax.plan import grid
    from d1jax.plan.compile import as_spec
    sft_config = config_lib.sft(None)
    sft_config.sft.batch_size, sft_config.optim.grad_accum = 8, 1
    gsm8k, sft = as_spec(config_lib.grpo("gsm8k", None)), as_spec(sft_config)
    # 96 rows in 2 micro-batches: 48 a micro-batch, 3 rows a chip on 32 chips would not split
    assert grid.mesh_for(gsm8k, 4) == (1, 4, 1) and grid.mesh_for(gsm8k, 32) == (1, 16, 2)
    for chips_n in (4, 8, 16, 32):
        d, f, t = grid.mesh_for(gsm8k, chips_n)
        config_lib.check_batch(96, 6, d * f, "rows", gsm8k.optim.grad_accum)  # no error
    assert grid.mesh_for(sft, 8) == (1, 8, 1)
    assert grid.mesh_for(sft, 32) == (1, 8, 4)  # 8 rows: the rest on the tensor axis


@needs_tpu
def test_grid_compiles_each_distinct_program_once(tmp_path):
    """Two configs with the same shapes: the second's rows reuse the first's compiles (same
    lowered HLO), and the markdown table has a row per program of each."""
    from d1jax.plan import grid
    files = []
    for task in ("gsm8k", "math"):
        f = tmp_path / f"grpo_{task}.py"
        f.write_text("from d1jax import config\n\n\ndef get_config(arg=None):\n"
                     f"    c = config.grpo({task!r}, 'tiny')\n"
                     "    c.model.width, c.model.n_layers = 128, 1\n"
                     "    return c\n")
        files.append(str(f))
    seen: dict = {}
    first = grid.plan_config(files[0], "v5e:2x2", seen)
    second = grid.plan_config(files[1], "v5e:2x2", seen)
    names = ["rollout", "rollout_logps", "grpo_update"]
    assert [r["program"] for r in first] == names == [r["program"] for r in second]
    assert all(r["fits"] and not r["remat"] and r["same_as"] == "" for r in first)
    assert all(r["same_as"] == files[0] and r["config"] == files[1] for r in second)
    assert [r["temp_bytes"] for r in first] == [r["temp_bytes"] for r in second]
    looped = grid.plan_config(files[0], "v5e:2x2", {}, layers="loop")
    assert [r["layers"] for r in looped] == ["loop"] * 3  # 1 layer: the override is recorded
    table = grid.markdown(first + second).splitlines()
    assert len(table) == 2 + 6 and \
        "| grpo_math | v5e:2x2 | 1,4,1 | unrolled | off | grpo_update |" \
        in table[-1] and table[-1].endswith("| = grpo_gsm8k |")
    # one line per config: a rollout cycle is the rollout, its log-probs and mu updates
    lines = grid.summary(first + second, iterations=lambda path: 3).splitlines()
    assert len(lines) == 2 + 2 and lines[2].startswith("| grpo_gsm8k | v5e:2x2 | 1,4,1 | off |")
    by = {r["program"]: r["seconds"] for r in first}
    cycle = by["rollout"] + by["rollout_logps"] + 3 * by["grpo_update"]
    assert lines[2].endswith(f"| {cycle:.3g} |") and lines[3].endswith(f"| {cycle:.3g} |")
    # Rows measured before (a grid's JSON) stand for a known config: its programs are only
    # lowered, and a config with the same HLO takes those rows, compiling nothing.
    stored = [dict(r, temp_bytes=-1) for r in first]  # marked: not what a compile gives
    seen = {}
    assert grid.plan_config(files[0], "v5e:2x2", seen, known=stored) == []
    from d1jax.plan import compile as plan_lib
    compiled = []
    real = plan_lib.estimate
    plan_lib.estimate = lambda *a, **k: compiled.append(a) or real(*a, **k)
    try:
        again = grid.plan_config(files[1], "v5e:2x2", seen)
    finally:
        plan_lib.estimate = real
    assert compiled == [] and [r["temp_bytes"] for r in again] == [-1] * 3
    assert all(r["same_as"] == files[0] and r["config"] == files[1] for r in again)
