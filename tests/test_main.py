"""`python -m d1jax.main` end to end (subprocess, exactly as a user runs it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import D1JAX_MAIN, commands_fixture

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """``python -m`` commands forked from one process that imported theirs (tests/commands.py)."""
    yield from commands_fixture(tmp_path_factory, (*D1JAX_MAIN, "examples.demo.run"))


def test_forward_demo_runs(tmp_path, commands):
    """configs/forward_demo.py through the demo's command (examples/demo), not d1jax.main."""
    r = commands.run("examples.demo", "--config=configs/forward_demo.py",
                     f"--workdir={tmp_path}", "--config.model.preset=test-tiny",
                     "--config.seq_len=16")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads((tmp_path / "forward_demo.json").read_text())
    assert out["finite"] and out["logits_shape"] == [8, 16, 128]
    r = commands.run("d1jax.main", "--config=configs/forward_demo.py",
                     f"--workdir={tmp_path / 'x'}")
    assert r.returncode == 1 and r.stderr.strip() == (
        "error: config.stage='forward' is not one of ['eval', 'grpo', 'sft']"), r.stderr[-2000:]


@pytest.mark.parametrize("module", ["d1jax.main", "d1jax.plan"])
def test_commands_share_the_stage_runner(module, tmp_path, commands):
    """d1jax.main and d1jax.plan (d1jax.eval too, after its own eval-only line) run through
    cli.run_stage: a stage no command runs is its one line, before anything else."""
    workdir = [f"--workdir={tmp_path / 'x'}"] if module == "d1jax.main" else []  # plan: none
    r = commands.run(module, "--config=configs/forward_demo.py", *workdir)
    assert r.returncode == 1 and r.stderr.strip() == (
        "error: config.stage='forward' is not one of ['eval', 'grpo', 'sft']"), r.stderr[-2000:]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("module", ["d1jax.main", "examples.demo"])
def test_unknown_config_key_fails_in_one_line_naming_the_closest_keys(tmp_path, module,
                                                                     commands):
    r = commands.run(module, "--config=configs/forward_demo.py", f"--workdir={tmp_path}",
                     "--config.model.presett=test-tiny")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "error: unknown config key 'model.presett' in --config.model.presett=...; "
        "closest valid keys: model.preset"], r.stderr[-2000:]


@pytest.mark.parametrize("module,config", [("d1jax.eval", "configs/eval.py:sudoku,tiny"),
                                           ("d1jax.plan", "configs/grpo_sudoku.py")])
def test_eval_and_plan_refuse_an_unknown_key_in_one_line(module, config, tmp_path, commands):
    r = commands.run(module, f"--config={config}", f"--workdir={tmp_path}",
                     "--config.model.pth=x")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "error: unknown config key 'model.pth' in --config.model.pth=...; "
        "closest valid keys: model.path, model.width, model"], r.stderr[-2000:]


def test_unknown_key_message_walks_the_config_tree():
    import ml_collections

    from d1jax.cli import unknown_key_message
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


@pytest.fixture(scope="module")
def quiet_commands(tmp_path_factory):
    """``python -m`` commands in a user's shell's environment, forked (tests/commands.py)."""
    yield from commands_fixture(tmp_path_factory, env=_quiet_env())


TINY = "--config=configs/grpo_sudoku.py:tiny"
EVAL_TINY = "--config=configs/eval.py:sudoku,tiny"


@pytest.mark.parametrize("module,args,message", [
    # A value of the wrong type: the key, the value and the type the config's value has.
    ("d1jax.main", [TINY, "--config.grpo.beta=abc"],
     "error: --config.grpo.beta=abc: expected a float (the config has 0.04), got 'abc'"),
    ("d1jax.main", [TINY, "--config.train.num_steps=2.5"],
     "error: --config.train.num_steps=2.5: expected an integer (the config has 4), got '2.5'"),
    ("d1jax.main", [TINY, "--config.lora.enabled=maybe"],
     "error: --config.lora.enabled=maybe: expected true or false (the config has True), got "
     "'maybe'"),
    ("d1jax.main", [TINY, "--config.mesh.shape=(1,2"],
     "error: --config.mesh.shape=(1,2: expected a tuple such as --config.mesh.shape='(-1, 1, 1)'"),
    # Config files and variants: the valid variants named.
    ("d1jax.main", ["--config=configs/grpo_sudoku.py:tiyn"],
     "error: --config=configs/grpo_sudoku.py:tiyn: unknown config variant 'tiyn' for "
     "configs/grpo_sudoku.py: use comma-separated words from tiny, full, authors, generated, "
     "or nothing"),
    ("examples.demo", ["--config=configs/forward_demo.py:tiny"],
     "error: --config=configs/forward_demo.py:tiny: configs/forward_demo.py takes no "
     "':variant'; drop it"),
    ("d1jax.main", ["--config=configs/nope.py"], "error: config file 'configs/nope.py' does not "
     "exist"),
    ("d1jax.main", ["--config=configs"], "error: config file 'configs' is a directory"),
    ("d1jax.main", [], "error: --config is required, e.g. --config=configs/grpo_sudoku.py:tiny"),
    # Paths and names, before the workdir is created.
    ("d1jax.main", [TINY, "--config.model.path=/nonexistent", "--config.model.random_init="],
     "error: config.model.path='/nonexistent' is not a directory"),
    ("d1jax.main", [TINY, "--config.task.source=/nonexistent.jsonl"],
     "error: config.task.source='/nonexistent.jsonl': no such file or directory"),
    ("d1jax.main", [TINY, "--config.task.name=sudokuu"],
     "error: config.task: unknown task 'sudokuu': choose one of gsm8k, math500, sudoku, "
     "countdown"),
    ("d1jax.main", [TINY, "--config.train.num_steps=0"],  # no epochs either: nothing to run
     "error: train.num_steps=0: no optimizer step to run"),
    ("d1jax.main", [TINY, "--config.grpo.num_generations=1"],
     "error: grpo.num_generations=1: must be >= 2"),
    # Would end the run in `step % 0` after its first rollout (issue 55): refused up front.
    ("d1jax.main", [TINY, "--config.train.sample_every=0"],
     "error: train.sample_every=0: must be >= 1"),
    ("d1jax.main", [TINY, "--config.sampler.gen_length=0"],  # computed into the spec: checked
     "error: sampler.gen_length=0: must be >= 1"),
    ("d1jax.main", [TINY, "--config.train.if_incompatible=x"],
     "error: train.if_incompatible='x': choose one of refuse, move_aside"),
    ("d1jax.eval", [EVAL_TINY, "--config.model.path=/nope", "--config.model.random_init="],
     "error: config.model.path='/nope' is not a directory"),
    ("d1jax.eval", ["--config=configs/eval.py:sudokuu,tiny"],
     "error: --config=configs/eval.py:sudokuu,tiny: unknown config variant 'sudokuu' for "
     "configs/eval.py: use comma-separated words from tiny, gsm8k, math500, sudoku, countdown, "
     "humaneval, mbpp"),
    ("d1jax.eval", ["--config=configs/eval.py:sudoku,tinyy"],
     "error: --config=configs/eval.py:sudoku,tinyy: unknown config variant 'tinyy'"),
    ("d1jax.plan", ["--config=configs/grpo_gsm8k.py:tiyn"],
     "error: --config=configs/grpo_gsm8k.py:tiyn: unknown config variant 'tiyn'"),
    ("d1jax.plan", [TINY, "--config.grpo.beta=abc"],
     "error: --config.grpo.beta=abc: expected a float (the config has 0.04), got 'abc'"),
    ("d1jax.plan", [TINY, "--config.model.path=/nope"],
     "error: config.model.path='/nope' is not a directory"),
    ("d1jax.plan", [TINY, "--json=/nonexistent/dir/plan.json"],
     "error: --json=/nonexistent/dir/plan.json: its directory does not exist"),
])
def test_bad_flags_values_variants_and_paths_are_one_line(module, args, message, tmp_path,
                                                          quiet_commands):
    """Exit 1, one `error:` line on stderr (no traceback, no libtpu lines), nothing written."""
    wd = tmp_path / "run"
    workdir = [] if module == "d1jax.plan" else [f"--workdir={wd}"]
    r = quiet_commands.run(module, *args, *workdir)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not wd.exists()


def test_commands_print_no_libtpu_or_info_lines_on_a_cpu_host(tmp_path):
    """The forward demo saves nothing; the Checkpointer saves once: neither prints libtpu's
    probe errors nor absl INFO lines (Orbax's ~40 per save); -v 0 brings INFO back."""
    r = subprocess.run([sys.executable, "-m", "examples.demo", "--config=configs/forward_demo.py",
                        f"--workdir={tmp_path}", "--config.model.preset=test-tiny",
                        "--config.seq_len=16"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=_quiet_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.strip() == "", r.stderr[-2000:]
    save = ("import sys, jax.numpy as jnp; from d1jax.cli import parse_flags; "
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


def test_quiet_defaults_leave_jax_alone_where_an_accelerator_may_be_attached(monkeypatch):
    """Only a host with no TPU and no GPU device file skips the TPU probe; JAX_PLATFORMS or
    D1JAX_PROBE_TPU=1 from the user always wins."""
    import jax

    from d1jax import cli
    seen = []
    monkeypatch.setattr(jax.config, "update", lambda k, v: seen.append((k, v)))
    import fnmatch
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda *a: object())  # libtpu there
    files = set()
    monkeypatch.setattr(cli.glob, "glob", lambda pattern: fnmatch.filter(files, pattern))
    monkeypatch.setattr(cli.os.path, "exists", lambda p: p in files)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.delenv("D1JAX_PROBE_TPU", raising=False)
    from jax._src import hardware_utils
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", lambda: (0, None))
    for attached in ("/dev/accel0", "/dev/vfio/0", "/dev/nvidiactl", "/dev/kfd"):
        files.clear()
        files.add(attached)
        cli.quiet_defaults()
    assert seen == []  # a TPU or GPU may be there: JAX probes as it would
    files.clear()
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", lambda: (4, 5))
    cli.quiet_defaults()  # a TPU on the PCI bus (JAX's own check)
    assert seen == []
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", lambda: (0, None))
    monkeypatch.setenv("D1JAX_PROBE_TPU", "1")
    cli.quiet_defaults()
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    cli.quiet_defaults()
    assert seen == []
    monkeypatch.delenv("D1JAX_PROBE_TPU")
    monkeypatch.delenv("JAX_PLATFORMS")
    cli.quiet_defaults()  # nothing attached: the CPU JAX would fall back to, without the probe
    assert seen == [("jax_platforms", "cpu")]


def test_check_inputs_accepts_hub_ids_urls_and_existing_paths(tmp_path):
    from d1jax.config import ConfigError, check_inputs, grpo
    c = grpo("sudoku", "tiny")
    for source in ("", "owner/name", "https://example.com/x.csv", str(tmp_path)):
        c.task.source = source
        check_inputs(c)
    c.model.path = str(tmp_path)  # a folder, but no checkpoint in it
    with pytest.raises(ConfigError, match="has no config.json: not a Hugging Face checkpoint"):
        check_inputs(c)
    c.model.path = ""
    for source in ("data/x.jsonl", "./x", "a/b/c"):  # local-looking and missing
        c.task.source = source
        with pytest.raises(ConfigError, match="no such file or directory"):
            check_inputs(c)
    check_inputs(c, data=False)  # d1jax.plan reads no data


_STAGE = """
import sys
sys.path.insert(0, sys.argv[1])
from d1jax import config as config_lib
from d1jax import cli
c = config_lib.grpo("sudoku", "tiny")
c.train.compile_cache = sys.argv[3]
cli.run_stage(c, sys.argv[2], {"grpo": "fake_stage"})
"""


@pytest.mark.parametrize("setting,env_dir,where", [
    ("workdir", False, "wd/compile_cache"),  # the default: beside the run's files
    ("shared", False, "shared"),             # a path: one cache for many runs
    ("", False, None),                       # off
    ("workdir", True, "env"),                # JAX_COMPILATION_CACHE_DIR wins
])
def test_run_stage_keeps_compiled_programs_where_train_compile_cache_says(
        tmp_path, setting, env_dir, where):
    """`python -m d1jax.main`'s shared body (cli.run_stage) points JAX's persistent cache at
    train.compile_cache before the stage compiles, so a rerun after preemption loads them."""
    (tmp_path / "fake_stage.py").write_text(
        "import jax\ndef run(config, workdir):\n    jax.jit(lambda x: x * 2 + 1)(1.0)\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PLATFORMS="cpu")
    if env_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "env")
    wd = tmp_path / "wd"
    arg = str(tmp_path / "shared") if setting == "shared" else setting
    r = subprocess.run([sys.executable, "-c", _STAGE, str(tmp_path), str(wd), arg], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    found = {str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("*-cache")}
    assert found == ({where} if where else set())


def test_compile_cache_dir_expands_the_home_as_the_workdir_check_does(monkeypatch, tmp_path):
    from d1jax import config as config_lib
    from d1jax import cli
    monkeypatch.setenv("HOME", str(tmp_path))
    c = config_lib.grpo("sudoku", "tiny")
    assert cli.compile_cache_dir(c, "~/runs/a") == str(tmp_path / "runs/a/compile_cache")
    assert config_lib.check_workdir("~/runs/a") == tmp_path / "runs/a"
    c.train.compile_cache = "gs://bucket/xla"
    assert cli.compile_cache_dir(c, "~/runs/a") == "gs://bucket/xla"


@pytest.mark.parametrize("stage,knob", [("grpo", "grpo.prompts_per_step=2"),
                                        ("sft", "sft.batch_size=8")])
def test_training_data_smaller_than_a_batch_is_refused_before_anything_is_built(
        tmp_path, stage, knob):
    """A data file with too few rows: one ConfigError naming it and the batch, before the
    tokenizer or model (a rerun on good data must not find a tokenizer trained on nothing)."""
    from d1jax import config as config_lib
    from d1jax.config import ConfigError
    from d1jax.train import grpo, sft
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    c = config_lib.grpo("sudoku", "tiny") if stage == "grpo" else config_lib.sft("tiny")
    c.task.source = str(empty)
    with pytest.raises(ConfigError, match=rf"^task.source='{empty}': 0 examples, fewer than "
                                          rf"{knob}$"):
        (grpo if stage == "grpo" else sft).run(c, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "tokenizer").exists()


def test_a_run_refuses_a_workdir_that_holds_the_checkpoint_it_reads(tmp_path, tiny_config,
                                                                     tiny_params):
    """The workdir itself, or its hf/ (an export would replace it; move_aside would move it):
    refused before the workdir is touched."""
    from d1jax import config as config_lib
    from d1jax.config import ConfigError
    from d1jax.model.llada import weights
    from d1jax.run import context
    ckpt = tmp_path / "sft" / "hf"
    weights.save_hf_checkpoint(ckpt, tiny_config, tiny_params)
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    c = config_lib.grpo("sudoku", "tiny")
    c.model.path, c.model.random_init = str(ckpt), ""
    c.train.if_incompatible = "move_aside"
    for wd, message in [(ckpt, "is config.model.path: a run writes config.json"),
                        (tmp_path / "sft", "is inside the workdir's hf/, which this run writes")]:
        with pytest.raises(ConfigError, match=message):
            context.prepare(c, str(wd))
    assert sorted(p.name for p in (tmp_path / "sft").iterdir()) == ["hf"]
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before


def test_an_eval_workdir_refuses_another_models_results(tmp_path):
    """Its *_generations.json name the model they came from: another model's evaluation is
    refused before anything is generated or overwritten."""
    import json
    from d1jax import config as config_lib
    from d1jax.config import ConfigError
    from d1jax.eval import evaluate
    earlier = tmp_path / "sudoku_d1jax_32_16_0_generations.json"
    earlier.write_text(json.dumps({"generations": [], "model_path": "/models/base"}))
    c = config_lib.eval_config("sudoku,tiny")
    with pytest.raises(ConfigError, match=r"holds an evaluation of model_path='/models/base' "
                                          r"\(sudoku_d1jax_32_16_0_generations.json\); this one "
                                          r"is of ''"):
        evaluate.run(c, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [earlier.name]


def test_a_model_path_without_a_checkpoint_or_tokenizer_is_one_line(tmp_path, tiny_config,
                                                                     tiny_params):
    from d1jax import config as config_lib
    from d1jax.config import ConfigError
    from d1jax.model.llada import weights
    from d1jax.model.tokenizer import TokenizerError, load_tokenizer
    (tmp_path / "empty").mkdir()
    c = config_lib.grpo("sudoku", "tiny")
    c.model.path, c.model.random_init = str(tmp_path / "empty"), ""
    with pytest.raises(ConfigError, match=r"has no config.json: not a Hugging Face checkpoint"):
        config_lib.check_inputs(c)  # d1jax.main's and d1jax.eval's first check
    weights.save_hf_checkpoint(tmp_path / "weights_only", tiny_config, tiny_params)
    with pytest.raises(TokenizerError, match=r"holds no tokenizer .*config.model.tokenizer_path"):
        load_tokenizer(tmp_path / "weights_only")
    # A run's workdir given for its export: the error points at the export.
    from d1jax.model import preflight
    from d1jax.model.hf_checkpoint import CheckpointError
    run = tmp_path / "run"
    weights.save_hf_checkpoint(run / "hf", tiny_config, tiny_params)
    (run / "config.json").write_text('{"stage": "sft", "model": {}}')
    with pytest.raises(CheckpointError, match=rf"a d1jax run's workdir: its model is {run}/hf$"):
        preflight.check_checkpoint(run, "llada")


def test_an_eval_prompt_longer_than_the_models_positions_is_one_line_before_generating(
        tmp_path, shared_d1):
    """A gen length that does not fit beside the longest prompt ends the evaluation in one
    line naming the lengths, the model's limit and the knob, before any sampler compiles or
    runs: no generation at the length that fits is written either (it was, then a traceback)."""
    import re
    r = subprocess.run([sys.executable, "-m", "d1jax.eval", EVAL_TINY,
                        "--config.eval.gen_lengths=(32, 2048)", f"--workdir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    m = re.fullmatch(
        r"error: eval: sudoku's longest prompt \(example \d+\) is (\d+) tokens, and "
        r"eval.gen_lengths 2048 needs \1 \+ 2048 = (\d+) positions; the model has (\d+) "
        r"\(max_sequence_length\): lower eval.gen_lengths to at most (\d+) \(whole "
        r"sampler.block_length (\d+) blocks\), e.g. --config.eval.gen_lengths='\(32,\)'",
        lines[0])
    assert m, lines[0]
    prompt, total, limit, most, block = map(int, m.groups())
    assert total == prompt + 2048 > limit and most == (limit - prompt) // block * block >= 32
    assert not list(tmp_path.glob("*_generations.json"))


def test_an_eval_prompt_that_leaves_less_than_a_block_says_so(tiny_config, tiny_model):
    """The branch where not one block fits beside the prompt: the line says how many positions
    the prompt leaves and what to do, not "a gen length of at most 0"."""
    import types

    from d1jax.config import ConfigError
    from d1jax.eval import evaluate
    s = types.SimpleNamespace(model_config=tiny_config, model=tiny_model)
    limit = tiny_config.max_sequence_length
    evaluate.check_positions(s, "gsm8k", limit - 64, 3, [32, 64], 32)  # fits exactly: silent
    with pytest.raises(ConfigError) as e:
        evaluate.check_positions(s, "gsm8k", limit - 10, 3, [32], 32)
    assert str(e.value) == (
        f"eval: gsm8k's longest prompt (example 3) is {limit - 10} tokens, and eval.gen_lengths "
        f"32 needs {limit - 10} + 32 = {limit + 22} positions; the model has {limit} "
        "(max_sequence_length): the prompt leaves 10, less than one sampler.block_length 32 "
        "block: use a model with more positions, or a test set (task.source) without that "
        "example")
