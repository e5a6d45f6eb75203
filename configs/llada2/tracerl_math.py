"""TraceRL (d1jax/objectives/tracerl.py, the block diffusion path SDAR/TraDo take) on MATH
with LLaDA2.0-mini (or -flash, LLaDA2.1-*): the policy scored on its own rollouts' traces.

Gen-Verse/dLLM-RL has no LLaDA2 recipe. The training values are their ``configs/rl_trado.yaml``
ones, as configs/sdar/tracerl_math.py takes them (``config.dllm_rl``, TraceRL's knob defaults):

  64 tasks a step x 16 responses; prompts up to 784 tokens; method TraceRL, post_num 0, clip
  eps 0.2, k3 KL to the old policy beta 0.01; full fine-tuning, AdamW lr 1e-6, betas
  0.9/0.999, eps 1e-8, weight decay 0, grad norm clip 1.0, constant rate, no warmup; 80 steps;
  advantages: z-scores of correctness per task, tasks with accuracy outside [0.2, 0.8]
  dropped (``grpo.advantage = "zscore_filtered"``); temperature 1.0, no top-k or top-p.

d1jax's choices where LLaDA2 is not TraDo: the rollout is LLaDA2's block decoding as
configs/llada2/ebpo_math.py runs it (block 32, the model's block_size; low_confidence_dynamic
at their generate's threshold 0.95, at most 32 steps a block); 2048 tokens, rl_trado.yaml's
max_token 2000 rounded up to whole blocks; trace shrink 8 (rl_llada.yaml's, dLLM-RL's other
block-32 trace) so a block gives at most 4 rounds, as TraDo's block 4 does at shrink 1.
rl_trado.yaml's 32 accumulation steps divide their gradient twice, so their clip 1.0 acts
like 32 x 1.0 here (``--config.optim.max_grad_norm=32``; docs/objectives.md, "Their optimizer
step"); d1jax keeps the written 1.0. One optimizer step per rollout (mu 1) over all its rows.

  python -m d1jax.main --config=configs/llada2/tracerl_math.py --workdir=runs/llada2_tracerl \
      --config.model.path=/path/to/LLaDA2.0-mini --config.mesh.shape='(1,1,1,8)'
  python -m d1jax.main --config=configs/llada2/tracerl_math.py:tiny --workdir=/tmp/l2_trace  # CPU

Not yet planned on a TPU slice (each row trains as its clean copy and up to 4 noised ones:
``--config.optim.grad_accum``, ``--config.grpo.rollout_batch``). ``:tiny`` is the random
``llada2-tiny`` model (block 4) on the letters toy task. Fields and their meaning:
docs/configs.md; builder d1jax/config/defaults.py (grpo; config.grpo.tracerl).
"""

from d1jax import config


def get_config(arg=None):
    tiny = "tiny" in config.variants.parse(arg, config.defaults.VARIANTS["grpo"])
    # :tiny runs offline on the letters toy task (MATH needs its download).
    c = config.grpo("letters" if tiny else "math500", arg, objective="tracerl",
                    checkpoint="llada2")
    block_decoding_sampler(c, tiny)
    # rl_trado.yaml: experiment.total_step, num_response_per_task, num_task_per_step,
    # max_prompt_len; accumulation for memory only
    config.dllm_rl(c, tiny, steps=80, responses=16, tasks=64, max_prompt=784, grad_accum=128)
    if not tiny:
        c.grpo.tracerl.shrink = 8  # at most 32 steps a block -> at most 4 rounds
    return c


def block_decoding_sampler(c, tiny: bool) -> None:
    """LLaDA2's block decoding (configs/llada2/ebpo_math.py's): the model's block, dynamic
    remasking at 0.95, at most a block's length of steps a block; temperature 1.0, no top-k
    or top-p; 2048 tokens (tiny: 16)."""
    s = c.sampler
    s.loop, s.kv_cache = "sdar", "prefix"  # block decoding over the committed blocks' cache
    s.block_length = 4 if tiny else 32  # the model's block_size
    s.gen_length = 16 if tiny else 2048
    s.steps = s.gen_length
    s.remasking, s.threshold = "low_confidence_dynamic", 0.95
    s.temperature, s.top_k, s.top_p = 1.0, 0, 1.0
