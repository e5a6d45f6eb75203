"""An independent torch (float64) port of how Gen-Verse/dLLM-RL trains SDAR / TraDo, LLaDA and
Dream, for the parity tests of block SFT and TraceRL (tests/test_blockwise.py,
tests/test_tracerl.py, tests/test_tracerl_full.py).

Written from their ``train/sft_sdar.py``, ``train/rl_sdar.py``, ``train/train_sdar_policy.py``,
``train/rl_llada.py`` and ``train/rl_dream.py`` (the functions named below are theirs; this is
a port of what they compute, row by row) and ``models/sdar/modeling_sdar.py`` (the forward:
Qwen3 blocks under a 4-D 0/1 mask at given positions; without the q/k norms and with q/k/v
biases it is ``models/dream/modeling_dream.py``'s Qwen2 stack), on HF-keyed tensors, so that
the gradient is compared key by key.
"""

from __future__ import annotations

import numpy as np

import torch  # noqa: E402  (the callers importorskip torch first)

F = torch.nn.functional
T = torch.float64


class TorchSDAR(torch.nn.Module):
    """SDARForCausalLM's forward in float64 from a state dict of HF names ([out, in])."""

    def __init__(self, sd: dict[str, np.ndarray], cfg):
        super().__init__()
        self.c = cfg
        self.w = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(
            torch.tensor(v, dtype=T)) for k, v in sd.items()})

    def p(self, name):
        return self.w[name.replace(".", "__")]

    def has(self, name):
        return name.replace(".", "__") in self.w

    def _proj(self, x, name):
        y = x @ self.p(name + ".weight").T
        return y + self.p(name + ".bias") if self.has(name + ".bias") else y

    def _head_norm(self, x, name):  # SDAR's q/k norms; Dream has none
        return self._rms(x, self.p(name)) if self.has(name) else x

    def _rms(self, x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c.rms_norm_eps)

    def forward(self, ids, attn_b1nn, positions):
        c = self.c
        n, k, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        b, length = ids.shape
        inv = 1.0 / c.rope_theta ** (torch.arange(0, h, 2, dtype=T) / h)
        ang = positions.to(T)[..., None] * inv
        cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
        rope = lambda v: v * cos + torch.cat([-v[..., h // 2:], v[..., :h // 2]], -1) * sin
        bias = torch.where(attn_b1nn.bool(), 0.0, float("-inf")).to(T)
        x = self.p("model.embed_tokens.weight")[ids]
        for i in range(c.num_hidden_layers):
            pre = f"model.layers.{i}."
            xn = self._rms(x, self.p(pre + "input_layernorm.weight"))
            q = self._proj(xn, pre + "self_attn.q_proj")
            kk = self._proj(xn, pre + "self_attn.k_proj")
            v = self._proj(xn, pre + "self_attn.v_proj").view(b, length, k, h).transpose(1, 2)
            q = rope(self._head_norm(q.view(b, length, n, h), pre + "self_attn.q_norm.weight")
                     .transpose(1, 2))
            kk = rope(self._head_norm(kk.view(b, length, k, h), pre + "self_attn.k_norm.weight")
                      .transpose(1, 2))
            kk, v = kk.repeat_interleave(n // k, 1), v.repeat_interleave(n // k, 1)
            att = F.scaled_dot_product_attention(q, kk, v, attn_mask=bias)
            x = x + att.transpose(1, 2).reshape(b, length, n * h) @ self.p(
                pre + "self_attn.o_proj.weight").T
            xn = self._rms(x, self.p(pre + "post_attention_layernorm.weight"))
            x = x + (F.silu(xn @ self.p(pre + "mlp.gate_proj.weight").T)
                     * (xn @ self.p(pre + "mlp.up_proj.weight").T)) @ self.p(
                         pre + "mlp.down_proj.weight").T
        head = "lm_head.weight" if self.has("lm_head.weight") else "model.embed_tokens.weight"
        return self._rms(x, self.p("model.norm.weight")) @ self.p(head).T

    def grads(self) -> dict[str, np.ndarray]:
        return {k.replace("__", "."): p.grad.detach().numpy() for k, p in self.w.items()}


# ------------------------------------------------------------------ their data pipeline

def make_basic_block_attention(n, l0, bs):
    """[1, 1, N, N] 0/1, N = L0 + 2 L1: prompt rows block-causal counted back from L0; clean
    response row of block i: keys [0, L0 + (i+1) bs); noised row of block i: keys
    [0, L0 + i bs) and its own block of the noised copy."""
    l1 = (n - l0) // 2
    bias = torch.zeros(1, 1, n, n, dtype=torch.long)
    for bi in range((l1 + bs - 1) // bs):
        lo, hi = bi * bs, min((bi + 1) * bs, l1)
        left = l0 + min(bi * bs, l1)
        noisy_rows = torch.arange(l0 + l1 + lo, l0 + l1 + hi)[:, None]
        bias[:, :, noisy_rows, 0:left] = 1
        right = l0 + l1 + (left - l0)
        bias[:, :, noisy_rows, right:right + bs] = 1
        bias[:, :, torch.arange(l0 + lo, l0 + hi)[:, None], 0:l0 + min((bi + 1) * bs, l1)] = 1
    for bi in range((l0 + bs - 1) // bs):
        end, start = max(l0 - bi * bs, 0), max(l0 - (bi + 1) * bs, 0)
        if end > start:
            bias[:, :, torch.arange(start, end)[:, None], 0:end] = 1
    return bias


def process_pad(attn, ids, l0, pad_id):
    """Prompt padding keys (cols < L0 holding pad_id) dropped; an emptied prompt row sees
    itself."""
    cols = torch.arange(ids.shape[1])
    attn = attn.clone()
    attn.masked_fill_(((cols < l0)[None] & (ids == pad_id))[:, None, None, :], 0)
    a = attn[:, 0]
    bad = (a.sum(-1) == 0) & (torch.arange(a.shape[1])[None] < l0)
    for bb, r in zip(*bad.nonzero(as_tuple=True)):
        a[bb, r, :] = 0
        a[bb, r, r] = 1
    return attn


def collapse_k_unique(lst, k):
    """Each value -> the last of its group of k consecutive distinct sorted values."""
    uniq = sorted(set(lst))
    rep = {v: uniq[min((i // k + 1) * k - 1, len(uniq) - 1)] for i, v in enumerate(uniq)}
    return [rep[x] for x in lst]


def one_round(ids_b, step_b, l0, l1, bs, mask_id):
    """One training row of a trace: per block the smallest remaining step is p_mask, every
    remaining step >= it is masked in the noised copy; those positions leave the map."""
    nb = (l1 + bs - 1) // bs
    pad = torch.full((nb * bs,), -1, dtype=torch.long)
    pad[:l1] = step_b
    blk = pad.view(nb, bs)
    valid = blk >= 0
    mins = blk.masked_fill(~valid, torch.iinfo(torch.long).max).min(1, keepdim=True).values
    pm = (blk == mins) & valid
    if not pm.any():
        return None
    ge = ((blk >= mins) & valid).view(-1)[:l1]
    pm = pm.view(-1)[:l1]
    tail = ids_b[l0:].clone()
    tail[ge] = mask_id
    p_mask = torch.zeros(l0 + l1, dtype=torch.bool)
    p_mask[l0:] = pm
    step = step_b.clone()
    step[pm] = -1
    return torch.cat([ids_b, tail]), p_mask, step


def finish_rows(ext, p_mask, l, l0, pad_id, post_num):
    """collect_training_data's tail: post_num on response padding, labels, tok_idx_ext,
    rows with an empty p_mask dropped. Returns (ext, p_mask, tok_idx_ext, labels, kept)."""
    pad_resp = (ext[:, :l] == pad_id) & p_mask
    if post_num is not None:
        p_mask = p_mask & ~(pad_resp & (torch.cumsum(pad_resp.int(), 1) > post_num))
    labels = ext[:, :l].clone()
    idx = torch.arange(l)[None].expand(ext.shape[0], -1)
    valid = (idx >= l0) | ext[:, :l].ne(pad_id)
    tok = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)
    tok_ext = torch.cat([tok, tok[:, l0:]], 1)
    keep = p_mask.any(1)
    return ext[keep], p_mask[keep], tok_ext[keep], labels[keep], keep


def trace_rows(input_ids, step_maps, l0, bs, shrink, mask_id, pad_id, post_num):
    """TraceRL's rows (rl_sdar.py collect_training_data, method TraceRL) and the source row
    of each."""
    l1 = input_ids.shape[1] - l0
    maps = []
    for sm in step_maps:
        sm = list(sm)
        for j in range((l1 - 1) // bs + 1):
            sm[j * bs:(j + 1) * bs] = collapse_k_unique(sm[j * bs:(j + 1) * bs], shrink)
        maps.append(sm)
    ext, pms, src = [], [], []
    for b, sm in enumerate(torch.as_tensor(maps, dtype=torch.long)):
        while (out := one_round(input_ids[b], sm, l0, l1, bs, mask_id)) is not None:
            e, pm, sm = out
            ext.append(e)
            pms.append(pm)
            src.append(b)
    ext, pm, tok, lab, keep = finish_rows(torch.stack(ext), torch.stack(pms),
                                          input_ids.shape[1], l0, pad_id, post_num)
    return ext, pm, tok, lab, [s for s, k in zip(src, keep.tolist()) if k]


def masked_rows(input_ids, pmask_tails, l0, mask_id, pad_id, post_num):
    """semi-ar / random_masking (and each half of coupled): the given response masks
    [rows, L1] (their random draws, handed in), one noised copy each."""
    tails = torch.as_tensor(pmask_tails, dtype=torch.bool)
    noise = input_ids[:, l0:].masked_fill(tails, mask_id)
    ext = torch.cat([input_ids, noise], 1)
    p_mask = torch.cat([torch.zeros(len(tails), l0, dtype=torch.bool), tails], 1)
    return finish_rows(ext, p_mask, input_ids.shape[1], l0, pad_id, post_num)


def their_logp(model, ext, tok_ext, labels, l0, bs, pad_id):
    """forward_process's logits (rows [:L0] and [L0 + L1:]) and log p(labels) [B, L0 + L1]."""
    l1 = labels.shape[1] - l0
    attn = make_basic_block_attention(l0 + 2 * l1, l0, bs).repeat_interleave(ext.shape[0], 0)
    attn = process_pad(attn, ext, l0, pad_id)
    logits = model(ext, attn, tok_ext)
    logits = torch.cat([logits[:, :l0], logits[:, l0 + l1:]], 1)
    return F.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]


def their_sft_loss(logp, p_mask, l1):
    """sft_sdar.py forward_process: -sum(p_mask logp) / L1 per row, mean over rows."""
    return (-(logp * p_mask).sum(1) / l1).sum() / logp.shape[0]


def their_rl_loss(logp_new, logp_old, p_mask, adv, l1, eps=0.2, beta=0.01, k3=True):
    """rl_sdar.py / train_sdar_policy.py forward_process: clipped ratio on p_mask, per-row sum
    / L1, mean over rows, plus beta x (k3) KL to the old log-probs."""
    adv = torch.as_tensor(adv, dtype=T)
    adv = adv[:, None] if adv.ndim == 1 else adv
    ratio = torch.where(p_mask, logp_new - logp_old, torch.zeros_like(logp_new)).clamp(-10, 10).exp()
    surr = torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv) * p_mask
    b = logp_new.shape[0]
    loss = -(surr.sum(1) / l1).sum() / b
    if beta > 0:
        kl = torch.where(p_mask, logp_new - logp_old, torch.zeros_like(logp_new))
        if k3:
            kl = (-kl).clamp(-10, 10).exp() - 1.0 + kl
        loss = loss + beta * ((kl * p_mask).sum(1) / l1).sum() / b
    return loss


# ------------------------------------------------------- their LLaDA / Dream training

def tail_pad(row, l0, pad_id, post_num):
    """prepare_inputs_and_labels_for_text's tail_pad_b: the response's pad tokens after its
    first post_num (None: none)."""
    pad = row == pad_id
    pad[:l0] = False
    if post_num is None:
        return torch.zeros_like(pad)
    return pad & ~(torch.cumsum(pad.int(), 0) <= post_num)


def full_trace_rows(input_ids, step_maps, l0, shrink, mask_id, pad_id, post_num):
    """rl_llada.py / rl_dream.py prepare_inputs_and_labels_for_text, method TraceRL: per row
    and distinct step of collapse_k_unique(step_map) (the whole response), the row with every
    response token of a step >= it masked; p_mask: that step's tokens but the tail pads.
    Returns (noisy [N, L], labels [N, L], p_mask [N, L], source row of each)."""
    n = input_ids.shape[1]
    noisy, pms, src = [], [], []
    for b, row in enumerate(input_ids):
        order = torch.full((n,), -1, dtype=torch.long)
        order[l0:] = torch.as_tensor(collapse_k_unique(list(step_maps[b]), shrink))[:n - l0]
        tail = tail_pad(row, l0, pad_id, post_num)
        for v in torch.unique(order[l0:], sorted=True):
            pm = (order == v) & ~tail
            if not pm.any():
                continue
            x = row.clone()
            x[order >= v] = mask_id
            noisy.append(x)
            pms.append(pm)
            src.append(b)
    return torch.stack(noisy), input_ids[src], torch.stack(pms), src


def full_masked_rows(input_ids, rand_tails, l0, mask_id, pad_id, post_num, coupled):
    """Their random_masking (and coupled: the complement too) for one draw per row, the
    response masks [B, L1] handed in; tail pads masked in every copy, scored in none."""
    noisy, pms, src = [], [], []
    for b, row in enumerate(input_ids):
        tail = tail_pad(row, l0, pad_id, post_num)
        rand = torch.zeros_like(tail)
        rand[l0:] = torch.as_tensor(rand_tails[b], dtype=torch.bool)
        comp = torch.zeros_like(tail)
        comp[l0:] = ~rand[l0:]
        for pm in [rand & ~tail] + ([comp & ~tail] if coupled else []):
            if pm.any():
                x = row.clone()
                x[pm | tail] = mask_id
                noisy.append(x)
                pms.append(pm)
                src.append(b)
    return torch.stack(noisy), input_ids[src], torch.stack(pms), src


def llada_logp(model, noisy, labels):
    """rl_llada.py forward_process's log p(labels) [N, L]: model(input_ids), no mask."""
    return F.log_softmax(model(noisy).logits, -1).gather(-1, labels[..., None])[..., 0]


def dream_logp(model, noisy, labels, l0, pad_id):
    """rl_dream.py forward_process's shifted log p(labels[:, 1:]) [N, L - 1]: its
    make_attention_mask (pad keys at idx <= start_pos dropped), positions 0..L-1."""
    n = noisy.shape[1]
    keep = ~((noisy == pad_id) & (torch.arange(n)[None] <= l0))
    logits = model(noisy, keep[:, None, None, :].long(), torch.arange(n)[None])
    return F.log_softmax(logits[:, :-1], -1).gather(-1, labels[:, 1:, None])[..., 0]


def their_full_rl_loss(logp_new, logp_old, p_mask, adv, eps=0.2, beta=0.01, k3=True):
    """rl_llada.py / rl_dream.py forward_process: clipped ratio (unclamped) on p_mask, per-row
    sum / n_mask, mean over rows; plus beta x the per-row sum of the (k3) KL, mean over rows."""
    adv = torch.as_tensor(adv, dtype=T)[:, None]
    ratio = torch.exp(logp_new - logp_old)
    surr = torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv) * p_mask
    b = logp_new.shape[0]
    loss = -(surr.sum(1) / p_mask.sum(1).clamp(min=1)).sum() / b
    if beta > 0:
        kl = logp_new - logp_old
        if k3:
            kl = (-kl).exp() - 1.0 + kl
        loss = loss + beta * (kl * p_mask).sum(1).sum() / b
    return loss


# ------------------------------------------------------------------ their reward step

def their_rl_rewards(correctness, lengths=None, max_len=None):
    """reward/rl_reward.py, experiment.function train, per task (a list of its responses'
    correctness, True/False): a response of ``max_len - 5`` tokens or more is wrong
    (``lengths`` given); the task is skipped when its share correct is above 0.8 or below
    0.2; else each response's reward is its correctness z-scored within the task (population
    std; all 0 when that std is 0). Returns the kept (task, response) pairs and rewards."""
    out = {}
    for i, task in enumerate(correctness):
        ok = [bool(c) for c in task]
        if lengths is not None:
            ok = [c and n < max_len - 5 for c, n in zip(ok, lengths[i])]
        share = sum(ok) / len(ok)
        if share > 0.8 or share < 0.2:
            continue
        var = sum((c - share) ** 2 for c in ok) / len(ok)
        for j, c in enumerate(ok):
            out[i, j] = 0.0 if var == 0 else (c - share) / var ** 0.5
    return out
