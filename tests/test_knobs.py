"""Config groups declared once (d1jax/config/knobs.py): the ConfigDict group and the typed
spec come from the same dataclass fields."""

import dataclasses

import pytest

from d1jax.config import ConfigError, knobs
from d1jax.run.spec import from_config


def test_train_group_and_loop_spec_come_from_one_declaration():
    fields = {f.name: f for f in dataclasses.fields(knobs.LoopSpec)}
    for tiny in (False, True):
        group = knobs.group(knobs.LoopSpec, tiny)
        assert set(group) == set(fields)  # every knob in the config, nothing else
        spec = knobs.translate(knobs.LoopSpec, group, "train", accept_changes=())
        for name, f in fields.items():
            want = f.metadata["tiny"] if tiny else f.default
            assert getattr(spec, name) == want, name
            assert f.metadata["doc"].strip(), f"train.{name} has no meaning written"
    # the CPU-sized defaults differ where declared, e.g. checkpoints every 2 steps
    assert knobs.group(knobs.LoopSpec, True).save_every == 2
    assert knobs.group(knobs.LoopSpec, False).save_every == 100


def test_a_run_config_carries_the_declared_train_group_into_its_spec():
    from d1jax import config as config_lib
    c = config_lib.grpo("sudoku", "tiny")
    with c.unlocked():
        c.train.save_every, c.train.accept_changes = 7, "optim.learning_rate, seed"
    spec = from_config(c)
    assert spec.train.save_every == 7
    assert spec.train.accept_changes == ("optim.learning_rate", "seed")  # parsed once
    assert spec.train == knobs.LoopSpec(**{**dict(c.train), "accept_changes": (
        "optim.learning_rate", "seed")})


def test_a_value_of_the_wrong_type_names_the_knob():
    """A ConfigDict keeps its fields' types on override; a group a config file builds by
    hand (a plain mapping) is checked on translation."""
    group = dict(knobs.group(knobs.LoopSpec, True), save_every="often")
    with pytest.raises(ConfigError, match=r"train.save_every='often': expected int"):
        knobs.translate(knobs.LoopSpec, group, "train", accept_changes=())
    group = dict(knobs.group(knobs.LoopSpec, True), export_hf=1)  # ints are not flags
    with pytest.raises(ConfigError, match="train.export_hf=1: expected bool"):
        knobs.translate(knobs.LoopSpec, group, "train", accept_changes=())
    with pytest.raises(TypeError, match="no knobs"):
        knobs.group(knobs.LoopSpec, False, save_evry=3)
