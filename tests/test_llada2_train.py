"""LLaDA2 end to end through ``python -m d1jax.main`` (configs/llada2/sft_gsm8k.py:tiny) from a
tiny replica of dFactory's merged layout (tests/published.py: merged expert tensors, bfloat16
shards, tokenizer with their special tokens and chat template): two block-SFT steps on 8 fake
CPU devices with the experts on a mesh axis of 4, logging the router's summary each step, an
export in the layout it loaded, and the export reloads with the trained weights. The Hub's
per-expert layout runs the same way, stopped and resumed, in tests/test_llada2_runs.py
(block_sft)"""

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
from tests import published
from tests.learnable import MAIN

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
MESH = "(2,1,1,4)"  # data 2 x expert 4

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")


# The merged layout's run aborted in XLA (SIGABRT in device_get during the SFT step) once in a
# full-suite run and once in a multi-file run (2026-11); six runs since, three at once under a
# load of 22 on 2 cores and two loading the hub run's cached programs, passed. Until it is found,
# an abort is reported as the known defect with XLA's fatal line (``_xla_fatal``), and any other
# failure fails.
def test_sft_exports_and_reloads_the_merged_layout(tmp_path):
    src = published.write_llada2(tmp_path / "src", "merged")
    wd = tmp_path / "run"
    steps = 2  # the first at learning rate 0 (warmup)
    r = subprocess.run(
        [sys.executable, "-c", MAIN, "--config=configs/llada2/sft_gsm8k.py:tiny",
         f"--workdir={wd}", f"--config.model.path={src}",
         "--config.model.random_init=", f"--config.train.num_steps={steps}",
         "--config.sft.batch_size=2", "--config.train.export_hf=True",
         f"--config.mesh.shape={MESH}",
         "--config.sft.max_length=720"],  # the replica BPE spends ~630 tokens on a prompt
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode == -6:
        pytest.xfail(f"known defect (docs/models.md): XLA aborted: {_xla_fatal(r.stderr)}")
    assert r.returncode == 0, _xla_fatal(r.stderr) + "\n" + r.stderr[-3000:]
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [x["step"] for x in rows] == list(range(1, steps + 1))
    assert all(np.isfinite(x["loss"]) and x["masked_tokens"] > 0 for x in rows)  # block SFT
    for x in rows:  # the router's summary of the step (LLaDA2.step_metrics)
        assert 0 <= x["router_load_min"] <= 1 / 8 <= x["router_load_max"] <= 1
        assert 0 < x["router_entropy"] <= np.log(8)
    run_cfg = json.loads((wd / "config.json").read_text())
    assert tuple(run_cfg["mesh"]["shape"]) == (2, 1, 1, 4)
    out = wd / "hf"
    exported = json.loads((out / "config.json").read_text())
    source = json.loads((src / "config.json").read_text())
    assert exported["model_type"] == source["model_type"]  # the layout it loaded
    keys = set(hf.open_checkpoint(out))
    assert "model.layers.1.mlp.experts.gate_proj" in keys  # merged, as loaded
    assert "model.layers.1.mlp.experts.7.down_proj.weight" not in keys
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file()
    assert "<|role_end|>" in json.loads((out / "tokenizer_config.json").read_text())[
        "chat_template"]
    # Reloaded on the expert mesh: the experts sharded 4 ways, the weights trained (moved from
    # the source's), the router bias as the source had it (a buffer: not trained).
    mesh = shd.make_mesh((2, 1, 1, 4))
    rules = shd.DEFAULT_RULES + ((shd.EXPERT, shd.EXPERT_AXIS),)
    config, params = load_hf_checkpoint(out, mesh, rules=rules)
    _, before = load_hf_checkpoint(src)
    experts = params["moe_layers"]["experts"]["gate_proj"]
    assert experts.addressable_shards[0].data.shape[1] == config.num_experts // 4
    moved = np.abs(np.asarray(experts, np.float32)
                   - np.asarray(before["moe_layers"]["experts"]["gate_proj"], np.float32))
    assert moved.max() > 0
    bias = lambda p: np.asarray(p["moe_layers"]["gate"]["expert_bias"])  # noqa: E731
    np.testing.assert_array_equal(bias(params), bias(before).astype(ml_dtypes.bfloat16)
                                  .astype(np.float32))


def _xla_fatal(stderr: str) -> str:
    """XLA's and glog's fatal lines of a run's stderr (they come before Python's thread dump,
    which the last 3000 characters keep)."""
    keys = ("Check failed", "terminate called", "Termination timeout", "Fatal Python error")
    lines = [x for x in stderr.splitlines()
             if x[:1] in "FE" and x[1:5].isdigit() or any(k in x for k in keys)]
    return " | ".join(lines[:6]) or "(no fatal line)"
