"""`python -m d1jax.main` end to end (subprocess, exactly as a user runs it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_main(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "d1jax.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_forward_demo_runs(tmp_path):
    r = run_main("--config=configs/forward_demo.py", f"--workdir={tmp_path}",
                 "--config.model.preset=test-tiny", "--config.seq_len=16")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads((tmp_path / "forward_demo.json").read_text())
    assert out["finite"] and out["logits_shape"] == [8, 16, 128]


def test_unknown_config_key_fails_in_one_line_naming_the_closest_keys(tmp_path):
    r = run_main("--config=configs/forward_demo.py", f"--workdir={tmp_path}",
                 "--config.model.presett=test-tiny")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "error: unknown config key 'model.presett' in --config.model.presett=...; "
        "closest valid keys: model.preset"], r.stderr[-2000:]


@pytest.mark.parametrize("module,config", [("d1jax.eval", "configs/eval.py:sudoku-tiny"),
                                           ("d1jax.plan", "configs/grpo_sudoku.py")])
def test_eval_and_plan_refuse_an_unknown_key_in_one_line(module, config, tmp_path):
    r = subprocess.run([sys.executable, "-m", module, f"--config={config}",
                        f"--workdir={tmp_path}", "--config.model.pth=x"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "error: unknown config key 'model.pth' in --config.model.pth=...; "
        "closest valid keys: model.path, model.width, model"], r.stderr[-2000:]


def test_unknown_key_message_walks_the_config_tree():
    import ml_collections

    from d1jax.config.cli import unknown_key_message
    c = ml_collections.ConfigDict({"optim": {"learning_rate": 1.0, "warmup_ratio": 0.0},
                                   "seed": 0})
    assert unknown_key_message(c, "optim.learning_rate") is None
    assert "closest valid keys: optim.learning_rate," in unknown_key_message(
        c, "optim.learning_rat")  # the closest first
    assert unknown_key_message(c, "seed.x").startswith("unknown config key 'seed.x'")
    assert unknown_key_message(c, "nope").endswith("see the config file for its fields")


def test_workdir_check_is_safe_when_every_process_runs_it_at_once(tmp_path):
    """Each process of a multi-host run checks the shared workdir at the same moment; one
    process's probe must never be deleted by another's (that race aborted a 2-process run)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        errors = pool.map(_check_workdir_many, [str(tmp_path)] * 4)
    assert errors == [None] * 4
    assert list(tmp_path.iterdir()) == []  # no probe left behind


def _check_workdir_many(path: str) -> str | None:
    from d1jax.config import ConfigError, check_workdir
    try:
        for _ in range(300):
            check_workdir(path)
    except ConfigError as e:
        return str(e)
    return None
