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
config.grpo.justgrpo for its own knobs; ``_justgrpo`` sets the values above);
docs/objectives.md (JustGRPO).
"""

from d1jax import config


def get_config(arg=None):
    # The values above are the objective's ':authors' variant (d1jax/config/defaults.py).
    return config.grpo("gsm8k", f"authors,{arg or ''}", objective="justgrpo")
