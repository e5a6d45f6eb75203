"""TraceRL on MATH with Gen-Verse/dLLM-RL's ``configs/rl_llada.yaml`` values, on LLaDA-8B
(``:dream``: ``configs/rl_dream.yaml``'s, on Dream-v0-7B): the policy scored on its own
rollouts' traces (d1jax/objectives/tracerl_full.py; SDAR/TraDo: configs/sdar/tracerl_math.py).

  rollouts: 32 tasks a step x 8 responses, temperature 0.8, blocks of 32, one token a step
  (LLaDA: 512 steps for 512 tokens, low_confidence_static, LLaDA's prefix cache, no
  attention mask; Dream: 1024 for 1024, each block's first position decoded alone at its
  full forward, as their Fast-dLLM Dream loop); prompts up to 512 tokens;
  training: method TraceRL, shrink 8, post_num 0, clip eps 0.2, k3 KL to the old policy
  beta 0.01; full fine-tuning, AdamW lr 1e-6, betas 0.9/0.999, eps 1e-8, weight decay 0,
  grad norm clip 1.0, constant rate (cosine with min_lr_scale 1.0), no warmup; 50 steps;
  advantages: z-scores of correctness per task, tasks with accuracy outside [0.2, 0.8]
  dropped (``grpo.advantage = "zscore_filtered"``; the filter and z-scores read the task's
  correctness, math500's correctness column, while the logged reward stays d1's weighted one).
  Their loop divides the gradient by its 128 accumulation steps twice, so their clip 1.0
  acts like 128 x 1.0 here (``--config.optim.max_grad_norm=128``; docs/objectives.md,
  "Their optimizer step").

Where d1jax differs: one optimizer step per rollout (mu 1) over all its rows, where their
step is 256 accumulated copies and one rollout feeds several steps (the loss of a copy is
theirs); the task is d1jax's math500 training task; their rollouts' ``further_horizon``
window and Dream's top_p 0.9 / top_k 50 are not applied by d1jax's block loop; Dream's RoPE
positions are the rollout's (``grpo.tracerl.their_dream_forward`` for their training's).

  python -m d1jax.main --config=configs/tracerl_math.py --workdir=runs/llada_tracerl \
      --config.model.path=/path/to/LLaDA-8B-Instruct
  python -m d1jax.main --config=configs/tracerl_math.py:dream --workdir=runs/dream_tracerl \
      --config.model.path=/path/to/Dream-v0-Instruct-7B
  python -m d1jax.main --config=configs/tracerl_math.py:tiny --workdir=/tmp/llada_trace  # letters

Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (grpo;
config.grpo.tracerl for its own knobs); docs/objectives.md (TraceRL).
"""

from d1jax import config


def get_config(arg=None):
    checkpoint, rest, tiny = config.checkpoint_word(arg, "dream", "llada")
    c = config.grpo("letters" if tiny else "math500", rest, objective="tracerl",
                    checkpoint=checkpoint)
    s = c.sampler
    s.loop = "llada"  # the block loop, which records the trace (decoded_at)
    s.kv_cache = "prefix"  # rollout.use_cache
    s.block_length = 8 if tiny else 32
    s.gen_length = 16 if tiny else (1024 if checkpoint == "dream" else 512)
    s.steps = s.gen_length  # one token a step
    s.temperature = 0.8
    s.remasking = "low_confidence"  # low_confidence_static, target confidence
    if checkpoint == "dream":  # their dream_rl_rollout.py: Fast-dLLM's Dream block loop
        s.parallel_rule, s.threshold, s.first_position = "fast_dllm", 2.0, True
    else:
        s.use_attention_mask = False  # rl_llada.py and its rollout pass no mask
    t = c.grpo.tracerl
    t.shrink = 8
    t.post_num = 0
    t.beta = 0.01
    # rl_llada.yaml / rl_dream.yaml: experiment.total_step, num_response_per_task,
    # num_task_per_step, max_prompt_len; accumulation for memory only
    config.dllm_rl(c, tiny, steps=50, responses=8, tasks=32, max_prompt=512, grad_accum=32)
    return c
