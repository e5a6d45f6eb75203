"""The code check: a tiny LLaDA learns generated code problems, its completions run against unit
tests in the sandbox, and GRPO raises that reward, with each objective that applies to code.

  python -m d1jax.main --config=configs/grpo_code_toy.py:sft --workdir=runs/code_sft  # ~30 s
  python -m d1jax.main --config=configs/grpo_code_toy.py --workdir=runs/code_grpo \
      --config.model.path=runs/code_sft/hf                                           # ~1 min
  ... --config=configs/grpo_code_toy.py:coupled_grpo   (or :justgrpo) with the same flags

The problems (``d1jax/tasks/code.py`` ``toy_rows``, the code tasks' ``source="toy"``) are
``add``/``sub``/``mul(a, b)`` with three asserts each, in DiffuCoder's prompt; the reward is the
code tasks' own: the share of asserts passed, run in the sandbox's subprocesses (weight 2.0,
0 unless the format holds), and DiffuCoder's code format (0.5). A random model writes no
```python block (reward 0), so ``:sft`` first trains one from scratch (masked SFT, full
fine-tuning, 300 steps) on the problems' solutions in that format, half of them closed by a
blank line that fails the format (mixed-quality data, as the CPU demo's): the warm start
earns 0.96 of 2.5 on 48 fixed prompts x 4 samples. GRPO from its export
(``--config.model.path``), 15 rollouts of 4 prompts x 8 completions, raises that to 1.34
(diffu-GRPO) and 1.38 (coupled-GRPO); JustGRPO, whose rollouts decode left to right at
temperature 1 (0.60 for the warm start), to 0.92 (docs/testing.md, "RL tests that learn").

Variants: ``sft``; ``diffu_grpo`` (the default), ``coupled_grpo`` (LoRA, d1's knobs with
coupled-GRPO's loss), ``justgrpo`` (JustGRPO's ``:authors`` recipe at tiny size: full
fine-tuning, autoregressive rollouts, mu 1, at lr 1e-4). Without ``--config.model.path`` a GRPO variant
starts from a random model and its reward stays 0.

Fields and their meaning: d1jax/config/defaults.py (sft, grpo).
"""

from d1jax import config

VARIANTS = ("sft", "diffu_grpo", "coupled_grpo", "justgrpo")
# Prompt tokens of the toy under the SFT run's tokenizer: 66 at most; the completion ~19.
PROMPT, GEN = 72, 32
# GRPO changes to the :tiny config: 4 prompts x G 8, std-normalised advantages, one token a
# diffusion step, 30 optimizer steps (15 rollouts of mu 2; JustGRPO: 15 of mu 1).
GRPO = {"task.source": "toy", "max_prompt_length": PROMPT, "sampler.gen_length": GEN,
        "sampler.steps": GEN, "grpo.prompts_per_step": 4, "grpo.num_generations": 8,
        "grpo.advantage": "grpo", "optim.learning_rate": 3e-3, "train.num_steps": 30,
        "train.save_every": 10}
# JustGRPO trains every parameter: at its :tiny rate 1e-3 the warm start collapses (reward to 0).
JUSTGRPO = {"sampler.block_length": 1, "train.num_steps": 15, "optim.learning_rate": 1e-4}


def get_config(arg=None):
    (variant,) = config.variants.parse(arg, VARIANTS, exclusive=[VARIANTS]) or {"diffu_grpo"}
    if variant == "sft":
        c = config.sft("tiny")
        c.update_from_flattened_dict({
            "task.name": "humaneval", "task.source": "toy", "lora.enabled": False,
            # The solution and ~10 pad tokens: more padding dilutes the loss (at 104 tokens
            # 300 steps leave the format unlearnt; docs/testing.md).
            "train.num_steps": 300, "sft.batch_size": 16, "sft.max_length": 96,
            "sft.tokenize": "split",  # the tokens generation sees (the template trims text)
            "optim.learning_rate": 3e-3, "train.save_every": 100})
        return c
    justgrpo = variant == "justgrpo"
    c = config.grpo("humaneval", "authors,tiny" if justgrpo else "tiny", objective=variant)
    c.update_from_flattened_dict({**GRPO, **(JUSTGRPO if justgrpo else {})})
    return c
