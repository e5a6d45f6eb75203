"""The run's ml_collections config, translated once into typed configs and validated.

``from_config(config)`` is the one translation of the ConfigDict: it returns a ``RunSpec``
of frozen dataclasses (model, LoRA, mesh, task, loop, optimizer, rollout sampler, GRPO,
SFT, evaluation) and fails before any compute with one ``ConfigError`` line naming the
bad field. Everything downstream takes the spec; before it, only the commands read the
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
from d1jax.config import ConfigError, knobs
from d1jax.config.knobs import LoopSpec
from d1jax.model import LoraConfig
from d1jax.model import family as family_lib
from d1jax.model import lora as lora_lib
from d1jax.model import quant
from d1jax.objectives import advantages as adv_lib
from d1jax.objectives import coupled_grpo, justgrpo, spg, wd1
from d1jax.objectives.table import GRPOConfig, SFTConfig
from d1jax.run import optim
from d1jax.tasks import Task, get_task

STAGES = ("sft", "grpo", "eval")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_MASTER = {"float32": jnp.float32, "none": None}  # optim.master_weights


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where the model comes from and how it computes (fields: config/defaults.py _model)."""

    path: str
    tokenizer_path: str
    random_init: str
    width: int
    n_layers: int
    vocab_size: int
    tokenizer_vocab: int
    dtype: Any
    param_dtype: Any
    remat: bool
    lora: LoraConfig | None
    unroll_layers: bool | None = None  # None: LLaDA's default (unrolled up to 8 layers)
    layers_per_loop: int = 1  # middle layers per loop iteration when not unrolled
    family: str = "llada"  # d1jax.model.family: "llada" or "dream" (Dream, DiffuCoder)

    @property
    def random(self) -> bool:
        """Random weights: a preset is named and no path given (a path wins)."""
        return bool(self.random_init) and not self.path


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    shape: tuple[int, ...]  # (data, fsdp, tensor); one -1 takes the remaining devices.
    rules: tuple  # logical axis -> mesh axes, the defaults updated by the config's.

    def build(self, devices=None):
        """The mesh over ``devices`` (default: all), e.g. a TPU topology's when planning."""
        try:
            return sharding.make_mesh(self.shape, devices=devices)
        except ValueError as e:
            raise ConfigError(f"mesh.shape={self.shape}: {e}") from None


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    source: str | None  # local data; None: the task's default
    num_train: int

    def build(self) -> Task:
        return get_task(self.name)


@dataclasses.dataclass(frozen=True)
class OptimSpec:
    adamw: optim.OptimConfig  # warmup_steps filled in by ``build``
    warmup_ratio: float
    grad_accum: int
    master_dtype: Any = jnp.float32  # optim.master_weights; None: "none"

    def build(self, total_steps: int) -> optim.OptimConfig:
        """HF's warmup: ceil(ratio x total optimizer steps); the schedule's length."""
        return dataclasses.replace(self.adamw, total_steps=total_steps,
                                   warmup_steps=math.ceil(self.warmup_ratio * total_steps))


@dataclasses.dataclass(frozen=True)
class GRPORun:
    """Rollout-side GRPO knobs (config.grpo), around the update's ``GRPOConfig``."""

    num_generations: int
    prompts_per_step: int
    random_masking: bool
    advantage: str
    sync_ref_model: bool
    ref_model_sync_steps: int
    ref_model_mixup_alpha: float
    num_epochs: int = 0  # passes over the training prompts; 0: train.num_steps

    def num_steps(self, n_examples: int, mu: int, default: int) -> int:
        """Optimizer steps of the run on ``n_examples`` training prompts. With num_epochs,
        TRL's count as d1 ran it: its RepeatRandomSampler keeps only whole batches of
        prompts_per_step prompts and feeds each to mu optimizer steps, so an epoch is
        (n // prompts_per_step) x mu steps; without, ``default`` (train.num_steps)."""
        if not self.num_epochs:
            return default
        return self.num_epochs * (n_examples // self.prompts_per_step) * mu


@dataclasses.dataclass(frozen=True)
class SFTRun:
    batch_size: int
    max_length: int
    num_epochs: int
    split_tokenize: bool  # sft.tokenize == "split"

    def num_steps(self, n_examples: int, default: int) -> int:
        return self.num_epochs * (n_examples // self.batch_size) if self.num_epochs else default


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    samplers: tuple[smp.SamplerConfig, ...]  # one per gen length, steps = length / 2 (d1)
    batch_size: int
    num_examples: int
    model_name: str


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
    grpo_run: GRPORun | None = None
    sft: SFTConfig | None = None
    sft_run: SFTRun | None = None
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
    if gen_length % group.block_length:
        raise ConfigError(f"{prefix}block_length={group.block_length} does not divide "
                          f"gen_length={gen_length}")
    if steps % (gen_length // group.block_length):
        raise ConfigError(f"{prefix}steps={steps} is not a multiple of the "
                          f"{gen_length // group.block_length} blocks (gen_length / block_length)")
    try:
        return smp.SamplerConfig(
            gen_length=gen_length, block_length=group.block_length, steps=steps,
            temperature=group.temperature, cfg_scale=group.cfg_scale,
            remasking=group.remasking, use_attention_mask=group.use_attention_mask,
            kv_cache=group.kv_cache, threshold=group.threshold, recompute=group.recompute,
            cache_refresh=group.cache_refresh, parallel_rule=group.parallel_rule,
            first_position=group.get("first_position", False),
            loop=group.get("loop", "llada"), alg=group.get("alg", "entropy"),
            top_p=group.get("top_p", 1.0), top_k=group.get("top_k", 50))
    except ValueError as e:
        raise ConfigError(f"{prefix}{e}") from None


def _model(c, weights: bool = True) -> ModelSpec:
    m = c.model
    if m.path and not Path(m.path).is_dir():  # a path wins over random_init: it must exist
        raise ConfigError(f"config.model.path={m.path!r} is not a directory; download "
                          "a LLaDA checkpoint there (see README) or fix the path")
    if m.tokenizer_path and not Path(m.tokenizer_path).is_dir():
        raise ConfigError(f"config.model.tokenizer_path={m.tokenizer_path!r} is not a directory")
    if not m.random_init and weights:
        if not m.path:
            raise ConfigError(
                "config.model.path is not set: point it (or $LLADA_PATH) at a local Hugging Face "
                "LLaDA directory, e.g. `hf download GSAI-ML/LLaDA-8B-Instruct "
                "--local-dir ~/llada-8b-instruct`, or use a :tiny config")
        if not Path(m.path).is_dir():
            raise ConfigError(f"config.model.path={m.path!r} is not a directory; download "
                              "a LLaDA checkpoint there (see README) or fix the path")
    for name in ("dtype", "param_dtype"):
        if getattr(m, name) not in _DTYPES:
            raise ConfigError(f"model.{name}={getattr(m, name)!r}: one of {sorted(_DTYPES)}")
    layers_per_loop = m.get("layers_per_loop", 1)
    if isinstance(layers_per_loop, bool) or not isinstance(layers_per_loop, int) \
            or layers_per_loop < 1:
        raise ConfigError(f"model.layers_per_loop={layers_per_loop!r} must be an int >= 1")
    fam = _family(m)
    base_quant = _base_quant(m, c.lora.enabled)
    lora = _lora(c.lora, fam, base_quant) if c.lora.enabled else None
    return ModelSpec(m.path, m.tokenizer_path, m.random_init, m.width, m.n_layers, m.vocab_size,
                     m.tokenizer_vocab, _DTYPES[m.dtype], _DTYPES[m.param_dtype],
                     bool(m.remat), lora, m.get("unroll_layers"), layers_per_loop, fam.name)


def _family(m) -> family_lib.Family:
    """config.model.family, checked against the checkpoint's config.json and the preset."""
    name = m.get("family", "llada")
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
    scheme = m.get("base_quant", "none")
    if scheme not in quant.SCHEMES:
        raise ConfigError(f"model.base_quant={scheme!r}: choose one of {', '.join(quant.SCHEMES)}")
    if scheme != "none" and not lora:
        raise ConfigError(f"model.base_quant={scheme!r} quantises the frozen base of a LoRA run, "
                          "but lora.enabled=False (full fine-tuning trains every weight): set "
                          "--config.lora.enabled=True or --config.model.base_quant=none")
    return scheme


def _lora(lo, fam: family_lib.Family, base_quant: str = "none") -> LoraConfig:
    """The adapters of config.lora, on the family's projections that ``lora.targets`` names."""
    try:
        targets = lora_lib.check_targets(lo.get("targets", fam.lora_targets), fam.lora_targets,
                                         fam.title)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return LoraConfig(rank=lo.rank, alpha=lo.alpha, dropout=lo.dropout, targets=targets,
                      base_quant=base_quant)


def _optim(o) -> OptimSpec:
    if o.learning_rate <= 0:
        raise ConfigError(f"optim.learning_rate={o.learning_rate} must be positive")
    schedule = o.get("lr_schedule", "constant_with_warmup")
    if schedule not in optim.SCHEDULES:
        raise ConfigError(f"optim.lr_schedule={schedule!r}: choose one of "
                          f"{', '.join(optim.SCHEDULES)}")
    adamw = optim.OptimConfig(learning_rate=o.learning_rate, b1=o.b1, b2=o.b2, eps=o.eps,
                              weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm,
                              schedule=schedule, min_lr_rate=o.get("min_lr_rate", 0.0))
    master = o.get("master_weights", "float32")
    if master not in _MASTER:
        raise ConfigError(f"optim.master_weights={master!r}: float32 or none")
    return OptimSpec(adamw, o.warmup_ratio, o.grad_accum, _MASTER[master])


def _hparams(c) -> Any:
    """The objective's own config from config.grpo.<objective>; shared knobs (G, prompt
    noise, attention mask, block length, beta, epsilon) from the fields the loop uses."""
    g, s = c.grpo, c.sampler
    if g.objective == "wd1":
        return wd1.WD1Config(group_size=g.num_generations, negative=g.wd1.negative,
                             use_attention_mask=s.use_attention_mask)
    if g.objective == "spg":
        blocks = s.gen_length // s.block_length
        if not 1 <= g.spg.num_t <= blocks:
            raise ValueError(f"spg.num_t={g.spg.num_t} must be in [1, {blocks}] (the blocks of "
                             "sampler.gen_length / sampler.block_length)")
        return spg.SPGConfig(block_length=s.block_length, num_t=g.spg.num_t, min_t=g.spg.min_t,
                             max_t=g.spg.max_t, p_mask_prompt=g.p_mask_prompt,
                             eubo_beta=g.spg.eubo_beta, mix_weight=g.spg.mix_weight,
                             use_attention_mask=s.use_attention_mask)
    if g.objective == "coupled_grpo":
        return coupled_grpo.CoupledGRPOConfig(
            epsilon=g.epsilon, beta=g.beta, t_min=g.coupled_grpo.t_min,
            t_max=g.coupled_grpo.t_max, use_attention_mask=s.use_attention_mask)
    if g.objective == "justgrpo":
        return justgrpo.JustGRPOConfig(gain=g.justgrpo.gain,
                                       position_chunk=g.justgrpo.position_chunk or None,
                                       use_attention_mask=s.use_attention_mask)
    return None


def _grpo(c, lora: bool) -> tuple[GRPOConfig, GRPORun]:
    g = c.grpo
    token_mean = g.get("token_mean", "step")
    if token_mean not in ("group", "step"):
        raise ConfigError(f"grpo.token_mean={token_mean!r}: group (d1) or step")
    try:
        cfg = GRPOConfig(num_iterations=g.num_iterations, beta=g.beta, epsilon=g.epsilon,
                         p_mask_prompt=g.p_mask_prompt, cfg_scale=c.sampler.cfg_scale,
                         use_attention_mask=c.sampler.use_attention_mask,
                         grad_accum=c.optim.grad_accum, objective=g.objective,
                         hparams=_hparams(c), lora_dropout=lora and c.lora.dropout > 0,
                         norm_group=g.num_generations if token_mean == "group" else None)
    except ValueError as e:
        raise ConfigError(f"grpo: {e}") from None
    if g.advantage not in adv_lib.ESTIMATORS:
        raise ConfigError(f"grpo.advantage={g.advantage!r}: choose one of "
                          f"{', '.join(adv_lib.ESTIMATORS)}")
    run = GRPORun(g.num_generations, g.prompts_per_step, g.random_masking, g.advantage,
                  g.sync_ref_model, g.ref_model_sync_steps, g.ref_model_mixup_alpha,
                  int(g.get("num_epochs") or 0))
    return cfg, run


def _sft(c, lora: bool) -> tuple[SFTConfig, SFTRun]:
    s = c.sft
    if s.tokenize not in ("joint", "split"):
        raise ConfigError(f"sft.tokenize={s.tokenize!r}: joint or split")
    cfg = SFTConfig(eps=s.eps, grad_accum=c.optim.grad_accum,
                    lora_dropout=lora and c.lora.dropout > 0)
    return cfg, SFTRun(s.batch_size, s.max_length, s.num_epochs, s.tokenize == "split")


def _eval(c) -> EvalSpec:
    e = c.eval
    samplers = tuple(sampler_config(c.sampler, "sampler.", int(gl), int(gl) // 2)
                     for gl in e.gen_lengths)
    return EvalSpec(samplers, e.batch_size, e.num_examples, e.model_name)


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
    "sft.batch_size", "sft.max_length", "sft.tokenize",
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


def _loop(t) -> LoopSpec:
    if t.get("if_incompatible", "refuse") not in ("refuse", "move_aside"):
        raise ConfigError(f"train.if_incompatible={t.if_incompatible!r}: refuse or move_aside")
    accept = tuple(f.strip() for f in str(t.get("accept_changes", "")).split(",") if f.strip())
    unknown = [f for f in accept if f not in RESUME_FIELDS]
    if unknown:
        raise ConfigError(f"train.accept_changes names {', '.join(unknown)}, not resume fields; "
                          f"choose from {', '.join(RESUME_FIELDS)}")
    return knobs.translate(LoopSpec, t, "train", accept_changes=accept)


def from_config(c, *, weights: bool = True) -> RunSpec:
    """Every typed config of a sft / grpo / eval run; ConfigError on the first bad field.

    ``weights=False`` accepts a config that names neither model.path nor random_init (the
    planner compiles LLaDA-8B's shapes, no weights needed)."""
    if c.stage not in STAGES:
        raise ConfigError(f"stage={c.stage!r}: must be one of {', '.join(STAGES)}")
    model = _model(c, weights)
    lora = model.lora is not None
    rules = dict(sharding.DEFAULT_RULES)
    rules.update(dict(c.mesh.rules))
    t = c.train
    spec = RunSpec(
        stage=c.stage, seed=c.seed, max_prompt_length=c.max_prompt_length,
        config_json=c.to_json_best_effort(indent=2), model=model,
        mesh=MeshSpec(tuple(c.mesh.shape), tuple(rules.items())),
        task=TaskSpec(c.task.name, c.task.source or None, c.task.num_train),
        identity=resume_identity(c), train=_loop(t),
        optim=_optim(c.optim))
    if c.stage == "grpo":
        s = c.sampler
        grpo, run = _grpo(c, lora)
        spec = dataclasses.replace(spec, grpo=grpo, grpo_run=run,
                                   sampler=sampler_config(s, "sampler.", s.gen_length, s.steps))
    elif c.stage == "sft":
        sft, run = _sft(c, lora)
        spec = dataclasses.replace(spec, sft=sft, sft_run=run)
    else:
        spec = dataclasses.replace(spec, eval=_eval(c))
    return spec
