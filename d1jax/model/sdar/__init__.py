"""The block-diffusion family (SDAR-*-Chat, TraDo-*-Instruct: model_type "sdar", Qwen3 blocks
under a block-causal mask): the module, its config and presets, the Hugging Face key map
with load and save, and its record (``FAMILY``).

Its sampler is block diffusion's (``d1jax.sampling.block_diffusion``, ``loop="sdar"``), over
the cache entry points of ``SDAR`` (the committed blocks' exact cache). Its training layout
(block SFT) and TraceRL: ``d1jax.objectives.blockwise``, ``d1jax.objectives.tracerl``.
"""

from d1jax.model.family import Family
from d1jax.model.qwen import FIELDS, GRPO_TARGETS, LORA_TARGETS  # all seven projections
from d1jax.model.sdar.config import PRESETS, SDARConfig, preset
from d1jax.model.sdar.model import (SDAR, block_causal_mask, block_ids, head_weight,
                                    token_positions)
from d1jax.model.sdar.weights import (EMBEDDING, REMOTE_CODE, key_map, load_hf_checkpoint,
                                      read_config, save_hf_checkpoint)

FAMILY = Family(
    name="sdar", title="SDAR", module=SDAR, config_class=SDARConfig,
    model_types=("sdar",), presets=PRESETS, make_config=preset,
    fields=FIELDS,  # Qwen's config.json names
    lora_targets=LORA_TARGETS, grpo_targets=GRPO_TARGETS,
    load=load_hf_checkpoint, save=save_hf_checkpoint, read_config=read_config,
    remote_code=REMOTE_CODE, default_preset="sdar-8b", embedding=EMBEDDING,
    checkpoints={"sdar": ("SDAR_PATH", "sdar-tiny"),  # JetAstra/SDAR-{4B,8B}-Chat
                 "trado": ("TRADO_PATH", "sdar-tiny")},  # Gen-Verse/TraDo-{4B,8B}-Instruct
    published=("JetAstra/SDAR-8B-Chat", "JetAstra/SDAR-4B-Chat", "Gen-Verse/TraDo-8B-Instruct",
               "Gen-Verse/TraDo-4B-Instruct"),
    # docs/tpu_plan.md, "SDAR and TraDo-8B"
    plan_configs=("configs/sdar/tracerl_math.py",),
    turn_ends=("<|im_end|>",),  # Qwen's chat turns
    sft_loss="block")  # dLLM-RL trains SDAR/TraDo with block SFT (train/sft_sdar.py)

__all__ = ["FAMILY", "GRPO_TARGETS", "LORA_TARGETS", "PRESETS", "REMOTE_CODE", "SDAR",
           "SDARConfig", "block_causal_mask", "block_ids", "head_weight", "key_map",
           "load_hf_checkpoint", "preset", "read_config", "save_hf_checkpoint",
           "token_positions"]
