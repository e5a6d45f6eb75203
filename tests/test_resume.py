"""Resume compatibility (d1jax/run/resume.py) on hand-made workdirs: which config changes
are refused, accepted by name, or moved aside. End-to-end runs: tests/test_faults.py."""

import json

import pytest

from d1jax import config as config_lib
from d1jax.run import resume
from d1jax.run import spec as spec_lib


def _workdir(tmp_path, identity: dict, step: int = 4):
    """A workdir whose checkpoint ``step`` recorded ``identity`` (Orbax's meta layout)."""
    meta = tmp_path / "checkpoints" / str(step) / "meta"
    meta.mkdir(parents=True)
    (meta / "metadata").write_text(json.dumps({"data": {}, "identity": identity}))
    for name in ("metrics.jsonl", "config.json"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "tokenizer").mkdir()
    return tmp_path


def _spec(**changes):
    c = config_lib.grpo("sudoku", "tiny")
    for dotted, value in changes.items():
        group, _, field = dotted.rpartition("__")
        setattr(c[group] if group else c, field, value)
    return spec_lib.from_config(c)


def test_identity_holds_the_state_shaping_fields_and_not_the_others():
    ident = dict(_spec().identity)
    assert ident["lora.rank"] == 8 and ident["grpo.num_generations"] == 4
    assert ident["model.width"] == 64 and ident["task.name"] == "sudoku" and "seed" in ident
    for free in ("train.num_steps", "train.save_every", "mesh.shape", "model.remat",
                 "sampler.kv_cache", "model.dtype"):
        assert free not in ident
    # Each RESUME_FIELDS entry a GRPO config has is recorded (SFT's are absent here).
    assert set(ident) == {f for f in spec_lib.RESUME_FIELDS if not f.startswith("sft.")}


def test_a_state_shaping_change_is_refused_with_each_field_named(tmp_path):
    wd = _workdir(tmp_path, dict(_spec().identity))
    resume.check(_spec(train__num_steps=100, train__save_every=7), wd)  # not state: fine
    with pytest.raises(resume.IncompatibleResume) as e:
        resume.check(_spec(lora__rank=4, grpo__prompts_per_step=4), wd)
    msg = str(e.value)
    assert "at step 4" in msg and "grpo.prompts_per_step 2 -> 4; lora.rank 8 -> 4." in msg
    assert "--config.train.if_incompatible=move_aside" in msg and "\n" not in msg
    assert sorted(p.name for p in wd.iterdir()) == ["checkpoints", "config.json",
                                                    "metrics.jsonl", "tokenizer"]


def test_a_change_of_lora_targets_is_refused(tmp_path):
    """The adapters' projections shape the state: d1's GRPO set, recorded as one string."""
    ident = dict(_spec().identity)
    assert ident["lora.targets"] == "q_proj,k_proj,v_proj,up_proj"
    wd = _workdir(tmp_path, json.loads(json.dumps(ident)))  # as the metadata file reads back
    resume.check(_spec(), wd)
    with pytest.raises(resume.IncompatibleResume,
                       match='lora.targets "q_proj,k_proj,v_proj,up_proj" -> "q_proj,v_proj"'):
        resume.check(_spec(lora__targets=("q_proj", "v_proj")), wd)


def test_accepted_changes_resume_and_unknown_names_are_refused(tmp_path):
    wd = _workdir(tmp_path, dict(_spec().identity))
    resume.check(_spec(optim__learning_rate=5e-4, train__accept_changes="optim.learning_rate"),
                 wd)
    with pytest.raises(resume.IncompatibleResume, match="lora.rank 8 -> 4"):
        resume.check(_spec(optim__learning_rate=5e-4, lora__rank=4,
                           train__accept_changes="optim.learning_rate"), wd)
    with pytest.raises(config_lib.ConfigError, match="train.accept_changes names train.num_steps"):
        _spec(train__accept_changes="train.num_steps")


def test_move_aside_keeps_the_whole_old_run_and_its_tokenizer(tmp_path):
    wd = _workdir(tmp_path, dict(_spec().identity))
    resume.check(_spec(lora__rank=4, train__if_incompatible="move_aside"), wd)
    (old,) = (wd / "previous").iterdir()
    assert sorted(p.name for p in old.iterdir()) == ["checkpoints", "config.json",
                                                     "metrics.jsonl", "tokenizer"]
    assert (old / "checkpoints" / "4" / "meta" / "metadata").exists()
    assert sorted(p.name for p in wd.iterdir()) == ["previous"]


def test_the_newest_readable_record_decides_and_old_checkpoints_pass(tmp_path):
    wd = _workdir(tmp_path, dict(_spec(lora__rank=4).identity), step=2)
    (wd / "checkpoints" / "6" / "meta").mkdir(parents=True)  # unreadable: no metadata file
    with pytest.raises(resume.IncompatibleResume, match="at step 2"):
        resume.check(_spec(), wd)
    legacy = tmp_path / "legacy"
    (legacy / "checkpoints" / "3" / "meta").mkdir(parents=True)
    (legacy / "checkpoints" / "3" / "meta" / "metadata").write_text('{"data": {}}')
    resume.check(_spec(lora__rank=4), legacy)  # written before identities were recorded


def test_a_field_the_checkpoint_predates_is_not_compared(tmp_path):
    """A checkpoint written before d1jax recorded a field (here the optimizer's schedule)
    resumes after an upgrade; the fields it did record are still compared."""
    old = dict(_spec().identity)
    del old["optim.lr_schedule"]
    resume.check(_spec(optim__lr_schedule="linear"), _workdir(tmp_path / "a", old))
    with pytest.raises(resume.IncompatibleResume, match="lora.rank"):
        resume.check(_spec(lora__rank=4), _workdir(tmp_path / "b", old))
