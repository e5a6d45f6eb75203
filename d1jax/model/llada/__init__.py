"""The LLaDA family (LLaDA-8B-Base/Instruct, ``LLaDAModelLM``): the module, its config and
presets, the Hugging Face key map with load and save, and its record (``FAMILY``) of every
other fact d1jax needs about it: LoRA target names, checkpoint kinds, planner configs,
tokenizer facts."""

from d1jax.model.family import Family
from d1jax.model.llada.config import PRESETS, LLaDAConfig, preset
from d1jax.model.llada.model import LLaDA, head_weight
from d1jax.model.llada.weights import (EMBEDDING, REMOTE_CODE, key_map, load_hf_checkpoint,
                                       param_shapes, read_config, save_hf_checkpoint)

# LLaDA's block projections by their Hugging Face module names (modeling_llada.py:
# LLaDALlamaBlock's q_proj, k_proj, v_proj, ff_proj (SwiGLU gate), up_proj; LLaDABlock's
# attn_out and ff_out (down)). Names are matched exactly, as PEFT's target_modules are.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")
# d1's GRPO targets as they land on LLaDA's names: it has no o_proj/gate_proj/down_proj, so
# its attn_out/ff_proj/ff_out stay frozen in d1 (diffu_grpo_train.py's target_modules).
GRPO_TARGETS = ("q_proj", "k_proj", "v_proj", "up_proj")

FAMILY = Family(
    name="llada", title="LLaDA", module=LLaDA, config_class=LLaDAConfig,
    model_types=("llada", "LLaDA"), presets=PRESETS, make_config=preset,
    fields=dict(vocab=("vocab_size", "embedding_size"), mask=("mask_token_id",),
                eos=("eos_token_id",), pad=("pad_token_id",), length=("max_sequence_length",),
                width=("d_model",), mlp=("mlp_hidden_size",), layers=("n_layers",)),
    lora_targets=LORA_TARGETS, grpo_targets=GRPO_TARGETS,
    load=load_hf_checkpoint, save=save_hf_checkpoint, read_config=read_config,
    remote_code=REMOTE_CODE, default_preset="llada-8b", embedding=EMBEDDING,
    checkpoints={"llada": ("LLADA_PATH", "test-tiny")},  # LLaDA-8B-Base/Instruct
    published=("GSAI-ML/LLaDA-8B-Instruct", "GSAI-ML/LLaDA-8B-Base"),
    plan_configs=("configs/grpo_gsm8k.py", "configs/grpo_math.py",
                  "configs/grpo_countdown.py", "configs/grpo_sudoku.py", "configs/sft_s1k.py"),
    turn_ends=("<|eot_id|>",),  # Llama-3 style headers
    peeled_ends=True)

__all__ = ["FAMILY", "GRPO_TARGETS", "LLaDA", "LLaDAConfig", "LORA_TARGETS", "PRESETS",
           "REMOTE_CODE", "head_weight", "key_map", "load_hf_checkpoint", "param_shapes",
           "preset", "read_config", "save_hf_checkpoint"]
