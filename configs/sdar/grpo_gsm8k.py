"""diffu-GRPO (d1's knobs) on gsm8k on SDAR / TraDo, rollouts by block diffusion as
rl_trado.yaml samples them (configs/sdar/tracerl_math.py's sampler).

d1's one-step estimator runs under the model's block-causal mask: every completion block
sees the earlier ones fully masked, a view block diffusion never trains on (its training
layout shows clean earlier blocks: block SFT, TraceRL). It runs, and is here as a baseline
next to TraceRL; TraceRL is the family's RL objective.

  python -m d1jax.main --config=configs/sdar/grpo_gsm8k.py --workdir=runs/sdar_grpo_gsm8k \
      --config.model.path=/path/to/SDAR-8B-Chat
  python -m d1jax.main --config=configs/sdar/grpo_gsm8k.py:tiny --workdir=/tmp/sdar_grpo  # letters

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo).
"""

from d1jax import config


def get_config(arg=None):
    tiny = "tiny" in config.variants.parse(arg, config.defaults.VARIANTS["grpo"])
    # :tiny runs offline on the letters toy task (a reward a random model varies on;
    # gsm8k needs its download).
    c = config.grpo("letters" if tiny else "gsm8k", arg, checkpoint="sdar")
    config.sibling(__file__, "tracerl_math").block_diffusion_sampler(c, tiny)
    return c
