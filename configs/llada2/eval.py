"""Evaluation of LLaDA2.0/2.1 (mini, flash) by their own block decoding: the Hugging Face
file's ``LLaDA2MoeModelLM.generate`` (block_length 32, threshold 0.95, greedy, no top-k/top-p),
which is block diffusion's loop (``loop="sdar"``, ``low_confidence_dynamic``; docs/models.md,
"LLaDA2.x: decoding") over the committed blocks' exact cache; d1's tasks, lengths and
scoring (configs/eval.py).

  python -m d1jax.eval --config=configs/llada2/eval.py:gsm8k --workdir=runs/llada2_eval \
      --config.model.path=/path/to/LLaDA2.0-mini
  python -m d1jax.main --config=configs/llada2/eval.py:letters,tiny --workdir=/tmp/l2_eval  # CPU

The variant is the task (gsm8k, the default, or any registered task) and optionally "tiny"
(the random ``llada2-tiny`` model, whose block is 4; a replica on disk has the published 32:
``--config.sampler.block_length=32``). Where it differs from their call: steps come from d1's
protocol (gen_length / 2 in all, so 16 a block of 32 where theirs default to 32: a step
commits at least 2 tokens), and decoding stops at EOS per row (theirs at the block holding it,
batch 1). dInfer's ThresholdParallelDecoder is ``d1jax.sampling.threshold`` (not yet a config
choice). Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py
(eval_config).
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
    return c
