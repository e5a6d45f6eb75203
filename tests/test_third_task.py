"""A task registered from outside the package trains through ``python -m d1jax.main`` and is
evaluated through ``python -m d1jax.eval`` (and scored by ``python -m d1jax.eval.score``) as the
built-in ones are: its entry's facts (default mu, evaluation sizes, file-name token, SFT
trajectory) are the ones the builders, the scorer and SFT read.

The task is "toy_vowels": prompts "Write vowels. <word>", reward the share of the completion's
letters that are vowels. It lives in this file and touches no file of the package: the runs
import a plugin module (``$D1JAX_TASK_MODULES``) that calls ``register_task`` on it.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d1jax import config as config_lib
from d1jax.config import ConfigError
from d1jax.eval import score
from d1jax.metrics import read_jsonl
from d1jax.tasks import MODULES_ENV, Task, Verdict, get_task, register_task, registry
from d1jax.train.sft_data import trajectory_examples
from tests.learnable import MAIN

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
NAME = "toy_vowels"
FACTS = dict(mu=3, eval_examples=5, gen_lengths=(24, 48), file_tokens=("vowels",),
             trajectory=lambda ex: f"<answer>{ex['word'].upper()}</answer>")


def vowel_share(completions, examples):
    shares = []
    for text in completions:
        letters = [c for c in text.lower() if c.isalpha()]
        shares.append(sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0)
    return shares


def _messages(ex):
    return [{"role": "user", "content": f"Write vowels. {ex['word']}"}]


def _rows(source=None, n=64, seed=0):
    rng = random.Random(seed)
    return [{"word": "".join(rng.choice("abcdefghij") for _ in range(4))} for _ in range(n)]


def _verdict(record):
    share = vowel_share([record["generation"]], [record])[0]
    return Verdict(extracted=share, correct=share == 1.0, hits=share, total=1)


def make_task() -> Task:
    return Task(name=NAME, system_prompt="Write vowels.", reward_funcs=(vowel_share,),
                reward_weights=(1.0,), build_messages=_messages, eval_system_prompt="",
                build_eval_messages=_messages, record=lambda ex, g: {**ex, "generation": g},
                verdict=_verdict, load_train=_rows, load_test=lambda source=None: _rows(n=8, seed=1),
                ground_truth=lambda ex: "aeiou", eval_prefill="")


# The plugin a run imports: the registration call, nothing else.
PLUGIN = ("from d1jax.tasks import register_task\n"
          "from tests.test_third_task import FACTS, NAME, make_task\n"
          "register_task(NAME, make_task, **FACTS)\n")

# Config files of the run's own: the builders read the task's entry.
GRPO_CONFIG = ("from d1jax import config\n\n\n"
               "def get_config(arg=None):\n"
               f"    c = config.grpo({NAME!r}, 'tiny')\n"
               "    c.max_prompt_length = 24\n"
               "    return c\n")
EVAL_CONFIG = ("from d1jax import config\n\n\n"
               "def get_config(arg=None):\n"
               f"    return config.eval_config({NAME + ',tiny'!r})\n")


# Shorter than :tiny (one inner iteration, 16 positions in 8 steps): the task is what's tested.
SHORT = ("--config.grpo.num_iterations=1", "--config.sampler.gen_length=16",
         "--config.sampler.steps=8", "--config.sampler.block_length=8")


@pytest.fixture
def registered():
    """The toy task in this process's registry, for the config-time checks."""
    entry = register_task(NAME, make_task, **FACTS)
    try:
        yield entry
    finally:
        del registry.TASKS[NAME]


def test_its_facts_come_from_its_entry(registered, tmp_path):
    assert get_task(NAME).total_reward(["aaab"], [{}]) == [0.75]
    c = config_lib.grpo(NAME, None)
    assert c.grpo.num_iterations == 3 and c.task.source == ""  # its mu; no named data
    e = config_lib.eval_config(NAME)
    assert (tuple(e.eval.gen_lengths), e.eval.num_examples) == ((24, 48), 5)
    (pair,) = trajectory_examples(get_task(NAME), [{"word": "abcd"}])
    assert pair == {"prompt": _messages({"word": "abcd"}), "completion": "<answer>ABCD</answer>"}
    assert score.infer_task("vowels_model_24_12") == score.infer_task(f"{NAME}_m_24_12") == NAME
    with pytest.raises(ValueError, match="already registered"):  # a name is one task's
        register_task(NAME, lambda: None)
    with pytest.raises(ValueError, match="one of d1's"):
        register_task("sudoku", make_task)


def test_without_its_module_the_task_is_unknown_in_one_line(monkeypatch):
    c = config_lib.grpo(NAME, "tiny")  # builds: the input checks name the known tasks
    with pytest.raises(ConfigError, match=rf"^config.task: unknown task '{NAME}': choose one of "
                                          "gsm8k, math500, sudoku, countdown, humaneval, mbpp"):
        config_lib.check_inputs(c)
    monkeypatch.setenv(MODULES_ENV, "no_such_task_module")
    with pytest.raises(ConfigError, match=r"^\$D1JAX_TASK_MODULES: cannot import the task module "
                                          r"'no_such_task_module' .*is it on PYTHONPATH\?$"):
        config_lib.grpo(NAME, "tiny")


def _run(module_args, tmp_path):
    env = {**os.environ, MODULES_ENV: "toy_task_plugin",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *module_args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_a_registered_task_trains_and_evaluates_through_the_commands(tmp_path):
    (tmp_path / "toy_task_plugin.py").write_text(PLUGIN)
    (tmp_path / "toy_grpo.py").write_text(GRPO_CONFIG)
    (tmp_path / "toy_eval.py").write_text(EVAL_CONFIG)
    wd, ev = tmp_path / "run", tmp_path / "eval"
    r = _run(["-c", MAIN, f"--config={tmp_path / 'toy_grpo.py'}", f"--workdir={wd}",
              "--config.train.num_steps=2", "--config.train.export_hf=False",
              *SHORT], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["loss"]) and 0 <= r["reward"] <= 1 for r in rows)
    assert "rewards/vowel_share" in rows[0]  # its reward function, by name

    r = _run(["-m", "d1jax.eval", f"--config={tmp_path / 'toy_eval.py'}", f"--workdir={ev}",
              "--config.eval.num_examples=4", "--config.eval.gen_lengths=(16,)"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (gen,) = ev.glob(f"{NAME}_*_generations.json")
    assert len(json.loads(gen.read_text())["generations"]) == 4
    assert json.loads((ev / "accuracy.json").read_text())["16"]["n"] == 4
    r = _run(["-m", "d1jax.eval.score", str(ev), "--json"], tmp_path)  # its name, from the file's
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(p["task"], p["n"]) for p in json.loads(r.stdout)] == [(NAME, 4)]

