"""An objective registered from outside the package trains through ``python -m d1jax.main``
as the built-in ones do: its knobs become config.grpo.<name>, its record's facts (default
beta, hyper-parameters, families) are the ones the builders, the spec and the loop read.

The objective is "toy_reinforce": REINFORCE on d1's one-step estimator, -scale x mean over rows
of A x (the row's mean log-prob), no ratio and no reference term. It lives in
``toy_objective()`` below and touches no file of the package: the run imports a plugin module
(``$D1JAX_OBJECTIVE_MODULES``) that calls ``registry.register`` on it.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import config as config_lib
from d1jax.config import ConfigError
from d1jax.knobs import frozen, knob, shared
from d1jax.metrics import read_jsonl
from d1jax.objectives import registry, table
from d1jax.run import spec as spec_lib
from tests.learnable import MAIN

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
NAME = "toy_reinforce"


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """The objective's own config (``GRPOConfig.hparams``)."""

    scale: float = 1.0


@frozen
class ToyKnobs:
    """config.grpo.toy_reinforce."""

    scale: float = knob(1.0, "Loss multiplier.", low=0)


def _loss(model, cfg, params, rows, seed_1, dropout_rng):
    logps_bc = table.estimate_logps(model, cfg, params, rows, seed_1, dropout_rng=dropout_rng,
                                    p_mask_prompt=0.0)[0]
    mask = rows.completion_mask.astype(jnp.float32)
    seq_b = jnp.sum(logps_bc * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
    loss = -cfg.hparams.scale * jnp.mean(rows.advantages * seq_b)
    return loss, {"toy_scale": jnp.asarray(cfg.hparams.scale), "toy_logp": jnp.mean(seq_b)}


def toy_objective() -> registry.Objective:
    return registry.Objective(
        NAME, _loss, table.mask_prompt_rows, None, ToyConfig, knobs=ToyKnobs,
        doc="The toy REINFORCE of tests/test_third_objective.py.",
        make_hparams=lambda g, s: shared(ToyConfig, g.toy_reinforce), families=("llada",))


# The plugin a run imports: the registry's registration call, nothing else.
PLUGIN = ("from d1jax.objectives import registry\n"
          "from tests.test_third_objective import toy_objective\n"
          "registry.register(toy_objective())\n")

# A config file of the run's own: the builder gives the objective its knobs and beta.
CONFIG = ("from d1jax import config\n"
          "from d1jax.tasks import letters\n\n\n"
          "def get_config(arg=None):\n"
          f"    c = config.grpo(letters.NAME, 'tiny', objective={NAME!r})\n"
          "    c.update_from_flattened_dict(letters.TINY_OVERRIDES)\n"
          "    return c\n")


@pytest.fixture
def registered():
    """The toy objective in this process's registry, for the config-time checks."""
    entry = registry.register(toy_objective())
    try:
        yield entry
    finally:
        del registry.OBJECTIVES[NAME]


def test_its_knobs_beta_and_hparams_come_from_its_record(registered):
    c = config_lib.grpo("letters", "tiny", objective=NAME)
    assert c.grpo.beta == 0.0 and c.grpo.toy_reinforce.scale == 1.0  # ratio-free: no KL
    with c.unlocked():
        c.grpo.toy_reinforce.scale = 3.0
    spec = spec_lib.from_config(c)
    assert spec.grpo.hparams == ToyConfig(scale=3.0) and spec.grpo_run.toy_reinforce.scale == 3.0
    with c.unlocked():
        c.grpo.toy_reinforce.scale = -1.0
    with pytest.raises(ConfigError, match=r"^grpo.toy_reinforce.scale=-1.0: must be >= 0$"):
        spec_lib.from_config(c)


def test_a_family_it_is_not_adapted_to_is_refused_in_one_line(registered):
    c = config_lib.grpo("letters", "tiny", objective=NAME, checkpoint="dream")
    with pytest.raises(ConfigError) as e:
        spec_lib.from_config(c)
    assert "\n" not in str(e.value)
    assert f"objective {NAME!r} is not adapted to model family 'dream'" in str(e.value)
    # A built-in objective not wired to block diffusion's layout is refused the same way.
    c = config_lib.grpo("gsm8k", "tiny", objective="wd1", checkpoint="sdar")
    with pytest.raises(ConfigError, match="objective 'wd1' is not adapted to model family "
                                          "'sdar' \\(it runs on llada, dream\\)"):
        spec_lib.from_config(c)


def test_an_unknown_objective_lists_the_registered_ones():
    c = config_lib.grpo("letters", "tiny")
    with c.unlocked():
        c.grpo.objective = NAME
    with pytest.raises(ConfigError, match=r"objective='toy_reinforce': choose one of \["):
        spec_lib.from_config(c)


def test_a_registered_objective_trains_through_main(tmp_path):
    (tmp_path / "toy_objective_plugin.py").write_text(PLUGIN)
    (tmp_path / "toy_objective_config.py").write_text(CONFIG)
    wd = tmp_path / "run"
    env = {**os.environ, registry.MODULES_ENV: "toy_objective_plugin",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", MAIN, f"--config={tmp_path / 'toy_objective_config.py'}",
         f"--workdir={wd}", "--config.train.num_steps=2", "--config.train.export_hf=False",
         "--config.grpo.toy_reinforce.scale=2.0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_jsonl(wd / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["loss"]) and r["toy_scale"] == 2.0 for r in rows)  # its knob
    assert "kl" not in rows[0]  # no reference pass: the record says ratio-free
