"""JustGRPO (arXiv 2601.15165) on gsm8k: rollouts in autoregressive order (block length 1,
one token per step), plain GRPO on the exact autoregressive likelihood (one forward per
completion position, the future masked), with LeapLabTHU/JustGRPO's train.py values:

  full fine-tuning of LLaDA-8B-Instruct (bfloat16 weights; accelerate's FSDP mixed precision
  keeps float32 masters); AdamW lr 5e-6, betas 0.9/0.999, eps 1e-8, weight decay 0, grad
  norm clip 1.0, constant rate, no warmup; 125 steps; G = 16 (num_generations 8 x
  repeat_times 2); 64 prompts a step (8 GPUs x 1 prompt x grad_accum 8, the README's global
  batch); gen length 256, 256 steps, block length 1, temperature 1.0 (``sample``'s
  default); advantages (r - mean) / (std + 1e-4), std unbiased; one update per rollout
  (mu 1, ratio 1), epsilon 0.2, no KL (beta 0); loss gain 1.0 x 8 summed accumulation steps.

Not theirs: the prompt and reward are d1jax's gsm8k task (d1's system prompt and reward
functions) where JustGRPO applies the chat template to the bare question and scores the
boxed answer (data/math.py).

  python -m d1jax.main --config=configs/justgrpo_gsm8k.py --workdir=runs/justgrpo_gsm8k \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/justgrpo_gsm8k.py:tiny --workdir=/tmp/jg  # CPU, ~30 s

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo;
config.grpo.justgrpo for its own knobs); docs/objectives.md (JustGRPO).
"""

from d1jax import config


def get_config(arg=None):
    c = config.grpo("gsm8k", arg, objective="justgrpo")
    tiny = c.model.random_init != ""
    c.lora.enabled = False  # train.py trains every parameter
    c.optim.learning_rate = 1e-3 if tiny else 5e-6
    c.optim.b2 = 0.999
    c.optim.weight_decay = 0.0
    c.optim.max_grad_norm = 1.0
    c.optim.warmup_ratio = 0.0
    c.optim.lr_schedule = "constant_with_warmup"  # with no warmup: constant
    c.optim.grad_accum = 1 if tiny else 16  # memory only: the loss is the same (module doc)
    c.train.num_steps = 4 if tiny else 125
    c.grpo.num_epochs = 0  # train.num_steps, as train.py's total_steps
    c.grpo.num_generations = 4 if tiny else 16
    c.grpo.prompts_per_step = 2 if tiny else 64
    c.grpo.num_iterations = 1
    c.grpo.beta = 0.0
    c.grpo.epsilon = 0.2
    c.grpo.advantage = "grpo"
    c.grpo.p_mask_prompt = 0.0  # the exact likelihood masks no prompt token
    c.sampler.gen_length = 16 if tiny else 256
    c.sampler.steps = c.sampler.gen_length
    c.sampler.block_length = 1
    c.sampler.temperature = 1.0
    if not tiny:
        # Full fine-tuning of 8B with AdamW's float32 state: remat and the layer loop, as
        # coupled-GRPO's full fine-tuning (docs/tpu_plan.md).
        c.model.remat, c.model.unroll_layers = True, False
    return c
