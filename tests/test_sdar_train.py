"""The block diffusion family (SDAR, TraDo) trains end to end: block SFT through the SFT
stage, TraceRL on the rollouts' traces and diffu-GRPO through the GRPO stage, all through
``python -m d1jax.main``; stopped with a save, resumed from the workdir, exported as an SDAR
checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d1jax.config import ConfigError
from d1jax.config import defaults
from d1jax.metrics import read_jsonl
from d1jax.model import sdar
from d1jax.run.spec import from_config
from d1jax.run.context import RunStopped
from d1jax.train import grpo
from tests.config_files import load_module
from tests.learnable import MAIN

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]


load = load_module  # a config file's module, by its path


def test_tracerl_tiny_runs_through_main_and_exports(tmp_path):
    wd = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-c", MAIN, "--config=configs/sdar/tracerl_math.py:tiny",
         f"--workdir={wd}", "--config.train.num_steps=1", "--config.train.export_hf=True"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [x["step"] for x in rows] == [1] and np.isfinite(rows[0]["loss"])
    assert rows[0]["scored_tokens"] > 0  # the trace's tokens were scored
    cfg_json = json.loads((wd / "hf" / "config.json").read_text())
    assert cfg_json["model_type"] == "sdar" and cfg_json["block_size"] == 4
    config, params = sdar.load_hf_checkpoint(wd / "hf")
    assert config.num_hidden_layers == 2


@pytest.mark.parametrize("config_file,changes,model_type", [
    # TraceRL on LLaDA (configs/tracerl_math.py, rl_llada.yaml): the trace of LLaDA's block
    # loop and the old pass of mu > 1; SDAR's TraceRL runs through main above
    ("configs/tracerl_math.py", {"num_iterations": 2}, "llada"),
    ("configs/sdar/grpo_gsm8k.py", {}, "sdar"),
], ids=["tracerl_llada", "diffu_grpo"])
def test_configs_save_resume_and_export(config_file, changes, model_type, tmp_path):
    """Stopped (with a save) after the first rollout's mu = 2 steps, resumed from the
    workdir to the end, then exported."""
    mod = load(config_file)

    def config(**train):
        c = mod.get_config("tiny")
        for k, v in {"num_steps": 4, **train}.items():
            setattr(c.train, k, v)
        for k, v in changes.items():
            setattr(c.grpo, k, v)
        return c
    with pytest.raises(RunStopped, match="stopped at step 2 of 4"):
        grpo.run(config(stop_after=2), str(tmp_path))
    assert (tmp_path / "checkpoints" / "2").is_dir() and not (tmp_path / "hf").exists()
    grpo.run(config(), str(tmp_path))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(x["loss"]) for x in rows)
    if "tracerl" in config_file:  # the trace's tokens were scored
        assert all(x["scored_tokens"] > 0 for x in rows)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == model_type


def test_block_sft_tiny_trains_through_main_saves_and_exports(tmp_path):
    """configs/sdar/sft_s1k.py:tiny (block SFT on generated Sudoku trajectories): the loss
    falls over 8 steps, a checkpoint is saved, the export reads back as SDAR."""
    wd = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-c", MAIN, "--config=configs/sdar/sft_s1k.py:tiny",
         f"--workdir={wd}", "--config.train.num_steps=8", "--config.train.save_every=4",
         "--config.train.export_hf=True"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [x["step"] for x in rows] == list(range(1, 9))
    loss = [x["loss"] for x in rows]
    assert all(np.isfinite(loss)) and all(x["masked_tokens"] > 0 for x in rows)  # block SFT's
    print("block SFT loss by step:", [round(x, 4) for x in loss])
    assert np.mean(loss[-3:]) < 0.95 * np.mean(loss[:2]), loss
    assert (wd / "checkpoints" / "8").is_dir()
    assert json.loads((wd / "hf" / "config.json").read_text())["model_type"] == "sdar"
    config, _ = sdar.load_hf_checkpoint(wd / "hf")
    assert config.num_hidden_layers == 2


def test_sft_loss_follows_the_family_and_block_needs_block_diffusion():
    """sft.loss "family" (the default): block SFT on SDAR, d1's masked SFT on LLaDA/Dream;
    "block" on LLaDA is refused in the user's words."""
    assert from_config(defaults.sft("tiny", checkpoint="sdar")).sft.loss == "block"
    assert from_config(defaults.sft("tiny")).sft.loss == "masked"
    assert from_config(defaults.sft("tiny", checkpoint="dream")).sft.loss == "masked"
    c = defaults.sft("tiny")
    c.sft.loss = "block"
    with pytest.raises(ConfigError, match="needs a block diffusion model"):
        from_config(c)
    c = load("configs/sdar/sft_s1k.py").get_config("tiny")
    c.sft.upper_p = 1.5
    with pytest.raises(ConfigError, match="upper_p"):
        from_config(c)
