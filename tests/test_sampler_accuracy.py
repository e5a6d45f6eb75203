"""bench/sampler_accuracy.py on a random tiny model saved in the Hugging Face layout."""

import csv
import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import d1jax
from d1jax.eval import evaluate as eval_lib
from d1jax import sampling as smp
from d1jax import tasks
from d1jax.model.llada import weights
from d1jax.tasks import sudoku
from d1jax.model.tokenizer import special_ids, train_tiny_tokenizer
from d1jax.model.tokenizer import encode_prompts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import sampler_accuracy  # noqa: E402
from examples.demo import task as demo_task  # noqa: E402  (bench puts the repo root on sys.path)

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

GEN, BLOCK, PROMPT = 16, 8, 44  # 16 digits: one answer; two blocks; compact prompt tokens


def make_model(out_dir: Path, tmp: Path) -> None:
    """Random test-tiny LLaDA whose head predicts only the digits 1-4: logits +-w1.h and
    +-w2.h against 0 for every other token, w1 and w2 the main directions along which the
    masked positions' hidden states vary. Completions are 16-digit answers (some cells
    right by chance) that vary by puzzle and position, with confidences across (0, 1)."""
    train = sudoku.generate_puzzles(200, seed=1)
    tok = train_tiny_tokenizer([t for ex in train for t in
                                (sudoku.question(ex), f"<answer>\n{ex['solution']}\n</answer>")],
                               tmp / "tokenizer", vocab_size=320)
    ids = special_ids(tok)
    vocab = -(-len(tok) // 64) * 64
    cfg = d1jax.preset("test-tiny", vocab_size=vocab, embedding_size=vocab,
                       mask_token_id=ids["mask"], eos_token_id=ids["eos"],
                       pad_token_id=ids["pad"], max_sequence_length=256)
    model = d1jax.LLaDA(cfg)
    p = d1jax.init_params(model, jax.random.key(0))
    p["blocks"] = jax.tree_util.tree_map(lambda x: x * 10 if x.ndim == 3 else x, p["blocks"])
    task = demo_task.make_task()
    x, _ = encode_prompts(tok, [task.eval_prompt(tok, ex) for ex in train[:64]], PROMPT)
    x = np.concatenate([x, np.full((64, GEN), ids["mask"], np.int32)], 1)
    h = np.asarray(model.apply({"params": p}, x, method=model.hidden))[:, PROMPT:]
    h = h.reshape(-1, cfg.d_model) - h.reshape(-1, cfg.d_model).mean(0)
    w = np.linalg.svd(h, full_matrices=False)[2][:2].T  # [D, 2]
    w = w * 8.0 / (h @ w).std(0)
    k = np.zeros((cfg.d_model, vocab), np.float32)
    for j, d in enumerate("1234"):
        k[:, tok.convert_tokens_to_ids(d)] = (-1) ** j * w[:, j // 2]
    p["ff_out"] = {"kernel": jnp.asarray(k)}
    weights.save_hf_checkpoint(out_dir, cfg, p)
    tok.save_pretrained(out_dir)


@pytest.fixture(scope="module")
def bench_inputs(tmp_path_factory):
    """(model dir, puzzles CSV, its 16 puzzles, the loaded model), shared by the tests."""
    tmp = tmp_path_factory.mktemp("sampler_accuracy")
    model_dir, puzzles = tmp / "model", tmp / "puzzles.csv"
    make_model(model_dir, tmp)
    examples = sudoku.generate_puzzles(16, seed=5)
    with open(puzzles, "w", newline="") as f:
        csv.writer(f).writerows([("Puzzle", "Solution")] +
                                [(ex["puzzle"], ex["solution"]) for ex in examples])
    return model_dir, puzzles, examples, sampler_accuracy.load(str(model_dir))


REFERENCE = {"sampler": {"batch": 8, "prompt_len": 64, "gen_length": 128, "block_length": 32,
                         "steps": 64, "times_s": [8.0, 7.0, 9.0]}}


@pytest.fixture(scope="module")
def bench_run(bench_inputs):
    """One run of every variant (tau 0.7 and the cached samplers without a threshold, refresh
    1) on the unpadded prompts, read by both tests below: compiling the variants is nearly
    all of its time, so no second tau (tau 1 is the exact sampler with or without a cache:
    tests/test_fast_sampler.py)."""
    model_dir, puzzles, _, s = bench_inputs
    return sampler_accuracy.run(str(model_dir), str(puzzles), num=16, gen_length=GEN,
                                block_length=BLOCK, batch_size=8, taus=(0.7,), repeats=1,
                                s=s, refreshes=(1,), reference=REFERENCE)


def test_sampler_accuracy_run(bench_inputs, bench_run, tmp_path):
    model_dir, puzzles, examples, s = bench_inputs
    res = bench_run
    rows = res["variants"]
    assert res["prompt_length"] == PROMPT and res["num"] == 16
    assert res["reference_tokens_per_s"] == 128.0  # 8 * 128 tokens / median 8.0 s
    assert res["reference_workload_matches"] is False  # gen 16 here, 128 there
    for r in rows.values():
        assert r["speedup_vs_reference"] == pytest.approx(r["tokens_per_s_median"] / 128.0,
                                                          rel=1e-3)
    kvs = ("none", "prefix", "dual", "dual_masked")
    assert set(rows) == ({"exact", "prefix", "dual", "dual_masked", "dual+refresh1"}
                         | {f"{kv}+tau0.7" for kv in kvs}
                         | {f"{kv}+tau0.7+refresh1" for kv in ("dual", "dual_masked")})
    assert rows["dual_masked"]["recompute"] == "masked"
    # A refresh after every decoded token is a full forward per step: the exact sampler.
    assert rows["dual+refresh1"]["accuracy"] == rows["exact"]["accuracy"]

    # Exact: the accuracy d1's protocol (eval.generate_texts, task.verdict) gives.
    task = demo_task.make_task()
    scfg = smp.SamplerConfig(gen_length=GEN, block_length=BLOCK, steps=GEN // 2,
                             mask_id=s.model_config.mask_token_id, eos_id=s.ids["eos"])
    texts = eval_lib.generate_texts(s, task, examples, scfg, batch_size=8, prompt_length=PROMPT)
    verdicts = [task.verdict(task.record(ex, t)) for ex, t in zip(examples, texts)]
    accuracy = 100.0 * sum(v.hits for v in verdicts) / sum(v.total for v in verdicts)
    assert 0 < accuracy < 100  # the model's answers are parsed, and vary
    assert rows["exact"]["accuracy"] == round(accuracy, 4)
    assert rows["exact"]["forwards_per_token"] == 0.5  # steps / gen_length
    assert rows["exact"]["block_steps_mean"] == [4.0, 4.0]  # 8 steps over 2 blocks
    for r in rows.values():  # the per-block means add up to the forwards per token
        assert sum(r["block_steps_mean"]) / GEN == pytest.approx(r["forwards_per_token"], 1e-2)
    assert rows["dual+refresh1"]["accuracy_vs_exact"] == 0.0
    for r in rows.values():
        assert 0 <= r["accuracy"] <= 100 and 0 <= r["solved"] <= 100
        assert r["tokens_per_s"] > 0 and r["speedup_vs_exact"] > 0
        assert 0 < r["forwards_per_token"] <= 0.5
    assert min(rows[f"{kv}+tau0.7"]["forwards_per_token"] for kv in kvs) < 0.5  # tau acted

    sampler_accuracy.plot(res, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_sampler_accuracy_padded_prompts_and_variant_subset(bench_inputs, bench_run):
    """--prompt-length left-pads (BENCH.md's 64-token prompts) with the padding masked out:
    RoPE scores depend only on relative positions, so the answers equal the unpadded ones
    (the module's run of every variant), and d1's protocol with the same padding agrees.
    --only keeps exact and the named ones."""
    model_dir, puzzles, examples, s = bench_inputs
    kw = dict(num=16, gen_length=GEN, block_length=BLOCK, batch_size=8, taus=(0.7,), repeats=1,
              s=s, only=("dual+tau0.7",))
    plain = bench_run  # same puzzles, model and sampler settings, unpadded
    padded = sampler_accuracy.run(str(model_dir), str(puzzles), prompt_length=PROMPT + 20, **kw)
    assert set(padded["variants"]) == {"exact", "dual+tau0.7"}
    assert padded["prompt_length"] == PROMPT + 20 and plain["prompt_length"] == PROMPT
    for m in ("exact", "dual+tau0.7"):
        assert padded["variants"][m]["accuracy"] == plain["variants"][m]["accuracy"]
        assert padded["variants"][m]["solved"] == plain["variants"][m]["solved"]
    task = demo_task.make_task()
    scfg = smp.SamplerConfig(gen_length=GEN, block_length=BLOCK, steps=GEN // 2,
                             mask_id=s.model_config.mask_token_id, eos_id=s.ids["eos"])
    texts = eval_lib.generate_texts(s, task, examples, scfg, batch_size=8,
                                    prompt_length=PROMPT + 20)
    verdicts = [task.verdict(task.record(ex, t)) for ex, t in zip(examples, texts)]
    accuracy = 100.0 * sum(v.hits for v in verdicts) / sum(v.total for v in verdicts)
    assert padded["variants"]["exact"]["accuracy"] == round(accuracy, 4)
    with pytest.raises(ValueError, match="shorter than the prompts"):
        sampler_accuracy.run(str(model_dir), str(puzzles), prompt_length=PROMPT - 1, **kw)
    with pytest.raises(ValueError, match="unknown variants"):
        sampler_accuracy.run(str(model_dir), str(puzzles), **{**kw, "only": ("dual+tau9",)})


def test_variants_name_both_threshold_rules():
    """``+fastdllm`` variants ask SamplerConfig for Fast-dLLM's threshold rule when it has
    the ``parallel_rule`` field, and say what to do when it does not."""
    names = sampler_accuracy.variants((0.9,), (8,), rules=("budget", "fast_dllm"))
    assert names["dual+tau0.9"] == ("dual", "block", 0.9, 0, "budget")
    assert names["dual+tau0.9+fastdllm"] == ("dual", "block", 0.9, 0, "fast_dllm")
    assert names["dual_masked+tau0.9+refresh8+fastdllm"] == ("dual", "masked", 0.9, 8,
                                                             "fast_dllm")
    assert "dual+refresh8+fastdllm" not in names  # tau 1 decodes no token in parallel
    assert set(sampler_accuracy.variants((0.9,))) == {n for n in names if "refresh" not in n
                                                      and "fastdllm" not in n}
    base = dict(gen_length=GEN, block_length=BLOCK, steps=GEN // 2)
    cfg = sampler_accuracy.sampler_config("dual+tau0.9", names["dual+tau0.9"], **base)
    assert (cfg.kv_cache, cfg.recompute, cfg.threshold, cfg.cache_refresh) == ("dual", "block",
                                                                               0.9, 0)
    fast = names["dual+tau0.9+fastdllm"]
    if "parallel_rule" in {f.name for f in dataclasses.fields(smp.SamplerConfig)}:
        cfg = sampler_accuracy.sampler_config("dual+tau0.9+fastdllm", fast, **base)
        assert cfg.parallel_rule == "fast_dllm"
    else:
        with pytest.raises(ValueError, match="drop fast_dllm from --rules"):
            sampler_accuracy.sampler_config("dual+tau0.9+fastdllm", fast, **base)
    with pytest.raises(ValueError, match="unknown"):
        sampler_accuracy.rule_names("budget,fastdllm")
