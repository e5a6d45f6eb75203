"""Resume compatibility (d1jax/run/resume.py) on hand-made workdirs: which config changes
are refused, accepted by name, or moved aside. End-to-end runs: tests/test_faults.py."""

import dataclasses
import json

import pytest

from d1jax import config as config_lib
from d1jax.run import resume
from d1jax.run import spec as spec_lib

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


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


# Written by hand, not read from spec.RESUME_FIELDS: every config field that shapes what a
# checkpoint holds or the data it resumes into, each with a value other than the tiny
# configs' own. A change of any one of them alone must be refused on resume.
SHAPES_STATE = {
    # what the run is and its data order
    "stage": "sft", "seed": 43, "max_prompt_length": 100,
    "task.name": "countdown", "task.source": "d1", "task.num_train": 128,
    # the model's params: their tree, shapes and stored dtype
    "model.family": "dream", "model.path": "/elsewhere/llada", "model.tokenizer_path": "/tok",
    "model.random_init": "bench-tiny", "model.width": 128, "model.n_layers": 3,
    "model.vocab_size": 2048, "model.tokenizer_vocab": 512, "model.param_dtype": "bfloat16",
    "model.base_quant": "int8",
    "lora.enabled": False, "lora.rank": 4, "lora.alpha": 32.0, "lora.targets": ("q_proj",),
    # the optimizer state and where its schedule stands
    "optim.learning_rate": 5e-4, "optim.b1": 0.8, "optim.b2": 0.999, "optim.eps": 1e-6,
    "optim.weight_decay": 0.0, "optim.max_grad_norm": 0.0, "optim.warmup_ratio": 0.1,
    "optim.lr_schedule": "linear", "optim.min_lr_rate": 0.1, "optim.master_weights": "none",
    # the objective, its reference copy, and rows and updates per rollout
    "grpo.objective": "wd1", "grpo.num_iterations": 3, "grpo.beta": 0.0,
    "grpo.sync_ref_model": True, "grpo.num_generations": 8, "grpo.prompts_per_step": 4,
    # SFT's batches
    "sft.batch_size": 16, "sft.max_length": 128, "sft.tokenize": "split", "sft.loss": "masked",
}
# Fields a resumed run may change (cadences, lengths of the run, mesh, compute, sampler and
# objective knobs), with a value for those changed one by one below.
MAY_CHANGE = {
    "train.num_steps": 100, "train.save_every": 7, "train.log_every": 3, "mesh.shape": (1, 8, 1),
    "model.remat": True, "model.dtype": "bfloat16", "sampler.kv_cache": "dual",
    "sampler.temperature": 0.0, "lora.dropout": 0.05, "grpo.epsilon": 0.2,
    "optim.grad_accum": 2, "train.accept_changes": "optim.b1", "workdir": "/elsewhere",
}
MAY_CHANGE_TOO = {  # the other fields that may change, by name
    "grpo.advantage", "grpo.coupled_grpo.t_max", "grpo.coupled_grpo.t_min",
    "grpo.p_mask_prompt", "grpo.random_masking", "grpo.ref_model_mixup_alpha",
    "grpo.ref_model_sync_steps", "grpo.spg.eubo_beta", "grpo.spg.max_t", "grpo.spg.min_t",
    "grpo.spg.mix_weight", "grpo.spg.num_t", "grpo.wd1.negative", "mesh.rules",
    "model.layers_per_loop", "model.unroll_layers", "sampler.block_length",
    "sampler.cache_refresh", "sampler.cfg_scale", "sampler.first_position",
    "sampler.gen_length", "sampler.parallel_rule", "sampler.recompute", "sampler.remasking",
    "sampler.steps", "sampler.threshold", "sampler.use_attention_mask",
    "train.async_checkpoints", "train.compile_cache", "train.export_hf",
    "train.if_incompatible", "train.keep_best_metric", "train.max_to_keep",
    "train.sample_every", "train.stop_after", "train.stopped_exit_code",
    "sft.eps", "sft.num_epochs", "grpo.num_epochs", "grpo.token_mean", "grpo.rollout_batch",
    "sampler.loop", "sampler.alg", "sampler.top_p", "sampler.top_k",
    "grpo.justgrpo.gain", "grpo.justgrpo.position_chunk",
    "grpo.tracerl.beta", "grpo.tracerl.block_size", "grpo.tracerl.lower_p",
    "grpo.tracerl.method", "grpo.tracerl.post_num", "grpo.tracerl.shrink",
    "grpo.tracerl.their_dream_forward", "grpo.tracerl.upper_p",
    "grpo.tracerl.use_kl_estimator_k3",
    "sft.lower_p", "sft.upper_p", "sft.post_num",
    "grpo.ebpo.block_size", "grpo.ebpo.eps_high", "grpo.ebpo.eps_low", "grpo.ebpo.num_t",
    "grpo.ebpo.t_max", "grpo.ebpo.t_min",
    "grpo.ebpo.routing_replay",  # the routes ride in the rollout's batch, never in a checkpoint
    "sampler.edit_threshold", "sampler.max_post_edit_steps",
}


def _configs():
    return config_lib.grpo("sudoku", "tiny"), config_lib.sft("tiny")


def _leaves(c, prefix=""):
    for key, value in c.items():
        if hasattr(value, "items"):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def _set(c, dotted, value):
    *groups, field = dotted.split(".")
    node = c
    for g in groups:
        node = node[g]
    setattr(node, field, value)
    return c


def _has(c, dotted):
    return dotted in set(_leaves(c))


def test_every_config_field_is_classified_and_the_identity_records_the_state_shaping_ones():
    """A field added to the configs is a decision: it shapes the saved state (SHAPES_STATE
    here and spec.RESUME_FIELDS) or may change on resume (MAY_CHANGE)."""
    fields = set().union(*(_leaves(c) for c in _configs()))
    shaping = {f for f in SHAPES_STATE if f in fields}  # (a field not in the configs yet)
    unclassified = fields - shaping - set(MAY_CHANGE) - MAY_CHANGE_TOO
    assert not unclassified, (f"config fields {sorted(unclassified)}: add each to SHAPES_STATE "
                              "(and spec.RESUME_FIELDS) if it shapes a checkpoint's state or data "
                              "order, else to MAY_CHANGE_TOO (tests/test_resume.py)")
    assert set(spec_lib.RESUME_FIELDS) == shaping
    assert not shaping & (set(MAY_CHANGE) | MAY_CHANGE_TOO)
    for c in _configs():
        ident = dict(spec_lib.resume_identity(c))
        assert set(ident) == {f for f in shaping if _has(c, f)}
        for f in set(MAY_CHANGE) | MAY_CHANGE_TOO:
            assert f not in ident


@pytest.mark.parametrize("field", sorted(SHAPES_STATE))
def test_changing_one_state_shaping_field_alone_is_refused_naming_it(tmp_path, field):
    """Each field of the hand-written list, changed alone from a tiny config (GRPO, or SFT
    for sft.*): the identity differs in that field only, and resuming is refused with a
    message naming it with both values."""
    base = _configs()[1 if field.startswith("sft.") else 0]
    if not _has(base, field):
        assert field not in spec_lib.RESUME_FIELDS
        pytest.skip(f"{field} is not a config field yet")
    old = dict(spec_lib.resume_identity(base))
    changed = dict(spec_lib.resume_identity(_set(base.copy_and_resolve_references(), field,
                                                 SHAPES_STATE[field])))
    assert {f for f in old.keys() | changed.keys() if old.get(f) != changed.get(f)} == {field}
    spec = spec_lib.from_config(base)
    wd = _workdir(tmp_path, json.loads(json.dumps(old)))  # as the metadata file reads back
    resume.check(spec, wd)
    with pytest.raises(resume.IncompatibleResume) as e:
        resume.check(dataclasses.replace(spec, identity=tuple(changed.items())), wd)
    want = f"{field} {json.dumps(old[field])} -> {json.dumps(changed[field])}."
    assert f"written with another config: {want} Use" in str(e.value)


@pytest.mark.parametrize("field", sorted(MAY_CHANGE))
def test_changing_a_free_field_resumes(tmp_path, field):
    base = config_lib.grpo("sudoku", "tiny")
    wd = _workdir(tmp_path, json.loads(json.dumps(dict(_spec().identity))))
    changed = _set(base, field, MAY_CHANGE[field])
    assert dict(spec_lib.resume_identity(changed)) == dict(_spec().identity)
    resume.check(spec_lib.from_config(changed), wd)


def test_identity_holds_the_state_shaping_fields_and_not_the_others():
    ident = dict(_spec().identity)
    assert ident["lora.rank"] == 8 and ident["grpo.num_generations"] == 4
    assert ident["model.width"] == 64 and ident["task.name"] == "sudoku" and "seed" in ident


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
