"""d1jax.plan on the Dream family: FLOPs of Dream's shapes against a hand count, the
architecture a Dream run plans (config.json or Dream-7B), and tiny Dream programs compiled
for a 4-chip TPU v5e topology whose HLO FLOPs equal the analytic count (skipped without
libtpu)."""

import dataclasses
import json

import pytest

from d1jax import config as config_lib
from d1jax.model import LoraConfig, dream
from d1jax.model.dream import DreamConfig, preset as dream_preset
from d1jax.plan import chips, flops
from tests.test_plan import needs_tpu  # the compile-only TPU topology check

# d 4, 2 query heads of 2 (1 kv head), mlp 6, vocab 8.
_HAND = dict(vocab_size=8, hidden_size=4, intermediate_size=6, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, mask_token_id=7, pad_token_id=6,
             bos_token_id=6, eos_token_id=6)


def test_dream_forward_flops_match_a_hand_count():
    cfg = dream_preset("dream-test-tiny", **_HAND)
    assert set(cfg.projections) == set(dream.LORA_TARGETS)
    f = flops.forward(cfg, batch=2, q_len=3, kv_len=3, head_positions=1)
    # per token: q 4x4, k 4x2, v 4x2 (GQA: one kv head), o 4x4, gate/up/down 3 x 4x6 = 120 MACs
    assert f.base - f.head == 2 * 120 * 2 * 3
    assert f.head == 2 * 4 * 8 * 2 * 1  # untied head: the same matmul as a tied one
    assert f.attention == 2 * (2 * 3 * 3 * 4) * 2  # scores and sum: 3x3 keys x 4 dims, 2 rows
    lora = flops.forward(cfg, 2, 3, 3, 1, LoraConfig(rank=1, targets=("o_proj", "gate_proj")))
    assert lora.lora == 2 * ((4 + 4) + (4 + 6)) * 2 * 3
    # Dream scans every layer over every row: the estimator's last layer is not trimmed to
    # the completion, and each of coupled-GRPO's three copies is a row.
    deep = dream_preset("dream-test-tiny", **{**_HAND, "num_hidden_layers": 3})
    est = flops.estimator(deep, 2, 5, 4, copies=3, peeled=False)
    assert est == flops.forward(deep, 6, 9, 9, 4)
    assert est.base - est.head == 3 * 2 * 120 * 6 * 9
    assert flops.estimator(deep, 2, 5, 4, peeled=True).total < est.total / 3


def test_cached_steps_run_the_row_before_query_only():
    """Dream's cached steps recompute, query-only, the row before the slice (dual, prefix)
    or before each masked position (recompute="masked"): every layer runs its queries,
    attention over all keys, o_proj and the MLP on them, no keys or values. The count
    exceeds the LLaDA-shaped one (``shifted=False``) by exactly those rows."""
    from d1jax.sampling import SamplerConfig
    deep = dream_preset("dream-test-tiny", **{**_HAND, "num_hidden_layers": 3})
    lora = LoraConfig(rank=1, targets=("q_proj", "k_proj"))
    batch, prompt, total = 2, 2, 2 + 8
    # a query-only row in each of 3 layers: q, o (16 MACs each), gate/up/down (72); scores
    # and sums over the 10 keys, 2 heads of 2; the q adapter's 4 + 4 (k's is not run)
    row_base, row_att, row_lora = 3 * 2 * 104, 3 * 4 * total * 4, 3 * 2 * (4 + 4)
    # 2 blocks of 4 in 4 steps of one token: step 0 is the full forward
    dual = dict(gen_length=8, block_length=4, steps=8, kv_cache="dual")
    cases = [(dual, 2 * 3),  # one row before the block at steps 1-3
             (dict(dual, kv_cache="prefix"), 2 * 3),
             (dict(dual, cache_refresh=2), 2 * 2),  # step 2 refreshes: steps 1 and 3
             # the masked positions before the previous step, 4, 3, 2: a row before each
             (dict(dual, recompute="masked"), 2 * (4 + 3 + 2))]
    for kw, rows in cases:
        scfg = SamplerConfig(**kw)
        plain, shifted = (flops.sampler(deep, scfg, batch, prompt, lora, peeled=False,
                                        shifted=s) for s in (False, True))
        assert shifted.head == plain.head, kw
        assert shifted.base - plain.base == batch * rows * row_base, kw
        assert shifted.attention - plain.attention == batch * rows * row_att, kw
        assert shifted.lora - plain.lora == batch * rows * row_lora, kw
    exact = SamplerConfig(gen_length=8, block_length=4, steps=8)  # no cached step
    assert flops.sampler(deep, exact, 2, 2, shifted=True) == flops.sampler(deep, exact, 2, 2)


def test_estimator_rows_by_objective():
    gsm8k = config_lib.grpo("gsm8k", None, checkpoint="dream")
    coupled = config_lib.grpo("sudoku", "authors", objective="coupled_grpo",
                              checkpoint="diffucoder")
    spg = config_lib.grpo("sudoku", None, objective="spg")
    from d1jax.plan.compile import as_spec
    assert flops.estimator_rows(as_spec(gsm8k).grpo) == 1
    assert flops.estimator_rows(as_spec(coupled).grpo) == 3
    assert flops.estimator_rows(as_spec(spg).grpo) == as_spec(spg).grpo.hparams.num_t


def test_lora_first_layer_gradient_runs_inside_a_layer_loop():
    g = flops.Forward(base=10.0, head=4.0, lora=1.0, attention=2.0, first_qkv=0.5)
    peeled = flops.train_step(g, lora=True, remat=False, head_remat=False)
    looped = flops.train_step(g, lora=True, remat=False, head_remat=False, peeled=False)
    assert peeled == (28.5, 28.5) and looped == (28.5, 29.0)  # not model work, but run


def test_architecture_of_a_dream_run(tmp_path):
    from d1jax.plan import compile as plan_lib, programs
    run = plan_lib.as_spec(config_lib.grpo("gsm8k", None, checkpoint="dream"))
    assert run.model.family == "dream" and not run.model.path
    assert programs.architecture(run.model) == dream_preset("dream-7b")
    small = dream_preset("dream-test-tiny", hidden_size=64, num_hidden_layers=3)
    (tmp_path / "config.json").write_text(json.dumps(small.to_hf_dict()))
    got = programs.architecture(dataclasses.replace(run.model, path=str(tmp_path)))
    assert isinstance(got, DreamConfig) and got == small
    llada = plan_lib.as_spec(config_lib.grpo("gsm8k", None))
    assert programs.architecture(llada.model).d_model == 4096  # LLaDA-8B, as before


def test_grid_names_configs_by_their_folder():
    from d1jax.plan import grid
    assert grid.config_name("configs/grpo_gsm8k.py") == "grpo_gsm8k"
    assert grid.config_name("configs/dream/grpo_gsm8k.py") == "dream/grpo_gsm8k"
    assert grid.config_name("configs/diffucoder/coupled_grpo_sudoku.py:authors") == \
        "diffucoder/coupled_grpo_sudoku:authors"
    assert grid.expand(["dream", "configs/sft_s1k.py"]) == \
        [*dream.FAMILY.plan_configs, "configs/sft_s1k.py"]


@needs_tpu
def test_tiny_dream_programs_compile_to_the_analytic_count():
    """A Dream LoRA update (every layer in the scan, the first layer's q/k/v input gradient
    run) and coupled-GRPO's old/reference pass (three copies a row) compiled for v5e:2x2:
    the HLO's loop-aware FLOPs equal the analytic count."""
    import concurrent.futures
    from d1jax.plan import compile as plan_lib
    from d1jax.plan.programs import PlanSpec, build_programs
    chip, devices = chips.topology_devices("v5e:2x2")
    cases = [(config_lib.grpo("gsm8k", "tiny", checkpoint="dream"), "grpo_update"),
             (config_lib.grpo("sudoku", "authors,tiny", objective="coupled_grpo",
                              checkpoint="diffucoder"), "rollout_logps")]
    jobs = []
    for c, name in cases:
        spec = PlanSpec.of(plan_lib.as_spec(c))
        mesh = dataclasses.replace(spec.run.mesh, shape=(1, 4, 1)).build(devices)
        program = next(p for p in build_programs(spec, mesh) if p.name == name)
        jobs.append((program, spec, mesh, plan_lib.lower(program, "v5e:2x2")))
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # as plan() compiles
        estimates = list(pool.map(lambda j: plan_lib.estimate(
            j[0], j[1], j[2], chip, "v5e:2x2", lowered=j[3]), jobs))
    for (program, *_), e in zip(jobs, estimates):
        assert e.fits and e.flops_hardware > 0
        assert e.flops_xla == pytest.approx(e.flops_hardware, rel=0.01), program.name


@needs_tpu
def test_tiny_dream_cached_sampler_compiles_to_the_analytic_count():
    """A Dream eval sampler with the dual cache compiled for v5e:2x2: XLA's loop-aware count
    is the analytic one (the row before the block among every cached step's rows) plus two
    things the walk or the kernel adds: the head switch at its widest branch (the block of 8
    where the static widths are 6, 4, 2) and the cached rows' scores and sums over their own
    block's 8 fresh keys beside the whole cache's (``attend_two_part``; the analytic count
    takes the sequence's keys once)."""
    from d1jax.plan import compile as plan_lib
    from d1jax.plan.programs import PlanSpec
    c = config_lib.eval_config("sudoku,tiny", checkpoint="dream")
    c.model.width, c.model.n_layers, c.model.vocab_size = 512, 1, 1152
    c.eval.gen_lengths, c.sampler.block_length, c.sampler.kv_cache = (16,), 8, "dual"
    c.eval.batch_size, c.max_prompt_length = 8, 16
    (e,) = plan_lib.plan(c, "v5e:2x2", (1, 4, 1), cache_dir="")
    spec = PlanSpec.of(plan_lib.as_spec(c))
    m = spec.model_config
    blocks, cached_steps = 2, 3  # 8 steps of 2 tokens over 2 blocks: 4 a block, 1 full
    widest = 2 * m.width * m.output_vocab * 8 * blocks * ((8 - 6) + (8 - 4) + (8 - 2))
    own = 4 * 8 * blocks * cached_steps * (8 + 1) * 8 * m.query_heads * m.head_dim * m.depth
    assert e.flops_xla == pytest.approx(e.flops_hardware + widest + own, rel=0.01)
    # counted LLaDA's way (no row before the block), the sum falls short by ~4%
    plain = flops.sampler(m, spec.run.eval.samplers[0], 8, 16, peeled=False)
    assert e.flops_xla != pytest.approx(plain.total + widest + own, rel=0.01)
