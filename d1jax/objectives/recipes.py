"""The ``:authors`` recipes of the built-in objectives: the knobs each objective's authors ran
with, where they differ from d1's, set on a run's ConfigDict (their records' ``authors``,
applied by ``d1jax.config.grpo(task, "authors", objective)``; docs/objectives.md has each
source). They assign fields only, so they sit beside the objectives, below the config layer.
"""

from __future__ import annotations

from typing import Any

ConfigDict = Any  # an ml_collections.ConfigDict of ``d1jax.config.grpo``


def full_finetuning(c: ConfigDict, learning_rate: float) -> None:
    """Every parameter trained (no LoRA) by AdamW at a constant ``learning_rate``: b2 0.999,
    no weight decay, gradients clipped to norm 1, no warmup. JustGRPO's train.py and
    Gen-Verse/dLLM-RL's sft_*.yaml / rl_*.yaml (a cosine with min_lr_scale 1.0) all train so."""
    o = c.optim
    c.lora.enabled = False
    o.learning_rate = learning_rate
    o.b2, o.weight_decay, o.max_grad_norm, o.warmup_ratio = 0.999, 0.0, 1.0, 0.0
    o.lr_schedule = "constant_with_warmup"  # with no warmup: constant


def coupled_grpo(c: ConfigDict, tiny: bool) -> None:
    """DiffuCoder's recipes/config_coupled_code.yaml (apple/ml-diffucoder): full fine-tuning
    of Dream-v0-Instruct-7B, a reference synced every 64 steps, RLOO advantage unscaled."""
    g = c.grpo
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


def spg(c: ConfigDict, tiny: bool) -> None:
    """SPG's run scripts: num_iterations 4; on Sudoku its own split and prompt."""
    g = c.grpo
    g.num_iterations = 4  # SPG's run scripts: num_iterations 4
    if c.task.name == "sudoku":
        # spg_mix/sudoku_new_base_spg_mix_beta1.0_weight0.5.sbatch: dataset sudoku_new (its
        # split, 3-shot prompt), eubo_beta 1.0, temperature 0.3, max_prompt_length 1500.
        g.spg.eubo_beta = 1.0
        c.sampler.temperature = 0.3
        if not tiny:
            c.task.source = "spg"
            c.max_prompt_length = 1500


def justgrpo(c: ConfigDict, tiny: bool) -> None:
    """LeapLabTHU/JustGRPO's train.py values (configs/justgrpo_gsm8k.py lists each)."""
    g, o, s = c.grpo, c.optim, c.sampler
    full_finetuning(c, 1e-3 if tiny else 5e-6)  # train.py's AdamW on every parameter
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
