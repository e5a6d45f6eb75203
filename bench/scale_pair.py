"""One GRPO update's loss and gradient norm on inputs d1's code reads too (bench/scale.py --pair).

Both sides hold the same bf16 base and the same float32 adapters, every value from the counter
hash (``bench.scale.hashed``; the adapters' A and B both non-zero, so the policy differs from
the base and d1's KL term is live), LoRA dropout 0 (d1's 0.05 draws masks neither side can
share), and the same batch: prompts, completions with an EOS each, advantages and, for the
first inner iteration's mask seed, the prompt mask d1jax draws (``logprob.mask_prompt``),
which ``bench/reference/scale.py --sections pair`` hands to d1's ``forward_process`` in place
of its own draw. d1jax runs its training programs (``rollout_logps``, then the first
``grpo_update``); the batch, that mask, d1jax's reference log-probs, loss and gradient norm
(before clipping) go to ``DIR/pair.npz`` for the reference to compare.
"""

from __future__ import annotations

import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.objectives import logprob
from d1jax.objectives.batch import GRPOBatch

PAIR_SEED = 11


def adapter_key(layer: int, target: str, which: str) -> str:
    """The HF/PEFT name (without ``.default.weight``) whose crc32 seeds an adapter tensor."""
    return f"model.transformer.blocks.{layer}.{target}.lora_{which}"


def hashed_adapters(params, hashed, n_layers: int) -> dict:
    """``params`` with every ``lora_a`` [n, in, r] / ``lora_b`` [n, r, out] under ``blocks``
    from ``hashed`` of PEFT's layout (A [r, in], B [out, r]) transposed, float32."""
    out = jax.tree.map(lambda x: x, params)
    for target, node in out["blocks"].items():
        if not isinstance(node, dict) or "lora_a" not in node:
            continue
        for name, which in (("lora_a", "A"), ("lora_b", "B")):
            n, d0, d1 = node[name].shape
            if n != n_layers:
                raise ValueError(f"{target}.{name} {node[name].shape}: expected {n_layers} "
                                 "stacked layers")
            seeds = np.asarray([zlib.crc32(adapter_key(i, target, which).encode())
                                for i in range(n)], np.uint32)
            node[name] = jax.jit(lambda s=seeds, d0=d0, d1=d1: jnp.swapaxes(
                hashed((n, d1, d0), s), -1, -2))()
    return out


def pair_batch(rows: int, prompt: int, gen: int, mu: int, vocab_hi: int, eos: int,
               seed: int = PAIR_SEED) -> GRPOBatch:
    """Prompts and completions of random tokens below ``vocab_hi``, each completion ended by
    an EOS at a random place and EOS after it (LLaDA pads so), random advantages."""
    rs = np.random.RandomState(seed)
    prompt_ids = rs.randint(0, vocab_hi, (rows, prompt)).astype(np.int32)
    comp = rs.randint(0, vocab_hi, (rows, gen)).astype(np.int32)
    ends = rs.randint(gen // 3, gen, rows)
    pos = np.arange(gen)[None]
    comp = np.where(pos >= ends[:, None], eos, comp).astype(np.int32)
    return GRPOBatch(prompt_ids=prompt_ids, prompt_mask=np.ones_like(prompt_ids),
                     completion_ids=comp,
                     completion_mask=(pos <= ends[:, None]).astype(np.int32),
                     advantages=rs.normal(size=rows).astype(np.float32),
                     mask_seeds=rs.randint(0, 2 ** 16, mu).astype(np.int32))


def run(directory: str, steps, state, batch: GRPOBatch, p_mask_prompt: float,
        mask_id: int) -> dict:
    """d1jax's side: the first update's metrics; the shared inputs written to
    ``directory/pair.npz``."""
    seed = int(batch.mask_seeds[0])
    masked = np.asarray(jax.jit(lambda x: logprob.mask_prompt(
        logprob.mask_key(seed), x, p_mask_prompt, mask_id) == mask_id)(batch.prompt_ids))
    lp = jax.device_get(steps.rollout_logps(state, batch))
    ubatch = batch.replace(**lp, iteration=np.int32(0))
    _, metrics = steps.grpo_update(state, ubatch, jax.random.key(0))
    m = {k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0}
    os.makedirs(directory, exist_ok=True)
    np.savez(os.path.join(directory, "pair.npz"), prompt_ids=batch.prompt_ids,
             completion_ids=batch.completion_ids, completion_mask=batch.completion_mask,
             advantages=batch.advantages, mask_seed=np.int64(seed), prompt_masked=masked,
             ref_logps=np.asarray(lp["ref_logps"][0], np.float32),
             loss=np.float64(m["loss"]), grad_norm=np.float64(m["grad_norm"]),
             kl=np.float64(m.get("kl", np.nan)))
    return {"mask_seed": seed, "prompt_masked_share": round(float(masked.mean()), 4),
            "completion_tokens": int(batch.completion_mask.sum()),
            "loss": m["loss"], "grad_norm": m["grad_norm"], "kl": m.get("kl")}
