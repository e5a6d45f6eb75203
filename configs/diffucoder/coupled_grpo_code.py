"""coupled-GRPO (DiffuCoder, arXiv 2506.20639) on code, on DiffuCoder-7B-Instruct: DiffuCoder's
own task, trained on AceCode rows with unit-test rewards, evaluated on HumanEval.

Default: d1's knobs, so runs compare with diffu-GRPO. ``:authors``: DiffuCoder's recipe
(recipes/config_coupled_code.yaml, run.sh): full fine-tuning, beta 0.01, mu 2, the
leave-one-out advantage, 8 prompts x G 10 a step, lr 1e-6 with a cosine to 0.1 x lr, a
reference synced every 64 steps, one epoch; rollouts through Dream's diffusion_generate
(alg entropy, temperature 1.0, top_p 0.95, 256 tokens in 256 steps); rewards code (2.0) and
code_format (0.5), the task's (d1jax/tasks/code.py).

  python -m d1jax.main --config=configs/diffucoder/coupled_grpo_code.py:authors \
      --workdir=runs/diffucoder_code --config.model.path=/path/to/DiffuCoder-7B-Instruct \
      --config.task.source=acecode_hard.jsonl  # DiffuCoder's recipes/process_data.py output
  python -m d1jax.main --config=configs/diffucoder/coupled_grpo_code.py:authors,tiny \
      --workdir=/tmp/diffucoder_code_tiny  # CPU, generated problems

Fields: docs/configs.md; builder d1jax/config/defaults.py (grpo; config.grpo.coupled_grpo for
its own knobs).
"""

from d1jax import config


def get_config(arg=None):
    c = config.grpo("humaneval", arg, objective="coupled_grpo", checkpoint="diffucoder")
    if c.model.random_init:  # :tiny: generated problems, nothing downloaded
        c.task.source = "toy"
    elif "authors" in config.variants.parse(arg, config.defaults.VARIANTS["grpo"]):
        c.grpo.num_epochs = 1  # config_coupled_code.yaml: num_train_epochs 1
    return c
