"""The LLaDA-MoE family (inclusionAI LLaDA-MoE-7B-A1B-Base and -Instruct: OLMoE-style mixture
of experts, full attention; config.json model_type "llada" as published, or ZHZisZZ/dllm's
"lladamoe"): the module, its config and presets, the Hub's per-expert checkpoint in and out,
and its record (``FAMILY``). The routed experts, their expert parallelism and the router
metrics are LLaDA2's (``d1jax.model.llada2.moe``); the router is its own (softmax top-k).

It is trained and sampled as LLaDA is: d1's masked SFT loss, d1's semi-autoregressive
sampler over full attention (dInfer's blocks of 32-64 tokens with threshold decoding run on
it as ``loop="llada"`` cached decoding; their ThresholdParallelDecoder was not ported here).
"""

from d1jax.model.family import Family
from d1jax.model.lladamoe.config import MODEL_TYPES, PRESETS, LLaDAMoEConfig, preset
from d1jax.model.lladamoe.model import LLaDAMoE
from d1jax.model.lladamoe.weights import (EMBEDDING, REMOTE_CODE, key_map, load_hf_checkpoint,
                                          read_config, save_hf_checkpoint)

# The projections LoRA may adapt, by module name (OLMoE's; the routed experts are stacked
# weights, not adapted). d1's GRPO list [q, k, v, o, up, down, gate]_proj lands on all seven:
# the attention's four, and the dense layers' and the shared expert's SwiGLU.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GRPO_TARGETS = LORA_TARGETS

FAMILY = Family(
    name="lladamoe", title="LLaDA-MoE", module=LLaDAMoE, config_class=LLaDAMoEConfig,
    # The published "llada" is LLaDA-8B's type too: its experts tell them apart (``marks``);
    # "lladamoe" is ZHZisZZ/dllm's rename.
    model_types=MODEL_TYPES, marks=("num_experts",), presets=PRESETS, make_config=preset,
    fields={"vocab": ("vocab_size",), "mask": ("mask_token_id",), "eos": ("eos_token_id",),
            "pad": ("pad_token_id",), "length": ("max_position_embeddings",),
            "width": ("hidden_size",), "mlp": ("dense_intermediate_size",),
            "layers": ("num_hidden_layers",)},
    lora_targets=LORA_TARGETS, grpo_targets=GRPO_TARGETS,
    load=load_hf_checkpoint, save=save_hf_checkpoint, read_config=read_config,
    remote_code=REMOTE_CODE, default_preset="lladamoe-7b-a1b", embedding=EMBEDDING,
    checkpoints={"lladamoe": ("LLADAMOE_PATH", "lladamoe-tiny")},
    published=("inclusionAI/LLaDA-MoE-7B-A1B-Instruct", "inclusionAI/LLaDA-MoE-7B-A1B-Base"),
    turn_ends=("<|role_end|>",))  # LLaDA2's tokenizer family (dllm's eot_token)

__all__ = ["FAMILY", "GRPO_TARGETS", "LLaDAMoE", "LLaDAMoEConfig", "LORA_TARGETS", "PRESETS",
           "REMOTE_CODE", "key_map", "load_hf_checkpoint", "preset", "read_config",
           "save_hf_checkpoint"]
