"""TraceRL on MATH with Gen-Verse/dLLM-RL's ``configs/rl_trado.yaml`` values, on TraDo-4B/8B
(or SDAR-*-Chat): the policy scored on its own rollouts' traces (d1jax/objectives/tracerl.py).

  rollouts: 64 tasks a step x 16 responses, block diffusion (block 4, 4 denoising steps a
  block), low_confidence_dynamic remasking at threshold 0.9, temperature 1.0, top_p 1.0,
  top_k 0, at most 2000 tokens; prompts up to 784 tokens;
  training: method TraceRL, shrink 1, post_num 0, clip eps 0.2, k3 KL to the old policy
  beta 0.01; full fine-tuning, AdamW lr 1e-6, betas 0.9/0.999, eps 1e-8, weight decay 0,
  grad norm clip 1.0, constant rate (cosine with min_lr_scale 1.0), no warmup; 80 steps;
  advantages: z-scores of correctness per task, tasks with accuracy outside [0.2, 0.8]
  dropped (``grpo.advantage = "zscore_filtered"``; the filter and z-scores read the task's
  correctness, math500's correctness column, while the logged reward stays d1's weighted one).
  Their loop divides the gradient by its 32 accumulation steps twice, so their clip 1.0
  acts like 32 x 1.0 here (``--config.optim.max_grad_norm=32``; docs/objectives.md,
  "Their optimizer step").

Where d1jax differs: one optimizer step per rollout (mu 1) over all its rows, where their
step is 32 accumulated rows and one rollout feeds many steps (the loss of a row is theirs);
the task is d1jax's math500 training task (d1's MATH rows, prompt and reward) where theirs
scores the boxed answer of MATH_train; random_masking and coupled: ``grpo.tracerl.method``.

  python -m d1jax.main --config=configs/sdar/tracerl_math.py --workdir=runs/trado_tracerl \
      --config.model.path=/path/to/TraDo-8B-Instruct
  python -m d1jax.main --config=configs/sdar/tracerl_math.py:tiny --workdir=/tmp/trado  # letters

Fits v5p-8 as shipped; on v6e-8 the update needs every chip on the tensor axis:
``--config.mesh.shape="(1,1,8)" --config.optim.grad_accum=1024`` (docs/tpu_plan.md, "SDAR and
TraDo-8B"). The rollout runs in 16 sampler calls of 64 rows (``grpo.rollout_batch``).

``:sdar`` starts from SDAR-*-Chat (``$SDAR_PATH``) instead of TraDo (``$TRADO_PATH``).
Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo;
config.grpo.tracerl for its own knobs); docs/objectives.md (TraceRL).
"""

from d1jax import config


def get_config(arg=None):
    checkpoint, rest, tiny = config.checkpoint_word(arg, "sdar", "trado")
    # :tiny runs offline on the letters toy task (a reward a random model varies on;
    # MATH needs its download).
    c = config.grpo("letters" if tiny else "math500", rest, objective="tracerl",
                    checkpoint=checkpoint)
    block_diffusion_sampler(c, tiny)
    # rl_trado.yaml: experiment.total_step, num_response_per_task, num_task_per_step,
    # max_prompt_len; accumulation for memory only (1 row a micro-batch on 8 chips)
    config.dllm_rl(c, tiny, steps=80, responses=16, tasks=64, max_prompt=784, grad_accum=128)
    if not tiny:
        # 1,024 rows fit no slice as one sampler call (docs/tpu_plan.md, "SDAR and
        # TraDo-8B"): 16 calls of 4 tasks x 16, which fit v5p-8 and v6e-8 (128 rows: v5p-8
        # only), as their engine rolls out in batches
        c.grpo.rollout_batch = 64
    return c


def block_diffusion_sampler(c, tiny: bool) -> None:
    """rl_trado.yaml's rollout: block 4, 4 steps a block, dynamic remasking at 0.9,
    temperature 1.0, no top-k or top-p; 2000 tokens (tiny: 16)."""
    s = c.sampler
    s.loop = "sdar"
    s.kv_cache = "prefix"
    s.block_length = 4  # the model's block_size
    s.gen_length = 16 if tiny else 2000  # max_token
    s.steps = s.gen_length  # denoising_steps_per_block 4 = steps / (gen_length / 4)
    s.remasking = "low_confidence_dynamic"
    s.threshold = 0.9  # dynamic_threshold
    s.temperature = 1.0
    s.top_p = 1.0
    s.top_k = 0
