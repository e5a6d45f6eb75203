"""Analytic FLOP counts of LLaDA and Dream programs, loop-aware (every layer, step and block
counted).

A matmul [m, k] x [k, n] is 2 m k n FLOPs. Per token and layer the projections cost
2 (D·NH + 2 D·KH + NH·D + 3 D·F); attention over ``kv`` keys costs 4 kv·NH per query
(scores and the weighted sum); the output head 2 D·V per position it is applied to; a LoRA
adapter of rank r on a [in, out] projection 2 r (in + out) per token. Norms, RoPE, softmax,
Dream's q/k/v biases and the optimizer are elementwise and left out (under 1% at 7-8B).
Shapes come from the properties every family's config answers (``width``, ``depth``,
``query_heads``, ``head_dim``, ``output_vocab``, ``projections`` by LoRA target name); a
family whose layers differ (LLaDA2: dense layers, then mixture-of-experts layers whose
projections are the ones a token runs, its top-k experts and the router among them) answers
``layer_projections`` too, one such dict per layer (``layer_shapes``).

Layer layout (``Family.peeled_ends``): LLaDA runs its first and last layers outside the
layer loop, so its last layer computes queries and MLP only for the rows the output reads
and, under LoRA, XLA drops the first layer's q/k/v input gradient; Dream scans all layers,
running every row through each and computing that gradient.

Shifted prediction (``d1jax.model.predictor.is_shifted``: Dream): position p is predicted
by row p-1, so a cached sampler step also runs the row before each recomputed position
through every layer, query-only (its keys/values stay the cache's).

Training: the backward pass of a matmul costs twice its forward (input and weight
gradients), once for a frozen weight (input gradient only: the base model under LoRA);
attention has no weights and costs twice its forward. ``remat`` recomputes the layers'
forward once more; a chunked (checkpointed) output head recomputes its forward too.
"Model" FLOPs leave recomputation out (the MFU convention); "hardware" FLOPs include it.

Shape letters: B batch, P prompt, C completion, L = P + C, D d_model, N/K query/kv heads,
H head dim, F mlp hidden, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from d1jax import sampling as smp
from d1jax.model import LoraConfig
from d1jax.objectives import registry


@dataclasses.dataclass(frozen=True)
class Forward:
    """FLOPs of forward passes split by how their backward pass is costed."""

    base: float = 0.0  # Matmuls with the (possibly frozen) model weights, head included.
    head: float = 0.0  # The part of ``base`` spent in the output head.
    lora: float = 0.0  # LoRA adapter matmuls.
    attention: float = 0.0  # Scores and weighted sums.
    # The first layer's query/key/value base matmuls (part of ``base``): under LoRA their
    # input gradient feeds only the frozen embedding, so it is not model work.
    first_qkv: float = 0.0

    @property
    def total(self) -> float:
        return self.base + self.lora + self.attention

    def __add__(self, other: "Forward") -> "Forward":
        return Forward(*(a + b for a, b in zip(dataclasses.astuple(self),
                                               dataclasses.astuple(other))))

    def scale(self, k: float) -> "Forward":
        return Forward(*(k * a for a in dataclasses.astuple(self)))


def estimator_rows(grpo, completion: int | None = None) -> int:
    """Rows the log-prob estimate of a ``GRPOConfig`` runs per completion (its objective's
    record, ``Objective.estimator_rows``): beside classifier-free guidance's 2, coupled-GRPO's
    three masked copies, SPG's J noisy copies, JustGRPO's exact AR likelihood one per
    completion position (``completion`` required; its FLOPs are ``ar_estimator``'s)."""
    return registry.get(grpo.objective).estimator_rows(grpo, completion)


def projection_shapes(cfg) -> dict[str, tuple[int, int]]:
    """[in, out] of each block projection (the family's LoRA target names)."""
    return cfg.projections


def layer_shapes(cfg) -> list[dict[str, tuple[int, int]]]:
    """Per layer, [in, out] of each projection a token runs through: the config's
    ``layer_projections`` where its layers differ (LLaDA2), else ``projections`` in every
    layer."""
    per_layer = getattr(cfg, "layer_projections", None)
    layers = [projection_shapes(cfg)] * cfg.depth if per_layer is None else list(per_layer)
    if len(layers) != cfg.depth:
        raise ValueError(f"layer_projections has {len(layers)} layers, depth is {cfg.depth}")
    return layers


# The first layer's query/key/value projections (LLaDA2 fuses them: query_key_value).
_FIRST_QKV = ("q_proj", "k_proj", "v_proj", "query_key_value")


def forward(cfg, batch: int, q_len: int, kv_len: int, head_positions: int,
            lora: LoraConfig | None = None, last_rows: int | None = None,
            query_only: int = 0) -> Forward:
    """One forward of ``batch`` sequences: ``q_len`` positions through every layer,
    attending to ``kv_len`` keys, the head on ``head_positions`` of them. ``last_rows``: the
    last layer computes keys and values for all positions but queries, attention output
    and MLP only for that many (``LLaDA``'s full forward with a sliced output).
    ``query_only``: rows more that every layer runs without keys and values (queries,
    attention, output projection and MLP: a shifted predictor's cached step, the row
    before each recomputed one)."""
    layers = layer_shapes(cfg)
    n_layers = len(layers)
    kv_side = ("k_proj", "v_proj")
    rows = (q_len if last_rows is None else last_rows)

    def per_token(shapes, names, adapter: bool):
        if adapter and lora is None:
            return 0
        return sum((2 * lora.rank * (i + o) if adapter else 2 * i * o)
                   for name, (i, o) in shapes.items()
                   if name in names and (not adapter or name in lora.targets))
    base = adapters = 0
    for index, shapes in enumerate(layers):  # keys/values on q_len rows, the rest on q_rows
        q_rows = (rows if index == n_layers - 1 else q_len) + query_only
        query = tuple(n for n in shapes if n not in kv_side)
        base += q_len * per_token(shapes, kv_side, False) + q_rows * per_token(shapes, query, False)
        adapters += q_len * per_token(shapes, kv_side, True) + q_rows * per_token(shapes, query,
                                                                                   True)
    base, adapters = batch * base, batch * adapters
    query_rows = q_len * (n_layers - 1) + rows + query_only * n_layers
    head = 2.0 * batch * head_positions * cfg.width * cfg.output_vocab
    attention = 4.0 * batch * query_rows * kv_len * cfg.query_heads * cfg.head_dim
    first_qkv = batch * (q_len * per_token(layers[0], _FIRST_QKV, False)
                         + query_only * per_token(layers[0], ("q_proj",), False))
    return Forward(base=float(base) + head, head=head, lora=float(adapters),
                   attention=attention, first_qkv=float(first_qkv))


def train_step(fwd: Forward, *, lora: bool, remat: bool, head_remat: bool,
               peeled: bool = True) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of forward + backward given the forward's split.

    Under LoRA the first layer's q/k/v input gradient is not model work (it feeds the
    frozen embedding); with ``peeled`` ends (``LLaDA``: the first layer is its own code)
    XLA drops it, inside a layer loop (Dream) the chips still run it."""
    base_bwd = 1.0 if lora else 2.0  # frozen base under LoRA: input gradients only
    dead = fwd.first_qkv if lora else 0.0
    model = fwd.base * (1 + base_bwd) + fwd.lora * 3 + fwd.attention * 3 - dead
    layers = fwd.total - fwd.head
    recompute = (layers if remat else 0.0) + (fwd.head if head_remat else 0.0)
    return model, model + recompute + (0.0 if peeled else dead)


def estimator(cfg, batch: int, prompt: int, completion: int,
              lora: LoraConfig | None = None, cfg_scale: float = 0.0, *,
              copies: int | None = None, peeled: bool = True) -> Forward:
    """d1's one-step log-prob estimator: a forward over P + C, the head on C positions, on
    ``copies`` rows per completion (``estimator_rows``; default twice the batch with
    classifier-free guidance); with ``peeled`` ends the last layer runs its queries and MLP
    on the completion only."""
    rows = batch * (copies or (2 if cfg_scale > 0 else 1))
    length = prompt + completion
    return forward(cfg, rows, length, length, completion, lora,
                   last_rows=completion if peeled else None)


def stream_estimator(cfg, batch: int, prompt: int, completion: int, copies: int,
                     lora: LoraConfig | None = None) -> Forward:
    """Block diffusion's training layout (``objectives.blockwise.copy_logps``, TraceRL's
    scoring): per row one forward over the clean sequence followed by ``copies`` noised
    copies of the completion, P + C (1 + R) positions, every key scored by the query chunks
    (the block-causal mask is applied to the scores, not to the matmuls); the head on the
    copies' R C positions."""
    length = prompt + completion * (1 + copies)
    return forward(cfg, batch, length, length, copies * completion, lora)


def ar_estimator(cfg, batch: int, prompt: int, completion: int,
                 lora: LoraConfig | None = None, *, chunk: int, peeled: bool = True) -> Forward:
    """JustGRPO's exact autoregressive log-likelihood (``objectives.justgrpo.ar_logps``): per
    row one forward over P + C per completion position (the future masked), the head on the
    one position each predicts; with ``peeled`` ends the last layer runs the ``chunk`` rows
    its forward reads. Its update (``train_step``) recomputes the whole forward, the chunks
    being rematerialised: pass ``remat=True, head_remat=True`` (and count a model that
    remats its layers once more)."""
    length = prompt + completion
    return forward(cfg, batch * completion, length, length, 1, lora,
                   last_rows=chunk if peeled else None)


def sampler(cfg, scfg, batch: int, prompt: int, lora: LoraConfig | None = None, *,
            peeled: bool = True, shifted: bool = False) -> Forward:
    """One ``generate`` call, loop-aware, every step taking only its budget of tokens
    (with ``threshold < 1`` that is the upper bound; blocks may end earlier).

    Exact: every step is a full forward (with ``peeled`` ends the last layer's queries on
    the block only), the head on the block positions that can still be masked, at the
    static widths of ``head_sizes`` (with CFG on the whole block, twice the rows). With a
    KV cache a block's first step (and each ``cache_refresh``) is a full forward; the
    others recompute the block ("dual"), the block and what follows ("prefix") or the
    masked positions ("masked"), attending to all keys, with the head on the still-masked
    ones. ``shifted`` (a shifted predictor, ``d1jax.model.predictor.is_shifted``: Dream):
    a cached step also recomputes, query-only, the row before the slice (one row) or
    before each masked position (as many rows).
    """
    if scfg.loop == "sdar":
        return block_sampler(cfg, scfg, batch, prompt, lora)
    rows = batch * (2 if scfg.cfg_scale > 0 else 1)
    total = prompt + scfg.gen_length
    blk = scfg.block_length
    budget = scfg.min_transfer()
    head_which, head_w = smp.head_sizes(scfg)
    if scfg.kv_cache == "none":
        last_rows = blk if peeled else None
        if scfg.cfg_scale > 0:  # CFG mixes two passes' logits: the head on the whole block
            return forward(cfg, rows, total, total, blk, lora, last_rows=last_rows).scale(
                scfg.num_blocks * scfg.loop_steps)
        return sum((forward(cfg, rows, total, total, head_w[head_which[i]], lora,
                            last_rows=last_rows) for i in range(scfg.loop_steps)),
                   Forward()).scale(scfg.num_blocks)
    rec_which, rec_w = smp.recompute_sizes(scfg)
    out = Forward()
    for block in range(scfg.num_blocks):
        decoded = np.concatenate([[0], np.cumsum(budget)])
        last = 0
        out = out + forward(cfg, rows, total, total, blk, lora)
        for i in range(1, scfg.loop_steps):
            if scfg.cache_refresh and decoded[i] - last >= scfg.cache_refresh:
                last = decoded[i]
                out = out + forward(cfg, rows, total, total, blk, lora)
                continue
            if scfg.recompute == "masked":
                q = rec_w[rec_which[i]]
                before = q if shifted else 0  # the row before each recomputed position
            else:
                q = blk if scfg.kv_cache == "dual" else total - (prompt + block * blk)
                before = 1 if shifted else 0  # the row before the slice
            out = out + forward(cfg, rows, q, total, head_w[head_which[i]], lora,
                                query_only=before)
    return out


def block_sampler(cfg, scfg, batch: int, prompt: int, lora: LoraConfig | None = None
                  ) -> Forward:
    """Block diffusion's sampler (``loop="sdar"``, ``d1jax.sampling.block_diffusion``): the
    prompt's whole blocks prefilled into the cache, then per denoised block at most
    ``loop_steps`` steps of the block's queries (the head on the block) and one pass writing
    its final keys/values, every query scored against the whole static buffer."""
    from d1jax.sampling.block_diffusion import layout
    blk = scfg.block_length
    start, n = layout(prompt, scfg.gen_length, blk)
    buffer = start + n * blk
    out = forward(cfg, batch, start, start, 0, lora) if start else Forward()
    per_block = (forward(cfg, batch, blk, buffer, blk, lora).scale(scfg.loop_steps)
                 + forward(cfg, batch, blk, buffer, 0, lora))
    return out + per_block.scale(n)
