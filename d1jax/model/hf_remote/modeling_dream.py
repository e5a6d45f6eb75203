"""Dream's mask predictor in PyTorch, shipped by d1jax beside Dream exports (``trust_remote_code``).

Written for d1jax to load under transformers 4.x and 5.x. Class names, ``model_type`` and the
state-dict keys are those of Dream-org/Dream-v0-Instruct-7B's code (Qwen2 blocks run
bidirectionally), so its checkpoints and d1jax's exports load with either file:

  model.embed_tokens.weight                            [V, D]
  model.layers.{i}.input_layernorm.weight              [D]      RMSNorm before attention
  model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias} [N*H or K*H, D], [N*H or K*H]
  model.layers.{i}.self_attn.o_proj.weight             [D, N*H] (no bias)
  model.layers.{i}.post_attention_layernorm.weight     [D]      RMSNorm before the MLP
  model.layers.{i}.mlp.{gate,up}_proj.weight           [F, D]   SwiGLU gate and up
  model.layers.{i}.mlp.down_proj.weight                [D, F]
  model.norm.weight                                    [D]
  lm_head.weight                                       [V, D]   (absent when tie_word_embeddings)

A forward is one full bidirectional pass (no causal mask, no KV cache) returning the raw
logits, as Dream's own ``DreamModel``: row i predicts token i+1 (Dream keeps its
autoregressive initialisation; its sampler shifts the rows by one). There is no
``diffusion_generate`` here; ``d1jax.sampling.dream`` samples. Shape letters: B batch,
L length, D hidden, N query heads, K kv heads, H head dim, F MLP width, V vocabulary.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from .configuration_dream import ROPE_TYPES, SUPPORTED, DreamConfig, rope_type_and_factor


class DreamRMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back to the input dtype, then scaled."""

    def __init__(self, size, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_tables(positions_bl, head_dim, theta, factor):
    """sin, cos [B, L, H] in float32 for positions [B, L] (rotate-half layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions_bl.device,
                                            dtype=torch.float32) / head_dim)
    freqs = (positions_bl.float() / factor)[..., None] * inv_freq
    freqs = torch.cat([freqs, freqs], dim=-1)
    return freqs.sin(), freqs.cos()


def apply_rope(x_bnlh, sin_blh, cos_blh):
    """Rotary embedding in float32, cast back."""
    x = x_bnlh.float()
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos_blh[:, None] + rotated * sin_blh[:, None]).to(x_bnlh.dtype)


def dream_positions(mask_bl):
    """Positions counted from each row's first real token, padding at 1: the ``tok_idx``
    Dream's sampler passes with a left-padded batch (``cumsum(mask) - 1``)."""
    mask_bl = mask_bl.long()
    return (mask_bl.cumsum(-1) - 1).masked_fill(mask_bl == 0, 1)


class DreamAttention(nn.Module):
    """Grouped-query softmax attention with biases on q, k, v (not o), no causal mask."""

    def __init__(self, config):
        super().__init__()
        d, self.n = config.hidden_size, config.num_attention_heads
        self.k = config.num_key_value_heads
        self.h = d // self.n
        self.q_proj = nn.Linear(d, self.n * self.h, bias=True)
        self.k_proj = nn.Linear(d, self.k * self.h, bias=True)
        self.v_proj = nn.Linear(d, self.k * self.h, bias=True)
        self.o_proj = nn.Linear(self.n * self.h, d, bias=False)

    def forward(self, x_bld, rope, mask):
        b, l, _ = x_bld.shape
        q = self.q_proj(x_bld).view(b, l, self.n, self.h).transpose(1, 2)
        k = self.k_proj(x_bld).view(b, l, self.k, self.h).transpose(1, 2)
        v = self.v_proj(x_bld).view(b, l, self.k, self.h).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        # Query head j reads kv head j // (N / K).
        k = k.repeat_interleave(self.n // self.k, dim=1)
        v = v.repeat_interleave(self.n // self.k, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        return self.o_proj(att.transpose(1, 2).reshape(b, l, self.n * self.h))


class DreamMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamDecoderLayer(nn.Module):
    """x + Attn(input_layernorm(x)), then + MLP(post_attention_layernorm(.))."""

    def __init__(self, config):
        super().__init__()
        self.input_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DreamAttention(config)
        self.post_attention_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DreamMLP(config)

    def forward(self, x_bld, rope, mask):
        x_bld = x_bld + self.self_attn(self.input_layernorm(x_bld), rope, mask)
        return x_bld + self.mlp(self.post_attention_layernorm(x_bld))


class DreamBaseModel(nn.Module):
    """Embedding, blocks and final norm: the ``model.`` part of Dream's checkpoints."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DreamDecoderLayer(config)
                                    for _ in range(config.num_hidden_layers))
        self.norm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x_bld, positions_bl, mask, output_hidden_states=False):
        """Final-norm hidden states [B, L, D] and, if asked, every block's input plus them."""
        c = self.config
        _, factor = rope_type_and_factor(c)
        rope = rope_tables(positions_bl, c.hidden_size // c.num_attention_heads, c.rope_theta,
                           factor)
        hidden = []
        for layer in self.layers:
            hidden.append(x_bld)
            x_bld = layer(x_bld, rope, mask)
        x_bld = self.norm(x_bld)
        hidden.append(x_bld)
        return x_bld, (tuple(hidden) if output_hidden_states else None)


def attention_bias(attention_mask, dtype):
    """The mask SDPA takes: a [B, L] padding mask (1 = token, 0 = padding key) becomes an
    additive [B, 1, 1, L] bias; a 4-D mask (boolean or additive, as Dream's sampler builds)
    is passed as it is; None or the sampler's "full" attends everywhere."""
    if attention_mask is None or isinstance(attention_mask, str):
        return None
    if attention_mask.dim() == 2:
        return ((1.0 - attention_mask.float()) * torch.finfo(dtype).min)[:, None, None].to(dtype)
    if attention_mask.dim() == 4:
        return attention_mask if attention_mask.dtype == torch.bool else attention_mask.to(dtype)
    raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; pass [B, L] "
                     f"(1 = token, 0 = padding) or a [B, 1, L, L] mask")


class DreamModel(PreTrainedModel):
    """Dream for ``AutoModel``: ``model(ids, attention_mask).logits`` [B, L, V], raw (row i
    predicts token i+1)."""

    config_class = DreamConfig
    base_model_prefix = "model"
    _no_split_modules = ["DreamDecoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        wrong = {k: getattr(config, k) for k, v in SUPPORTED.items() if getattr(config, k, v) != v}
        rope_type, _ = rope_type_and_factor(config)
        if rope_type not in ROPE_TYPES:
            wrong["rope_scaling"] = config.rope_scaling
        if wrong:
            raise ValueError(f"config.json has {wrong}; this modeling_dream.py implements only "
                             f"{SUPPORTED} and rope types {ROPE_TYPES} (Dream-7B's variant)")
        self.model = DreamBaseModel(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        # Used only for a fresh model or weights missing from a checkpoint.
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, DreamRMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
                output_attentions=None, output_hidden_states=None, return_dict=None,
                num_logits_to_keep=0, **kwargs):
        """input_ids [B, L]; attention_mask [B, L] (1 = token, 0 = padding key) or the
        [B, 1, L, L] mask Dream's sampler builds; position_ids [B, L] or [1, L].

        Without position_ids, a [B, L] mask gives each row positions counted from its first
        real token (padding at 1), the ``tok_idx`` Dream's sampler passes with that mask;
        otherwise positions are 0..L-1. Padding keys are ignored; padding rows still get
        logits. Caching options are ignored; ``num_logits_to_keep`` > 0 keeps the last rows.
        """
        if labels is not None:
            raise ValueError("DreamModel computes no loss: diffusion training weights masked "
                             "tokens by 1/t; compute it from .logits (row i predicts token i+1)")
        if output_attentions:
            raise ValueError("DreamModel does not return attention weights")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        b, l = x.shape[:2]
        if position_ids is None:
            if torch.is_tensor(attention_mask) and attention_mask.dim() == 2:
                position_ids = dream_positions(attention_mask)
            else:
                position_ids = torch.arange(l, device=x.device)[None]
        position_ids = position_ids.to(x.device).expand(b, l)
        hidden, all_hidden = self.model(x, position_ids, attention_bias(attention_mask, x.dtype),
                                        bool(output_hidden_states))
        hidden = hidden[:, -num_logits_to_keep:] if num_logits_to_keep else hidden
        if self.config.tie_word_embeddings:
            logits = F.linear(hidden, self.model.embed_tokens.weight)
        else:
            logits = self.lm_head(hidden)
        if return_dict is False:
            return (logits,) if all_hidden is None else (logits, all_hidden)
        return MaskedLMOutput(logits=logits, hidden_states=all_hidden)
