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


class ConfigError(ValueError):
    """A config that cannot run; raised before any compute."""


def _model(tiny: bool) -> mlc.ConfigDict:
    m = mlc.ConfigDict()
    m.path = "" if tiny else os.environ.get("LLADA_PATH", "")  # Local HF LLaDA dir (config.json, *.safetensors, tokenizer); $LLADA_PATH by default.
    m.tokenizer_path = ""  # Tokenizer dir; None: model.path (or a tiny one trained on the task text when random_init).
    m.random_init = "test-tiny" if tiny else ""  # Preset name: random weights of that shape when model.path is empty (tests, CPU smoke runs).
    m.width = 64 if tiny else 0  # For random_init: d_model override (0 keeps the preset's).
    m.n_layers = 2 if tiny else 0  # For random_init: layer count override (0 keeps the preset's).
    m.tokenizer_vocab = 1024  # For random_init: vocabulary size of the trained tiny tokenizer.
    m.vocab_size = 0  # For random_init: model vocabulary (embedding rows); 0: the tokenizer's, rounded up to 64.
    m.dtype = "float32" if tiny else "bfloat16"  # Compute dtype of matmuls.
    m.param_dtype = "float32" if tiny else "bfloat16"  # Storage dtype of the params.
    m.remat = not tiny  # Rematerialise each block in the backward pass.
    return m


def _lora(tiny: bool) -> mlc.ConfigDict:
    lo = mlc.ConfigDict()
    lo.enabled = True  # Train LoRA adapters (d1); False: full fine-tuning with a frozen reference copy.
    lo.rank = 8 if tiny else 128  # r.
    lo.alpha = 16.0 if tiny else 64.0  # alpha; adapters scale by alpha / r.
    lo.dropout = 0.0 if tiny else 0.05  # Dropout on the adapter input.
    return lo


def _optim(tiny: bool) -> mlc.ConfigDict:
    o = mlc.ConfigDict()
    o.learning_rate = 1e-3 if tiny else 3e-6  # Peak learning rate.
    o.b1 = 0.9  # Adam beta1.
    o.b2 = 0.99  # Adam beta2.
    o.eps = 1e-8  # Adam epsilon (torch default).
    o.weight_decay = 0.1  # AdamW decoupled weight decay.
    o.max_grad_norm = 0.2  # Global-norm gradient clipping.
    o.warmup_ratio = 0.0001  # Linear warmup over this fraction of the steps, then constant.
    o.grad_accum = 1 if tiny else 2  # Micro-batches accumulated per optimizer step.
    return o


def _sampler(tiny: bool) -> mlc.ConfigDict:
    s = mlc.ConfigDict()
    s.gen_length = 32 if tiny else 256  # Completion length (max_completion_length).
    s.block_length = 16 if tiny else 32  # Semi-autoregressive block length.
    s.steps = 16 if tiny else 128  # Diffusion steps over the whole completion (diffusion_steps).
    s.temperature = 0.9  # Rollout temperature (d1's DiffuGRPOConfig default).
    s.cfg_scale = 0.0  # Classifier-free guidance scale.
    s.remasking = "low_confidence"  # "low_confidence" or "random".
    s.use_attention_mask = True  # Honour prompt padding; False attends to padding like d1.
    s.kv_cache = "none"  # Rollout sampler: "none" (exact), "prefix" or "dual" block KV cache (Fast-dLLM).
    s.threshold = 1.0  # Parallel decoding: also unmask every token with confidence > tau (>= 1: off).
    s.recompute = "block"  # Dual cache steps recompute the whole block (Fast-dLLM) or only "masked" positions.
    s.cache_refresh = 0  # With kv_cache: refresh it once this many block tokens were decoded (0: at block starts only).
    return s


def _train(tiny: bool, steps: int) -> mlc.ConfigDict:
    t = mlc.ConfigDict()
    t.num_steps = 4 if tiny else steps  # Optimizer steps in the whole run.
    t.log_every = 1  # Metrics every N optimizer steps.
    t.sample_every = 2 if tiny else 20  # Sample completions as text every N steps.
    t.save_every = 2 if tiny else 100  # Checkpoint every N optimizer steps.
    t.max_to_keep = 2 if tiny else 5  # Newest checkpoints kept.
    t.keep_best_metric = ""  # Also keep the best checkpoint by this logged metric ("" off).
    t.async_checkpoints = True  # Save in the background.
    t.export_hf = True  # Write the final model in the Hugging Face layout to <workdir>/hf.
    t.stop_after = 0  # Stop (as if preempted, with a save) after this many steps; 0 off.
    return t


def base(stage: str, task: str, tiny: bool, steps: int = 1000) -> mlc.ConfigDict:
    c = mlc.ConfigDict()
    c.stage = stage  # Which stage d1jax.main runs: sft, grpo or eval.
    c.workdir = ""  # Run directory (--workdir overrides): checkpoints, metrics, export.
    c.seed = 42  # Seed of data order, init, rollouts and mask seeds.
    c.model = _model(tiny)
    c.lora = _lora(tiny)
    c.optim = _optim(tiny)
    c.train = _train(tiny, steps)
    c.task = mlc.ConfigDict()
    c.task.name = task  # gsm8k, math500, sudoku, countdown (or s1k for SFT).
    c.task.source = ""  # Local data file/dir in the Hugging Face schema; "": the default (public data, or generated puzzles for sudoku/countdown).
    c.task.prompt = "d1"  # "d1": d1's prompt; "compact" (sudoku): the question alone (CPU demo).
    c.task.num_train = 256 if tiny else 0  # Use only the first N training examples (0: all).
    c.mesh = mlc.ConfigDict()
    c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); one -1 takes the remaining devices.
    c.mesh.rules = ()  # Logical-axis rule overrides, e.g. (("embed", None),); () keeps the defaults.
    c.max_prompt_length = 192 if tiny else 200  # Prompts are left-truncated to this many tokens.
    return c


def validate(c: mlc.ConfigDict) -> None:
    """Fails before any compute with one clear line for a config that cannot run."""
    if c.stage not in ("sft", "grpo", "eval"):
        raise ConfigError(f"stage={c.stage!r}: must be sft, grpo or eval")
    if not c.model.random_init:
        if not c.model.path:
            raise ConfigError(
                "config.model.path is not set: point it (or $LLADA_PATH) at a local Hugging Face "
                "LLaDA directory, e.g. `huggingface-cli download GSAI-ML/LLaDA-8B-Instruct "
                "--local-dir ~/llada-8b-instruct`, or use a :tiny config")
        if not Path(c.model.path).is_dir():
            raise ConfigError(f"config.model.path={c.model.path!r} is not a directory; download "
                              "a LLaDA checkpoint there (see README) or fix the path")
    if "sampler" in c:
        s = c.sampler
        if s.gen_length % s.block_length:
            raise ConfigError(f"sampler.block_length={s.block_length} does not divide "
                              f"sampler.gen_length={s.gen_length}")
        nblocks = s.gen_length // s.block_length
        if s.steps % nblocks:
            raise ConfigError(f"sampler.steps={s.steps} is not a multiple of the "
                              f"{nblocks} blocks (gen_length / block_length)")
        check_sampler("sampler.", gen_length=s.gen_length, block_length=s.block_length,
                      steps=s.steps, temperature=s.temperature, cfg_scale=s.cfg_scale,
                      remasking=s.remasking, kv_cache=s.get("kv_cache", "none"),
                      threshold=s.get("threshold", 1.0),
                      recompute=s.get("recompute", "block"),
                      cache_refresh=s.get("cache_refresh", 0))
    if "sft" in c and c.sft.get("tokenize", "joint") not in ("joint", "split"):
        raise ConfigError(f"sft.tokenize={c.sft.tokenize!r}: joint or split")
    if c.optim.learning_rate <= 0:
        raise ConfigError(f"optim.learning_rate={c.optim.learning_rate} must be positive")


def check_sampler(prefix: str, **fields) -> None:
    """Runs the sampler's own checks (``SamplerConfig``) before any model is loaded; a bad
    field becomes one ConfigError naming it as ``prefix + field``."""
    from d1jax import sampling as sampler  # heavy (jax): only when a config is validated
    try:
        sampler.SamplerConfig(**fields)
    except ValueError as e:
        raise ConfigError(f"{prefix}{e}") from None


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


def check_batch(global_batch: int, group: int, data_parallel: int, what: str) -> None:
    """A global batch must split into whole groups and over the data-parallel devices."""
    if global_batch % group:
        raise ConfigError(f"{what}={global_batch} is not divisible by num_generations G={group}")
    if global_batch % data_parallel:
        raise ConfigError(f"{what}={global_batch} is not divisible by the data-parallel size "
                          f"{data_parallel} (mesh data x fsdp)")


# d1's per-task inner iterations (slurm_scripts/*_base.sbatch NUM_ITER).
_MU = {"gsm8k": 12, "math500": 12, "sudoku": 8, "countdown": 8}


def grpo(task: str, arg: str | None) -> mlc.ConfigDict:
    """diffu-GRPO on ``task``; ``arg`` "tiny" shrinks it for CPU."""
    tiny = _variant(arg)
    c = base("grpo", task, tiny, steps=5000)
    c.sampler = _sampler(tiny)
    g = c.grpo = mlc.ConfigDict()
    g.num_generations = 4 if tiny else 6  # G: completions per prompt.
    g.prompts_per_step = 2 if tiny else 16  # Prompts per optimizer step, all hosts (8 GPUs x 6 x 2 accum / G in d1).
    g.num_iterations = 2 if tiny else _MU.get(task, 12)  # mu: inner updates per rollout, each with a fresh mask seed.
    g.beta = 0.04  # beta: weight of the k3 KL to the reference policy.
    g.epsilon = 0.5  # epsilon: PPO ratio clipping.
    g.p_mask_prompt = 0.15  # Probability of masking each prompt token in the log-prob estimator.
    g.random_masking = True  # Fresh random mask seed per inner iteration (False: seed 42 for all, as d1).
    g.advantage = "group_mean"  # group_mean (d1), grpo (std-normalised) or dr_grpo.
    g.sync_ref_model = True  # Mix the reference toward the policy every ref_model_sync_steps.
    g.ref_model_sync_steps = 4 if tiny else 64  # Optimizer steps between reference syncs.
    g.ref_model_mixup_alpha = 0.6  # ref <- alpha * policy + (1 - alpha) * ref.
    c.lock()
    return c


def sft(arg: str | None) -> mlc.ConfigDict:
    """Masked SFT on s1K reasoning traces (d1's stage 1); "tiny" shrinks it for CPU."""
    tiny = _variant(arg)
    # The tiny variant trains on generated Sudoku trajectories: s1K needs the Hub.
    c = base("sft", "sudoku" if tiny else "s1k", tiny, steps=0)
    c.optim.learning_rate = 1e-3 if tiny else 1e-5  # d1 SFT: 1e-5.
    c.optim.grad_accum = 1 if tiny else 4  # d1 SFT: 4.
    c.optim.max_grad_norm = 1.0  # d1 SFT: the Trainer's default 1.0.
    c.optim.warmup_ratio = 0.0 if tiny else 0.05  # Linear warmup fraction, then constant.
    c.sft = mlc.ConfigDict()
    c.sft.batch_size = 8 if tiny else 8  # Sequences per optimizer step, all hosts.
    c.sft.max_length = 256 if tiny else 4096  # Prompt + completion tokens (longer are cut).
    c.sft.num_epochs = 0 if tiny else 20  # Epochs (d1: 20); 0: run train.num_steps.
    c.sft.eps = 1e-3  # Lower bound of the mask ratio t ~ U(eps, 1).
    c.sft.tokenize = "joint"  # "joint": template the whole conversation (d1); "split": prompt and completion apart, as generation sees them.
    c.sft.objective = "sft"  # "sft": completion-only loss; "pretrain": whole documents (the demo's base model).
    c.sft.answer_noise = 0.0  # sudoku, > 0: train on a noisy corpus (demo_data); chance each empty cell of a document's answer is wrong.
    c.sft.format_noise = 0.0  # sudoku, > 0: noisy corpus; chance a document's answer is untagged rows (unreadable to the reward).
    c.lock()
    return c


def _variant(arg: str | None) -> bool:
    if arg in (None, "", "full"):
        return False
    if arg == "tiny":
        return True
    raise ConfigError(f"unknown config variant {arg!r}: use ':tiny' or nothing")


def eval_config(arg: str | None) -> mlc.ConfigDict:
    """d1's evaluation protocol. ``arg``: "TASK" or "TASK-tiny" (e.g. "sudoku-tiny")."""
    task, _, variant = (arg or "gsm8k").partition("-")
    tiny = _variant(variant or None)
    c = base("eval", task, tiny)
    c.lora.enabled = False  # Evaluate plain weights (export LoRA runs first: <workdir>/hf).
    c.eval = mlc.ConfigDict()
    c.eval.gen_lengths = (32,) if tiny else (128, 256, 512)  # d1: 128, 256, 512.
    c.eval.block_length = 16 if tiny else 32  # d1: 32.
    c.eval.temperature = 0.0  # d1: 0 (greedy).
    c.eval.batch_size = 8  # Prompts per generate call, all hosts.
    c.eval.num_examples = 16 if tiny else {"sudoku": 256, "countdown": 256}.get(task, 0)  # d1: 256 for sudoku/countdown, all otherwise (0).
    c.eval.use_attention_mask = True  # Honour prompt padding (d1 attends to it).
    c.eval.model_name = "d1jax"  # Model name in the output file names.
    c.eval.kv_cache = "none"  # "none" (d1's exact protocol), "prefix" or "dual" KV cache.
    c.eval.threshold = 1.0  # Parallel decoding tau (>= 1: off, d1's protocol).
    c.eval.recompute = "block"  # Dual cache steps recompute the whole block (Fast-dLLM) or only "masked" positions.
    c.eval.cache_refresh = 0  # With kv_cache: refresh it once this many block tokens were decoded (0: at block starts only).
    c.lock()
    return c


def demo(arg: str | None) -> mlc.ConfigDict:
    """The CPU demo (d1jax/demo/run.py): base -> SFT -> diffu-GRPO on 4x4 Sudoku.

    ``arg``: None (the README's run, about 13 minutes on 2 cores) or "ci" (a shortened
    run for the test suite: fewer pretraining steps, one 60-step diffu-GRPO run from the SFT
    model with exact rollouts).
    """
    if arg not in (None, "", "ci"):
        raise ConfigError(f"unknown demo variant {arg!r}: use nothing or ':ci'")
    ci = arg == "ci"
    c = mlc.ConfigDict()
    c.stage = "demo"  # d1jax.main runs d1jax.demo.run.
    c.workdir = ""  # Run directory (--workdir overrides); one sub-directory per stage.
    d = c.demo = mlc.ConfigDict()
    d.seed = 0  # Seed of the data, the base model's init and the SFT stage.
    # One diffu-GRPO run per seed from each starting model. ci: one run, seed 1 (on the ci
    # variant's SFT model seed 0 gains +0.009 held-out reward, under the test's 0.01; README).
    d.seeds = (1,) if ci else (0, 1, 2)
    d.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor) for every stage.
    d.gen_length = 32  # Completion tokens: <answer> grid </answer> is 24, then EOS.
    d.block_length = 32  # Semi-autoregressive block length (d1: 32); steps = gen_length / 2 (d1).
    d.model = mlc.ConfigDict()
    d.model.preset = "test-tiny"  # Architecture preset the widths below override ("bench-tiny": BENCH.md's shape).
    d.model.width = 128  # d_model (mlp 3x; test-tiny: 4 heads, 2 KV heads); 0 keeps the preset's.
    d.model.n_layers = 4  # Transformer blocks; 0 keeps the preset's.
    d.model.vocab_size = 0  # Model vocabulary (bench-tiny: 8192); 0: the tokenizer's, rounded up to 64.
    d.model.tokenizer_vocab = 320  # Byte-level BPE vocabulary trained on the puzzles' text.
    d.data = mlc.ConfigDict()
    d.data.seed = 1234  # Seed of the generated puzzles.
    d.data.num_train = 20_000  # Training pool (pretraining documents, SFT and GRPO prompts).
    d.data.num_heldout = 256  # Held-out generated puzzles (evaluation only).
    d.data.num_empty = (6, 10)  # Empty cells per generated puzzle (d1's test set has 8).
    d.pretrain = mlc.ConfigDict()
    d.pretrain.objective = "sft"  # "sft": masked diffusion on the documents' answers; "pretrain": on whole documents.
    d.pretrain.steps = 200 if ci else 400  # Optimizer steps of masked-diffusion training on the noisy corpus.
    d.pretrain.batch_size = 32  # Documents per step.
    d.pretrain.learning_rate = 1e-3  # AdamW peak learning rate.
    d.pretrain.answer_noise = 0.3  # Chance each empty cell of a document's answer is wrong.
    d.pretrain.format_noise = 0.3  # Chance a document's answer is untagged rows instead of <answer>.
    d.pretrain.save_every = 250  # Checkpoint period.
    d.sft = mlc.ConfigDict()
    d.sft.steps = 300  # Optimizer steps of masked SFT on clean trajectories.
    d.sft.batch_size = 32  # Trajectories per step.
    d.sft.learning_rate = 1e-3  # AdamW learning rate (constant).
    d.sft.save_every = 100  # Checkpoint period.
    d.grpo = mlc.ConfigDict()
    d.grpo.steps = 60 if ci else 160  # Optimizer steps per diffu-GRPO run.
    d.grpo.starts = ("sft",) if ci else ("base", "sft")  # Starting models: "base" (+diffu-GRPO row), "sft" (d1).
    d.grpo.num_generations = 8  # G.
    d.grpo.prompts_per_step = 4  # Prompts per rollout.
    d.grpo.num_iterations = 2  # mu: optimizer steps per rollout (each with a fresh mask seed).
    d.grpo.beta = 0.04  # KL weight (d1).
    # Prompt-token mask rate of the log-prob estimator. d1: 0.15. Here the 43-token prompt's 16
    # puzzle digits are the whole problem: masking them sends k3 KL to 20-200 per token in the
    # first updates (measured at 0.15 and 0.05); 0 keeps GRPO stable (README, CPU demo).
    d.grpo.p_mask_prompt = 0.0
    d.grpo.temperature = 0.9  # Rollout temperature (d1).
    d.grpo.learning_rate = 1e-3  # AdamW learning rate (of the LoRA adapters).
    d.grpo.adam_eps = 1e-8  # Adam epsilon (torch default).
    d.grpo.warmup_ratio = 0.0001  # Linear warmup over this fraction of the steps (d1: 0.0001).
    d.grpo.lora_rank = 16  # LoRA rank (0: full fine-tuning).
    # Rollouts with the fast sampler (issue 8): GRPO runs ~1.7x faster; ci keeps the exact one.
    d.grpo.kv_cache = "none" if ci else "dual"  # Rollout block KV cache: "none" (exact), "prefix", "dual".
    d.grpo.threshold = 1.0 if ci else 0.9  # Rollout parallel decoding: unmask confidence > tau (>= 1: off).
    d.grpo.save_every = 40  # Checkpoint period.
    d.eval = mlc.ConfigDict()
    d.eval.num_examples = 256  # Puzzles per evaluation set (d1: 256).
    d.eval.batch_size = 64  # Prompts per generate call.
    d.eval.samples = 2  # Sampled completions per puzzle (rollout temperature) besides greedy.
    d.eval.sampled_sets = ("heldout",)  # Sets scored on samples too ("heldout", "d1_test").
    c.lock()
    return c
