"""Block SFT of SDAR-*-Chat (or TraDo) with Gen-Verse/dLLM-RL's ``configs/sft_sdar.yaml``
values (``train/sft_sdar.py``, method "semi-ar"): each row's completion is masked position
by position with p ~ U(0.1, 0.9), and the noised copy attends to the clean earlier blocks
(d1jax/objectives/blockwise.py; docs/objectives.md, "Block SFT").

  training: full fine-tuning, AdamW lr 1e-5, betas 0.9/0.999, eps 1e-8, weight decay 0,
  grad norm clip 1.0, constant rate (cosine with min_lr_scale 1.0), no warmup, 1 epoch;
  prompts up to 784 tokens, completions up to 2000; post_num 0 (no padding token after
  the completion is trained on).

Where d1jax differs: the data is d1jax's SFT task (s1K traces) where theirs is a prepared
file (their example: OpenR1-Math); a row here is prompt then completion right-padded to
``sft.max_length`` (theirs: the prompt left-padded to 784, the completion right-padded to
2000), and the loss divides by that length where theirs divides by 2000 (a constant
factor); the noised copy spans the whole row (prompts are not left-padded here, so the
completion starts at a different place in each row), N = 2 x 2784 where theirs is
784 + 2 x 2000; 128 rows a step stands for their 1 row x 16 accumulation steps per GPU,
taking one node (their num_node 1) as 8 GPUs.

  python -m d1jax.main --config=configs/sdar/sft_s1k.py --workdir=runs/sdar_sft_s1k \
      --config.model.path=/path/to/SDAR-8B-Chat
  python -m d1jax.main --config=configs/sdar/sft_s1k.py:tiny --workdir=/tmp/sdar_sft  # CPU

``:trado`` starts from TraDo-*-Instruct (``$TRADO_PATH``; sft_trado.yaml has the same
values) instead of SDAR (``$SDAR_PATH``). Fields and their meaning: docs/configs.md;
builder d1jax/config/defaults.py (sft).
"""

from d1jax import config


def get_config(arg=None):
    checkpoint, rest, tiny = config.checkpoint_word(arg, "trado", "sdar", builder="sft")
    c = config.sft(rest, checkpoint=checkpoint)
    c.sft.loss = "block"  # the family's own; named so the file says what it trains
    c.sft.lower_p, c.sft.upper_p = 0.1, 0.9
    c.sft.post_num = 0
    config.full_finetuning(c, 1e-3 if tiny else 1e-5)  # sft_sdar.py: every parameter
    if not tiny:
        c.sft.num_epochs = 1
        c.sft.batch_size = 128  # 1 row x 16 accumulation steps x 8 GPUs
        c.sft.max_length = 784 + 2000  # max_prompt_len + max_gen_length
        c.optim.grad_accum = 16  # memory only (8 rows a micro-batch: one per chip of 8)
        c.model.remat, c.model.unroll_layers = True, False
    return c
