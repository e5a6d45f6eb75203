"""Config builders shared by ``configs/*.py`` and their validation.

Each group's knobs (model, lora, optim, train, task, mesh, sampler, grpo, sft, eval) are
declared once, with their defaults, types and meaning, in ``d1jax.config.groups`` or, for
those the library takes, on its config (``SamplerConfig``, ``GRPOConfig``, ...); the
builders here assemble them and set what depends on the task, objective or checkpoint
(each with the source it follows). Defaults are d1's ``diffu-grpo/slurm_scripts/train.yaml``
and ``DiffuGRPOConfig``. A ``tiny`` variant shrinks everything to a random width-64 model and a tokenizer trained
on the task's text, so the same code runs on a laptop CPU in about a minute.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import ml_collections as mlc

from d1jax.config import groups, knobs, variants
from d1jax.knobs import ConfigError  # noqa: F401 - the config layer's name for it
from d1jax.objectives import registry
from d1jax.objectives.recipes import full_finetuning  # noqa: F401 - configs call it
from d1jax.tasks import registry as task_registry




def checkpoints() -> dict[str, tuple[str, str, str]]:
    """The checkpoints a config can name (``checkpoint=`` of the builders below), from the
    families' records (``d1jax.model.family.Family.checkpoints``): kind -> (family, the
    environment variable that gives model.path by default, the tiny random preset)."""
    from d1jax.model import family as family_lib
    family_lib.load_modules()
    return {kind: (fam.name, env, tiny) for fam in family_lib.FAMILIES.values()
            for kind, (env, tiny) in fam.checkpoints.items()}


def _model(tiny: bool, checkpoint: str = "llada") -> mlc.ConfigDict:
    """config.model of ``checkpoint``'s family: its path from the checkpoint's environment
    variable, or with ``tiny`` random weights of the family's tiny preset."""
    kinds = checkpoints()
    if checkpoint not in kinds:
        raise ConfigError(f"unknown checkpoint kind {checkpoint!r}: one of {', '.join(kinds)}")
    family, env, tiny_preset = kinds[checkpoint]
    return knobs.group(groups.ModelKnobs, tiny, family=family,
                       path="" if tiny else os.environ.get(env, ""),
                       random_init=tiny_preset if tiny else "")


# d1's LoRA targets. GRPO: diffu-grpo/diffu_grpo_train.py target_modules [q, k, v, o, up,
# down, gate]_proj, as they land on each family's module names (PEFT matches names exactly):
# the family record's ``grpo_targets`` (d1jax.model.family).
# SFT: SFT/sft_train.py target_modules ["q_proj", "k_proj", "v_proj"].
D1_SFT_TARGETS = ("q_proj", "k_proj", "v_proj")


def grpo_targets(family: str) -> tuple[str, ...]:
    """d1's GRPO LoRA targets on ``family``'s module names (its record's)."""
    from d1jax.model import family as family_lib
    return family_lib.get(family).grpo_targets


# The rollouts' sampler: d1's train.yaml (max_completion_length 256, diffusion_steps 128)
# and DiffuGRPOConfig's temperature 0.9, where SamplerConfig's defaults are d1's evaluation's
# (128 tokens, 64 steps, greedy). The tiny variant keeps the knobs' tiny lengths.
ROLLOUT_SAMPLER = dict(gen_length=256, steps=128, temperature=0.9)


def sampler_fields(tiny: bool, rollout: bool = True) -> mlc.ConfigDict:
    """The sampler's fields (``groups.SamplerKnobs``, declared on ``SamplerConfig``): rollouts
    (GRPO, ``ROLLOUT_SAMPLER``) or, with ``rollout=False``, evaluation, whose lengths come
    from eval.gen_lengths with steps = length / 2 and whose decoding is greedy (d1's
    protocol: SamplerConfig's own default)."""
    if rollout:
        run = {"temperature": ROLLOUT_SAMPLER["temperature"]} if tiny else ROLLOUT_SAMPLER
        return knobs.group(groups.SamplerKnobs, tiny, **run)
    return knobs.group(groups.SamplerKnobs, tiny, omit=("gen_length", "steps"))


def base(stage: str, task: str, tiny: bool, steps: int = 1000,
         checkpoint: str = "llada") -> mlc.ConfigDict:
    c = mlc.ConfigDict()
    c.stage = stage  # Which stage d1jax.main runs: sft, grpo or eval.
    c.workdir = ""  # Run directory (--workdir overrides): checkpoints, metrics, export.
    c.seed = 42  # Seed of data order, init, rollouts and mask seeds.
    c.model = _model(tiny, checkpoint)
    c.lora = knobs.group(groups.LoraKnobs, tiny, targets=grpo_targets(c.model.family))
    c.optim = knobs.group(groups.OptimKnobs, tiny)
    c.train = knobs.group(groups.LoopSpec, tiny, num_steps=4 if tiny else steps)
    c.task = knobs.group(groups.TaskKnobs, tiny, name=task)
    c.mesh = knobs.group(groups.MeshKnobs, tiny)
    c.max_prompt_length = 192 if tiny else 200  # Prompts are left-truncated to this many tokens.
    return c


def check_workdir(workdir: str) -> Path:
    """Creates the workdir and checks it is writable (before any compute).

    Every process of a multi-host run checks the same workdir at the same time: each writes
    its own probe, so no process deletes another's.
    """
    path = Path(workdir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe.{socket.gethostname()}.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"workdir {path} is a file, not a directory") from None
        raise ConfigError(f"workdir {path} is not writable ({e.strerror})") from None
    return path


def check_inputs(config, data: bool = True) -> None:
    """The model paths, and with ``data`` the data source and task, a run config names,
    checked before anything is written (``d1jax.main`` and ``d1jax.eval`` call it after
    parsing their flags; ``d1jax.plan``, which reads no data, with ``data=False``)."""
    model = config.get("model") or {}
    for key in ("path", "tokenizer_path"):  # a path wins over random_init: it must exist
        path = model.get(key)
        if path and not Path(path).expanduser().is_dir():
            family = model.get("family", "llada")
            hint = (f"; download a {family} checkpoint there (README, docs/models.md) or fix "
                    "the path" if key == "path" else "")
            raise ConfigError(f"config.model.{key}={path!r} is not a directory{hint}")
    path = model.get("path")
    if path and not (Path(path).expanduser() / "config.json").is_file():
        raise ConfigError(f"config.model.path={path!r} has no config.json: not a Hugging Face "
                          "checkpoint (a d1jax run's export is its workdir's hf/)")
    task = config.get("task")
    if not data or not task or config.get("stage") not in ("grpo", "sft", "eval"):
        return
    from d1jax.tasks.sources import _FILE_SUFFIXES
    entry = task_entry(task.get("name") or "")
    source = task.get("source") or ""
    named = [e.name for e in task_registry.TASKS.values() if source in e.sources]
    if named and task.get("name") not in named:  # a loader's own name for its data
        raise ConfigError(f"config.task.source={source!r} names {source}'s training data of "
                          f"{' and '.join(named)}, not of {task.get('name')!r}")
    if named:
        source = ""
    # The rule of tasks.sources.load_rows: a URL, a local path, or a Hub id "owner/name".
    local = (source.endswith(_FILE_SUFFIXES) or source.startswith((".", "/", "~"))
             or source.count("/") != 1)
    if (source and local and not source.startswith(("http://", "https://"))
            and not Path(source).expanduser().exists()):
        raise ConfigError(f"config.task.source={source!r}: no such file or directory (and not "
                          "a Hub id of the form owner/name)")
    if config.stage == "sft" and entry is not None and entry.sft_rows is not None:
        return  # SFT data of its own, without rewards (s1k)
    try:
        task_registry.entry(task.name).build()
    except ValueError as e:  # an unknown task name, or SFT data in a run that needs rewards
        raise ConfigError(f"config.task: {e}") from None


def task_entry(name: str) -> task_registry.TaskEntry | None:
    """The registered task ``name`` (``d1jax.tasks.registry``: the built-ins and those of the
    modules in $D1JAX_TASK_MODULES), None when none has it (the input checks list the known)."""
    try:
        return task_registry.find(name)
    except ValueError as e:  # a module that does not import
        raise ConfigError(f"${task_registry.MODULES_ENV}: {e}") from None


def check_batch(global_batch: int, group: int, data_parallel: int, what: str,
                grad_accum: int = 1) -> None:
    """A global batch must split into whole groups, over the data-parallel devices, and
    each device's rows into ``grad_accum`` micro-batches (micro-batches are strided, so
    every device holds an equal share of each: otherwise XLA reshards every micro-batch,
    which the planner estimates at a fifth of the speed on a v5p-64)."""
    if global_batch % group:
        raise ConfigError(f"{what}={global_batch} is not divisible by num_generations G={group}")
    if global_batch % data_parallel:
        raise ConfigError(f"{what}={global_batch} is not divisible by the data-parallel size "
                          f"{data_parallel} (mesh data x fsdp)")
    per_device = global_batch // data_parallel
    if per_device % grad_accum:
        fits = [k for k in range(1, per_device + 1) if per_device % k == 0]
        raise ConfigError(
            f"{what}={global_batch} is {per_device} rows per data-parallel device (mesh data "
            f"x fsdp = {data_parallel}), which do not split into optim.grad_accum="
            f"{grad_accum} micro-batches: set grad_accum to one of {fits}, or move chips "
            f"from fsdp to the tensor axis (config.mesh.shape)")


def rollout_chunks(rows: int, rollout_batch: int, data_parallel: int,
                   processes: int = 1) -> int:
    """Sampler calls of one rollout of ``rows`` rows (all hosts) in calls of
    ``rollout_batch`` rows (``grpo.rollout_batch``; 0: one call of every row). Each call
    must split evenly over the data-parallel devices and each host's rows into the calls."""
    if rollout_batch == 0:
        return 1
    what = f"grpo.rollout_batch={rollout_batch}"
    if rollout_batch < 0 or rows % rollout_batch:
        raise ConfigError(f"{what} must be 0 (one call) or a positive divisor of the rollout's "
                          f"{rows} rows (grpo.prompts_per_step x num_generations)")
    if rollout_batch % data_parallel:
        raise ConfigError(f"{what} is not a multiple of the data-parallel size {data_parallel} "
                          "(mesh data x fsdp): every device generates an equal share of each "
                          "call; set a multiple of it")
    if rollout_batch % processes:
        raise ConfigError(f"{what} does not split over the {processes} processes (each host "
                          "generates its share of every call)")
    return rows // rollout_batch


def smaller_rollout_batch(rows: int, rollout_batch: int, data_parallel: int) -> int | None:
    """The largest ``grpo.rollout_batch`` at most half of the current one (0: all ``rows``)
    that ``rollout_chunks`` accepts; None where none is."""
    now = rollout_batch or rows
    fits = [k for k in range(data_parallel, now // 2 + 1, data_parallel) if rows % k == 0]
    return fits[-1] if fits else None


def grpo(task: str, arg: str | None, objective: str = "diffu_grpo",
         checkpoint: str = "llada") -> mlc.ConfigDict:
    """GRPO-style RL on ``task`` with ``objective`` (diffu_grpo, wd1, spg, coupled_grpo),
    every other knob d1's, on ``checkpoint`` (``checkpoints()``: llada, dream, diffucoder).

    ``arg``: "tiny" shrinks it for CPU; "authors" takes the objective's own authors' recipe
    instead of d1's knobs (``_authors``); "authors,tiny" both."""
    tiny, authors, generated = _variant(arg, authors_ok=True)
    try:
        registry.load_modules()  # the built-in objectives and $D1JAX_OBJECTIVE_MODULES'
    except ValueError as e:
        raise ConfigError(f"${registry.MODULES_ENV}: {e}") from None
    entry = registry.OBJECTIVES.get(objective)  # an unknown one: the spec names the known
    known = task_entry(task)  # an unknown one: the input checks name the known
    c = base("grpo", task, tiny, steps=5000, checkpoint=checkpoint)
    if known and known.train_source and not (tiny or generated):
        c.task.source = known.train_source  # sudoku, countdown: d1's data; ':generated': ours
    if not tiny:
        # Planned for v5p-8 (docs/tpu_plan.md): the 8B update without remat, its 32 layers
        # unrolled, fits a v5p chip (61 GiB of 84) at XLA's estimated 55% MFU, against 44%
        # (82 GiB) with the middle layers in a loop and 31% with remat as well. Chips with less
        # HBM need remat (the planner says so).
        c.model.remat, c.model.unroll_layers = False, True
    c.sampler = sampler_fields(tiny)
    g = c.grpo = knobs.group(
        groups.GRPOKnobs, tiny, objective=objective,
        num_iterations=2 if tiny else known.mu if known else 12,  # d1's mu of the task
        beta=entry.default_beta if entry else 0.04)  # 0 without a reference term
    if authors:
        _authors(c, objective, tiny)
    c.lock()
    return c


def _authors(c: mlc.ConfigDict, objective: str, tiny: bool) -> None:
    """The ``:authors`` variant: the knobs the objective's authors ran with, where they differ
    from d1's (its record's ``authors``; docs/objectives.md has each source)."""
    entry = registry.OBJECTIVES.get(objective)
    if entry is None or entry.authors is None:
        have = ", ".join(o.name for o in registry.by_paper(registry.OBJECTIVES.values())
                         if o.authors)
        raise ConfigError(f"no ':authors' variant for objective {objective!r} ({have} have "
                          f"one; diffu_grpo's authors are d1)")
    entry.authors(c, tiny)


def checkpoint_word(arg: str | None, word: str, default: str,
                    builder: str = "grpo") -> tuple[str, str | None, bool]:
    """(checkpoint, the argument's other words or None, tiny) of a config argument in which
    the word ``word`` picks that checkpoint instead of ``default`` (``:dream,tiny``); the
    other words are ``builder``'s ("grpo" or "sft": ``VARIANTS``)."""
    words = variants.parse(arg, (word, *VARIANTS[builder]), exclusive=[("tiny", "full")])
    rest = ",".join(w for w in (arg or "").split(",") if w.strip() in words - {word}) or None
    return word if word in words else default, rest, "tiny" in words


def dllm_rl(c: mlc.ConfigDict, tiny: bool, *, steps: int, responses: int, tasks: int,
            max_prompt: int, grad_accum: int) -> None:
    """TraceRL as Gen-Verse/dLLM-RL's rl_*.yaml run it, beside the sampler and the trace
    knobs each config sets: full fine-tuning at 1e-6 (tiny: 1e-3), ``steps`` optimizer steps
    (experiment.total_step), ``tasks`` prompts of ``responses`` completions a step, one
    update a rollout, clip 0.2, accuracy-filtered z-score advantages, no prompt token masked;
    at full size ``grad_accum`` micro-batches (memory only), remat and the layer loop."""
    full_finetuning(c, 1e-3 if tiny else 1e-6)
    g = c.grpo
    c.train.num_steps = 4 if tiny else steps
    g.num_epochs = 0
    g.num_generations = 4 if tiny else responses  # num_response_per_task
    g.prompts_per_step = 2 if tiny else tasks  # num_task_per_step
    g.num_iterations, g.epsilon, g.advantage = 1, 0.2, "zscore_filtered"
    g.p_mask_prompt = 0.0  # TraceRL never masks the prompt
    c.max_prompt_length = 24 if tiny else max_prompt  # max_prompt_len
    if not tiny:
        c.optim.grad_accum = grad_accum
        c.model.remat, c.model.unroll_layers = True, False


def sft(arg: str | None, checkpoint: str = "llada") -> mlc.ConfigDict:
    """Masked SFT on s1K reasoning traces (d1's stage 1) of ``checkpoint``; "tiny" shrinks it
    for CPU."""
    tiny = _variant(arg)[0]
    # The tiny variant trains on generated Sudoku trajectories: s1K needs the Hub.
    c = base("sft", "sudoku" if tiny else "s1k", tiny, steps=0, checkpoint=checkpoint)
    c.lora.alpha = 16.0 if tiny else 256.0  # d1 SFT: lora_alpha 256 (scale 2 at r = 128).
    c.lora.targets = D1_SFT_TARGETS  # d1 SFT: q_proj, k_proj, v_proj.
    c.optim.learning_rate = 1e-3 if tiny else 1e-5  # d1 SFT: 1e-5.
    c.optim.b2 = 0.999  # d1 SFT: the Trainer's default adam_beta2.
    c.optim.grad_accum = 1  # One step of all 16 rows (d1: 4 micro-batches of one row per GPU; the loss is a token mean over the step here, docs/training.md).
    c.optim.max_grad_norm = 1.0  # d1 SFT: the Trainer's default 1.0.
    c.optim.warmup_ratio = 0.0  # d1 SFT: no warmup (the Trainer's default).
    c.optim.lr_schedule = "linear"  # d1 SFT: the Trainer's default, linear decay to 0.
    c.sft = knobs.group(groups.SFTKnobs, tiny)
    c.lock()
    return c


# The words of the builders' config variants (``d1jax.config.variants``): "tiny" shrinks
# the run for CPU, "full" is the full-size run spelled out (as no word); "authors" takes the
# objective's authors' recipe; "generated" trains sudoku and countdown on generated puzzles
# instead of d1's data.
VARIANTS = {"grpo": ("tiny", "full", "authors", "generated"), "sft": ("tiny", "full")}


def _variant(arg: str | None, authors_ok: bool = False) -> tuple[bool, bool, bool]:
    """(tiny, authors, generated) of a config argument: words of ``VARIANTS["grpo"]`` with
    ``authors_ok``, else of ``VARIANTS["sft"]``."""
    words = variants.parse(arg, VARIANTS["grpo" if authors_ok else "sft"],
                           exclusive=[("tiny", "full")])
    return "tiny" in words, "authors" in words, "generated" in words


def eval_config(arg: str | None, checkpoint: str = "llada") -> mlc.ConfigDict:
    """d1's evaluation protocol. ``arg``: a task's name (gsm8k, the default, or any registered
    task), "tiny" or both ("sudoku,tiny"); the task's entry gives its number of examples and
    generation lengths."""
    try:
        tasks = task_registry.names()
    except ValueError as e:  # a module in $D1JAX_TASK_MODULES that does not import
        raise ConfigError(f"${task_registry.MODULES_ENV}: {e}") from None
    named = tuple(a for t in tasks for a in task_entry(t).aliases)
    words = variants.parse(arg, ("tiny", *tasks, *named), exclusive=[tasks + named])
    task = next((w for w in words if w != "tiny"), "gsm8k")
    known, tiny = task_entry(task), "tiny" in words
    c = base("eval", task, tiny, checkpoint=checkpoint)
    c.lora.enabled = False  # Evaluate plain weights (export LoRA runs first: <workdir>/hf).
    c.sampler = sampler_fields(tiny, rollout=False)
    c.eval = knobs.group(  # d1: 256 for sudoku/countdown, all otherwise (0)
        groups.EvalKnobs, tiny, gen_lengths=(32,) if tiny else known.gen_lengths,
        num_examples=16 if tiny else known.eval_examples)
    c.lock()
    return c
