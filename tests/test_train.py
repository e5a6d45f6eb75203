"""Training end to end through `python -m d1jax.main`: tiny SFT and GRPO, bad configs refused
before any compute. Interrupted and resumed runs: tests/test_faults.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d1jax.metrics import read_jsonl
from tests.commands import commands_fixture

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """``python -m d1jax.main`` runs forked from one process (tests/commands.py)."""
    yield from commands_fixture(tmp_path_factory)


def assert_ok(r):
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, shared_d1_module, commands):
    wd = tmp_path_factory.mktemp("grpo")
    assert_ok(commands.run("d1jax.main", "--config=configs/grpo_sudoku.py:tiny", f"--workdir={wd}"))
    return wd


@pytest.fixture(scope="module")
def shared_d1_module():
    from tests.conftest import SHARED_D1
    if not SHARED_D1.is_dir():
        pytest.skip(f"d1 data folder {SHARED_D1} is absent")
    return SHARED_D1


def test_tiny_grpo_writes_checkpoints_metrics_and_export(grpo_run):
    wd = grpo_run
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("loss", "reward", "reward_std", "zero_std_ratio", "kl", "clip_ratio",
                "grad_norm", "grad_norm_clipped", "lr", "completion_length", "time_generate",
                "time_score", "time_update", "rewards/sudoku_reward_func"):
        assert key in rows[-1], key
    assert sorted(p.name for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
    assert list((wd / "tensorboard").glob("events.out.tfevents.*"))
    assert (wd / "samples.jsonl").read_text().strip()
    cfg = json.loads((wd / "hf" / "config.json").read_text())
    assert cfg["model_type"] == "llada" and (wd / "hf" / "model.safetensors").exists()
    assert (wd / "hf" / "tokenizer.json").exists()


def test_tiny_sft_runs(tmp_path, shared_d1_module, commands):
    assert_ok(commands.run("d1jax.main", "--config=configs/sft_s1k.py:tiny",
                           f"--workdir={tmp_path}"))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 4 and all(np.isfinite(r["loss"]) for r in rows)
    assert (tmp_path / "checkpoints" / "4").exists() and (tmp_path / "hf" / "config.json").exists()


@pytest.mark.parametrize("override,message", [
    ("--config.nope=1", "nope"),
    ("--config.sampler.block_length=12", "does not divide"),
    ("--config.sampler.kv_cache=dual2", "sampler.kv_cache='dual2'"),
    ("--config.sampler.recompute=masked", "sampler.recompute='masked' needs kv_cache='dual'"),
    ("--config.grpo.prompts_per_step=3", "not divisible by the data-parallel size"),
    ("--config.optim.grad_accum=2", "do not split into optim.grad_accum=2 micro-batches"),
    ("--config.model.random_init=", "config.model.path is not set"),
    ("--config.grpo.objective=ppo", "objective='ppo': choose one of"),
    ("--config.grpo.objective=wd1", "beta=0.04: wd1 has no reference term; set beta=0"),
])
def test_bad_config_fails_with_one_clear_line(tmp_path, override, message, commands):
    r = commands.run("d1jax.main", "--config=configs/grpo_sudoku.py:tiny",
                     f"--workdir={tmp_path}", override)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "checkpoints").exists()


def test_group_size_must_divide_batch(tmp_path):
    from d1jax.config import ConfigError, check_batch
    with pytest.raises(ConfigError, match="not divisible by num_generations G=4"):
        check_batch(10, 4, 1, "prompts_per_step x G")
    # 96 rows on 32 data-parallel devices: 3 a device, which 2 micro-batches cannot split
    with pytest.raises(ConfigError, match=r"is 3 rows per data-parallel device .* one of "
                                          r"\[1, 3\]"):
        check_batch(96, 6, 32, "prompts_per_step x G", grad_accum=2)
    check_batch(96, 6, 16, "prompts_per_step x G", grad_accum=2)  # 6 a device: 3 + 3


def test_unwritable_workdir_is_refused(tmp_path, commands):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):  # root ignores permissions: use a file in the way instead
        ro.chmod(0o700)
        ro = tmp_path / "file"
        ro.write_text("x")
    r = commands.run("d1jax.main", "--config=configs/grpo_sudoku.py:tiny", f"--workdir={ro}/run")
    assert r.returncode != 0 and "is not writable" in r.stderr, r.stderr[-2000:]


def test_eval_of_the_exported_model_writes_d1_layout_and_scores(grpo_run, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "d1jax.eval", "--config=configs/eval.py:sudoku,tiny",
         f"--workdir={tmp_path}", f"--config.model.path={grpo_run / 'hf'}",
         "--config.model.random_init=", "--config.eval.num_examples=8"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert_ok(r)
    files = list(tmp_path.glob("sudoku_d1jax_32_16_0_generations.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert len(data["generations"]) == 8
    assert {"question", "generations", "ground_truth"} <= set(data["generations"][0])
    acc = json.loads((tmp_path / "accuracy.json").read_text())["32"]
    from d1jax.eval.score import score_file
    scored = score_file(files[0])
    np.testing.assert_allclose(scored["accuracy"], acc["accuracy"], atol=1e-6)


def test_fast_sampler_rollouts_run(tmp_path, shared_d1_module, commands):
    assert_ok(commands.run("d1jax.main", "--config=configs/grpo_sudoku.py:tiny",
                           f"--workdir={tmp_path}", "--config.sampler.kv_cache=dual",
                           "--config.sampler.threshold=0.9", "--config.train.num_steps=2",
                           "--config.train.export_hf=False"))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)


def test_sigterm_saves_and_stops(tmp_path, shared_d1_module):
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "d1jax.main", "--config=configs/grpo_sudoku.py:tiny",
                          f"--workdir={tmp_path}", "--config.train.num_steps=1000",
                          "--config.train.save_every=1000"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 75, out[-3000:]  # EX_TEMPFAIL: saved, rerun to resume
    assert "SIGTERM received" in out
    steps = sorted(int(d.name) for d in (tmp_path / "checkpoints").iterdir() if d.name.isdigit())
    assert steps and steps[-1] == read_jsonl(metrics)[-1]["step"] < 1000


@pytest.mark.parametrize("config,row", [
    ("configs/grpo_gsm8k.py:tiny",
     lambda i: {"question": f"Tom has {i} apples and buys 3 more. How many now?",
                "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"}),
    ("configs/grpo_math.py:tiny",
     lambda i: {"problem": f"What is ${i}+1$?", "solution": f"It is $\\boxed{{{i + 1}}}$.",
                "answer": str(i + 1), "level": "Level 1", "type": "Algebra"}),
])
def test_hub_task_tiny_configs_run_on_a_local_file(tmp_path, config, row, commands):
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(row(i)) for i in range(16)) + "\n")
    assert_ok(commands.run("d1jax.main", f"--config={config}", f"--workdir={tmp_path / 'run'}",
                           f"--config.task.source={data}", "--config.train.num_steps=2",
                           "--config.train.export_hf=False"))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)


def test_config_is_translated_once_into_typed_configs():
    """Eval's sampler per gen length (steps = length / 2, d1), the GRPO estimator sharing
    the rollout sampler's mask switches, HF's warmup rounding, the reference-copy rule."""
    import math
    from d1jax import config as config_lib
    from d1jax.run import spec as spec_lib
    c = config_lib.eval_config("sudoku,tiny")
    c.eval.gen_lengths, c.sampler.kv_cache = (32, 64), "dual"
    got = [(s.gen_length, s.steps, s.block_length, s.kv_cache, s.temperature)
           for s in spec_lib.from_config(c).eval.samplers]
    assert got == [(32, 16, 16, "dual", 0.0), (64, 32, 16, "dual", 0.0)]
    c = config_lib.grpo("sudoku", "tiny")
    c.sampler.use_attention_mask = False
    spec = spec_lib.from_config(c)
    assert spec.grpo.use_attention_mask is False and spec.sampler.use_attention_mask is False
    assert spec.optim.build(10_001).warmup_steps == math.ceil(0.0001 * 10_001) == 2
    assert not spec.keep_reference  # LoRA, beta > 0: the base model is the reference (d1)
    c.grpo.sync_ref_model = True
    assert spec_lib.from_config(c).keep_reference  # a synced reference copy
    c.grpo.sync_ref_model = False
    c.lora.enabled = False
    assert spec_lib.from_config(c).keep_reference  # full fine-tuning needs a copy
    c.grpo.objective = "ppo"
    with pytest.raises(config_lib.ConfigError, match="objective='ppo'"):
        spec_lib.from_config(c)
    c.grpo.objective = "diffu_grpo"
    c.model.layers_per_loop = 3
    assert spec_lib.from_config(c).model.layers_per_loop == 3
    c.model.layers_per_loop = 0
    with pytest.raises(config_lib.ConfigError, match="layers_per_loop=0"):
        spec_lib.from_config(c)
