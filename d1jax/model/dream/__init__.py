"""The Dream family (Dream-v0-7B, DiffuCoder-7B: model_type "Dream", Qwen2 blocks): the
module, its config and presets, the Hugging Face key map with load and save, Dream's RoPE
positions and row shift, and its record (``FAMILY``) of every other fact d1jax needs about
it: LoRA target names, checkpoint kinds, planner configs, tokenizer facts."""

from d1jax.model.dream.config import PRESETS, DreamConfig, preset
from d1jax.model.dream.model import Dream, dream_positions, head_weight, shift_logits, shift_rows
from d1jax.model.dream.weights import (EMBEDDING, REMOTE_CODE, key_map, load_hf_checkpoint,
                                       param_shapes, read_config, save_hf_checkpoint)
from d1jax.model.family import Family
from d1jax.model.qwen import FIELDS, GRPO_TARGETS, LORA_TARGETS  # all seven projections

FAMILY = Family(
    name="dream", title="Dream", module=Dream, config_class=DreamConfig,
    model_types=("Dream", "dream"), presets=PRESETS, make_config=preset,
    fields=FIELDS,  # Qwen's config.json names
    lora_targets=LORA_TARGETS, grpo_targets=GRPO_TARGETS,
    load=load_hf_checkpoint, save=save_hf_checkpoint, read_config=read_config,
    remote_code=REMOTE_CODE, default_preset="dream-7b", embedding=EMBEDDING,
    checkpoints={"dream": ("DREAM_PATH", "dream-test-tiny"),  # Dream-v0-Base/Instruct-7B
                 "diffucoder": ("DIFFUCODER_PATH", "dream-test-tiny")},  # DiffuCoder-7B-*
    published=("Dream-org/Dream-v0-Instruct-7B", "Dream-org/Dream-v0-Base-7B",
               "apple/DiffuCoder-7B-Instruct", "apple/DiffuCoder-7B-cpGRPO",
               "apple/DiffuCoder-7B-Base"),
    # docs/tpu_plan.md, "Dream-7B and DiffuCoder-7B"
    plan_configs=("configs/dream/grpo_gsm8k.py", "configs/diffucoder/coupled_grpo_sudoku.py:authors",
                  "configs/dream/sft_s1k.py"),
    turn_ends=("<|im_end|>",))  # Qwen's chat turns

__all__ = ["FAMILY", "GRPO_TARGETS", "LORA_TARGETS", "PRESETS", "REMOTE_CODE", "Dream",
           "DreamConfig", "dream_positions", "head_weight", "key_map", "load_hf_checkpoint",
           "param_shapes", "preset", "read_config", "save_hf_checkpoint", "shift_logits",
           "shift_rows"]
