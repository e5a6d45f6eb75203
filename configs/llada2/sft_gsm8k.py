"""Block SFT of LLaDA2.0-mini (or -flash) with inclusionAI/dFactory's
``configs/sft/llada2_mini_bd_sft.yaml`` values (``tasks/train_llada2_bd.py``,
``block_diffusion_mode``; ``sft.loss="block_dfactory"``): each row draws one t ~ U(0.3, 0.8)
and masks each completion position (padding included, trained on) with probability t; the
noised copy attends to its own block and to the clean blocks before it, blocks of 32 tokens
counted from position 0; the loss is each row's masked-token mean, averaged over rows
(d1jax/objectives/blockwise.py; docs/objectives.md, "Block SFT").

  training: full fine-tuning, AdamW lr 1e-5, betas 0.9/0.999, weight decay 0.1, grad norm
  clip 1.0, 3% linear warmup then a cosine to 0, 1 epoch, 8 rows a step (global_batch_size 8,
  micro_batch_size 1), rows of up to 2048 tokens (max_seq_len).

  python -m d1jax.main --config=configs/llada2/sft_gsm8k.py --workdir=runs/llada2_sft \
      --config.model.path=/path/to/LLaDA2.0-mini --config.mesh.shape='(1,1,1,8)'
  python -m d1jax.main --config=configs/llada2/sft_gsm8k.py:tiny --workdir=/tmp/llada2_sft  # CPU

Where d1jax differs: the data is d1jax's SFT task (s1K reasoning traces; :tiny generated
Sudoku trajectories) where theirs is a prepared gsm8k conversation file; their VeOmni trainer
warms the batch size up (bsz_warmup_ratio 0.007), d1jax does not. ``--config.model.path`` may
hold either published layout (the Hub's per-expert tensors or dFactory's merged experts: the
export keeps it); a mesh of four entries (data, fsdp, tensor, expert) shards the experts.
Fields and their meaning: docs/configs.md; builder d1jax/config/defaults.py (sft).
"""

from d1jax import config


def get_config(arg=None):
    tiny = "tiny" in config.variants.parse(arg, config.defaults.VARIANTS["sft"])
    c = config.sft(arg, checkpoint="llada2")
    c.sft.loss = "block_dfactory"  # the family's own; named so the file says what it trains
    c.sft.lower_p, c.sft.upper_p = 0.3, 0.8  # noise_range_low / noise_range_high
    c.sft.post_num = -1  # their padding is masked and trained on (data_transform.py)
    config.full_finetuning(c, 1e-3 if tiny else 1e-5)
    o = c.optim
    o.weight_decay, o.warmup_ratio = 0.1, 0.03  # weight_decay, lr_warmup_ratio
    o.lr_schedule, o.min_lr_rate = "cosine_with_min_lr", 0.0  # lr_decay_style cosine
    if not tiny:
        c.sft.num_epochs = 1
        c.sft.batch_size = 8  # global_batch_size
        c.sft.max_length = 2048  # max_seq_len
        c.optim.grad_accum = 1
        c.model.remat, c.model.unroll_layers = True, False  # enable_gradient_checkpointing
    return c
