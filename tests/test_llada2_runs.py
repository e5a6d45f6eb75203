"""Issue 59's "done when": a tiny LLaDA2 MoE (``llada2-tiny``: 8 experts) runs each of its
configs end to end on 8 fake CPU devices with the experts on a mesh axis of 4 (data 2 x
expert 4): block SFT (configs/llada2/sft_gsm8k.py), EBPO (ebpo_math.py), TraceRL
(tracerl_math.py) and diffu-GRPO (grpo_gsm8k.py), each stopped in-process with a save after
step 1, resumed from the workdir to step 2 by ``python -m d1jax.main``, logging the router's
health every step, exported as a LLaDA2 checkpoint that reloads with its experts sharded 4
ways.

Block SFT starts from a tiny replica of the Hub's published layout (tests/published.py:
per-expert tensors, bfloat16 shards, the tokenizer with their special tokens and chat
template): the export keeps that layout and its tokenizer, reloads with the trained weights
(moved from the source's) and the router bias as the source had it (a buffer: not trained).
tests/test_llada2_train.py does the same from dFactory's merged layout; tests/test_ebpo.py's
tiny LLaDA2 run checks EBPO's mu = 2 ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from d1jax import sharding as shd
from d1jax.metrics import read_jsonl
from d1jax.model import hf_checkpoint as hf
from d1jax.model.llada2 import load_hf_checkpoint
from d1jax.run.context import RunStopped
from d1jax.train import grpo, sft
from tests import published
from tests.config_files import load_module
from tests.learnable import MAIN

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

MESH = (2, 1, 1, 4)  # data 2 x expert 4
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")


@pytest.mark.parametrize("config_file", [
    "configs/llada2/sft_gsm8k.py", "configs/llada2/ebpo_math.py",
    "configs/llada2/tracerl_math.py", "configs/llada2/grpo_gsm8k.py",
], ids=["block_sft", "ebpo", "tracerl", "diffu_grpo"])
def test_tiny_config_stops_resumes_and_exports_on_the_expert_mesh(config_file, tmp_path):
    mod = load_module(config_file)
    wd = tmp_path / "run"
    c = mod.get_config("tiny")
    # The run's changes: set in-process for the stopped run, given as flags to the command.
    changes = {"mesh.shape": MESH, "train.num_steps": 2, "train.sample_every": 100,
               "train.export_hf": True}
    if c.stage == "sft":  # from the Hub layout's replica; one row a data shard
        src = published.write_llada2(tmp_path / "src", "hub")
        changes.update({"sft.batch_size": 2, "model.path": str(src), "model.random_init": "",
                        "sft.max_length": 720})  # the replica BPE spends ~630 tokens a prompt
    else:  # a rollout a step: a run stops only between rollouts (mu 2 would not at step 1)
        changes["grpo.num_iterations"] = 1
    c.update_from_flattened_dict({**changes, "train.stop_after": 1})
    run = sft.run if c.stage == "sft" else grpo.run
    with pytest.raises(RunStopped, match="stopped at step 1 of 2"):
        run(c, str(wd))
    assert (wd / "checkpoints" / "1").is_dir() and not (wd / "hf").exists()
    # resumed by the command, with the same fields
    flags = [f"--config.{k}={v}" for k, v in changes.items()]
    r = subprocess.run([sys.executable, "-c", MAIN, f"--config={config_file}:tiny",
                        f"--workdir={wd}", *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [x["step"] for x in rows] == [1, 2]
    assert all(np.isfinite(x["loss"]) for x in rows)
    if "tracerl" in config_file:  # the trace's tokens were scored
        assert all(x["scored_tokens"] > 0 for x in rows)
    for x in rows:  # router health: 8 experts, k = 2 (each objective's update forward)
        assert 0.0 <= x["router_load_min"] <= 1 / 8 <= x["router_load_max"] <= 1.0, x
        assert 0.0 < x["router_entropy"] <= np.log(8) + 1e-6, x
    assert tuple(json.loads((wd / "config.json").read_text())["mesh"]["shape"]) == MESH
    out = wd / "hf"
    assert json.loads((out / "config.json").read_text())["model_type"] == "llada2_moe"
    keys = set(hf.open_checkpoint(out))
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in keys  # the Hub's layout
    # Reloaded on the expert mesh: every MoE layer's experts, sharded 4 ways.
    rules = shd.DEFAULT_RULES + ((shd.EXPERT, shd.EXPERT_AXIS),)
    cfg, params = load_hf_checkpoint(out, shd.make_mesh(MESH), rules=rules)
    for name in ("gate_proj", "up_proj", "down_proj"):
        experts = params["moe_layers"]["experts"][name]
        assert experts.shape[1] == cfg.num_experts == 8
        assert experts.addressable_shards[0].data.shape[1] == cfg.num_experts // 4
        assert np.isfinite(np.asarray(experts, np.float32)).all()
    if c.stage != "sft":
        return
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file()
    assert "<|role_end|>" in json.loads((out / "tokenizer_config.json").read_text())[
        "chat_template"]
    _, before = load_hf_checkpoint(src)
    moved = np.abs(np.asarray(params["moe_layers"]["experts"]["gate_proj"], np.float32)
                   - np.asarray(before["moe_layers"]["experts"]["gate_proj"], np.float32))
    assert moved.max() > 0  # trained
    bias = lambda p: np.asarray(p["moe_layers"]["gate"]["expert_bias"])  # noqa: E731
    np.testing.assert_array_equal(bias(params), bias(before).astype(ml_dtypes.bfloat16)
                                  .astype(np.float32))
