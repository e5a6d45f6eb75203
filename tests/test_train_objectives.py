"""wd1, SPG and coupled-GRPO through the GRPO loop: each config's :tiny variant trains, logs its
objective's metrics, checkpoints and resumes exactly; bad objective settings are refused."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from d1jax.config import ConfigError
from d1jax.metrics import read_jsonl
from d1jax.run.context import RunStopped
from d1jax.train import grpo

ROOT = Path(__file__).resolve().parents[1]
# Each objective's own metric, compared across the resume beside the shared ones.
OWN_METRIC = {"wd1": "positive_loss", "spg": "elbo_mean", "coupled_grpo": "ratio_mean"}


def tiny_config(objective: str, **train):
    path = ROOT / "configs" / f"{objective}_sudoku.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("tiny")
    c.train.export_hf = False
    for k, v in train.items():
        setattr(c.train, k, v)
    return c


@pytest.mark.parametrize("objective", sorted(OWN_METRIC))
def test_objective_trains_checkpoints_and_resumes_exactly(objective, tmp_path, shared_d1):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    grpo.run(tiny_config(objective), str(full))
    rows = read_jsonl(full / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) and OWN_METRIC[objective] in r for r in rows)
    saved = sorted(p.name for p in (full / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == ["2", "4"]

    with pytest.raises(RunStopped, match="stopped at step 2 of 4"):
        grpo.run(tiny_config(objective, stop_after=2), str(resumed))
    assert [r["step"] for r in read_jsonl(resumed / "metrics.jsonl")] == [1, 2]
    grpo.run(tiny_config(objective), str(resumed))
    want = {r["step"]: r for r in rows}
    got = {r["step"]: r for r in read_jsonl(resumed / "metrics.jsonl")}
    for step in (3, 4):
        for key in ("loss", "reward", "grad_norm", "completion_length", OWN_METRIC[objective]):
            np.testing.assert_allclose(got[step][key], want[step][key], rtol=1e-4, atol=1e-7,
                                       err_msg=f"{objective} step {step} {key}")


@pytest.mark.parametrize("objective,field,value,message", [
    ("diffu_grpo", "objective", "ppo", "objective='ppo': choose one of"),
    ("wd1", "beta", 0.04, "beta=0.04: wd1 has no reference term; set beta=0"),
    ("spg", "beta", 0.04, "beta=0.04: spg has no reference term"),
    ("spg", "spg.num_t", 3, "spg.num_t=3 must be in [1, 2]"),
    ("spg", "spg.mix_weight", 1.5, "mix_weight=1.5 must be in [0, 1]"),
    ("coupled_grpo", "coupled_grpo.t_max", 1.0, "t_max=1.0] must satisfy"),
])
def test_bad_objective_settings_fail_with_one_clear_line(objective, field, value, message):
    from d1jax import config as config_lib
    from d1jax.run import spec as spec_lib
    c = config_lib.grpo("sudoku", "tiny", objective=objective)
    group, _, name = field.rpartition(".")
    setattr(c.grpo[group] if group else c.grpo, name, value)
    with pytest.raises(ConfigError) as err:
        spec_lib.from_config(c)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_objective_knobs_reach_the_typed_config():
    """Shared knobs (G, block length, beta, epsilon) come from the fields the loop uses."""
    from d1jax import config as config_lib
    from d1jax.run import spec as spec_lib
    c = config_lib.grpo("sudoku", "tiny", objective="spg")
    c.grpo.spg.eubo_beta, c.grpo.spg.num_t = 1.0, 1
    h = spec_lib.from_config(c).grpo.hparams
    assert (h.block_length, h.num_t, h.eubo_beta, h.p_mask_prompt) == (16, 1, 1.0, 0.15)
    c = config_lib.grpo("sudoku", "tiny", objective="wd1")
    c.grpo.wd1.negative = False
    spec = spec_lib.from_config(c)
    assert (spec.grpo.hparams.group_size, spec.grpo.hparams.negative) == (4, False)
    assert not spec.keep_reference  # beta 0: no reference copy
    c = config_lib.grpo("sudoku", "tiny", objective="coupled_grpo")
    h = spec_lib.from_config(c).grpo.hparams
    assert (h.beta, h.epsilon, h.t_min, h.t_max) == (0.04, 0.5, 0.2, 0.8)
