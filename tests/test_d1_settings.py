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

import math
from pathlib import Path

import pytest

from d1jax.run import optim
from d1jax.run import spec as spec_lib
from tests.config_files import load_config

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
    "grpo.num_epochs": 10,  # d1: diffu-grpo/slurm_scripts/train.yaml:38 num_train_epochs
    # d1: diffu-grpo/diffu_grpo_trainer.py:121 divides by completion_mask.sum() of one GPU's
    # micro-batch, which holds train.yaml:41 per_device_train_batch_size 6 rows = one
    # prompt's train.yaml:37 num_generations 6 (TRL's RepeatRandomSampler at d1's pinned
    # commit 0f88c17 puts a prompt's G copies next to each other; env.yml:22).
    "grpo.token_mean": "group",
}
# d1's training data by task: diffu-grpo/data_utils.py:79-81 get_countdown_questions
# (Jiayi-Pan/Countdown-Tasks-3to4, three-number rows), :97 get_sudoku_questions (its
# dataset/4x4_sudoku_unique_puzzles.csv), each shuffled with seed 42 less its last 500 rows
# (diffu_grpo_train.py:60-64); the public GSM8K / MATH for the other two.
D1_SOURCE = {"grpo_gsm8k": "", "grpo_math": "", "grpo_countdown": "d1", "grpo_sudoku": "d1"}
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
    # d1's SFT accumulates 4 micro-batches (sft_train.py:37), each its own token mean; d1jax
    # takes the 16 rows in one step (one token mean): --config.optim.grad_accum=4 restores it.
    "sft: gradient_accumulation_steps 4": ("optim.grad_accum", 1),
}


def _config(name: str, arg=None):
    return load_config(f"configs/{name}.py", arg)


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
    assert c.task.source == D1_SOURCE[name]
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


def test_generated_variant_trains_on_generated_puzzles():
    """``:generated`` (sudoku, countdown): our generated puzzles instead of d1's data; the
    tiny variants never download."""
    for name in ("grpo_sudoku", "grpo_countdown"):
        assert _config(name, "generated").task.source == ""
        assert _config(name, "tiny").task.source == ""
        assert _config(name, "generated").grpo.num_iterations == D1_MU[name]


def test_run_length_is_d1s_ten_epochs_counted_as_trl_counts():
    """10 epochs of N prompts: TRL's RepeatRandomSampler (trl 0f88c17
    trl/trainer/grpo_trainer.py:144-160) keeps only whole batches of effective batch / G =
    8 x 6 x 2 / 6 = 16 prompts and repeats each batch num_iterations times, one optimizer
    step per repeat: N // 16 x mu steps an epoch."""
    from d1jax.run.spec import from_config

    def grpo_num_steps(c, n):  # what the GRPO loop runs (d1jax.train.grpo.run)
        spec = from_config(c, weights=False)
        return spec.grpo_run.num_steps(n, spec.grpo.num_iterations, spec.train.num_steps)
    for name, mu in D1_MU.items():
        c = _config(name)
        n = 7473  # GSM8K's train split; any N counts the same way
        assert grpo_num_steps(c, n) == 10 * (n // (8 * 6 * 2 // 6)) * mu
    tiny = _config("grpo_sudoku", "tiny")
    assert grpo_num_steps(tiny, 1000) == tiny.train.num_steps  # epochs 0: train.num_steps


# ------------------------------------------------------------ DiffuCoder's recipe as it ran
# apple/ml-diffucoder at f735e01: recipes/config_coupled_code.yaml (line of each field),
# run.sh, src/open_r1/coupled_grpo.py.
DIFFUCODER = {
    "lora.enabled": False,  # config_coupled_code.yaml sets no peft: full fine-tuning
    "grpo.sync_ref_model": True,  # config_coupled_code.yaml:11 sync_ref_model
    "grpo.ref_model_sync_steps": 64,  # config_coupled_code.yaml:12 ref_model_sync_steps
    "grpo.beta": 0.01,  # config_coupled_code.yaml:13 beta
    "grpo.epsilon": 0.5,  # config_coupled_code.yaml:14 epsilon
    # coupled_grpo.py:545 leave_one_out = True; config_coupled_code.yaml:15 scale_rewards false
    "grpo.advantage": "leave_one_out",
    "grpo.num_generations": 10,  # config_coupled_code.yaml:19 num_generations
    "grpo.num_iterations": 2,  # config_coupled_code.yaml:20 num_iterations
    # run.sh:6 --num_processes 8 x config_coupled_code.yaml:22 per_device_train_batch_size 5
    # x :23 gradient_accumulation_steps 2 = 80 rows = 8 prompts of G 10.
    "grpo.prompts_per_step": 8 * 5 * 2 // 10,
    "optim.learning_rate": 1e-6,  # config_coupled_code.yaml:28 learning_rate
    "optim.b1": 0.9,  # config_coupled_code.yaml:29 adam_beta1
    "optim.b2": 0.99,  # config_coupled_code.yaml:30 adam_beta2
    "optim.weight_decay": 0.1,  # config_coupled_code.yaml:31 weight_decay
    "optim.max_grad_norm": 0.2,  # config_coupled_code.yaml:32 max_grad_norm
    "optim.lr_schedule": "cosine_with_min_lr",  # config_coupled_code.yaml:38 lr_scheduler_type
    "optim.min_lr_rate": 0.1,  # config_coupled_code.yaml:40 min_lr_rate
    "max_prompt_length": 200,  # config_coupled_code.yaml:47 max_prompt_length
    "sampler.gen_length": 256,  # config_coupled_code.yaml:48 max_completion_length
    "grpo.random_masking": True,  # config_coupled_code.yaml:49 random_masking
    "grpo.p_mask_prompt": 0.0,  # config_coupled_code.yaml:50 p_mask_prompt
    "sampler.steps": 256,  # config_coupled_code.yaml:51 diffusion_steps
    "sampler.temperature": 1.0,  # config_coupled_code.yaml:53 generation_temperature
    "optim.warmup_ratio": 0.0001,  # config_coupled_code.yaml:69 warmup_ratio
    # coupled_grpo.py:419-429: model.diffusion_generate(..., steps=steps, temperature=,
    # top_p=0.95 if temperature > 0 else 1.0, alg="entropy", alg_temp=0.0): Dream's sampler
    # over the whole completion, no blocks.
    "sampler.loop": "dream",
    "sampler.block_length": 256,
    "sampler.alg": "entropy",
    "sampler.top_p": 0.95,
}


@pytest.mark.parametrize("name", ["diffucoder/coupled_grpo_sudoku",
                                  "diffucoder/coupled_grpo_countdown"])
def test_diffucoder_authors_variant_is_their_recipe(name, tmp_path):
    c = _config(name, "authors")
    _check(c, DIFFUCODER, f"{name}:authors")
    assert c.grpo.objective == "coupled_grpo" and c.model.family == "dream"


@pytest.mark.parametrize("name", ["diffucoder/coupled_grpo_sudoku",
                                  "diffucoder/coupled_grpo_countdown"])
def test_diffucoder_authors_rollouts_are_dreams_sampler(name, tmp_path):
    sampler = _spec(_config(name, "authors"), tmp_path).sampler
    # the rollout sampler the run builds: Dream's diffusion_generate with their call's knobs
    # (top_k: the 50 diffusion_generate applies when the call names none, d1jax.sampling.dream)
    dream = sampler.dream_config()
    assert (sampler.loop, dream.alg, dream.alg_temp, dream.temperature, dream.top_p,
            dream.steps, dream.max_new_tokens) == ("dream", "entropy", None, 1.0, 0.95, 256, 256)


def test_d1s_loss_normalisation_reaches_the_update(tmp_path):
    """grpo.token_mean "group" -> GRPOConfig.norm_group = G (the per-group token mean of
    tests/test_losses.py); "step" -> None, one token mean per micro-batch."""
    c = _config("grpo_gsm8k")
    assert _spec(c, tmp_path).grpo.norm_group == 6
    c.grpo.token_mean = "step"
    assert _spec(c, tmp_path).grpo.norm_group is None


# ------------------------------------------------------------------ SPG's Sudoku as it ran
# facebookresearch/SPG at a1c7120: spg/slurm_scripts/spg_mix/
# sudoku_new_base_spg_mix_beta1.0_weight0.5.sbatch (line of each flag) and spg/data_utils.py.
SPG_SUDOKU = {
    "task.source": "spg",  # sbatch:25 DATASET="sudoku_new" (spg/diffu_grpo_train.py:58-59)
    "grpo.num_iterations": 4,  # sbatch:29 NUM_ITER=4
    "grpo.spg.num_t": 2,  # sbatch:42 --num_t 2
    "grpo.spg.min_t": 0.0,  # sbatch:43 --min_t 0
    "grpo.spg.max_t": 1.0,  # sbatch:44 --max_t 1
    "grpo.num_generations": 6,  # sbatch:45 --num_generations 6
    # spg/slurm_scripts/accelerate_genai_a100.yaml:19 num_processes 8 x sbatch:46
    # --per_device_train_batch_size 3 x :47 --gradient_accumulation_steps 4 / G 6.
    "grpo.prompts_per_step": 8 * 3 * 4 // 6,
    "grpo.beta": 0.0,  # sbatch:48 --beta 0.0
    "grpo.spg.mix_weight": 0.5,  # sbatch:49-50 --logp_estimation mix --mix_weight 0.5
    "grpo.spg.eubo_beta": 1.0,  # sbatch:51 --eubo_beta 1.0
    "sampler.temperature": 0.3,  # sbatch:52 --temperature 0.3
    "max_prompt_length": 1500,  # sbatch:54 --max_prompt_length 1500
    "grpo.num_epochs": 10,  # spg/slurm_scripts/train.yaml:38 num_train_epochs
}


def test_spg_authors_sudoku_is_their_setup():
    c = _config("spg_sudoku", "authors")
    _check(c, SPG_SUDOKU, "spg_sudoku:authors")
    tiny = _config("spg_sudoku", "authors,tiny")
    assert tiny.task.source == "" and tiny.sampler.temperature == 0.3  # no download on CPU


def test_spg_prompt_is_their_three_shot_format():
    """spg/data_utils.py:133-143: d1's system prompt, the worked examples joined by blank
    lines (sbatch:53 --few_shot 3: all three), then "Question: ...\\nAnswer:\\n". Each worked
    example's answer solves its puzzle (the texts were copied intact)."""
    from d1jax.tasks import sudoku
    text = sudoku.build_messages({"puzzle": "1234341221434321", "solution": "x",
                                  "few_shot": 3})[0]["content"]
    assert text.startswith(sudoku.SYSTEM_PROMPT + "\n\nQuestion:\nSolve the following Sudoku "
                           "puzzle: 3014002020004130\nAnswer:\n<reasoning>\n")
    assert text.endswith("</answer>\n\nQuestion: Solve the following Sudoku puzzle: "
                         "1234341221434321\nAnswer:\n")
    shots = text[len(sudoku.SYSTEM_PROMPT) + 2:].split("\n\nQuestion: Solve")[0].split("\n\n")
    shots = [s for s in "\n\n".join(shots).split("</answer>") if s.strip()]
    assert len(shots) == 3
    for shot in shots:
        puzzle = shot.split("Solve the following Sudoku puzzle: ")[1][:16]
        answer = shot.split("<answer>\n")[1].strip()
        sudoku.check_puzzle(puzzle, answer)
    # without few_shot: d1's prompt
    assert sudoku.build_messages({"puzzle": "1234341221434321"})[0]["content"] == (
        sudoku.SYSTEM_PROMPT + "\n\nSolve the following Sudoku puzzle: 1234341221434321\n")


def test_spg_source_is_their_split_less_500_with_the_three_shot_prompt(tmp_path, monkeypatch):
    """source "spg": SPG's train CSV (dataset/train_sudoku_split_new.csv), shuffled with seed
    42 and cut by its last 500 rows (spg/diffu_grpo_train.py:69-73, numpy's
    default_rng(42).permutation as datasets' shuffle), every example prompted 3-shot."""
    import numpy as np
    from d1jax.tasks import sudoku
    grids = sudoku.generate_puzzles(520, seed=3)
    (tmp_path / sudoku.SPG_TRAIN_FILE).write_text(
        "Puzzle,Solution\n" + "".join(f"{g['puzzle']},{g['solution']}\n" for g in grids))
    monkeypatch.setenv("D1JAX_DATA_DIR", str(tmp_path))
    got = sudoku.load_train("spg")
    keep = np.random.default_rng(42).permutation(520)[:20]
    assert [g["puzzle"] for g in got] == [grids[i]["puzzle"] for i in keep]
    assert all(g["few_shot"] == 3 for g in got)
    assert "Question: Solve the following Sudoku puzzle" in (
        sudoku.build_messages(got[0])[0]["content"])


@pytest.mark.parametrize("task, source", [("gsm8k", "d1"), ("countdown", "spg")])
def test_named_sources_are_refused_for_other_tasks(task, source):
    from d1jax.config import ConfigError, check_inputs
    c = _config("grpo_gsm8k", "tiny")
    c.task.name, c.task.source = task, source
    with pytest.raises(ConfigError, match=f"config.task.source='{source}' names"):
        check_inputs(c)
