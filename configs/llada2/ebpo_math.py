"""EBPO (LLaDA2.1's RL objective: tech report arXiv 2602.08676, section 3.2, equations (4)-(5);
d1jax/objectives/ebpo.py) on MATH with LLaDA2.0-mini or LLaDA2.1-mini (or -flash).

The report publishes no RL hyper-parameters and its RL code (an AReaL extension) is not public,
so every value here is d1jax's choice (docs/objectives.md, "EBPO"):

  rollouts: 16 prompts a step x 8 completions, LLaDA2's block decoding (block 32,
  low_confidence_dynamic at their generate's threshold 0.95, at most 32 steps a block) at
  temperature 1.0, no top-k or top-p, up to 1024 tokens; prompts up to 512 tokens;
  EBPO: N 4 timesteps (t = 1/4 .. 1, w_n = 1/n), eps_low 0.2, eps_high 0.28, no KL; mu 2
  updates a rollout (with mu 1 the ratio is 1 and the clip never acts); full fine-tuning,
  AdamW lr 1e-6, grad norm clip 1.0; 200 steps; d1's group-normalised advantages.

  python -m d1jax.main --config=configs/llada2/ebpo_math.py --workdir=runs/llada2_ebpo \
      --config.model.path=/path/to/LLaDA2.1-mini --config.mesh.shape='(1,1,1,8)'
  python -m d1jax.main --config=configs/llada2/ebpo_math.py:tiny --workdir=runs/ebpo_tiny  # CPU

Where it differs from LLaDA2.1's RL: their rollouts run in SGLang with token editing (T2T) as
well as unmasking (M2T); d1jax's block decoder only unmasks. Not yet planned on a TPU slice
(the update holds 1 + N copies of the completion a row: ``--config.optim.grad_accum``).
``:tiny`` is the random ``llada2-tiny`` model (block 4) on the letters toy task. Fields and
their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo; config.grpo.ebpo).
"""

from d1jax import config


def get_config(arg=None):
    tiny = "tiny" in (arg or "").split(",")
    c = config.grpo("letters" if tiny else "math500", arg, objective="ebpo", checkpoint="llada2")
    config.full_finetuning(c, 1e-3 if tiny else 1e-6)
    s = c.sampler
    s.loop, s.kv_cache = "sdar", "prefix"  # block decoding over the committed blocks' cache
    s.block_length = 4 if tiny else 32  # the model's block_size
    s.gen_length = 16 if tiny else 1024
    s.steps = s.gen_length  # at most block_length steps a block
    s.remasking, s.threshold = "low_confidence_dynamic", 0.95
    s.temperature, s.top_k, s.top_p = 1.0, 0, 1.0
    g = c.grpo
    g.num_epochs = 0  # train.num_steps counts the run
    g.num_iterations = 2  # mu: the second update's ratio is off the rollout's policy
    g.num_generations = 4 if tiny else 8
    g.prompts_per_step = 2 if tiny else 16
    g.p_mask_prompt = 0.0  # EBPO never masks the prompt
    c.train.num_steps = 4 if tiny else 200
    c.max_prompt_length = 24 if tiny else 512
    if not tiny:
        c.model.remat, c.model.unroll_layers = True, False
    return c
