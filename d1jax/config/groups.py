"""The run config's groups: each knob's default, its CPU-sized default (``tiny``), its
type, what it means and what it allows, declared once (``d1jax.knobs``). A knob the library
takes is declared on the library's config (``SamplerConfig``, ``GRPOConfig``, ``SFTConfig``,
``LoraConfig``, the objectives' configs) and shown here with ``of(...)`` or ``group_of``; the
run's own knobs are declared here (``OptimKnobs`` too: ``run.optim.OptimConfig`` sits above
this layer and takes its knobs from there). The ConfigDict groups of ``d1jax.config.defaults``
and the typed spec of ``d1jax.run.spec`` (these classes, or subclasses that add methods) are
both made from these fields.

Symbols in brackets are the paper's (d1, arXiv 2504.12216). Defaults are d1's
``diffu-grpo/slurm_scripts/train.yaml`` and ``DiffuGRPOConfig`` (GRPO), ``SFT/sft_train.py``
(SFT, set by ``defaults.sft``) and its evaluation protocol. Where a builder in defaults.py
sets a knob per task, objective or checkpoint, its default here says so.
"""

from typing import Any

from d1jax.knobs import frozen, group_of, knob, of
from d1jax.model.lora import LoraConfig
# The objectives' own groups: their configs' knobs, next to their modules (records name them).
from d1jax.objectives.coupled_grpo import CoupledGRPOKnobs  # noqa: F401 - re-exported
from d1jax.objectives.justgrpo import JustGRPOKnobs  # noqa: F401
from d1jax.objectives.spg import SPGKnobs  # noqa: F401
from d1jax.objectives.tracerl import TraceRLKnobs  # noqa: F401
from d1jax.objectives.table import GRPOConfig, SFTConfig
from d1jax.objectives.wd1 import WD1Knobs  # noqa: F401
from d1jax.sampling.config import SamplerConfig


def objective_groups() -> list[tuple[str, type, str]]:
    """(name, knobs class, meaning) of each registered objective with knobs of its own:
    config.grpo's groups after ``objective``."""
    from d1jax.objectives import registry
    registry.load_modules()
    return [(o.name, o.knobs, o.doc) for o in registry.OBJECTIVES.values() if o.knobs]


def _dtype(name: str) -> Any:
    import jax.numpy as jnp
    return getattr(jnp, name)


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(f.strip() for f in str(text).split(",") if f.strip())


DTYPES = ("float32", "bfloat16", "float16")


@frozen
class ModelKnobs:
    """Where the model comes from and how it computes: ``config.model``."""

    family: str = knob(
        "llada", 'Model family (d1jax.model.family): "llada" (LLaDA-8B), "dream" (Dream-v0-7B, '
        'DiffuCoder-7B) or "sdar" (SDAR, TraDo; block diffusion); must match model.path\'s '
        "config.json. Set by the builders' checkpoint kind.")
    path: str = knob(
        "", "Local HF checkpoint dir (config.json, *.safetensors, tokenizer); $LLADA_PATH "
        "($DREAM_PATH, $DIFFUCODER_PATH, $SDAR_PATH, $TRADO_PATH) by default, \"\" in the tiny "
        "configs.")
    tokenizer_path: str = knob(
        "", 'Tokenizer dir; "": model.path (or a tiny one trained on the task text when '
        "random_init).")
    random_init: str = knob(
        "", "Preset name: random weights of that shape when model.path is empty (tests, CPU "
        "smoke runs); the tiny configs name the family's tiny preset.")
    width: int = knob(0, "For random_init: d_model override (0 keeps the preset's).", tiny=64,
                       low=0)
    n_layers: int = knob(
        0, "For random_init: layer count override (0 keeps the preset's).", tiny=2, low=0)
    tokenizer_vocab: int = knob(1024, "For random_init: vocabulary size of the trained tiny "
                                "tokenizer.")
    vocab_size: int = knob(0, "For random_init: model vocabulary (embedding rows); 0: the "
                           "tokenizer's, rounded up to 64.", low=0)
    dtype: Any = knob("bfloat16", "Compute dtype of matmuls.", tiny="float32", choices=DTYPES,
                      parse=_dtype)
    param_dtype: Any = knob("bfloat16", "Storage dtype of the params.", tiny="float32",
                            choices=DTYPES, parse=_dtype)
    remat: bool = knob(True, "Rematerialise each block in the backward pass.", tiny=False)
    unroll_layers: bool | None = knob(
        None, "Layers as straight-line code (True) or a compiled loop over the middle ones "
        "(False); None: unrolled up to 8 layers.")
    layers_per_loop: int = knob(
        1, "Middle layers per iteration of that loop (compile time grows with it).", low=1)
    base_quant: str = of(LoraConfig)


@frozen
class LoraKnobs:
    """LoRA adapters: ``config.lora`` (the spec holds a ``d1jax.model.LoraConfig``)."""

    enabled: bool = knob(True, "Train LoRA adapters (d1); False: full fine-tuning with a "
                         "frozen reference copy.")
    rank: int = of(LoraConfig)
    alpha: float = of(LoraConfig)
    dropout: float = of(LoraConfig)
    targets: tuple[str, ...] = of(LoraConfig)


@frozen
class OptimKnobs:
    """AdamW and its schedule: ``config.optim`` (the spec's ``run.optim.OptimConfig`` takes its
    knobs from here)."""

    learning_rate: float = knob(3e-6, "Peak learning rate; > 0.", tiny=1e-3)
    b1: float = knob(0.9, "Adam beta1.")
    b2: float = knob(0.99, "Adam beta2.")
    eps: float = knob(1e-8, "Adam epsilon (torch default).")
    weight_decay: float = knob(0.1, "AdamW decoupled weight decay (lr x wd x param).")
    max_grad_norm: float = knob(0.2, "Global-norm gradient clipping (0: none).")
    warmup_ratio: float = knob(0.0001, "Linear warmup over this fraction of the steps.")
    lr_schedule: str = knob(
        "constant_with_warmup", 'After the warmup: "constant_with_warmup" (d1 GRPO), "linear" '
        "decay to 0 at the last step (HF Trainer's default, d1 SFT) or \"cosine_with_min_lr\" "
        "(DiffuCoder's coupled-GRPO).")
    min_lr_rate: float = knob(0.0, 'With "cosine_with_min_lr": the final learning rate as a '
                              "share of the peak (DiffuCoder: 0.1).")
    grad_accum: int = knob(2, "Micro-batches accumulated per optimizer step.", tiny=1, low=1)
    master_weights: str = knob(
        "float32", 'Full fine-tuning with a bfloat16 model.param_dtype: "float32" keeps float32 '
        "master weights and AdamW moments, cast to bfloat16 for each forward (DeepSpeed, "
        'MaxText); "none" stores and updates them in bfloat16, where an update below half a '
        "bfloat16 step (lr 1e-6) rounds away. LoRA: no effect (adapters are float32).",
        choices=("float32", "none"))


@frozen
class TaskKnobs:
    """The task and its data: ``config.task``."""

    name: str = knob("", "gsm8k, math500, sudoku, countdown, humaneval, mbpp, letters (the "
                     "install check's toy; or s1k for SFT), or a task a module in "
                     "$D1JAX_TASK_MODULES registers; set by the builders.")
    source: str | None = knob(
        "", '"d1": d1\'s training data (sudoku, countdown); "spg": SPG\'s Sudoku split with its '
        '3-shot prompt; "toy": generated code problems (humaneval, mbpp); a local data file/dir '
        'in the Hugging Face schema or a Hub id; "": the public data (gsm8k, math500, s1k), '
        "generated puzzles (sudoku, countdown).", parse=lambda s: s or None,
        kind=(str, type(None)))
    num_train: int = knob(0, "Use only the first N training examples (0: all).", tiny=256, low=0)


@frozen
class MeshKnobs:
    """The device mesh: ``config.mesh``."""

    shape: tuple[int, ...] = knob(
        (1, -1, 1), "(data, fsdp, tensor); one -1 takes the remaining devices. 8B: weights "
        "sharded over all chips (replicated bf16 weights alone are 16 GB a chip; "
        "docs/tpu_plan.md).", tiny=(-1, 1, 1))
    rules: tuple[tuple, ...] = knob(
        (), 'Logical-axis rule overrides, e.g. (("embed", None),); () keeps the defaults.')


# The sampler's knobs, all declared on the library's SamplerConfig. Its defaults are d1's
# evaluation's; the rollouts' (256 tokens, 128 steps, temperature 0.9) are set by
# ``defaults.sampler_fields``.
SamplerKnobs = group_of(
    SamplerConfig, "The sampler: ``config.sampler`` (the spec holds a "
    "``d1jax.sampling.SamplerConfig``). GRPO configs take d1's rollout lengths and temperature "
    "(``defaults.sampler_fields``; SamplerConfig's defaults are d1's evaluation's: 128 tokens, "
    "64 steps, greedy); evaluation configs have no gen_length or steps: eval.gen_lengths, "
    "steps = length / 2 (or eval.steps_per_block a block).")


@frozen
class GRPOKnobs:
    """GRPO-style RL: ``config.grpo`` (the update's share becomes an
    ``objectives.GRPOConfig``)."""

    num_generations: int = knob(6, "G: completions per prompt.", tiny=4, low=2)
    prompts_per_step: int = knob(16, "Prompts per optimizer step, all hosts (8 GPUs x 6 x 2 "
                                 "accum / G in d1).", tiny=2, low=1)
    rollout_batch: int = knob(
        0, "Rows per rollout sampler call, all hosts (0: all prompts_per_step x G rows in one "
        "call). Must divide that and be a multiple of the data-parallel size (mesh data x "
        "fsdp); one program serves every call. Chunks draw other samples than one call (the "
        "samplers draw a whole batch's noise from one key; chunk c > 0 uses fold_in(key, c)).",
        low=0)
    num_iterations: int = of(GRPOConfig)  # the update's GRPOConfig declares these four
    beta: float = of(GRPOConfig)
    epsilon: float = of(GRPOConfig)
    p_mask_prompt: float = of(GRPOConfig)
    random_masking: bool = knob(True, "Fresh random mask seed per inner iteration (False: seed "
                                "42 for all, as d1).")
    advantage: str = knob("group_mean", "group_mean (d1), grpo (std-normalised), dr_grpo, "
                          "leave_one_out (DiffuCoder's coupled-GRPO) or zscore_filtered "
                          "(TraceRL).")
    token_mean: str = knob(
        "group", 'Token mean of the diffu-/coupled-GRPO loss: "group" (d1) within each prompt\'s '
        "G completions, then the mean over groups, as d1's GPU micro-batch holds one group; "
        '"step": one token mean over all rows of each micro-batch (d1jax before; '
        "docs/objectives.md).", choices=("group", "step"))
    num_epochs: int = knob(
        10, "Passes over the training prompts (d1: num_train_epochs 10); the run's optimizer "
        "steps are then epochs x (prompts // prompts_per_step) x mu (TRL's count), printed at "
        "the start; 0: train.num_steps.", tiny=0, low=0)
    objective: str = of(GRPOConfig)
    # Then each registered objective's own group, config.grpo.<name> (its record's knobs:
    # d1jax.objectives.registry), spliced in here by ``more_groups``.
    # The reference of the KL term. False (d1): under LoRA the base model with the adapters
    # off, at every step (d1 scores it under PEFT's disable_adapter(); its train.yaml's
    # sync_ref_model: True acts on no model there); full fine-tuning: a frozen copy.
    sync_ref_model: bool = knob(
        False, "True: keep a reference copy (of the adapters under LoRA) mixed toward the "
        "policy every ref_model_sync_steps (TRL's SyncRefModelCallback without PEFT).")
    ref_model_sync_steps: int = knob(64, "With sync_ref_model: optimizer steps between "
                                     "reference syncs.", tiny=4, low=1)
    ref_model_mixup_alpha: float = knob(0.6, "With sync_ref_model: ref <- alpha * policy + "
                                        "(1 - alpha) * ref.")
    # The objectives' groups, translated: (name, knobs) pairs (``knobs.translate``).
    objective_knobs: tuple[tuple[str, Any], ...] = ()

    more_groups = ("objective", "objective_knobs", objective_groups)

    def __getattr__(self, name: str) -> Any:
        """An objective's translated group by its name (``spec.grpo_run.spg.num_t``)."""
        for key, value in self.__dict__.get("objective_knobs", ()):
            if key == name:
                return value
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


@frozen
class SFTKnobs:
    """SFT (d1's stage 1; block SFT on block diffusion models): ``config.sft``."""

    batch_size: int = knob(16, "Sequences per optimizer step, all hosts (d1: 1 per GPU x 4 "
                           "accumulation x 4 GPUs).", tiny=8, low=1)
    max_length: int = knob(4096, "Prompt + completion tokens (longer are cut).", tiny=256, low=1)
    num_epochs: int = knob(20, "Epochs (d1: 20); 0: run train.num_steps.", tiny=0, low=0)
    eps: float = of(SFTConfig)
    tokenize: str = knob(
        "joint", '"joint": template the whole conversation (d1); "split": prompt and completion '
        "apart, as generation sees them.", choices=("joint", "split"))
    loss: str = knob(
        "family", '"masked": d1\'s masked SFT (t ~ U(eps, 1), 1/t weight); "block": block SFT '
        "(dLLM-RL sft_sdar.py: a noised copy of the row attends to its clean earlier blocks; "
        'each position its own p, -sum/L per row); "block_dfactory": dFactory\'s '
        "(train_llada2_bd.py: one t per row, blocks from position 0, each row's masked-token "
        'mean); "family": the model family\'s own (block for SDAR/TraDo, block_dfactory for '
        "LLaDA2, masked otherwise).",
        choices=("family", "masked", "block", "block_dfactory"))
    lower_p: float = of(SFTConfig)  # the update's SFTConfig declares these
    upper_p: float = of(SFTConfig)
    post_num: int | None = of(SFTConfig)  # -1 ("all") here, None in SFTConfig


@frozen
class EvalKnobs:
    """d1's evaluation protocol: ``config.eval``."""

    gen_lengths: tuple[int, ...] = knob(
        (128, 256, 512), "d1: 128, 256, 512; code: 256, 512 (DiffuCoder, JustGRPO); steps = "
        "length / 2 (or steps_per_block a block).", tiny=(32,), low=1)
    batch_size: int = knob(8, "Prompts per generate call, all hosts.", low=1)
    num_examples: int = knob(0, "Examples scored (0: all; d1: 256 for sudoku and countdown, "
                             "all otherwise).", tiny=16, low=0)
    model_name: str = knob("d1jax", "Model name in the output file names.")
    steps_per_block: int = knob(
        0, "Diffusion steps a sampler block gets (0: d1's steps = length / 2 in all); e.g. "
        "LLaDA2's generate: 32 a block of 32.", low=0)


@frozen
class LoopSpec:
    """Checkpointing, logging, stopping and export of a training loop: ``config.train``."""

    num_steps: int = knob(1000, "Optimizer steps in the whole run (when the stage's num_epochs "
                          "is 0; the run refuses 0 steps).", tiny=4, low=0)
    log_every: int = knob(1, "Metrics every N optimizer steps.", low=1)
    sample_every: int = knob(20, "Sample completions as text every N steps.", tiny=2, low=1)
    save_every: int = knob(100, "Checkpoint every N optimizer steps.", tiny=2, low=1)
    max_to_keep: int = knob(5, "Newest checkpoints kept.", tiny=2)
    keep_best_metric: str = knob(
        "", 'Also keep the best checkpoint by this logged metric ("" off).')
    async_checkpoints: bool = knob(True, "Save in the background.")
    export_hf: bool = knob(
        True, "Write the final model in the Hugging Face layout to <workdir>/hf.")
    stop_after: int = knob(
        0, "Stop (as if preempted, with a save) after this many steps; 0 off.", low=0)
    if_incompatible: str = knob(
        "refuse", 'Workdir checkpoints from another config, or none restores: "refuse" (exit '
        '1, nothing changed) or "move_aside" (old run moved to <workdir>/previous/<time>, '
        "start at step 0).", choices=("refuse", "move_aside"))
    accept_changes: tuple[str, ...] = knob(
        "", 'Comma-separated resume fields whose change is accepted on resume, e.g. '
        '"optim.learning_rate" (d1jax.run.spec.RESUME_FIELDS); the spec holds them parsed.',
        parse=_comma_list)
    compile_cache: str = knob(
        "workdir", "Persistent XLA compilation cache of `python -m d1jax.main`, so a rerun "
        'after preemption loads its programs instead of compiling them: "workdir" '
        '(<workdir>/compile_cache), a path (one cache for many runs), or "" (off). '
        "JAX_COMPILATION_CACHE_DIR, when set, wins. Read by the commands (d1jax.cli).")
    stopped_exit_code: int = knob(
        75, "Exit code after a save on SIGTERM or stop_after, so a scheduler reruns the job "
        "(75: EX_TEMPFAIL); 0 if it must read as success.", low=0, high=255)
