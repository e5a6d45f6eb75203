"""diffu-GRPO (d1's estimator and knobs: train.yaml, mu from the task) on gsm8k with
LLaDA2.0-mini (or -flash), rollouts by LLaDA2's block decoding (configs/llada2/tracerl_math.py's
sampler: block 32, low_confidence_dynamic at 0.95, temperature 1.0, 2048 tokens).

From d1's train.yaml (d1jax's grpo builder, unchanged here): 16 prompts a step x 6
completions, beta 0.04, eps 0.5, p_mask_prompt 0.15, mu 12 (gsm8k's sbatch), LoRA r 128
alpha 64 dropout 0.05 (on the family's LoRA targets, LLaDA2's MLP projections), AdamW lr
3e-6, betas 0.9/0.99, weight decay 0.1, grad norm clip 0.2, 5000 steps, prompts up to 200
tokens. d1jax's choices: the decoding (d1's is LLaDA-8B's low-confidence loop, 256 tokens at
temperature 0.9, not block diffusion) and remat with the layer loop, as the family's other
configs.

d1's one-step estimator runs under the model's block-causal mask: every completion block
sees the earlier ones fully masked, a view block diffusion never trains on (its training
layout shows clean earlier blocks: block SFT, TraceRL, EBPO). It runs, and is here as a
baseline next to EBPO and TraceRL, as configs/sdar/grpo_gsm8k.py is for SDAR.

  python -m d1jax.main --config=configs/llada2/grpo_gsm8k.py --workdir=runs/llada2_grpo \
      --config.model.path=/path/to/LLaDA2.0-mini --config.mesh.shape='(1,1,1,8)'
  python -m d1jax.main --config=configs/llada2/grpo_gsm8k.py:tiny --workdir=/tmp/l2_grpo  # CPU

Not yet planned on a TPU slice. ``:tiny`` is the random ``llada2-tiny`` model (block 4) on
the letters toy task. Fields and their meaning: docs/configs.md; builder
d1jax/config/defaults.py (grpo).
"""

from d1jax import config


def get_config(arg=None):
    tiny = "tiny" in config.variants.parse(arg, config.defaults.VARIANTS["grpo"])
    # :tiny runs offline on the letters toy task (gsm8k needs its download).
    c = config.grpo("letters" if tiny else "gsm8k", arg, checkpoint="llada2")
    config.sibling(__file__, "tracerl_math").block_decoding_sampler(c, tiny)
    if tiny:
        c.max_prompt_length = 24  # the letters prompts are short
    else:
        c.model.remat, c.model.unroll_layers = True, False  # as the family's other configs
    return c
