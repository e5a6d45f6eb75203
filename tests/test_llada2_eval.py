"""LLaDA2's configs (configs/llada2/): the eval config decodes as the Hugging Face file's
``generate`` defaults (block_length 32, threshold 0.95, greedy, no top-k/top-p: block
diffusion's ``low_confidence_dynamic`` over the exact block cache, 32 steps a block), the SFT
config carries dFactory's llada2_mini_bd_sft.yaml values, and ``python -m d1jax.main``
evaluates a tiny replica of the Hub layout (tests/published.py ``write_llada2``) end to end on
8 fake CPU devices with the experts on a mesh axis of 4 (dInfer's decoder through the same
config: tests/test_llada2_decoders.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from tests import published
from tests.config_files import load_config
from tests.learnable import MAIN

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]


def test_eval_config_is_their_generate():
    c = load_config("configs/llada2/eval.py")
    s = c.sampler
    assert (c.stage, c.model.family, c.task.name) == ("eval", "llada2", "gsm8k")
    assert (s.loop, s.remasking, s.kv_cache) == ("sdar", "low_confidence_dynamic", "prefix")
    assert (s.block_length, s.threshold, s.temperature, s.top_k, s.top_p) == (
        32, 0.95, 0.0, 0, 1.0)
    assert (c.eval.steps_per_block, s.parallel_rule, s.edit_threshold) == (32, "budget", -1.0)
    from d1jax.run.spec import _eval
    assert [(x.gen_length, x.steps, x.steps_per_block) for x in _eval(c).samplers] == [
        (gl, gl, 32) for gl in c.eval.gen_lengths]  # their steps 32 a block of 32
    tiny = load_config("configs/llada2/eval.py:sudoku,tiny")
    assert (tiny.task.name, tiny.model.random_init, tiny.sampler.block_length) == (
        "sudoku", "llada2-tiny", 4)  # the tiny preset's block


def test_sft_config_is_dfactorys():
    c = load_config("configs/llada2/sft_gsm8k.py")
    o = c.optim
    assert (c.stage, c.model.family, c.sft.loss, c.lora.enabled) == (
        "sft", "llada2", "block_dfactory", False)
    assert (c.sft.lower_p, c.sft.upper_p, c.sft.batch_size, c.sft.max_length,
            c.sft.num_epochs) == (0.3, 0.8, 8, 2048, 1)
    assert (o.learning_rate, o.b1, o.b2, o.weight_decay, o.max_grad_norm, o.warmup_ratio,
            o.lr_schedule, o.min_lr_rate) == (1e-5, 0.9, 0.999, 0.1, 1.0, 0.03,
                                              "cosine_with_min_lr", 0.0)
    tiny = load_config("configs/llada2/sft_gsm8k.py:tiny")
    assert (tiny.model.random_init, tiny.sft.loss) == ("llada2-tiny", "block_dfactory")


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_eval_runs_on_a_hub_replica(tmp_path):
    src = published.write_llada2(tmp_path / "src", "hub")
    wd = tmp_path / "eval"
    r = subprocess.run(
        [sys.executable, "-c", MAIN, "--config=configs/llada2/eval.py:letters,tiny",
         f"--workdir={wd}", f"--config.model.path={src}", "--config.model.random_init=",
         "--config.sampler.block_length=32",  # the replica's block (config.json has none: 32)
         "--config.eval.steps_per_block=32", "--config.eval.num_examples=8",
         "--config.mesh.shape=(2,1,1,4)"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"})
    assert r.returncode == 0, r.stderr[-3000:]
    acc = json.loads((wd / "accuracy.json").read_text())
    assert list(acc) == ["32"] and acc["32"]["n"] == 8
    out = json.loads((wd / "letters_d1jax_32_32_0_generations.json").read_text())
    assert out["block_length"] == 32 and len(out["generations"]) == 8
    texts = [g["generation"] for g in out["generations"]]
    assert all(texts) and not any("<|mask|>" in t for t in texts)  # every block decoded
