"""Evaluation of LLaDA2.0/2.1 (mini, flash) by their own block decoding: the Hugging Face
file's ``LLaDA2MoeModelLM.generate`` defaults (block_length 32, steps 32 a block, threshold 0.95,
greedy, no top-k/top-p), which is block diffusion's loop (``loop="sdar"``,
``low_confidence_dynamic``; docs/models.md, "LLaDA2.x: decoding") over the committed blocks'
exact cache; d1's tasks, lengths and scoring (configs/eval.py).

  python -m d1jax.eval --config=configs/llada2/eval.py:gsm8k --workdir=runs/llada2_eval \
      --config.model.path=/path/to/LLaDA2.0-mini
  python -m d1jax.main --config=configs/llada2/eval.py:letters,tiny --workdir=runs/l2_eval  # CPU

dInfer's decoder instead (``ThresholdParallelDecoder``: p >= 0.95, else the most confident
token and its near ties; a block runs until decoded, so steps do not apply):

  python -m d1jax.eval --config=configs/llada2/eval.py:gsm8k --workdir=runs/llada2_dinfer \
      --config.model.path=/path/to/LLaDA2.0-mini --config.sampler.parallel_rule=dinfer

and with it LLaDA2.1's token editing (SGLang's JointThreshold; its recommended edit threshold
is 0): add ``--config.sampler.edit_threshold=0 --config.sampler.max_post_edit_steps=16``.

The variant is the task (gsm8k, the default, or any registered task) and optionally "tiny"
(the random ``llada2-tiny`` model, whose block is 4; a replica on disk has the published 32:
``--config.sampler.block_length=32 --config.eval.steps_per_block=32``). Where it differs from
their call: decoding stops at EOS per row (theirs at the block holding it, batch 1), and the
sampled draw is Gumbel-max (theirs: torch's multinomial). Fields and their meaning:
docs/configs.md; builder d1jax/config/defaults.py (eval_config).
"""

from d1jax import config


def get_config(arg=None):
    tiny = "tiny" in (arg or "").replace("-", ",").split(",")
    c = config.eval_config(arg, checkpoint="llada2")
    s = c.sampler
    s.loop = "sdar"
    s.kv_cache = "prefix"  # the committed blocks' exact cache (their past_key_values)
    s.block_length = 4 if tiny else 32  # the model's block_size (their block_length 32)
    s.remasking = "low_confidence_dynamic"  # p > threshold, else the step's top ones
    s.threshold = 0.95  # their generate's default
    s.temperature, s.top_k, s.top_p = 0.0, 0, 1.0
    c.eval.steps_per_block = s.block_length  # their steps 32 a block of 32 (d1's: 16)
    return c
