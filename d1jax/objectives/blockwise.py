"""Block diffusion's training layout and block SFT (SDAR, TraDo; Gen-Verse/dLLM-RL
``train/sft_sdar.py``, whose layout ``rl_sdar.py`` and ``train_sdar_policy.py`` share).

A row is the clean sequence followed by noised copies of its last C positions (the
response): ``[x (L), x~_1 (C), ..., x~_R (C)]``. Blocks of ``block`` tokens are counted from
the row's anchor (the response start, their ``L0``): block(j) = floor((j - anchor) / block),
so the prompt's blocks are counted back from it. The attention mask (their
``make_basic_block_attention`` then ``process_pad``):

- a clean query sees the real clean keys of its block and the blocks before it
  (block-causal: the model's own mask);
- a noised query of copy r sees the real clean keys of the blocks strictly before its
  block, and the keys of its own block inside copy r (response positions only);
- no clean query sees a noised key, and no copy sees another copy.

The authors build one row per copy (R = 1, ``[x, x~]``, length L0 + 2 L1); R copies in one
row give each copy exactly the same keys, so its logits are theirs while the clean stream
runs once. Noised positions take the clean positions' RoPE indices (their ``tok_idx_ext``:
``tok_idx`` of the clean row, the response part repeated). Padding keys of the prompt are
never seen; a padding query row sees what its block allows (theirs: itself only): its
output is never read.

The mask is held as per-position facts (``StreamMask``: stream, block, and which keys the
clean and own-block rules admit), and attention builds it ``query_chunk`` query rows at a
time (``d1jax.model.attention.RowMask``): never [N, N]. ``stream_mask`` builds it whole, the
reference the tests compare both with.

Block SFT (their ``sft_sdar.py``, ``training.method: semi-ar``): every response position is
masked with its own probability p ~ U(lower_p, upper_p) (``random_noise``); the loss is
-sum(p_mask log p(x | x~)) / L1 per row, then the mean over rows; no 1/t weight. Padding
tokens of the response (``pad_id``, after its end) count in p_mask only for the first
``post_num`` of them (``post_num_filter``); rows left with an empty p_mask are dropped (not
counted in the mean). L1 is their padded response length, a constant of the run; here the
copy length C.

dFactory's block SFT for LLaDA2 (``tasks/train_llada2_bd.py`` with ``sft_noise_transition``
of ``tasks/dataset/data_transform.py``; ``recipe="block_dfactory"``) differs in three ways:
one t ~ U(lower, upper) per row, each position from the prompt's end on masked when u < t
(``row_noise``); blocks counted from position 0, not from the prompt's end (anchor 0); the
loss of a row is its masked positions' cross entropy summed over their count (no 1/t), then
the mean over rows (their micro-batch of one row, ``/ len(micro_batches)``; a larger
micro-batch of theirs averages its tokens together). Their padding is masked and trained on:
``post_num`` -1 (None here) in configs/llada2/sft_gsm8k.py.

Shape letters: B rows, L clean length, R copies, C copy length, N = L + R C, D width.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from d1jax.model.attention import RowMask
from d1jax.model.predictor import MaskPredictor
from d1jax.model.qwen import token_positions
from d1jax.objectives import logprob

Array = jax.Array
# Block SFT recipes (``sft_stage_loss``): dLLM-RL's sft_sdar.py (SDAR, TraDo) and dFactory's
# train_llada2_bd.py (LLaDA2).
RECIPES = ("block", "block_dfactory")


def block_index(length: int, anchor_b: Array, block: int) -> Array:
    """[B, L] int32: floor((j - anchor) / block), the blocks counted from each row's anchor."""
    j = jnp.arange(length)[None]
    return jnp.floor_divide(j - jnp.asarray(anchor_b, jnp.int32)[:, None], block)


def stream_mask(real_bl: Array, anchor_b: Array, copies: int, copy_len: int,
                block: int) -> Array:
    """bool [B, N, N] of the module docstring, N = L + copies * copy_len; ``real_bl``: the
    clean row's key mask (1 = real; the response's padding tokens are real keys)."""
    b, l = real_bl.shape
    real = jnp.asarray(real_bl).astype(bool)
    blk = block_index(l, anchor_b, block)  # [B, L]
    clean = (blk[:, None, :] <= blk[:, :, None]) & real[:, None, :]  # [B, L, L]
    start = l - copy_len
    cblk = blk[:, start:]  # [B, C] the copy positions' blocks
    in_resp = (jnp.arange(start, l)[None] >= jnp.asarray(anchor_b)[:, None])  # [B, C]
    to_clean = (blk[:, None, :] < cblk[:, :, None]) & real[:, None, :]  # [B, C, L]
    own = (cblk[:, None, :] == cblk[:, :, None]) & in_resp[:, None, :]  # [B, C, C]
    eye = jnp.eye(copies, dtype=bool)
    to_copies = (eye[None, :, None, :, None] & own[:, None, :, None, :]).reshape(
        b, copies * copy_len, copies * copy_len)
    top = jnp.concatenate([clean, jnp.zeros((b, l, copies * copy_len), bool)], axis=2)
    bottom = jnp.concatenate([jnp.tile(to_clean, (1, copies, 1)), to_copies], axis=2)
    return jnp.concatenate([top, bottom], axis=1)


# Query rows per attention chunk of the training layout: a chunk's float32 scores are
# 512 x N per head (TraDo-8B at N = 10.8k: ~0.7 GB for 32 heads, against ~15 GB whole).
QUERY_CHUNK = 512


@struct.dataclass
class StreamMask(RowMask):
    """``stream_mask`` as per-position facts [B, N], its rows built on demand: query i sees
    key j iff j is a clean key the clean rule admits in a block <= i's (< i's for a copy's
    query), or j lies in i's own block of i's own copy and the own-block rule admits it."""

    stream: jax.Array  # int32: 0 clean, r + 1 copy r
    block: jax.Array  # int32: block_index of the position (a copy's: its clean position's)
    clean_key: jax.Array  # bool: a real clean key (padding and copies: False)
    own_key: jax.Array  # bool: a copy's response position (seen inside its own block)
    query_chunk: int = struct.field(pytree_node=False, default=QUERY_CHUNK)

    def rows(self, start, size: int) -> jax.Array:
        """bool [B, size, N]: rows start:+size (rows past N repeat the last)."""
        i = jnp.clip(start + jnp.arange(size), 0, self.stream.shape[1] - 1)
        s_i, b_i = self.stream[:, i, None], self.block[:, i, None]  # [B, size, 1]
        s_j, b_j = self.stream[:, None], self.block[:, None]  # [B, 1, N]
        copy_q = s_i != 0
        to_clean = self.clean_key[:, None] & (b_j <= b_i - copy_q.astype(jnp.int32))
        to_own = copy_q & (s_j == s_i) & (b_j == b_i) & self.own_key[:, None]
        return to_clean | to_own


def stream_facts(real_bl: Array, anchor_b: Array, copies: int, copy_len: int, block: int,
                 query_chunk: int = QUERY_CHUNK) -> StreamMask:
    """``stream_mask``'s mask as a ``StreamMask`` (O(N) memory)."""
    b, l = real_bl.shape
    blk = block_index(l, anchor_b, block)  # [B, L]
    start = l - copy_len
    in_resp = jnp.arange(start, l)[None] >= jnp.asarray(anchor_b)[:, None]  # [B, C]
    n_c = copies * copy_len
    stream = jnp.concatenate([jnp.zeros((b, l), jnp.int32), jnp.broadcast_to(
        jnp.repeat(jnp.arange(1, copies + 1, dtype=jnp.int32), copy_len), (b, n_c))], 1)
    return StreamMask(
        stream=stream, block=jnp.concatenate([blk, jnp.tile(blk[:, start:], (1, copies))], 1),
        clean_key=jnp.concatenate([jnp.asarray(real_bl).astype(bool),
                                   jnp.zeros((b, n_c), bool)], 1),
        own_key=jnp.concatenate([jnp.zeros((b, l), bool), jnp.tile(in_resp, (1, copies))], 1),
        query_chunk=query_chunk)


def stream_inputs(ids_bl: Array, real_bl: Array, noised_brc: Array) -> tuple[Array, Array]:
    """(ids [B, N], RoPE positions [B, N]): the clean row then its R noised copies, each copy
    at the clean positions' indices (``token_positions`` of the real mask)."""
    b, r, c = noised_brc.shape
    l = ids_bl.shape[1]
    pos = jnp.broadcast_to(token_positions(real_bl, l), (b, l))
    ids = jnp.concatenate([ids_bl, noised_brc.reshape(b, r * c)], axis=1)
    return ids.astype(jnp.int32), jnp.concatenate([pos, jnp.tile(pos[:, l - c:], (1, r))], 1)


def copy_logps(model: MaskPredictor, params: Any, ids_bl: Array, real_bl: Array,
               anchor_b: Array, noised_brc: Array, *, block: int | None = None,
               use_lora: bool = True, dropout_rng: Array | None = None,
               seq_chunk: int | None = None, query_chunk: int | None = QUERY_CHUNK,
               with_metrics: bool = False, routing: Array | None = None,
               record_routing: bool = False) -> Array | tuple[Array, Any]:
    """log p(clean token | its noised copy's view) [B, R, C] at every copy position: one
    forward of the streams (``stream_mask``), the head on the copies' rows only (float32
    log-softmax, ``logprob.head_logps``). ``block``: default the model's block size.
    ``query_chunk``: attention rows at a time under a ``StreamMask``; None: the whole
    [N, N] mask (the reference). ``with_metrics``: also the model's per-step metrics of this
    forward (``step_metrics`` of what it sows, e.g. an MoE router's load; {} for a model
    without). ``routing`` [B, n_moe, N, K]: an MoE's expert ids to replay in this forward
    (``record_routing``: return (log p, the ids this forward chose, [B, n_moe, N, K] int32)
    instead; ``LLaDA2.hidden``'s routing replay)."""
    b, r, c = noised_brc.shape
    block = model.config.block_size if block is None else block
    summarize = getattr(model, "step_metrics", None) if with_metrics else None
    sow = bool(summarize) or record_routing
    extra = {} if routing is None else {"routing": jnp.moveaxis(routing, 1, 0)}
    ids, pos = stream_inputs(ids_bl, real_bl, noised_brc)
    mask = (stream_mask(real_bl, anchor_b, r, c, block) if query_chunk is None
            else stream_facts(real_bl, anchor_b, r, c, block, query_chunk))
    rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
    h = model.apply({"params": params}, ids, None, method=type(model).hidden, positions=pos,
                    mask=mask, use_lora=use_lora, deterministic=dropout_rng is None,
                    keep_last=r * c, rngs=rngs, mutable=["intermediates"] if sow else False,
                    **extra)
    h, sown = h if sow else (h, None)
    head, scale = logprob.model_head(model, params)
    targets = jnp.tile(ids_bl[:, -c:].astype(jnp.int32), (1, r))
    out = logprob.head_logps(h, head, targets, scale=scale, seq_chunk=seq_chunk).reshape(b, r, c)
    if record_routing:
        sown_moe = sown.get("intermediates", {}).get("moe_layers", {})
        if "router_ids" not in sown_moe:
            raise ValueError(f"routing replay needs a mixture-of-experts model (llada2); "
                             f"{type(model).__name__} routes no tokens: turn it off")
        (ids,) = sown_moe["router_ids"]
        return out, jnp.moveaxis(ids, 0, 1)
    if not with_metrics:
        return out
    return out, summarize(sown.get("intermediates", {})) if summarize else {}


def random_noise(key: Array, shape: tuple[int, ...], lower: float, upper: float) -> Array:
    """bool: each position masked when u <= p, u ~ U(0, 1) and its own p ~ U(lower, upper)
    (their ``rand <= empty().uniform_(lower_p, upper_p)``)."""
    k_p, k_u = jax.random.split(key)
    p = jax.random.uniform(k_p, shape, minval=lower, maxval=upper)
    return jax.random.uniform(k_u, shape) <= p


def row_noise(key: Array, shape: tuple[int, int], lower: float, upper: float) -> Array:
    """bool [B, L]: one t ~ U(lower, upper) per row, each position masked when u < t, u ~ U(0, 1)
    (dFactory's ``sft_noise_transition``)."""
    k_t, k_u = jax.random.split(key)
    t = jax.random.uniform(k_t, (shape[0], 1), minval=lower, maxval=upper)
    return jax.random.uniform(k_u, shape) < t


def post_num_filter(pmask_brc: Array, targets_bc: Array, pad_id: int,
                    post_num: int | None) -> Array:
    """p_mask without the padding tokens past the first ``post_num`` of each row (their
    ``pad_resp & cumsum(pad_resp) > post_num``); None: unchanged."""
    if post_num is None:
        return pmask_brc
    pad = pmask_brc & (targets_bc[:, None, :] == pad_id)
    return pmask_brc & ~(pad & (jnp.cumsum(pad.astype(jnp.int32), axis=-1) > post_num))


def block_sft_loss(model: MaskPredictor, params: Any, ids_bl: Array, real_bl: Array,
                   anchor_b: Array, pmask_bc: Array, *, copy_len: int, post_num: int | None,
                   pad_id: int, norm_len: int | None = None, per_token: bool = False,
                   use_lora: bool = True, dropout_rng: Array | None = None
                   ) -> tuple[Array, dict[str, Array]]:
    """Their SFT loss on rows with the masked positions ``pmask_bc`` [B, C] of the last
    ``copy_len`` positions given: one noised copy; -sum(p_mask log p) / L1 per kept row
    (p_mask not empty after ``post_num_filter``), mean over kept rows. ``norm_len``: L1
    (default C); ``per_token``: divide each row by its count of p_mask positions instead
    (dFactory's). Returns (loss, metrics: masked_tokens per row, kept_rows, and the model's
    ``step_metrics`` of the forward: an MoE's router summary)."""
    c = copy_len
    clean_c = ids_bl[:, -c:]
    noised = jnp.where(pmask_bc, model.config.mask_token_id, clean_c)[:, None]
    pm = post_num_filter(pmask_bc[:, None].astype(bool), clean_c, pad_id, post_num)[:, 0]
    lp, aux = copy_logps(model, params, ids_bl, real_bl, anchor_b, noised, use_lora=use_lora,
                         dropout_rng=dropout_rng, with_metrics=True)
    lp = lp[:, 0]
    kept = jnp.any(pm, axis=1)
    n = jnp.maximum(jnp.sum(kept), 1).astype(jnp.float32)
    count = jnp.maximum(jnp.sum(pm, axis=1), 1).astype(jnp.float32)
    row = -jnp.sum(jnp.where(pm, lp, 0.0), axis=1) / (count if per_token else (norm_len or c))
    return jnp.sum(row) / n, {"masked_tokens": jnp.mean(jnp.sum(pm, axis=1).astype(jnp.float32)),
                              "kept_rows": jnp.mean(kept.astype(jnp.float32)), **aux}


def sft_stage_loss(model: MaskPredictor, params: Any, input_ids_bl: Array, prompt_len_b: Array,
                   key: Array, *, lower: float, upper: float, post_num: int | None,
                   pad_id: int, recipe: str = "block", use_lora: bool = True,
                   dropout_rng: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """Block SFT on the SFT stage's rows (prompt then completion, EOS-padded, no left
    padding): the copy is the whole row, its positions from ``prompt_len`` on masked.
    ``recipe`` "block" (dLLM-RL's): by ``random_noise``, blocks anchored at ``prompt_len``,
    L1 = L; "block_dfactory" (dFactory's, module docstring): by ``row_noise``, blocks from
    position 0, each row's masked-token mean."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe={recipe!r}: one of {RECIPES}")
    b, l = input_ids_bl.shape
    resp = jnp.arange(l)[None] >= prompt_len_b[:, None]
    dfactory = recipe == "block_dfactory"
    noise = row_noise if dfactory else random_noise
    pmask = noise(key, (b, l), lower, upper) & resp
    anchor = jnp.zeros_like(prompt_len_b) if dfactory else prompt_len_b
    return block_sft_loss(model, params, input_ids_bl, jnp.ones((b, l), jnp.int32),
                          anchor, pmask, copy_len=l, post_num=post_num, pad_id=pad_id,
                          per_token=dfactory, use_lora=use_lora, dropout_rng=dropout_rng)
