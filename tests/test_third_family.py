"""A third model family, registered from outside the package, runs through ``python -m
d1jax.main`` as LLaDA and Dream do: rollouts, a GRPO step, a save and a Hugging Face export.

The family is "toy": LLaDA's layers under a config class, ``model_type`` and checkpoint key
names of its own (``toy.embed.weight``, ``toy.layers.{i}.{p}.weight``, ...), and no remote
code. It lives in ``toy_family()`` below and touches no file of the package: the run imports
a two-line plugin module (``$D1JAX_FAMILY_MODULES``) that calls ``family.register`` on it.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.metrics import read_jsonl
from d1jax.model import family as family_lib
from d1jax.model import hf_checkpoint, hf_files, llada
from tests.learnable import MAIN

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]


class ToyConfig(llada.LLaDAConfig):
    """LLaDA's architecture fields under the toy family's config.json."""

    def to_hf_dict(self):
        d = super().to_hf_dict()
        d.update(model_type="toy", architectures=["ToyLM"])
        del d["auto_map"]
        return d


class Toy(llada.LLaDA):
    """LLaDA's module, holding a ToyConfig."""

    config: ToyConfig


def key_map(config: ToyConfig) -> hf_checkpoint.KeyMap:
    """The toy checkpoint's names for LLaDA's params."""
    out = {"toy.embed.weight": (("wte", "embedding"), None, False),
           "toy.norm.weight": (("ln_f", "weight"), None, False),
           "toy.head.weight": (("ff_out", "kernel"), None, True)}
    for i in range(config.n_layers):
        for p in (*llada.LORA_TARGETS, "attn_norm", "ff_norm"):
            kind = "weight" if p.endswith("norm") else "kernel"
            out[f"toy.layers.{i}.{p}.weight"] = (("blocks", p, kind), i, kind == "kernel")
    return out


def toy_family() -> family_lib.Family:
    def read_config(path):
        return hf_checkpoint.read_config(path, ToyConfig.from_hf_dict)

    def load(path, mesh=None, dtype=jnp.float32, rules=None):
        config = read_config(path)
        kw = {} if rules is None else {"rules": rules}
        return config, hf_checkpoint.load_hf_checkpoint(path, key_map(config), Toy(config),
                                                        mesh, dtype, **kw)

    def save(path, config, params, max_shard_size="5GB", dtype=None, **kw):
        hf_checkpoint.save_hf_checkpoint(path, config, params, key_map(config), code,
                                         max_shard_size, dtype, **kw)

    def preset(name, **overrides):
        return ToyConfig(**{**llada.PRESETS["test-tiny"], **overrides})

    code = hf_files.RemoteCode("Toy", (), {}, "", "tests.test_third_family.toy_family().load",
                               keep_source=False, forward="d1jax reads it back.")
    return family_lib.Family(
        name="toy", title="Toy", module=Toy, config_class=ToyConfig, model_types=("toy",),
        presets={"toy-tiny": {}}, make_config=preset, fields=llada.FAMILY.fields,
        lora_targets=llada.LORA_TARGETS, grpo_targets=llada.GRPO_TARGETS, load=load,
        save=save, read_config=read_config, remote_code=code, default_preset="toy-tiny",
        embedding="toy.embed.weight", checkpoints={"toy": ("TOY_PATH", "toy-tiny")},
        turn_ends=("<|eot_id|>",))


# The plugin a run imports: d1jax.model.family's registration call, nothing else.
PLUGIN = ("from d1jax.model import family\n"
          "from tests.test_third_family import toy_family\n"
          "family.register(toy_family())\n")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """One GRPO step of the letters toy task on a random tiny toy model, saved and exported."""
    root = tmp_path_factory.mktemp("toy")
    (root / "toy_plugin.py").write_text(PLUGIN)
    wd = root / "run"
    env = {**os.environ, family_lib.MODULES_ENV: "toy_plugin",
           "PYTHONPATH": os.pathsep.join([str(root), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", MAIN, "--config=configs/grpo_letters.py", f"--workdir={wd}",
         "--config.model.family=toy", "--config.model.random_init=toy-tiny",
         "--config.train.num_steps=1", "--config.train.export_hf=True"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return wd


def test_register_checks_the_interface():
    """A module without the interface's entry points is refused when it registers."""
    fam = toy_family()
    bad = type("NoCache", (), {"shifted_prediction": False})
    with pytest.raises(TypeError, match="NoCache is not a MaskPredictor.*no prefill"):
        family_lib.register(dataclasses.replace(fam, module=bad))
    assert "toy" not in family_lib.FAMILIES


def test_a_registered_family_samples_trains_saves_and_exports(toy_run):
    wd = toy_run
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and np.isfinite(rows[0]["loss"])
    assert 0.0 <= rows[0]["reward"] <= 1.0  # rewards of the run's own rollouts
    assert (wd / "checkpoints" / "1").is_dir()
    hf = wd / "hf"
    cfg_json = json.loads((hf / "config.json").read_text())
    assert cfg_json["model_type"] == "toy" and not cfg_json.get("auto_map")  # no remote code
    fam = toy_family()
    config, params = fam.load(hf)
    keys = set(hf_checkpoint.open_checkpoint(hf))
    assert keys == set(key_map(config)) and "toy.layers.0.q_proj.weight" in keys
    # It loads back under the toy names and runs.
    ids = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size - 8, (2, 12)))
    logits = Toy(config).apply({"params": params}, ids)
    assert np.isfinite(np.asarray(logits)).all()
    family_lib.FAMILIES["toy"] = fam  # detect() knows registered families only
    try:
        assert family_lib.detect(hf) == "toy"
    finally:
        del family_lib.FAMILIES["toy"]
