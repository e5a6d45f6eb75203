"""Dream through the GRPO loop that learns: diffu-GRPO on the learnable task (tests/learnable.py)
with a random tiny Dream raises the reward over its frozen control, resumes exactly and exports
the trained policy. Compiled optimized, as the seeds were chosen.

The sampler, estimator, SFT loss and objectives against float64 numpy references, and the
family's configs stopped, resumed and exported, are tests/test_dream_objectives.py.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.metrics import read_jsonl
from d1jax.model import dream
from d1jax.model import family as family_lib
from d1jax.model.dream import Dream
from d1jax.model.dream import load_hf_checkpoint as load_dream_checkpoint
from d1jax.run.context import RunStopped
from d1jax.train import grpo
from tests import learnable
# tests/test_dream_cache.py imports the fixture from here
from tests.test_dream_objectives import peaked  # noqa: F401

# --------------------------------------------------------------------------- the loop

DREAM = {"model.family": "dream", "model.random_init": "dream-test-tiny",
         "lora.targets": ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj",
                          "gate_proj")}
STEPS = learnable.OVERRIDES["train.num_steps"]


@pytest.fixture(scope="module")
def dream_run(tmp_path_factory):
    """diffu-GRPO on the learnable task with a random tiny Dream, exported."""
    wd = tmp_path_factory.mktemp("dream_grpo")
    grpo.run(learnable.config("diffu_grpo", **DREAM, **{"train.export_hf": True}), str(wd))
    return wd, read_jsonl(wd / "metrics.jsonl")


def test_diffu_grpo_on_dream_raises_the_reward(dream_run, tmp_path):
    """Against the frozen control on the same prompts and keys (docs/testing.md)."""
    _, rows = dream_run
    mu = learnable.config("diffu_grpo").grpo.num_iterations
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    rewards = [r["reward"] for r in rows][::mu]
    grpo.run(learnable.config("diffu_grpo", **DREAM, **learnable.FROZEN), str(tmp_path))
    frozen = [r["reward"] for r in read_jsonl(tmp_path / "metrics.jsonl")][::mu]
    assert rewards[0] == frozen[0]  # paired: the same first rollout
    assert learnable.gain(rewards, frozen) > learnable.MIN_GAIN, (
        np.round(rewards, 3).tolist(), np.round(frozen, 3).tolist())


def test_dream_export_is_a_dream_checkpoint_of_the_trained_policy(dream_run):
    wd, _ = dream_run
    hf = wd / "hf"
    cfg_json = json.loads((hf / "config.json").read_text())
    assert cfg_json["model_type"] == "Dream"  # random init: d1jax's remote code, named
    assert cfg_json["auto_map"] == dict(dream.REMOTE_CODE.auto_map)
    assert all((hf / name).is_file() for name in dream.REMOTE_CODE.files)
    assert (hf / "tokenizer.json").is_file() and (hf / "tokenizer_config.json").is_file()
    cfg, params = load_dream_checkpoint(hf)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size - 4, (2, 12)))
    logits = Dream(cfg).apply({"params": params}, ids)
    # the export is the trained policy, not the random init
    from d1jax.model import init_params
    init = init_params(Dream(cfg), jax.random.key(learnable.config("diffu_grpo").seed))
    assert not np.allclose(np.asarray(logits),
                           np.asarray(Dream(cfg).apply({"params": init}, ids)), atol=1e-3)
    assert family_lib.detect(hf) == "dream"


def test_dream_run_resumes_exactly(dream_run, tmp_path):
    """Stopped at step 2 and resumed to 4: steps 3 and 4 repeat the uninterrupted run's."""
    _, rows = dream_run
    with pytest.raises(RunStopped, match="stopped at step 2 of 4"):
        grpo.run(learnable.config("diffu_grpo", **DREAM, **{"train.num_steps": 4,
                                                          "train.stop_after": 2}), str(tmp_path))
    grpo.run(learnable.config("diffu_grpo", **DREAM, **{"train.num_steps": 4}), str(tmp_path))
    got = {r["step"]: r for r in read_jsonl(tmp_path / "metrics.jsonl")}
    want = {r["step"]: r for r in rows}
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "reward", "grad_norm", "kl"):
            np.testing.assert_allclose(got[step][key], want[step][key], rtol=1e-4, atol=1e-7,
                                       err_msg=f"step {step} {key}")
