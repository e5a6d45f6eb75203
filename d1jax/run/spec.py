"""The run's ml_collections config, translated once into typed configs and validated.

``from_config(config)`` is the one translation of the ConfigDict: it returns a ``RunSpec``
of frozen dataclasses (model, LoRA, mesh, task, loop, optimizer, rollout sampler, GRPO,
SFT, evaluation) and fails before any compute with one ``ConfigError`` line naming the
bad field. Each group is read by ``config.knobs.translate`` from its declaration in
``config.groups`` (the spec classes here are those declarations, with methods added). Everything downstream takes the spec; before it, only the commands read the
ConfigDict (its stage, workdir and compile cache: ``d1jax.cli``) and the input checks
(``d1jax.config.check_inputs``). ``tests/structure.py --reach`` measures how far it goes.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from d1jax import sampling as smp
from d1jax import sharding
from d1jax.config import ConfigError, groups, knobs
from d1jax.config.groups import LoopSpec
from d1jax.model import LoraConfig
from d1jax.model import family as family_lib
from d1jax.model import lora as lora_lib
from d1jax.model import quant
from d1jax.objectives import advantages as adv_lib
from d1jax.objectives import registry
from d1jax.objectives.table import GRPOConfig, SFTConfig
from d1jax.run import optim
from d1jax.tasks import Task, get_task

STAGES = ("sft", "grpo", "eval")
_MASTER = {"float32": jnp.float32, "none": None}  # optim.master_weights


# The spec of each config group is its declaration (d1jax.config.groups: each knob's default,
# type and meaning written once) or a subclass of it that adds what the run computes from it.

@dataclasses.dataclass(frozen=True)
class ModelSpec(groups.ModelKnobs):
    """Where the model comes from and how it computes (config.model), with the adapters of
    config.lora (None: full fine-tuning)."""

    lora: LoraConfig | None = None

    @property
    def random(self) -> bool:
        """Random weights: a preset is named and no path given (a path wins)."""
        return bool(self.random_init) and not self.path


@dataclasses.dataclass(frozen=True)
class MeshSpec(groups.MeshKnobs):
    """config.mesh; ``rules``: logical axis -> mesh axes, the defaults updated by the config's."""

    def build(self, devices=None):
        """The mesh over ``devices`` (default: all), e.g. a TPU topology's when planning."""
        try:
            return sharding.make_mesh(self.shape, devices=devices)
        except ValueError as e:
            raise ConfigError(f"mesh.shape={self.shape}: {e}") from None


@dataclasses.dataclass(frozen=True)
class TaskSpec(groups.TaskKnobs):
    """config.task; ``source`` None: the task's default data."""

    def build(self) -> Task:
        return get_task(self.name)


@dataclasses.dataclass(frozen=True)
class OptimSpec(groups.OptimKnobs):
    """config.optim, with its AdamW (``run.optim.OptimConfig``, warmup_steps filled in by
    ``build``)."""

    adamw: optim.OptimConfig | None = None

    @property
    def master_dtype(self) -> Any:
        """optim.master_weights as a dtype; None: "none"."""
        return _MASTER[self.master_weights]

    def build(self, total_steps: int) -> optim.OptimConfig:
        """HF's warmup: ceil(ratio x total optimizer steps); the schedule's length."""
        return dataclasses.replace(self.adamw, total_steps=total_steps,
                                   warmup_steps=math.ceil(self.warmup_ratio * total_steps))


@dataclasses.dataclass(frozen=True)
class GRPOSpec(groups.GRPOKnobs):
    """config.grpo (the rollout side and the objectives' own knobs), around the update's
    ``GRPOConfig``."""

    def num_steps(self, n_examples: int, mu: int, default: int) -> int:
        """Optimizer steps of the run on ``n_examples`` training prompts. With num_epochs,
        TRL's count as d1 ran it: its RepeatRandomSampler keeps only whole batches of
        prompts_per_step prompts and feeds each to mu optimizer steps, so an epoch is
        (n // prompts_per_step) x mu steps; without, ``default`` (train.num_steps)."""
        if not self.num_epochs:
            return default
        return self.num_epochs * (n_examples // self.prompts_per_step) * mu


@dataclasses.dataclass(frozen=True)
class SFTSpec(groups.SFTKnobs):
    """config.sft, around the update's ``SFTConfig``."""

    @property
    def split_tokenize(self) -> bool:
        return self.tokenize == "split"

    def num_steps(self, n_examples: int, default: int) -> int:
        return self.num_epochs * (n_examples // self.batch_size) if self.num_epochs else default


@dataclasses.dataclass(frozen=True)
class EvalSpec(groups.EvalKnobs):
    """config.eval, with one sampler per gen length, steps = length / 2 (d1) or
    ``steps_per_block`` a block."""

    samplers: tuple[smp.SamplerConfig, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunSpec:
    stage: str
    seed: int
    max_prompt_length: int
    config_json: str  # the config as given, saved beside the run
    identity: tuple[tuple[str, Any], ...]  # the fields a checkpoint's state depends on
    model: ModelSpec
    mesh: MeshSpec
    task: TaskSpec
    train: LoopSpec
    optim: OptimSpec
    sampler: smp.SamplerConfig | None = None  # rollouts (grpo)
    grpo: GRPOConfig | None = None
    grpo_run: GRPOSpec | None = None
    sft: SFTConfig | None = None
    sft_run: SFTSpec | None = None
    eval: EvalSpec | None = None

    @property
    def keep_reference(self) -> bool:
        """Whether the state holds a reference copy: when beta != 0 under full fine-tuning
        (no base model to fall back on), or with ``grpo.sync_ref_model`` (the copy is mixed
        toward the policy). Under LoRA by default there is none: the reference is the base
        model with the adapters off at every step, as d1 scores it (PEFT's
        ``disable_adapter()``, diffu-grpo/diffu_grpo_trainer.py)."""
        if self.grpo is None or self.grpo.beta == 0:
            return False
        return self.grpo_run.sync_ref_model or self.model.lora is None


def with_tokens(sampler: smp.SamplerConfig, ids: dict) -> smp.SamplerConfig:
    """``sampler`` with the tokenizer's mask / EOS / EoT ids (``tokenizer.special_ids``)."""
    eot = ids["eot"] if ids.get("eot") is not None else ids["eos"]
    return dataclasses.replace(sampler, mask_id=ids["mask"], eos_id=ids["eos"], eot_id=eot)


def sampler_config(group, prefix: str, gen_length: int, steps: int) -> smp.SamplerConfig:
    """The one place a SamplerConfig is built from config fields (token ids are bound
    later, ``with_tokens``); a bad field is one ConfigError named ``prefix + field``."""
    s = knobs.translate(groups.SamplerKnobs, group, prefix.rstrip("."), gen_length=gen_length,
                        steps=steps)
    if gen_length % s.block_length:
        raise ConfigError(f"{prefix}block_length={s.block_length} does not divide "
                          f"gen_length={gen_length}")
    if steps % (gen_length // s.block_length):
        raise ConfigError(f"{prefix}steps={steps} is not a multiple of the "
                          f"{gen_length // s.block_length} blocks (gen_length / block_length)")
    try:
        return knobs.shared(smp.SamplerConfig, s)
    except ValueError as e:
        raise ConfigError(f"{prefix}{e}") from None


def _model(c, weights: bool = True) -> ModelSpec:
    m = knobs.translate(ModelSpec, c.model, "model")
    lo = knobs.translate(groups.LoraKnobs, c.lora, "lora")
    if m.tokenizer_path and not Path(m.tokenizer_path).is_dir():
        raise ConfigError(f"config.model.tokenizer_path={m.tokenizer_path!r} is not a directory")
    fam = _family(m)
    if m.path and not Path(m.path).is_dir():  # a path wins over random_init: it must exist
        raise ConfigError(f"config.model.path={m.path!r} is not a directory; download "
                          f"a {fam.title} checkpoint there (see README) or fix the path")
    if not m.random_init and not m.path and weights:
        envs = " or ".join(f"${env}" for env, _ in fam.checkpoints.values())
        example = (f", e.g. `hf download {fam.published[0]} --local-dir "
                   f"~/{fam.published[0].split('/')[-1].lower()}`" if fam.published else "")
        raise ConfigError(
            f"config.model.path is not set: point it (or {envs}) at a local Hugging Face "
            f"{fam.title} directory (README, docs/models.md){example}, or use a :tiny config")
    if m.layers_per_loop < 1:
        raise ConfigError(f"model.layers_per_loop={m.layers_per_loop!r} must be an int >= 1")
    _base_quant(m, lo.enabled)
    return dataclasses.replace(m, lora=_lora(lo, fam, m.base_quant) if lo.enabled else None)


def _family(m) -> family_lib.Family:
    """config.model.family, checked against the checkpoint's config.json and the preset."""
    name = m.family
    try:
        fam = family_lib.get(name)
    except ValueError as e:
        raise ConfigError(f"config.model.family: {e}") from None
    found = family_lib.detect(m.path) if m.path else None
    if found is not None and found != name:
        raise ConfigError(
            f"config.model.path={m.path!r} holds a {family_lib.get(found).title} checkpoint but "
            f"config.model.family={name!r}: set --config.model.family={found}")
    if m.random_init and not m.path and m.random_init not in fam.presets:
        raise ConfigError(f"config.model.random_init={m.random_init!r} is not a {fam.title} "
                          f"preset; choose one of {', '.join(sorted(fam.presets))}")
    return fam


def _base_quant(m, lora: bool) -> str:
    """config.model.base_quant, which needs LoRA: a quantised base is never trained."""
    scheme = m.base_quant
    if scheme not in quant.SCHEMES:
        raise ConfigError(f"model.base_quant={scheme!r}: choose one of {', '.join(quant.SCHEMES)}")
    if scheme != "none" and not lora:
        raise ConfigError(f"model.base_quant={scheme!r} quantises the frozen base of a LoRA run, "
                          "but lora.enabled=False (full fine-tuning trains every weight): set "
                          "--config.lora.enabled=True or --config.model.base_quant=none")
    return scheme


def _lora(lo: groups.LoraKnobs, fam: family_lib.Family, base_quant: str) -> LoraConfig:
    """The adapters of config.lora, on the family's projections that ``lora.targets`` names."""
    try:
        targets = lora_lib.check_targets(lo.targets, fam.lora_targets, fam.title)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return knobs.shared(LoraConfig, lo, targets=targets, base_quant=base_quant)


def _optim(c) -> OptimSpec:
    o = knobs.translate(OptimSpec, c.optim, "optim")
    if o.learning_rate <= 0:
        raise ConfigError(f"optim.learning_rate={o.learning_rate} must be positive")
    if o.lr_schedule not in optim.SCHEDULES:
        raise ConfigError(f"optim.lr_schedule={o.lr_schedule!r}: choose one of "
                          f"{', '.join(optim.SCHEDULES)}")
    return dataclasses.replace(o, adamw=knobs.shared(optim.OptimConfig, o,
                                                     schedule=o.lr_schedule))


def _hparams(g: GRPOSpec, s: smp.SamplerConfig, family: str) -> Any:
    """The objective's own config from config.grpo.<objective> (its record's
    ``make_hparams``), after checking that it runs on the model's family."""
    entry = registry.get(g.objective)
    entry.check_family(family)
    return None if entry.make_hparams is None else entry.make_hparams(g, s)


def _grpo(c, sampler: smp.SamplerConfig, o: OptimSpec, lora: LoraConfig | None, family: str
          ) -> tuple[GRPOConfig, GRPOSpec]:
    try:
        registry.load_modules()  # the built-in objectives and $D1JAX_OBJECTIVE_MODULES'
    except ValueError as e:
        raise ConfigError(f"${registry.MODULES_ENV}: {e}") from None
    g = knobs.translate(GRPOSpec, c.grpo, "grpo")
    try:
        cfg = knobs.shared(
            GRPOConfig, g, cfg_scale=sampler.cfg_scale,
            use_attention_mask=sampler.use_attention_mask, grad_accum=o.grad_accum,
            hparams=_hparams(g, sampler, family),
            lora_dropout=lora is not None and lora.dropout > 0,
            norm_group=g.num_generations if g.token_mean == "group" else None)
    except ValueError as e:
        raise ConfigError(f"grpo: {e}") from None
    if g.advantage not in adv_lib.ESTIMATORS:
        raise ConfigError(f"grpo.advantage={g.advantage!r}: choose one of "
                          f"{', '.join(adv_lib.ESTIMATORS)}")
    return cfg, g


def _sft(c, o: OptimSpec, lora: LoraConfig | None) -> tuple[SFTConfig, SFTSpec]:
    s = knobs.translate(SFTSpec, c.sft, "sft")
    fam = family_lib.get(c.model.family)
    loss = fam.sft_loss if s.loss == "family" else s.loss
    if loss != "masked" and fam.sft_loss == "masked":
        raise ConfigError(f"sft.loss={loss!r} needs a block diffusion model (SDAR, TraDo, "
                          f"LLaDA2); model.family={fam.name!r} trains with sft.loss='masked'")
    try:
        cfg = knobs.shared(SFTConfig, s, grad_accum=o.grad_accum, loss=loss,
                           lora_dropout=lora is not None and lora.dropout > 0)
    except ValueError as e:
        raise ConfigError(f"sft: {e}") from None
    return cfg, s


def _eval(c) -> EvalSpec:
    e = knobs.translate(EvalSpec, c.eval, "eval")

    def steps(gl: int) -> int:  # steps_per_block 0: d1's gen_length / 2
        return e.steps_per_block * (gl // c.sampler.block_length) or gl // 2
    return dataclasses.replace(e, samplers=tuple(
        sampler_config(c.sampler, "sampler.", gl, steps(gl)) for gl in e.gen_lengths))


# What a checkpoint's state and data order depend on: architecture, LoRA, optimizer,
# objective, batch, data order and task. A change to any of them is refused on resume
# (d1jax.run.resume); steps, cadences, mesh, compute dtype and sampler knobs may change.
RESUME_FIELDS = (
    "stage", "seed", "max_prompt_length", "model.family",
    "model.path", "model.tokenizer_path", "model.random_init", "model.width", "model.n_layers",
    "model.vocab_size", "model.tokenizer_vocab", "model.param_dtype", "model.base_quant",
    "lora.enabled", "lora.rank", "lora.alpha", "lora.targets",
    "optim.learning_rate", "optim.b1", "optim.b2", "optim.eps", "optim.weight_decay",
    "optim.max_grad_norm", "optim.warmup_ratio", "optim.lr_schedule", "optim.min_lr_rate",
    "optim.master_weights",
    "task.name", "task.source", "task.num_train",
    "grpo.objective", "grpo.num_iterations", "grpo.beta", "grpo.sync_ref_model",
    "grpo.num_generations", "grpo.prompts_per_step",
    "sft.batch_size", "sft.max_length", "sft.tokenize", "sft.loss",
)


def resume_identity(c) -> tuple[tuple[str, Any], ...]:
    """(field, value) of each RESUME_FIELDS entry the config has, values as JSON keeps them."""
    out = []
    for name in RESUME_FIELDS:
        node = c
        for part in name.split("."):
            node = node.get(part) if hasattr(node, "get") else None
            if node is None:
                break
        if isinstance(node, (tuple, list)):  # e.g. lora.targets: one string, JSON-stable
            node = ",".join(map(str, node))
        if node is not None:
            out.append((name, node if isinstance(node, (bool, int, float, str)) else str(node)))
    return tuple(out)


def _loop(c) -> LoopSpec:
    t = knobs.translate(LoopSpec, c.train, "train")
    unknown = [f for f in t.accept_changes if f not in RESUME_FIELDS]
    if unknown:
        raise ConfigError(f"train.accept_changes names {', '.join(unknown)}, not resume fields; "
                          f"choose from {', '.join(RESUME_FIELDS)}")
    return t


def from_config(c, *, weights: bool = True) -> RunSpec:
    """Every typed config of a sft / grpo / eval run; ConfigError on the first bad field.

    ``weights=False`` accepts a config that names neither model.path nor random_init (the
    planner compiles LLaDA-8B's shapes, no weights needed)."""
    if c.stage not in STAGES:
        raise ConfigError(f"stage={c.stage!r}: must be one of {', '.join(STAGES)}")
    if not isinstance(c.max_prompt_length, int) or c.max_prompt_length < 1:
        raise ConfigError(f"max_prompt_length={c.max_prompt_length!r}: must be an int >= 1")
    model = _model(c, weights)
    mesh = knobs.translate(MeshSpec, c.mesh, "mesh")
    # A mesh with an expert axis (a fourth entry) shards the experts on it unless a rule says
    # otherwise.
    expert = ({sharding.EXPERT: sharding.EXPERT_AXIS} if len(mesh.shape) == 4 else {})
    rules = {**dict(sharding.DEFAULT_RULES), **expert, **dict(mesh.rules)}
    o = _optim(c)
    spec = RunSpec(
        stage=c.stage, seed=c.seed, max_prompt_length=c.max_prompt_length,
        config_json=c.to_json_best_effort(indent=2), model=model,
        mesh=dataclasses.replace(mesh, rules=tuple(rules.items())),
        task=knobs.translate(TaskSpec, c.task, "task"),
        identity=resume_identity(c), train=_loop(c), optim=o)
    if c.stage == "grpo":
        s = c.sampler
        sampler = sampler_config(s, "sampler.", s.gen_length, s.steps)
        grpo, run = _grpo(c, sampler, o, model.lora, model.family)
        spec = dataclasses.replace(spec, grpo=grpo, grpo_run=run, sampler=sampler)
    elif c.stage == "sft":
        sft, run = _sft(c, o, model.lora)
        spec = dataclasses.replace(spec, sft=sft, sft_run=run)
    else:
        spec = dataclasses.replace(spec, eval=_eval(c))
    run = spec.grpo_run or spec.sft_run
    if run is not None and not run.num_epochs and spec.train.num_steps < 1:
        raise ConfigError(f"train.num_steps={spec.train.num_steps}: no optimizer step to run (set "
                          f"train.num_steps >= 1, or {c.stage}.num_epochs)")
    return spec
