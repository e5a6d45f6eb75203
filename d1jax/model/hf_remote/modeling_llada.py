"""LLaDA's mask predictor in PyTorch, shipped by d1jax beside every export (``trust_remote_code``).

Written for d1jax to load under transformers 4.x and 5.x. Class names, ``model_type`` and the
state-dict keys are those of GSAI-ML/LLaDA-8B-Instruct's code, so its checkpoints and d1jax's
exports load with either file:

  model.transformer.wte.weight                 [V, D]   token embedding
  model.transformer.blocks.{i}.attn_norm.weight [D]     RMSNorm before attention
  model.transformer.blocks.{i}.{q,k,v}_proj.weight      [N*H or K*H, D]
  model.transformer.blocks.{i}.attn_out.weight  [D, N*H]
  model.transformer.blocks.{i}.ff_norm.weight   [D]     RMSNorm before the MLP
  model.transformer.blocks.{i}.{ff_proj,up_proj}.weight [F, D]  SwiGLU gate and up
  model.transformer.blocks.{i}.ff_out.weight    [D, F]
  model.transformer.ln_f.weight                [D]
  model.transformer.ff_out.weight              [V, D]   output head (absent when weight_tying)

A forward is one full bidirectional pass (no causal mask, no KV cache): LLaDA predicts every
masked position at once. Shape letters: B batch, L length, D d_model, N query heads, K kv
heads, H head dim, F MLP width, V embedding rows.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import SUPPORTED, LLaDAConfig


class LLaDARMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back to the input dtype, then scaled."""

    def __init__(self, size, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_tables(length, head_dim, theta, device):
    """sin, cos [L, H] in float32 for positions 0..L-1 (rotate-half layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                               / head_dim)
    freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
    freqs = torch.cat([freqs, freqs], dim=-1)
    return freqs.sin(), freqs.cos()


def apply_rope(x_bnlh, sin_lh, cos_lh):
    """Rotary embedding in float32 (LLaDA's rope_full_precision), cast back."""
    x = x_bnlh.float()
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos_lh + torch.cat([-x2, x1], dim=-1) * sin_lh).to(x_bnlh.dtype)


class LLaDABlock(nn.Module):
    """x + Attn(attn_norm(x)), then + SwiGLU-MLP(ff_norm(.)) (LLaDA's "llama" block)."""

    def __init__(self, config):
        super().__init__()
        d, self.n, self.k = config.d_model, config.n_heads, config.kv_heads
        self.h = d // self.n
        self.attn_norm = LLaDARMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, self.n * self.h, bias=False)
        self.k_proj = nn.Linear(d, self.k * self.h, bias=False)
        self.v_proj = nn.Linear(d, self.k * self.h, bias=False)
        self.attn_out = nn.Linear(self.n * self.h, d, bias=False)
        self.ff_norm = LLaDARMSNorm(d, config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, config.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(d, config.mlp_hidden, bias=False)
        self.ff_out = nn.Linear(config.mlp_hidden, d, bias=False)

    def forward(self, x_bld, rope, bias_bl):
        b, l, _ = x_bld.shape
        xn = self.attn_norm(x_bld)
        q = self.q_proj(xn).view(b, l, self.n, self.h).transpose(1, 2)
        k = self.k_proj(xn).view(b, l, self.k, self.h).transpose(1, 2)
        v = self.v_proj(xn).view(b, l, self.k, self.h).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        # Grouped-query attention: query head j reads kv head j // (N / K).
        k = k.repeat_interleave(self.n // self.k, dim=1)
        v = v.repeat_interleave(self.n // self.k, dim=1)
        mask = None if bias_bl is None else bias_bl[:, None, None, :].to(q.dtype)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        x_bld = x_bld + self.attn_out(att.transpose(1, 2).reshape(b, l, self.n * self.h))
        xn = self.ff_norm(x_bld)
        return x_bld + self.ff_out(F.silu(self.ff_proj(xn)) * self.up_proj(xn))


class LLaDAModel(nn.Module):
    """Embedding, blocks, final norm and head, under ``transformer`` as in LLaDA's checkpoints."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        parts = dict(wte=nn.Embedding(config.rows, config.d_model),
                     blocks=nn.ModuleList(LLaDABlock(config) for _ in range(config.n_layers)),
                     ln_f=LLaDARMSNorm(config.d_model, config.rms_norm_eps))
        if not config.weight_tying:
            parts["ff_out"] = nn.Linear(config.d_model, config.rows, bias=False)
        self.transformer = nn.ModuleDict(parts)

    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None,
                output_hidden_states=False):
        """Logits [B, L, V] and, if asked, the input of every block plus the final output."""
        t, c = self.transformer, self.config
        x = t.wte(input_ids) if inputs_embeds is None else inputs_embeds
        rope = rope_tables(x.shape[1], c.d_model // c.n_heads, c.rope_theta, x.device)
        bias = None  # padding keys (attention_mask 0) get the dtype's lowest score
        if attention_mask is not None:
            bias = (1.0 - attention_mask.float()) * torch.finfo(x.dtype).min
        hidden = []
        for block in t.blocks:
            hidden.append(x)
            x = block(x, rope, bias)
        x = t.ln_f(x)
        hidden.append(x)
        logits = F.linear(x, t.wte.weight) if c.weight_tying else t.ff_out(x)
        if c.scale_logits:
            logits = logits * (1 / math.sqrt(c.d_model))
        return logits, (tuple(hidden) if output_hidden_states else None)


class LLaDAModelLM(PreTrainedModel):
    """LLaDA for ``AutoModel`` and ``AutoModelForCausalLM``: ``model(ids).logits`` [B, L, V]."""

    config_class = LLaDAConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDABlock"]

    def __init__(self, config):
        super().__init__(config)
        wrong = {k: getattr(config, k) for k, v in SUPPORTED.items()
                 if getattr(config, k, v) != v and not (k == "block_group_size" and
                                                       getattr(config, k) is None)}
        if wrong:
            raise ValueError(f"config.json has {wrong}; this modeling_llada.py implements only "
                             f"{ {k: SUPPORTED[k] for k in wrong} } (LLaDA-8B's variant)")
        self.model = LLaDAModel(config)
        self.post_init()

    def _init_weights(self, module):
        # Used only for a fresh model or weights missing from a checkpoint.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, LLaDARMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self):
        return self.model.transformer.wte

    def set_input_embeddings(self, value):
        self.model.transformer.wte = value

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        """input_ids [B, L]; attention_mask [B, L] (1 = token, 0 = padding key), optional.

        Positions are 0..L-1 whatever the padding (as LLaDA's code; RoPE is relative, so a
        masked left padding does not change a sequence's logits). Caching options are ignored.
        """
        if labels is not None:
            raise ValueError("LLaDAModelLM computes no loss: LLaDA trains on masked tokens "
                             "weighted by 1/t, not on next tokens; compute it from .logits")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        logits, hidden = self.model(input_ids, inputs_embeds, attention_mask,
                                    bool(output_hidden_states))
        if return_dict is False:
            return (logits,) if hidden is None else (logits, hidden)
        return CausalLMOutputWithPast(logits=logits, hidden_states=hidden)
