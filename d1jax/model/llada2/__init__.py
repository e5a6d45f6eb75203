"""The LLaDA2.x mixture-of-experts family (inclusionAI LLaDA2.0/2.1-mini and -flash:
model_type "llada2_moe", dFactory's merged-expert "llada2_moe_veomni"): the module, its config
and presets, the MoE layer with expert parallelism, the two published checkpoint layouts (the
Hub's per-expert tensors, dFactory's merged experts) in and out, and its record (``FAMILY``).

Its sampler is block diffusion's (``d1jax.sampling.block_diffusion``, ``loop="sdar"``) over the
cache entry points of ``LLaDA2`` (the committed blocks' exact cache); its SFT loss is block SFT
(dFactory ``tasks/train_llada2_bd.py`` trains the noised and clean copies side by side under a
block mask, the layout of ``d1jax.objectives.blockwise``).
"""

from d1jax.model.family import Family
from d1jax.model.llada2.config import LLaDA2Config, PRESETS, preset
from d1jax.model.llada2.model import LLaDA2
from d1jax.model.llada2.weights import (EMBEDDING, REMOTE_CODE, key_map, load_hf_checkpoint,
                                        read_config, save_hf_checkpoint)

# The projections LoRA may adapt, by module name (the routed experts are stacked weights, not
# projections: no adapters). d1's GRPO list [q, k, v, o, up, down, gate]_proj lands on the
# MLP names only (the attention is one fused query_key_value and a dense output).
LORA_TARGETS = ("query_key_value", "dense", "gate_proj", "up_proj", "down_proj")
GRPO_TARGETS = ("up_proj", "down_proj", "gate_proj")

FAMILY = Family(
    name="llada2", title="LLaDA2", module=LLaDA2, config_class=LLaDA2Config,
    model_types=("llada2_moe", "llada2_moe_veomni"), presets=PRESETS, make_config=preset,
    fields={"vocab": ("vocab_size",), "mask": ("mask_token_id",), "eos": ("eos_token_id",),
            "pad": ("pad_token_id",), "length": ("max_position_embeddings",),
            "width": ("hidden_size",), "mlp": ("intermediate_size",),
            "layers": ("num_hidden_layers",)},
    lora_targets=LORA_TARGETS, grpo_targets=GRPO_TARGETS,
    load=load_hf_checkpoint, save=save_hf_checkpoint, read_config=read_config,
    remote_code=REMOTE_CODE, default_preset="llada2-mini", embedding=EMBEDDING,
    checkpoints={"llada2": ("LLADA2_PATH", "llada2-tiny")},  # inclusionAI/LLaDA2.0-mini
    published=("inclusionAI/LLaDA2.0-mini", "inclusionAI/LLaDA2.0-flash"),
    turn_ends=("<|role_end|>",),  # their chat turns: <role>HUMAN</role>...<|role_end|>
    sft_loss="block_dfactory")  # dFactory's block SFT (tasks/train_llada2_bd.py)

__all__ = ["FAMILY", "GRPO_TARGETS", "LLaDA2", "LLaDA2Config", "LORA_TARGETS", "PRESETS",
           "REMOTE_CODE", "key_map", "load_hf_checkpoint", "preset", "read_config",
           "save_hf_checkpoint"]
