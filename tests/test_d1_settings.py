"""d1's settings, pinned: every full config (configs/grpo_*.py, sft_s1k.py, eval.py) against
the values of d1's own files (github.com/dllm-reasoning/d1 at 837888f), each literal named
with its file and line. Nothing is downloaded; a value d1jax sets differently is listed in
DEPARTURES with its reason (README's departures table, docs/training.md), and the test
checks that the departure is still the one documented.

LLaDA's module names (for the LoRA targets) are those of the Hugging Face
``modeling_llada.py`` (ML-GSAI/LLaDA 5975047): LLaDABlock.attn_out (line 557), ff_out (562);
LLaDALlamaBlock.q_proj (859), k_proj (862), v_proj (865), ff_proj (870), up_proj (874). There
is no o_proj, gate_proj or down_proj: PEFT matches module names exactly, so d1's GRPO list
adapts q, k, v and up only.
"""

import importlib.util
import math
from pathlib import Path

import pytest

from d1jax.run import optim
from d1jax.run import spec as spec_lib

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------- d1's values
D1_GRPO = {
    "lora.rank": 128,  # d1: diffu-grpo/slurm_scripts/train.yaml:10 lora_r
    "lora.alpha": 64.0,  # d1: diffu-grpo/slurm_scripts/train.yaml:11 lora_alpha
    "lora.dropout": 0.05,  # d1: diffu-grpo/slurm_scripts/train.yaml:12 lora_dropout
    # d1: diffu-grpo/diffu_grpo_train.py:95 target_modules q, k, v, o, up, down, gate _proj,
    # of which LLaDA has q_proj, k_proj, v_proj and up_proj (module doc).
    "lora.targets": ("q_proj", "k_proj", "v_proj", "up_proj"),
    "model.param_dtype": "bfloat16",  # d1: diffu-grpo/slurm_scripts/train.yaml:4 torch_dtype
    "seed": 42,  # d1: diffu-grpo/slurm_scripts/train.yaml:17 seed
    "optim.b1": 0.9,  # d1: diffu-grpo/slurm_scripts/train.yaml:23 adam_beta1
    "optim.b2": 0.99,  # d1: diffu-grpo/slurm_scripts/train.yaml:24 adam_beta2
    "optim.eps": 1e-8,  # d1: TrainingArguments' adam_epsilon default (train.yaml sets none)
    "optim.weight_decay": 0.1,  # d1: diffu-grpo/slurm_scripts/train.yaml:25 weight_decay
    "optim.max_grad_norm": 0.2,  # d1: diffu-grpo/slurm_scripts/train.yaml:26 max_grad_norm
    "optim.warmup_ratio": 0.0001,  # d1: diffu-grpo/slurm_scripts/train.yaml:32 warmup_ratio
    "optim.learning_rate": 3e-6,  # d1: diffu-grpo/slurm_scripts/train.yaml:34 learning_rate
    "optim.grad_accum": 2,  # d1: diffu-grpo/slurm_scripts/train.yaml:42 gradient_accumulation_steps
    "grpo.num_generations": 6,  # d1: diffu-grpo/slurm_scripts/train.yaml:37 num_generations
    # 8 processes (diffu-grpo/slurm_scripts/accelerate_a100.yaml:19 num_processes) x 6 rows
    # (train.yaml:41 per_device_train_batch_size) x 2 (train.yaml:42) / G = 6 prompts.
    "grpo.prompts_per_step": 8 * 6 * 2 // 6,
    "sampler.gen_length": 256,  # d1: diffu-grpo/slurm_scripts/train.yaml:60 max_completion_length
    "max_prompt_length": 200,  # d1: diffu-grpo/slurm_scripts/train.yaml:61 max_prompt_length
    "sampler.block_length": 32,  # d1: diffu-grpo/slurm_scripts/train.yaml:62 block_length
    "sampler.steps": 128,  # d1: diffu-grpo/slurm_scripts/train.yaml:63 diffusion_steps
    "sampler.remasking": "low_confidence",  # d1: diffu-grpo/slurm_scripts/train.yaml:65 remasking
    # d1: diffu-grpo/diffu_grpo_config.py:194 temperature default 0.9; sudoku_base.sbatch:35's
    # "--temperature 0.3" follows a line without "\" (line 34), so it never reaches the script.
    "sampler.temperature": 0.9,
    "sampler.cfg_scale": 0.0,  # d1: diffu-grpo/diffu_grpo_config.py:364 cfg_scale
    "grpo.random_masking": True,  # d1: diffu-grpo/slurm_scripts/train.yaml:66 random_masking
    "grpo.p_mask_prompt": 0.15,  # d1: diffu-grpo/slurm_scripts/train.yaml:67 p_mask_prompt
    "grpo.beta": 0.04,  # d1: diffu-grpo/slurm_scripts/train.yaml:68 beta
    "grpo.epsilon": 0.5,  # d1: diffu-grpo/slurm_scripts/train.yaml:69 epsilon
    # d1: diffu-grpo/diffu_grpo_trainer.py:539 advantages = rewards - mean_grouped_rewards
    "grpo.advantage": "group_mean",
    # d1: diffu-grpo/diffu_grpo_trainer.py:474 scores the reference under PEFT's
    # disable_adapter() at every step: the base model, no copy to sync, whatever
    # train.yaml:20 sync_ref_model says (it acts on TRL's ref_model, None under PEFT).
    "grpo.sync_ref_model": False,
    "grpo.ref_model_sync_steps": 64,  # d1: diffu-grpo/slurm_scripts/train.yaml:21 (used with the switch on)
    "grpo.ref_model_mixup_alpha": 0.6,  # d1: diffu-grpo/diffu_grpo_config.py:328 (used with the switch on)
    "train.save_every": 100,  # d1: diffu-grpo/slurm_scripts/train.yaml:55 save_steps
    "train.log_every": 1,  # d1: diffu-grpo/slurm_scripts/train.yaml:33 logging_steps
}
# mu per task: d1: diffu-grpo/slurm_scripts/{gsm,math,countdown,sudoku}_base.sbatch:24 NUM_ITER
# (overriding train.yaml:70 num_iterations 12).
D1_MU = {"grpo_gsm8k": 12, "grpo_math": 12, "grpo_countdown": 8, "grpo_sudoku": 8}

D1_SFT = {
    "lora.rank": 128,  # d1: SFT/sft_train.py:69 r
    "lora.alpha": 256.0,  # d1: SFT/sft_train.py:70 lora_alpha
    "lora.targets": ("q_proj", "k_proj", "v_proj"),  # d1: SFT/sft_train.py:71 target_modules
    "lora.dropout": 0.05,  # d1: SFT/sft_train.py:72 lora_dropout
    "model.param_dtype": "bfloat16",  # d1: SFT/sft_train.py:64 torch_dtype
    "seed": 42,  # d1: SFT/sft_train.py:140 init_seed(42)
    "optim.learning_rate": 1e-5,  # d1: SFT/sft_train.py:36 --learning_rate
    "optim.weight_decay": 0.1,  # d1: SFT/sft_train.py:113 weight_decay
    "optim.max_grad_norm": 1.0,  # d1: SFT/sft_train.py:114 max_grad_norm
    "optim.b1": 0.9,  # d1: TrainingArguments' adam_beta1 default (sft_train.py:101 sets none)
    "optim.b2": 0.999,  # d1: TrainingArguments' adam_beta2 default (sft_train.py:101 sets none)
    "optim.eps": 1e-8,  # d1: TrainingArguments' adam_epsilon default
    "optim.warmup_ratio": 0.0,  # d1: TrainingArguments' warmup default (sft_train.py:101 sets none)
    "optim.lr_schedule": "linear",  # d1: TrainingArguments' lr_scheduler_type default (sft_train.py:101 sets none)
    # 1 row (SFT/sft_train.py:31 --batch_size) x 4 (sft_train.py:37 --grad_accum_steps) x 4
    # processes (SFT/ddp_config.yaml:17 num_processes; d1's README:51 --num_processes 4).
    "sft.batch_size": 1 * 4 * 4,
    "sft.max_length": 4096,  # d1: SFT/sft_train.py:33 --max_length
    "sft.num_epochs": 20,  # d1: SFT/sft_train.py:35 --num_epochs
    "sft.eps": 1e-3,  # d1: SFT/sft_trainer.py:71 forward_process eps
}

D1_EVAL = {
    "sampler.block_length": 32,  # d1: eval/eval.py:187 --block_length
    "sampler.temperature": 0.0,  # d1: eval/eval.py:55 evaluate(temperature=0.0)
    "sampler.cfg_scale": 0.0,  # d1: eval/eval.py:56 evaluate(cfg_scale=0.0)
    "sampler.remasking": "low_confidence",  # d1: eval/eval.py:82 generate(remasking=)
}
# d1: eval/run_eval.sh:10 GEN_LENGTHS=(128 256), with 512's batch size at run_eval.sh:28-29
# (and d1's eval_baselines files at 128, 256 and 512).
D1_GEN_LENGTHS = (128, 256, 512)
# d1: eval/eval.py:196 num_evals (-1: all).
D1_NUM_EVALS = {"gsm8k": 0, "math500": 0, "countdown": 256, "sudoku": 256}

# What d1jax sets differently, and why (README "Where d1jax departs from the reference").
DEPARTURES = {
    # d1's GRPO loads the base in 4-bit NF4 (train.yaml:5 load_in_4bit; diffu_grpo_train.py:72
    # BitsAndBytesConfig): d1jax keeps bfloat16 weights (no NF4 kernels; memory via sharding).
    "grpo: load_in_4bit": ("model.param_dtype", "bfloat16"),
    # d1 trains num_train_epochs 10 (train.yaml:38); d1jax counts optimizer steps.
    "grpo: num_train_epochs": ("train.num_steps", 5000),
    # d1's SFT accumulates 4 micro-batches (sft_train.py:37), each its own token mean; d1jax
    # takes the 16 rows in one step (one token mean): --config.optim.grad_accum=4 restores it.
    "sft: gradient_accumulation_steps 4": ("optim.grad_accum", 1),
}


def _config(name: str, arg=None):
    path = ROOT / "configs" / f"{name}.py"
    mod_spec = importlib.util.spec_from_file_location(f"d1_settings_{name}", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module.get_config(arg)


def _get(c, dotted: str):
    for part in dotted.split("."):
        c = c[part]
    return tuple(c) if isinstance(c, (list, tuple)) else c


def _check(c, want: dict, where: str):
    got = {k: _get(c, k) for k in want}
    wrong = {k: (got[k], v) for k, v in want.items()
             if not (got[k] == v or (isinstance(v, float) and math.isclose(got[k], v)))}
    assert not wrong, f"{where}: (d1jax, d1) differ: {wrong}"


def _spec(c, tmp_path):
    """The typed spec of a full config, its model path a stand-in directory (nothing loads)."""
    c.model.path = str(tmp_path)
    return spec_lib.from_config(c)


@pytest.mark.parametrize("name", sorted(D1_MU))
def test_grpo_configs_are_d1s(name, tmp_path):
    c = _config(name)
    _check(c, D1_GRPO, name)
    assert c.grpo.num_iterations == D1_MU[name]
    assert c.grpo.objective == "diffu_grpo"
    spec = _spec(c, tmp_path)
    assert spec.model.lora.targets == D1_GRPO["lora.targets"]
    assert spec.model.lora.scale == 64.0 / 128
    assert not spec.keep_reference  # the base model with adapters off is the reference
    # d1: train.yaml:35 lr_scheduler_type constant_with_warmup: ceil(0.0001 x steps) steps
    # of linear warmup, then the peak rate.
    adamw = spec.optim.build(20_000)
    assert adamw.warmup_steps == 2
    schedule = optim.lr_schedule(adamw)
    assert [float(schedule(s)) for s in (0, 1, 2, 10_000)] == pytest.approx(
        [0.0, 1.5e-6, 3e-6, 3e-6])


def test_sft_config_is_d1s(tmp_path):
    c = _config("sft_s1k")
    _check(c, D1_SFT, "sft_s1k")
    spec = _spec(c, tmp_path)
    assert spec.model.lora.scale == 256.0 / 128
    assert spec.model.lora.targets == ("q_proj", "k_proj", "v_proj")
    adamw = spec.optim.build(1000)
    assert adamw.warmup_steps == 0
    # HF's get_linear_schedule_with_warmup: lr x (total - s) / total, s the optimizer step.
    schedule = optim.lr_schedule(adamw)
    assert [float(schedule(s)) for s in (0, 500, 999, 1000)] == pytest.approx(
        [1e-5, 5e-6, 1e-8, 0.0])


def test_eval_configs_are_d1s_protocol(tmp_path):
    for task, n in D1_NUM_EVALS.items():
        c = _config("eval", task)
        _check(c, D1_EVAL, f"eval:{task}")
        assert tuple(c.eval.gen_lengths) == D1_GEN_LENGTHS
        assert c.eval.num_examples == n
        samplers = _spec(c, tmp_path).eval.samplers
        # d1: eval/eval.py:195 args.diffusion_steps = args.gen_length // 2
        assert [(s.gen_length, s.steps, s.block_length, s.temperature) for s in samplers] == [
            (g, g // 2, 32, 0.0) for g in D1_GEN_LENGTHS]


def test_departures_are_the_documented_ones():
    """Each value that differs from d1 is the documented one; if this fails, the departure
    changed: update README's departures table and docs/training.md with it."""
    configs = {"grpo": _config("grpo_gsm8k"), "sft": _config("sft_s1k")}
    for what, (field, value) in DEPARTURES.items():
        assert _get(configs[what.split(":")[0]], field) == value, what
    readme = (ROOT / "README.md").read_text()
    for phrase in ("4-bit NF4", "holds out 1%"):
        assert phrase in readme, phrase


def test_tiny_variants_keep_their_own_small_values():
    """``:tiny`` shrinks sizes, not the choices: same targets, same reference rule."""
    grpo, sft = _config("grpo_sudoku", "tiny"), _config("sft_s1k", "tiny")
    assert grpo.lora.rank == 8 and grpo.sampler.gen_length == 32
    assert tuple(grpo.lora.targets) == D1_GRPO["lora.targets"] and not grpo.grpo.sync_ref_model
    assert tuple(sft.lora.targets) == D1_SFT["lora.targets"] and sft.optim.b2 == 0.999
