"""Config groups declared once (d1jax/config/groups.py, the mechanism d1jax/config/knobs.py):
the ConfigDict group, the typed spec and the translation between them come from the same
dataclass fields."""

import dataclasses

import jax.numpy as jnp
import pytest

from d1jax import config as config_lib
from d1jax import sampling as smp
from d1jax.config import ConfigError, groups, knobs
from d1jax.model import LoraConfig
from d1jax.run import spec as spec_lib
from d1jax.run.spec import from_config

# config group -> (its declaration, the spec class holding it)
GROUPS = {
    "model": (groups.ModelKnobs, spec_lib.ModelSpec),
    "lora": (groups.LoraKnobs, None),  # the spec holds a model.LoraConfig
    "optim": (groups.OptimKnobs, spec_lib.OptimSpec),
    "train": (groups.LoopSpec, groups.LoopSpec),
    "task": (groups.TaskKnobs, spec_lib.TaskSpec),
    "mesh": (groups.MeshKnobs, spec_lib.MeshSpec),
    "sampler": (groups.SamplerKnobs, None),  # the spec holds a sampling.SamplerConfig
    "grpo": (groups.GRPOKnobs, spec_lib.GRPOSpec),
    "sft": (groups.SFTKnobs, spec_lib.SFTSpec),
    "eval": (groups.EvalKnobs, spec_lib.EvalSpec),
}


def names(cls) -> set[str]:
    return {f.name for f in knobs.fields(cls)}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_each_group_and_its_spec_come_from_one_declaration(name):
    cls, spec_cls = GROUPS[name]
    for tiny in (False, True):
        group = knobs.group(cls, tiny)
        assert set(group) == names(cls)  # every knob in the config, nothing else
        spec = knobs.translate(cls, group, name)
        for f in knobs.fields(cls):
            assert f.metadata["doc"].strip(), f"{name}.{f.name} has no meaning written"
            if "group" in f.metadata:
                continue
            want = f.metadata["tiny"] if tiny else f.metadata["default"]
            parse = f.metadata["parse"]
            assert getattr(spec, f.name) == (parse(want) if parse else want), f.name
    if spec_cls is not None:  # the spec adds methods and computed fields, never a knob
        assert issubclass(spec_cls, cls) and names(spec_cls) == names(cls)


def test_every_run_config_group_holds_exactly_the_declared_knobs():
    configs = [config_lib.grpo("sudoku", "tiny"), config_lib.grpo("gsm8k", None, "spg"),
               config_lib.sft("tiny"), config_lib.sft(None, checkpoint="dream"),
               config_lib.eval_config("gsm8k"), config_lib.eval_config("mbpp,tiny")]
    for c in configs:
        for name, (cls, _) in GROUPS.items():
            if name not in c:
                continue
            keys = set(c[name])
            if c.stage == "eval" and name == "sampler":  # lengths from eval.gen_lengths
                keys |= {"gen_length", "steps"}
            assert keys == names(cls), (c.stage, name)
        for sub in ("wd1", "spg", "coupled_grpo", "justgrpo"):
            if "grpo" in c:
                field = {f.name: f for f in knobs.fields(groups.GRPOKnobs)}[sub]
                assert set(c.grpo[sub]) == names(field.metadata["group"])


def test_library_types_take_every_knob_of_their_group_by_name():
    """knobs.shared passes knobs by name: a knob the library type has no field for would be
    dropped, so each is either a field there or consumed by the spec (lora.enabled)."""
    fields = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
    assert names(groups.SamplerKnobs) <= fields(smp.SamplerConfig)
    assert names(groups.LoraKnobs) - fields(LoraConfig) == {"enabled"}
    from d1jax.objectives import coupled_grpo, justgrpo, spg, tracerl, wd1
    for group, target in [(groups.WD1Knobs, wd1.WD1Config), (groups.SPGKnobs, spg.SPGConfig),
                          (groups.CoupledGRPOKnobs, coupled_grpo.CoupledGRPOConfig),
                          (groups.JustGRPOKnobs, justgrpo.JustGRPOConfig),
                          (groups.TraceRLKnobs, tracerl.TraceRLConfig)]:
        assert names(group) <= fields(target), (group.__name__, names(group) - fields(target))


def test_a_run_config_carries_its_groups_into_the_spec():
    c = config_lib.grpo("sudoku", "tiny")
    with c.unlocked():
        c.train.save_every, c.train.accept_changes = 7, "optim.learning_rate, seed"
        c.model.dtype, c.grpo.spg.num_t, c.sampler.top_k = "bfloat16", 1, 5
        c.lora.targets, c.task.source = ("q_proj",), ""
    spec = from_config(c)
    assert spec.train.save_every == 7
    assert spec.train.accept_changes == ("optim.learning_rate", "seed")  # parsed once
    assert spec.model.dtype is jnp.bfloat16 and spec.model.param_dtype is jnp.float32
    assert spec.grpo_run.spg.num_t == 1 and spec.sampler.top_k == 5
    assert spec.model.lora.targets == ("q_proj",) and spec.task.source is None
    assert spec.grpo.epsilon == spec.grpo_run.epsilon == c.grpo.epsilon  # one value, two views
    assert isinstance(spec.grpo_run, groups.GRPOKnobs)
    assert spec.train == knobs.translate(groups.LoopSpec, c.train, "train")


@pytest.mark.parametrize("key,value,message", [
    ("train.save_every", "often", r"^train.save_every='often': expected int$"),
    ("train.export_hf", 1, r"^train.export_hf=1: expected bool$"),  # ints are not flags
    ("grpo.spg.num_t", 1.5, r"^grpo.spg.num_t=1.5: expected int$"),
    ("model.unroll_layers", "yes", r"^model.unroll_layers='yes': expected bool or None$"),
    ("eval.gen_lengths", (32, "64"), r"^eval.gen_lengths=\(32, '64'\): expected a tuple of int$"),
    ("mesh.shape", 8, r"^mesh.shape=8: expected a tuple of int$"),
    ("grpo.token_mean", "batch", r"^grpo.token_mean='batch': choose one of group, step$"),
    ("model.param_dtype", "int8",
     r"^model.param_dtype='int8': choose one of float32, bfloat16, float16$"),
    # Counts below their least value (d1jax.main: before any data, model or workdir).
    ("grpo.num_generations", 1, r"^grpo.num_generations=1: must be >= 2$"),
    ("sampler.block_length", 0, r"^sampler.block_length=0: must be >= 1$"),
    ("train.log_every", 0, r"^train.log_every=0: must be >= 1$"),
    ("task.num_train", -1, r"^task.num_train=-1: must be >= 0$"),
    ("eval.gen_lengths", (), r"^eval.gen_lengths=\(\): needs at least one value, each >= 1$"),
    ("eval.gen_lengths", (32, 0), r"^eval.gen_lengths=\(32, 0\): needs at least one value"),
])
def test_a_bad_value_is_refused_naming_the_knob_the_value_and_what_is_allowed(key, value,
                                                                              message):
    """A ConfigDict keeps its fields' types on override; a group a config file builds by hand
    (a plain mapping) is checked on translation."""
    c = config_lib.eval_config("sudoku,tiny") if key.startswith("eval") else \
        config_lib.grpo("sudoku", "tiny")
    group, knob_name = key.rsplit(".", 1)
    with c.unlocked():
        node = c
        for part in group.split("."):
            node = node[part]
        as_dict = node.to_dict()
        as_dict[knob_name] = value
        *path, last = group.split(".")
        parent = c
        for part in path:
            parent = parent[part]
        parent[last] = as_dict  # a plain dict: no ConfigDict type check on the way in
    with pytest.raises(ConfigError, match=message):
        from_config(c)


def test_group_refuses_an_unknown_knob():
    with pytest.raises(TypeError, match="no knobs"):
        knobs.group(groups.LoopSpec, False, save_evry=3)
    assert knobs.describe(groups.GRPOKnobs)["spg.num_t"].startswith("J:")


def test_the_knob_reference_in_docs_is_the_one_the_code_prints():
    """docs/configs.md is `python -m d1jax.config`'s output: every knob, its type, defaults
    and meaning as declared; regenerate it after changing a declaration."""
    from pathlib import Path

    from d1jax.config.__main__ import GROUPS as DOC_GROUPS, reference
    doc = Path(__file__).resolve().parents[1] / "docs" / "configs.md"
    assert doc.read_text() == reference(), "run: python -m d1jax.config > docs/configs.md"
    assert [name for name, _ in DOC_GROUPS] == list(GROUPS)  # every group documented


# Every bounded knob and its bound, written here independently of the declarations: a bound
# dropped from a knob (or from the check) shows as a failure below, not only as a docs diff.
LEAST = {
    "model.width": 0, "model.n_layers": 0, "model.vocab_size": 0,  # 0: the preset's
    "model.layers_per_loop": 1,
    "lora.rank": 1,
    "optim.grad_accum": 1,
    "train.num_steps": 0,  # 0 only with num_epochs (from_config refuses it otherwise)
    "train.log_every": 1, "train.sample_every": 1, "train.save_every": 1,  # step % every
    "train.stop_after": 0, "train.stopped_exit_code": 0,
    "task.num_train": 0,
    "sampler.gen_length": 1, "sampler.steps": 1, "sampler.block_length": 1,
    "sampler.cache_refresh": 0, "sampler.top_k": 0, "sampler.max_post_edit_steps": 0,
    "grpo.num_generations": 2,  # a group of one has no advantage
    "grpo.prompts_per_step": 1, "grpo.rollout_batch": 0, "grpo.num_iterations": 1,
    "grpo.num_epochs": 0, "grpo.ref_model_sync_steps": 1,
    "grpo.spg.num_t": 1, "grpo.justgrpo.position_chunk": 0,
    "grpo.tracerl.shrink": 1, "grpo.tracerl.post_num": -1, "grpo.tracerl.block_size": 0,
    "grpo.ebpo.num_t": 1, "grpo.ebpo.block_size": 0,
    "sft.batch_size": 1, "sft.max_length": 1, "sft.num_epochs": 0, "sft.post_num": -1,
    "eval.gen_lengths": 1, "eval.batch_size": 1, "eval.num_examples": 0,
    "eval.steps_per_block": 0,
}
MOST = {"train.stopped_exit_code": 255}  # a shell keeps 8 bits: 256 would read as success


def declared(cls, prefix: str, bound: str) -> dict:
    out = {}
    for f in knobs.fields(cls):
        if "group" in f.metadata:
            out.update(declared(f.metadata["group"], f"{prefix}{f.name}.", bound))
        elif f.metadata.get(bound) is not None:
            out[prefix + f.name] = f.metadata[bound]
    return out


def run_config(key: str):
    if key.startswith("eval."):
        return config_lib.eval_config("sudoku,tiny")
    return config_lib.sft("tiny") if key.startswith("sft.") else config_lib.grpo("sudoku", "tiny")


def set_knob(c, key: str, value) -> None:
    """As ``--config.KEY=VALUE`` sets it: into the typed ConfigDict."""
    *path, name = key.split(".")
    node = c
    for part in path:
        node = node[part]
    with c.unlocked():
        node[name] = value


def test_the_declared_bounds_are_the_ones_runs_need():
    for bound, want in (("low", LEAST), ("high", MOST)):
        got = {}
        for name, (cls, _) in GROUPS.items():
            got.update(declared(cls, f"{name}.", bound))
        assert got == want, bound


@pytest.mark.parametrize("key", sorted(LEAST) + [f"{k}:high" for k in sorted(MOST)])
def test_each_bound_is_refused_at_config_time_in_one_line(key):
    key, _, side = key.partition(":")
    bound = MOST[key] if side else LEAST[key]
    bad = bound + 1 if side else bound - 1
    c = run_config(key)
    group, name = key.rsplit(".", 1)
    node = c
    for part in group.split("."):
        node = node[part]
    tuple_knob = isinstance(node[name], tuple)
    set_knob(c, key, (bad,) if tuple_knob else bad)
    with pytest.raises(ConfigError) as e:
        from_config(c)
    if tuple_knob:
        assert str(e.value) == f"{key}=({bad},): needs at least one value, each >= {bound}"
    else:
        assert str(e.value) == f"{key}={bad}: must be {'<=' if side else '>='} {bound}"
    # The bound itself is allowed.
    set_knob(c, key, (bound,) if tuple_knob else bound)
    cls = GROUPS[group.split(".")[0]][0]
    for part in group.split(".")[1:]:
        cls = {f.name: f for f in knobs.fields(cls)}[part].metadata["group"]
    assert getattr(knobs.translate(cls, node, group), name) == ((bound,) if tuple_knob else bound)


def test_a_group_built_in_python_keeps_its_bounds():
    """A notebook's spec (or ``dataclasses.replace`` of a translated one) is checked too: a
    sample interval of 0 would end the run in ``step % 0`` after its first rollout."""
    with pytest.raises(ConfigError, match=r"^LoopSpec.sample_every=0: must be >= 1$"):
        groups.LoopSpec(sample_every=0)
    spec = from_config(config_lib.grpo("sudoku", "tiny"))
    with pytest.raises(ConfigError, match=r"^LoopSpec.save_every=0: must be >= 1$"):
        dataclasses.replace(spec.train, save_every=0)
    with pytest.raises(ConfigError, match=r"^GRPOSpec.num_generations=1: must be >= 2$"):
        dataclasses.replace(spec.grpo_run, num_generations=1)


# Each knob is declared once: on the library config the pure functions take where there is one
# (d1jax.knobs.of / group_of carry its field into the group), else in the group. Same-named
# fields that are different things: the model's param_dtype and the adapters' (LoraConfig);
# config.sft.loss, which also takes "family" (the spec resolves it to SFTConfig.loss).
NOT_THE_SAME_KNOB = {("ModelKnobs", "param_dtype"), ("SFTKnobs", "loss")}


def library_pairs() -> list[tuple[type, type]]:
    """(config group, the library config it feeds) of every group with one; the built-in
    objectives' groups from their records."""
    from d1jax.objectives import registry, table
    from d1jax.run import optim
    registry.load_modules()
    pairs = [(groups.SamplerKnobs, smp.SamplerConfig), (groups.LoraKnobs, LoraConfig),
             (groups.ModelKnobs, LoraConfig), (groups.OptimKnobs, optim.OptimConfig),
             (groups.GRPOKnobs, table.GRPOConfig), (groups.SFTKnobs, table.SFTConfig)]
    return pairs + [(o.knobs, o.hparams) for o in registry.OBJECTIVES.values()
                    if o.knobs is not None and o.knobs.__module__.startswith("d1jax.")]


def declared_twice(group, library) -> list[str]:
    """Names ``group`` and ``library`` both have that neither takes from the other."""
    in_group = {f.name: f for f in knobs.fields(group) if "group" not in f.metadata}
    out = []
    for f in dataclasses.fields(library):
        g = in_group.get(f.name)
        if g is None or (group.__name__, f.name) in NOT_THE_SAME_KNOB:
            continue
        taken = (g.metadata.get("from") is library and "doc" in f.metadata) or \
            f.metadata.get("from") is group
        if not taken:
            out.append(f.name)
    return out


def test_no_knob_is_declared_twice():
    """A knob the library takes is declared on its config and the group takes it from there
    (or, for run.optim.OptimConfig above the config layer, the other way round): its doc,
    type, bounds and tiny default exist once. A same-named field written in both places (a
    knob(...) in the group, or a plain field with its own default in the library) fails."""
    pairs = library_pairs()
    assert len(pairs) >= 11  # six groups and the five built-in objectives with knobs
    assert {g.__name__: declared_twice(g, lib) for g, lib in pairs} == \
        {g.__name__: [] for g, _ in pairs}


def test_the_sampler_group_is_sampler_configs_knobs_with_the_rollouts_set_once():
    """config.sampler's knobs are SamplerConfig's fields (meaning, bounds, tiny default); the
    only values a GRPO config's sampler holds other than SamplerConfig's are the rollouts'
    (defaults.ROLLOUT_SAMPLER: d1's train.yaml), an evaluation config's none."""
    lib = {f.name: f for f in knobs.fields(smp.SamplerConfig)}
    assert names(groups.SamplerKnobs) == set(lib) and len(lib) == 19
    for f in knobs.fields(groups.SamplerKnobs):
        assert f.metadata["from"] is smp.SamplerConfig
        for key in ("doc", "default", "tiny", "low", "high", "choices"):
            assert f.metadata[key] == lib[f.name].metadata[key], (f.name, key)
    for tiny in (False, True):
        rollout = config_lib.grpo("sudoku", "tiny" if tiny else None).sampler
        evaluation = config_lib.sampler_fields(tiny, rollout=False)  # eval_config's
        declared = {n: f.metadata["tiny" if tiny else "default"] for n, f in lib.items()}
        moved = {k: v for k, v in rollout.items() if declared[k] != v}
        want = {"temperature": 0.9} if tiny else config_lib.defaults.ROLLOUT_SAMPLER
        assert moved == want
        assert {k: v for k, v in evaluation.items() if declared[k] != v} == {}
    assert (smp.SamplerConfig().gen_length, smp.SamplerConfig().steps,
            smp.SamplerConfig().temperature) == (128, 64, 0.0)  # the library's own defaults


def test_a_library_config_checks_its_bounds_after_its_own_rules():
    """``frozen`` composes: the class's own checks (their messages) then the knobs' bounds,
    however the config is built (a notebook's SamplerConfig, dataclasses.replace)."""
    with pytest.raises(ValueError, match="steps=0 must be positive"):
        smp.SamplerConfig(steps=0)
    with pytest.raises(ValueError, match="block_length=8 must divide gen_length=30"):
        smp.SamplerConfig(gen_length=30, block_length=8)
    with pytest.raises(ConfigError, match=r"^SamplerConfig.top_k=-1: must be >= 0$"):
        smp.SamplerConfig(top_k=-1)  # no rule of its own on loop "llada": the bound
    with pytest.raises(ConfigError, match=r"^LoraConfig.rank=0: must be >= 1$"):
        dataclasses.replace(LoraConfig(), rank=0)
    from d1jax.objectives import tracerl
    assert tracerl.TraceRLConfig().block_size is None  # held as None, the config's 0
    assert tracerl.TraceRLConfig().post_num == 0


def test_a_borrowed_knob_keeps_its_source_type():
    from d1jax.knobs import frozen, of

    class Slip:
        steps: float = of(smp.SamplerConfig)  # SamplerConfig.steps is an int

    with pytest.raises(TypeError, match="Slip.steps is annotated"):
        frozen(Slip)
