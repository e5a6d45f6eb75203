"""Config builders shared by ``configs/*.py`` and their validation.

Every field carries a comment; symbols in brackets are the paper's (d1, arXiv 2504.12216).
Defaults are d1's ``diffu-grpo/slurm_scripts/train.yaml`` and ``DiffuGRPOConfig``.
A ``tiny`` variant shrinks everything to a random width-64 model and a tokenizer trained
on the task's text, so the same code runs on a laptop CPU in about a minute.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import ml_collections as mlc

from d1jax.config import knobs


class ConfigError(ValueError):
    """A config that cannot run; raised before any compute."""


def checkpoints() -> dict[str, tuple[str, str, str]]:
    """The checkpoints a config can name (``checkpoint=`` of the builders below), from the
    families' records (``d1jax.model.family.Family.checkpoints``): kind -> (family, the
    environment variable that gives model.path by default, the tiny random preset)."""
    from d1jax.model import family as family_lib
    family_lib.load_modules()
    return {kind: (fam.name, env, tiny) for fam in family_lib.FAMILIES.values()
            for kind, (env, tiny) in fam.checkpoints.items()}


def _model(tiny: bool, checkpoint: str = "llada") -> mlc.ConfigDict:
    kinds = checkpoints()
    if checkpoint not in kinds:
        raise ConfigError(f"unknown checkpoint kind {checkpoint!r}: one of {', '.join(kinds)}")
    family, env, tiny_preset = kinds[checkpoint]
    m = mlc.ConfigDict()
    m.family = family  # Model family (d1jax.model.family): "llada" (LLaDA-8B), "dream" (Dream-v0-7B, DiffuCoder-7B) or "sdar" (SDAR, TraDo; block diffusion, model only so far); must match model.path's config.json.
    m.path = "" if tiny else os.environ.get(env, "")  # Local HF checkpoint dir (config.json, *.safetensors, tokenizer); $LLADA_PATH ($DREAM_PATH, $DIFFUCODER_PATH) by default.
    m.tokenizer_path = ""  # Tokenizer dir; None: model.path (or a tiny one trained on the task text when random_init).
    m.random_init = tiny_preset if tiny else ""  # Preset name: random weights of that shape when model.path is empty (tests, CPU smoke runs).
    m.width = 64 if tiny else 0  # For random_init: d_model override (0 keeps the preset's).
    m.n_layers = 2 if tiny else 0  # For random_init: layer count override (0 keeps the preset's).
    m.tokenizer_vocab = 1024  # For random_init: vocabulary size of the trained tiny tokenizer.
    m.vocab_size = 0  # For random_init: model vocabulary (embedding rows); 0: the tokenizer's, rounded up to 64.
    m.dtype = "float32" if tiny else "bfloat16"  # Compute dtype of matmuls.
    m.param_dtype = "float32" if tiny else "bfloat16"  # Storage dtype of the params.
    m.remat = not tiny  # Rematerialise each block in the backward pass.
    m.unroll_layers = mlc.config_dict.placeholder(bool)  # Layers as straight-line code (True) or a compiled loop over the middle ones (False); None: unrolled up to 8 layers.
    m.layers_per_loop = 1  # Middle layers per iteration of that loop (compile time grows with it).
    m.base_quant = "none"  # Frozen base under LoRA: "none" (param_dtype), "int8" (per-channel absmax) or "nf4" (d1's bitsandbytes 4-bit NormalFloat) storage of the block projections (d1jax.model.quant).
    return m


# d1's LoRA targets. GRPO: diffu-grpo/diffu_grpo_train.py target_modules [q, k, v, o, up,
# down, gate]_proj, as they land on each family's module names (PEFT matches names exactly):
# the family record's ``grpo_targets`` (d1jax.model.family).
# SFT: SFT/sft_train.py target_modules ["q_proj", "k_proj", "v_proj"].
D1_SFT_TARGETS = ("q_proj", "k_proj", "v_proj")


def grpo_targets(family: str) -> tuple[str, ...]:
    """d1's GRPO LoRA targets on ``family``'s module names (its record's)."""
    from d1jax.model import family as family_lib
    return family_lib.get(family).grpo_targets


def _lora(tiny: bool) -> mlc.ConfigDict:
    lo = mlc.ConfigDict()
    lo.enabled = True  # Train LoRA adapters (d1); False: full fine-tuning with a frozen reference copy.
    lo.rank = 8 if tiny else 128  # r.
    lo.alpha = 16.0 if tiny else 64.0  # alpha; adapters scale by alpha / r.
    lo.dropout = 0.0 if tiny else 0.05  # Dropout on the adapter input.
    lo.targets = grpo_targets("llada")  # Projections that get adapters, by the family's module names: LLaDA's q_proj, k_proj, v_proj, attn_out, ff_proj, up_proj, ff_out; Dream's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
    return lo


def _optim(tiny: bool) -> mlc.ConfigDict:
    o = mlc.ConfigDict()
    o.learning_rate = 1e-3 if tiny else 3e-6  # Peak learning rate.
    o.b1 = 0.9  # Adam beta1.
    o.b2 = 0.99  # Adam beta2.
    o.eps = 1e-8  # Adam epsilon (torch default).
    o.weight_decay = 0.1  # AdamW decoupled weight decay.
    o.max_grad_norm = 0.2  # Global-norm gradient clipping.
    o.warmup_ratio = 0.0001  # Linear warmup over this fraction of the steps.
    o.lr_schedule = "constant_with_warmup"  # After the warmup: "constant_with_warmup" (d1 GRPO), "linear" decay to 0 at the last step (HF Trainer's default, d1 SFT) or "cosine_with_min_lr" (DiffuCoder's coupled-GRPO).
    o.min_lr_rate = 0.0  # With "cosine_with_min_lr": the final learning rate as a share of the peak (DiffuCoder: 0.1).
    o.grad_accum = 1 if tiny else 2  # Micro-batches accumulated per optimizer step.
    o.master_weights = "float32"  # Full fine-tuning with a bfloat16 model.param_dtype: "float32" keeps float32 master weights and AdamW moments, cast to bfloat16 for each forward (DeepSpeed, MaxText); "none" stores and updates them in bfloat16, where an update below half a bfloat16 step (lr 1e-6) rounds away. LoRA: no effect (adapters are float32).
    return o


def sampler_fields(tiny: bool, rollout: bool = True) -> mlc.ConfigDict:
    """The sampler's fields: rollouts (GRPO) or, with ``rollout=False``, evaluation, whose
    lengths come from eval.gen_lengths with steps = length / 2 (d1's protocol)."""
    s = mlc.ConfigDict()
    if rollout:
        s.gen_length = 32 if tiny else 256  # Completion length (max_completion_length).
        s.steps = 16 if tiny else 128  # Diffusion steps over the whole completion (diffusion_steps).
    s.block_length = 16 if tiny else 32  # Semi-autoregressive block length (d1: 32).
    s.temperature = 0.9 if rollout else 0.0  # Rollouts: d1's DiffuGRPOConfig default; eval: greedy (d1).
    s.cfg_scale = 0.0  # Classifier-free guidance scale.
    s.remasking = "low_confidence"  # "low_confidence" or "random".
    s.use_attention_mask = True  # Honour prompt padding; False attends to padding like d1.
    s.kv_cache = "none"  # "none" (exact, d1's protocol), "prefix" or "dual" block KV cache (Fast-dLLM).
    s.threshold = 1.0  # Parallel decoding: also unmask every token with confidence > tau (>= 1: off).
    s.parallel_rule = "budget"  # With threshold < 1: "budget" unmasks at least the exact schedule's tokens per step; "fast_dllm" at least one (Fast-dLLM, no step cap).
    s.recompute = "block"  # Dual cache steps recompute the whole block (Fast-dLLM) or only "masked" positions.
    s.cache_refresh = 0  # With kv_cache: refresh it once this many block tokens were decoded (0: at block starts only).
    s.first_position = False  # With parallel_rule "fast_dllm": a block's first step unmasks its first position alone (Fast-dLLM's Dream loop).
    s.loop = "llada"  # "llada": LLaDA's semi-autoregressive blocks (d1); "dream": Dream's diffusion_generate over the whole completion (DiffuCoder's rollouts; block_length = gen_length).
    s.alg = "entropy"  # loop "dream": which positions a step decodes (origin, maskgit_plus, topk_margin, entropy).
    s.top_p = 1.0  # loop "dream": nucleus filter of the token draw (< 1 applies it).
    s.top_k = 50  # loop "dream": keep the k largest logits (0: none; 50: diffusion_generate's value when the call names none).
    return s


def _train(tiny: bool, steps: int) -> mlc.ConfigDict:
    """config.train: the knobs of ``knobs.LoopSpec`` (each declared there once)."""
    return knobs.group(knobs.LoopSpec, tiny, num_steps=4 if tiny else steps)


def base(stage: str, task: str, tiny: bool, steps: int = 1000,
         checkpoint: str = "llada") -> mlc.ConfigDict:
    c = mlc.ConfigDict()
    c.stage = stage  # Which stage d1jax.main runs: sft, grpo or eval.
    c.workdir = ""  # Run directory (--workdir overrides): checkpoints, metrics, export.
    c.seed = 42  # Seed of data order, init, rollouts and mask seeds.
    c.model = _model(tiny, checkpoint)
    c.lora = _lora(tiny)
    c.lora.targets = grpo_targets(c.model.family)
    c.optim = _optim(tiny)
    c.train = _train(tiny, steps)
    c.task = mlc.ConfigDict()
    c.task.name = task  # gsm8k, math500, sudoku, countdown (or s1k for SFT).
    c.task.source = ""  # "d1": d1's training data (sudoku, countdown); "spg": SPG's Sudoku split with its 3-shot prompt; a local data file/dir in the Hugging Face schema or a Hub id; "": the public data (gsm8k, math500, s1k), generated puzzles (sudoku, countdown).
    c.task.num_train = 256 if tiny else 0  # Use only the first N training examples (0: all).
    c.mesh = mlc.ConfigDict()
    # (data, fsdp, tensor); one -1 takes the remaining devices. 8B: weights sharded over all
    # chips (replicated bf16 weights alone are 16 GB a chip; docs/tpu_plan.md).
    c.mesh.shape = (-1, 1, 1) if tiny else (1, -1, 1)
    c.mesh.rules = ()  # Logical-axis rule overrides, e.g. (("embed", None),); () keeps the defaults.
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
    task = config.get("task")
    if not data or not task or config.get("stage") not in ("grpo", "sft", "eval"):
        return
    from d1jax import tasks
    from d1jax.tasks.sources import _FILE_SUFFIXES
    source = task.get("source") or ""
    named = {"d1": ("sudoku", "countdown"), "spg": ("sudoku",), "toy": ("humaneval", "mbpp")}  # the loaders' named sources ("toy": generated code problems)
    if source in named and task.get("name") not in named[source]:
        raise ConfigError(f"config.task.source={source!r} names {source}'s training data of "
                          f"{' and '.join(named[source])}, not of {task.get('name')!r}")
    if source in named:
        source = ""
    # The rule of tasks.sources.load_rows: a URL, a local path, or a Hub id "owner/name".
    local = (source.endswith(_FILE_SUFFIXES) or source.startswith((".", "/", "~"))
             or source.count("/") != 1)
    if (source and local and not source.startswith(("http://", "https://"))
            and not Path(source).expanduser().exists()):
        raise ConfigError(f"config.task.source={source!r}: no such file or directory (and not "
                          "a Hub id of the form owner/name)")
    if config.stage == "sft" and task.name == "s1k":
        return
    try:
        tasks.get_task(task.name)
    except ValueError as e:  # an unknown task name
        raise ConfigError(f"config.task: {e}") from None


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


# d1's per-task inner iterations (slurm_scripts/*_base.sbatch NUM_ITER).
_MU = {"gsm8k": 12, "math500": 12, "sudoku": 8, "countdown": 8}


# Objectives without a reference term (config.grpo.beta must be 0 for them).
_RATIO_FREE = ("wd1", "spg")


def grpo(task: str, arg: str | None, objective: str = "diffu_grpo",
         checkpoint: str = "llada") -> mlc.ConfigDict:
    """GRPO-style RL on ``task`` with ``objective`` (diffu_grpo, wd1, spg, coupled_grpo),
    every other knob d1's, on ``checkpoint`` (``checkpoints()``: llada, dream, diffucoder).

    ``arg``: "tiny" shrinks it for CPU; "authors" takes the objective's own authors' recipe
    instead of d1's knobs (``_authors``); "authors,tiny" both."""
    tiny, authors, generated = _variant(arg, authors_ok=True)
    c = base("grpo", task, tiny, steps=5000, checkpoint=checkpoint)
    if task in ("sudoku", "countdown") and not (tiny or generated):
        c.task.source = "d1"  # d1's training data (diffu-grpo/data_utils.py); ':generated': ours
    if not tiny:
        # Planned for v5p-8 (docs/tpu_plan.md): the 8B update without remat, its 32 layers
        # unrolled, fits a v5p chip (61 GiB of 84) at XLA's estimated 55% MFU, against 44%
        # (82 GiB) with the middle layers in a loop and 31% with remat as well. Chips with less
        # HBM need remat (the planner says so).
        c.model.remat, c.model.unroll_layers = False, True
    c.sampler = sampler_fields(tiny)
    g = c.grpo = mlc.ConfigDict()
    g.num_generations = 4 if tiny else 6  # G: completions per prompt.
    g.prompts_per_step = 2 if tiny else 16  # Prompts per optimizer step, all hosts (8 GPUs x 6 x 2 accum / G in d1).
    g.num_iterations = 2 if tiny else _MU.get(task, 12)  # mu: inner updates per rollout, each with a fresh mask seed.
    g.beta = 0.0 if objective in _RATIO_FREE else 0.04  # beta: weight of the k3 KL to the reference policy (wd1, spg: 0, they have none).
    g.epsilon = 0.5  # epsilon: PPO ratio clipping.
    g.p_mask_prompt = 0.15  # Probability of masking each prompt token in the log-prob estimator.
    g.random_masking = True  # Fresh random mask seed per inner iteration (False: seed 42 for all, as d1).
    g.advantage = "group_mean"  # group_mean (d1), grpo (std-normalised), dr_grpo or leave_one_out (DiffuCoder's coupled-GRPO).
    g.token_mean = "group"  # Token mean of the diffu-/coupled-GRPO loss: "group" (d1) within each prompt's G completions, then the mean over groups, as d1's GPU micro-batch holds one group; "step": one token mean over all rows of each micro-batch (d1jax before; docs/objectives.md).
    g.num_epochs = 0 if tiny else 10  # Passes over the training prompts (d1: num_train_epochs 10); the run's optimizer steps are then epochs x (prompts // prompts_per_step) x mu (TRL's count), printed at the start; 0: train.num_steps.
    g.objective = objective  # Policy loss: diffu_grpo, wd1, spg, coupled_grpo or justgrpo (d1jax.objectives.table.OBJECTIVES); knobs of each below.
    g.wd1 = mlc.ConfigDict()  # wd1 (arXiv 2507.08838); its group is G = num_generations.
    g.wd1.negative = True  # Keep the negative-advantage term - sum w- log pi (False: the authors' positive-only variant).
    g.spg = mlc.ConfigDict()  # SPG (arXiv 2510.09541); block masks use sampler.block_length.
    g.spg.num_t = 2  # J: block-masked noisy copies per sequence (Monte Carlo samples of the bounds).
    g.spg.min_t = 0.0  # Masked share of the chosen block lies in [min_t, max_t].
    g.spg.max_t = 1.0  # Upper end of that share.
    g.spg.eubo_beta = 1.5  # beta: power of the upper bound (EUBO).
    g.spg.mix_weight = 0.5  # omega: EUBO share of the negative-advantage estimate (1: pure EUBO).
    g.coupled_grpo = mlc.ConfigDict()  # coupled-GRPO (DiffuCoder, arXiv 2506.20639); beta and epsilon above.
    g.coupled_grpo.t_min = 0.2  # t ~ U(t_min, t_max): mask ratio of the set M of the complementary pair.
    g.coupled_grpo.t_max = 0.8  # Upper end of t.
    g.justgrpo = mlc.ConfigDict()  # JustGRPO (arXiv 2601.15165): exact AR likelihood, one forward per completion position (objectives.justgrpo).
    g.justgrpo.gain = 8.0  # Loss multiplier: its logprob_loss gain 1.0 x its 8 summed accumulation steps (train.py).
    g.justgrpo.position_chunk = 0  # K: completion positions per batched, rematerialised forward of the likelihood (0: auto by a token budget).
    # The reference of the KL term. False (d1): under LoRA the base model with the adapters off,
    # at every step (d1 scores it under PEFT's disable_adapter(); its train.yaml's
    # sync_ref_model: True acts on no model there); full fine-tuning: a frozen copy of the start.
    g.sync_ref_model = False  # True: keep a reference copy (of the adapters under LoRA) mixed toward the policy every ref_model_sync_steps (TRL's SyncRefModelCallback without PEFT).
    g.ref_model_sync_steps = 4 if tiny else 64  # With sync_ref_model: optimizer steps between reference syncs.
    g.ref_model_mixup_alpha = 0.6  # With sync_ref_model: ref <- alpha * policy + (1 - alpha) * ref.
    if authors:
        _authors(c, objective, tiny)
    c.lock()
    return c


def _authors(c: mlc.ConfigDict, objective: str, tiny: bool) -> None:
    """The ``:authors`` variant: the knobs the objective's authors ran with, where they differ
    from d1's (docs/objectives.md has each source)."""
    g = c.grpo
    if objective == "coupled_grpo":
        # DiffuCoder's recipes/config_coupled_code.yaml (apple/ml-diffucoder): full fine-tuning
        # of Dream-v0-Instruct-7B, a reference synced every 64 steps, RLOO advantage unscaled.
        c.lora.enabled = False
        g.beta = 0.01
        g.num_iterations = 2
        g.advantage = "leave_one_out"
        g.epsilon = 0.5
        g.sync_ref_model = True
        if not tiny:
            # Full fine-tuning of 7B with a reference copy fits v5p-8 and v6e-8 only with remat
            # and the layer loop (docs/tpu_plan.md: 320 / 160 GiB a chip without remat).
            c.model.remat, c.model.unroll_layers = True, False
            g.num_generations = 10
            # 8 GPUs (run.sh:6 --num_processes 8) x 5 rows (per_device_train_batch_size) x 2
            # (gradient_accumulation_steps) = 80 rows: 8 prompts of G = 10.
            g.prompts_per_step = 8
            g.ref_model_sync_steps = 64
            c.optim.learning_rate = 1e-6
            c.optim.lr_schedule = "cosine_with_min_lr"
            c.optim.min_lr_rate = 0.1
            c.sampler.gen_length = 256
            c.sampler.steps = 256  # diffusion_steps: one token per step
        # Rollouts through Dream's diffusion_generate over the whole completion, as
        # coupled_grpo.py calls it: alg "entropy", top_p 0.95 (temperature > 0), alg_temp 0.
        c.sampler.loop = "dream"
        c.sampler.block_length = c.sampler.gen_length
        c.sampler.alg = "entropy"
        c.sampler.top_p = 0.95
        c.sampler.temperature = 1.0  # generation_temperature
        g.p_mask_prompt = 0.0
    elif objective == "spg":
        g.num_iterations = 4  # SPG's run scripts: num_iterations 4
        if c.task.name == "sudoku":
            # spg_mix/sudoku_new_base_spg_mix_beta1.0_weight0.5.sbatch: dataset sudoku_new (its
            # split, 3-shot prompt), eubo_beta 1.0, temperature 0.3, max_prompt_length 1500.
            g.spg.eubo_beta = 1.0
            c.sampler.temperature = 0.3
            if not tiny:
                c.task.source = "spg"
                c.max_prompt_length = 1500
    elif objective == "justgrpo":
        _justgrpo(c, tiny)
    else:
        raise ConfigError(f"no ':authors' variant for objective {objective!r} (coupled_grpo, "
                          f"spg, justgrpo have one; diffu_grpo's authors are d1)")


def _justgrpo(c: mlc.ConfigDict, tiny: bool) -> None:
    """LeapLabTHU/JustGRPO's train.py values (configs/justgrpo_gsm8k.py lists each)."""
    g, o, s = c.grpo, c.optim, c.sampler
    c.lora.enabled = False  # train.py trains every parameter
    o.learning_rate = 1e-3 if tiny else 5e-6
    o.b2, o.weight_decay, o.max_grad_norm, o.warmup_ratio = 0.999, 0.0, 1.0, 0.0
    o.lr_schedule = "constant_with_warmup"  # with no warmup: constant
    o.grad_accum = 1 if tiny else 16  # memory only: the loss is the same
    c.train.num_steps = 4 if tiny else 125
    g.num_epochs = 0  # train.num_steps, as train.py's total_steps
    g.num_generations = 4 if tiny else 16
    g.prompts_per_step = 2 if tiny else 64
    g.num_iterations, g.beta, g.epsilon, g.advantage = 1, 0.0, 0.2, "grpo"
    g.p_mask_prompt = 0.0  # the exact likelihood masks no prompt token
    s.gen_length = 16 if tiny else 256
    s.steps, s.block_length, s.temperature = s.gen_length, 1, 1.0
    if not tiny:
        # Full fine-tuning of 8B with AdamW's float32 state: remat and the layer loop, as
        # coupled-GRPO's full fine-tuning (docs/tpu_plan.md).
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
    c.sft = mlc.ConfigDict()
    c.sft.batch_size = 8 if tiny else 16  # Sequences per optimizer step, all hosts (d1: 1 per GPU x 4 accumulation x 4 GPUs).
    c.sft.max_length = 256 if tiny else 4096  # Prompt + completion tokens (longer are cut).
    c.sft.num_epochs = 0 if tiny else 20  # Epochs (d1: 20); 0: run train.num_steps.
    c.sft.eps = 1e-3  # Lower bound of the mask ratio t ~ U(eps, 1).
    c.sft.tokenize = "joint"  # "joint": template the whole conversation (d1); "split": prompt and completion apart, as generation sees them.
    c.lock()
    return c


def _variant(arg: str | None, authors_ok: bool = False) -> tuple[bool, bool, bool]:
    """(tiny, authors, generated) of a config argument: comma-separated words of "tiny",
    and with ``authors_ok`` "authors" and "generated" (sudoku, countdown: train on our
    generated puzzles instead of d1's data)."""
    words = set((arg or "").replace("full", "").split(",")) - {""}
    allowed = {"tiny", "authors", "generated"} if authors_ok else {"tiny"}
    if words - allowed:
        use = ("':tiny', ':authors', ':authors,tiny' or nothing; ',generated' with any of them "
               "trains sudoku and countdown on generated puzzles instead of d1's data"
               if authors_ok else "':tiny' or nothing")
        raise ConfigError(f"unknown config variant {arg!r}: use {use}")
    return "tiny" in words, "authors" in words, "generated" in words


def eval_config(arg: str | None, checkpoint: str = "llada") -> mlc.ConfigDict:
    """d1's evaluation protocol. ``arg``: "TASK" or "TASK-tiny" (e.g. "sudoku-tiny")."""
    task, _, variant = (arg or "gsm8k").partition("-")
    from d1jax.tasks import CODE_TASKS, TASK_NAMES
    if task not in TASK_NAMES + CODE_TASKS or variant not in ("", "tiny"):
        raise ConfigError(f"unknown eval config {arg!r}: use ':TASK' or ':TASK-tiny' with TASK "
                          f"one of {', '.join(TASK_NAMES)} (e.g. ':sudoku-tiny')")
    tiny = variant == "tiny"
    c = base("eval", task, tiny, checkpoint=checkpoint)
    c.lora.enabled = False  # Evaluate plain weights (export LoRA runs first: <workdir>/hf).
    c.sampler = sampler_fields(tiny, rollout=False)
    c.eval = mlc.ConfigDict()
    c.eval.gen_lengths = (32,) if tiny else (256, 512) if task in CODE_TASKS else (128, 256, 512)  # d1: 128, 256, 512; code: 256, 512 (DiffuCoder, JustGRPO); steps = length / 2.
    c.eval.batch_size = 8  # Prompts per generate call, all hosts.
    c.eval.num_examples = 16 if tiny else {"sudoku": 256, "countdown": 256}.get(task, 0)  # d1: 256 for sudoku/countdown, all otherwise (0).
    c.eval.model_name = "d1jax"  # Model name in the output file names.
    c.lock()
    return c
