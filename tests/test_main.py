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


def _quiet_env(**extra) -> dict:
    """The environment of a user's shell: no JAX_PLATFORMS (libtpu installed, no TPU)."""
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    return {**env, **extra}


@pytest.mark.parametrize("module,args,message", [
    ("d1jax.main", ["--config=configs/grpo_sudoku.py:tiny", "--config.grpo.beta=abc"],
     "error: --config.grpo.beta=abc: could not convert string to float: 'abc'"),
    ("d1jax.main", ["--config=configs/grpo_sudoku.py:tiyn"],
     "error: --config=configs/grpo_sudoku.py:tiyn: unknown config variant 'tiyn': use ':tiny' "
     "or nothing"),
    ("d1jax.main", ["--config=configs/nope.py"], "error: config file 'configs/nope.py' does not "
     "exist"),
    ("d1jax.main", ["--config=configs/grpo_sudoku.py:tiny", "--config.model.path=/nonexistent"],
     "error: config.model.path='/nonexistent' is not a directory"),
    ("d1jax.main", ["--config=configs/grpo_sudoku.py:tiny", "--config.mesh.shape=(1,2"],
     "error: --config.mesh.shape=(1,2: Error while parsing string"),
    ("d1jax.main", ["--config=configs/grpo_sudoku.py:tiny", "--config.train.if_incompatible=x"],
     "error: train.if_incompatible='x': refuse or move_aside"),
    ("d1jax.eval", ["--config=configs/eval.py:sudoku-tiny", "--config.model.path=/nope"],
     "error: config.model.path='/nope' is not a directory"),
    ("d1jax.eval", ["--config=configs/eval.py:sudoku-tinyy"],
     "error: --config=configs/eval.py:sudoku-tinyy: unknown config variant 'tinyy'"),
    ("d1jax.plan", ["--config=configs/grpo_gsm8k.py:tiyn"],
     "error: --config=configs/grpo_gsm8k.py:tiyn: unknown config variant 'tiyn'"),
])
def test_bad_flags_values_variants_and_paths_are_one_line(module, args, message, tmp_path):
    wd = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", module, *args, f"--workdir={wd}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=_quiet_env())
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr[-2000:]
    assert not wd.exists() or not any(wd.iterdir())


def test_commands_print_no_libtpu_or_info_lines_on_a_cpu_host(tmp_path):
    """The forward demo saves nothing; the Checkpointer saves once: neither prints libtpu's
    probe errors nor absl INFO lines (Orbax's ~40 per save); -v 0 brings INFO back."""
    r = subprocess.run([sys.executable, "-m", "d1jax.main", "--config=configs/forward_demo.py",
                        f"--workdir={tmp_path}", "--config.model.preset=test-tiny",
                        "--config.seq_len=16"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=_quiet_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.strip() == "", r.stderr[-2000:]
    save = ("import sys, jax.numpy as jnp; from d1jax.config.cli import parse_flags; "
            "rest = parse_flags(sys.argv); from d1jax.checkpoint import Checkpointer; "
            "c = Checkpointer(rest[1], save_every=1); c.save(1, {'w': jnp.zeros(3)}, {}); "
            "c.close()")
    for verbosity, info in (([], 0), (["-v", "0"], 10)):
        r = subprocess.run([sys.executable, "-c", save, *verbosity, str(tmp_path / str(info))],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=_quiet_env())
        assert r.returncode == 0, r.stderr[-2000:]
        assert "TPU initialization" not in r.stderr and "TPU_" not in r.stderr, r.stderr[-2000:]
        n_info = sum(ln.startswith("INFO:absl") or ln.startswith("I") and ln[1:5].isdigit()
                     for ln in r.stderr.splitlines())
        assert (n_info == 0) if not info else (n_info >= info), r.stderr[-2000:]
        assert r.stdout.count("checkpoint: saving step 1") == 1


MISSING = "import sys; sys.modules[{name!r}] = None; import runpy; sys.argv = {argv!r}; " \
          "runpy.run_module({module!r}, run_name='__main__')"


def test_plan_without_libtpu_is_one_line_before_any_compile(tmp_path):
    code = MISSING.format(name="libtpu", module="d1jax.plan",
                          argv=["d1jax.plan", "--config=configs/grpo_sudoku.py:tiny"])
    code = code.replace("sys.modules['libtpu'] = None;",
                        "import importlib.util as u; f = u.find_spec; "
                        "u.find_spec = lambda n, *a: None if n == 'libtpu' else f(n, *a);")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "error: planning for TPU needs libtpu (no TPU): python -m pip install -e \".[tpu]\" "
        "(or \".[test]\"), then rerun"], r.stderr[-2000:]
