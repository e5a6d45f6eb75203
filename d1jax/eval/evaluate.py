"""d1's evaluation protocol: generate for a test set, write d1's generation JSON, score it.

  python -m d1jax.eval --config=configs/eval.py:sudoku --config.model.path=/path/to/LLaDA \
      --workdir=runs/eval_sudoku

Protocol (d1 eval/eval.py): gen lengths 128/256/512, block 32, steps = gen_length / 2,
temperature 0, low-confidence remasking, prompt = eval chat template + "<reasoning>",
generations decoded with special tokens kept. Files are named like d1's
(``{task}_{model}_{gen_length}_{steps}_0_generations.json``) so ``python -m d1jax.eval.score``
and d1's own parser read them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np

from d1jax import sampling as smp
from d1jax import sharding
from d1jax import tasks as tasks_lib
from d1jax.train import loop, rollout
from d1jax.train.setup import build


def generate_texts(s, task, examples, scfg: smp.SamplerConfig, batch_size: int,
                   prompt_length: int, seed: int = 0) -> list[str]:
    """Completions (special tokens kept, as d1 decodes them) for ``examples``."""
    gen = smp.make_generate_fn(smp.llada_fns(s.model), scfg,
                               s.model_config.max_sequence_length)
    prompts = [task.eval_prompt(s.tokenizer, ex) for ex in examples]
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        n = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch_size - n)  # fixed shapes: one compile
        ids, mask = rollout.encode_prompts(s.tokenizer, chunk, prompt_length)
        put = lambda a: jax.device_put(a, sharding.batch_sharding(s.mesh, 2, s.rules))
        with sharding.activate(s.mesh, s.rules):
            res = gen(s.params, put(ids), put(mask), jax.random.key(seed + i))
        comp = _all_rows(res.ids)[:n, prompt_length:]
        out.extend(s.tokenizer.batch_decode(comp, skip_special_tokens=False))
    return out


def _all_rows(x) -> np.ndarray:
    """Every row of a (possibly multi-host) global array, on every host."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def score_records(task, records) -> dict:
    """d1's pooled accuracy of generation records (``task.record``: hits / total over the
    items, %) and the share of strictly correct items (%), by the task's evaluation parser."""
    verdicts = [task.verdict(r) for r in records]
    hits, total = sum(v.hits for v in verdicts), sum(v.total for v in verdicts)
    return {"accuracy": 100.0 * hits / max(total, 1), "hits": hits, "total": total,
            "solved": 100.0 * float(np.mean([v.correct for v in verdicts]))}


def evaluate(config, s, task, examples, workdir: Path) -> dict:
    """Generates at each configured length; writes d1-layout JSON; returns accuracies."""
    e = config.eval
    model_name = e.model_name
    lengths = [int(x) for x in e.gen_lengths]
    plen = max(len(s.tokenizer(task.eval_prompt(s.tokenizer, ex), add_special_tokens=False)
                   ["input_ids"]) for ex in examples)
    results = {}
    for gl in lengths:
        steps = gl // 2
        scfg = smp.SamplerConfig(
            gen_length=gl, block_length=e.block_length, steps=steps, temperature=e.temperature,
            mask_id=s.model_config.mask_token_id, use_attention_mask=e.use_attention_mask,
            eos_id=s.ids["eos"], kv_cache=e.kv_cache, threshold=e.threshold,
            recompute=e.get("recompute", "block"), cache_refresh=e.get("cache_refresh", 0))
        t0 = time.perf_counter()
        texts = generate_texts(s, task, examples, scfg, e.batch_size, plen, config.seed)
        wall = time.perf_counter() - t0
        records = [task.record(ex, t) for ex, t in zip(examples, texts)]
        sc = score_records(task, records)
        acc = {"accuracy": sc["accuracy"], "solved": sc["solved"],
               "n": len(records), "wall_time_s": wall}
        results[gl] = acc
        if jax.process_index() == 0:
            name = f"{task.name}_{model_name}_{gl}_{steps}_0_generations.json"
            (workdir / name).write_text(json.dumps({
                "generations": records, "metrics": {"wall_time": wall, "total_processed": len(records)},
                "model_path": config.model.path, "gen_length": gl, "diffusion_steps": steps,
                "block_length": e.block_length}, indent=2))
    return results


def format_table(task_name: str, results: dict) -> str:
    lines = [f"| task | gen length | accuracy (d1 rule) | fully solved | n |", "|---|---|---|---|---|"]
    for gl, r in results.items():
        lines.append(f"| {task_name} | {gl} | {r['accuracy']:.2f} | {r['solved']:.2f} | {r['n']} |")
    return "\n".join(lines)


def run(config, workdir: str) -> dict:
    wd = loop.prepare(config, workdir)
    task = tasks_lib.task_from_config(config)
    examples = list(task.load_test(config.task.source or None))
    if config.eval.num_examples:
        examples = examples[:config.eval.num_examples]
    s = build(config, wd, texts=lambda: [m["content"] for ex in examples[:256]
                                         for m in task.build_eval_messages(ex)])
    results = evaluate(config, s, task, examples, wd)
    table = format_table(task.name, results)
    if jax.process_index() == 0:
        (wd / "accuracy.json").write_text(json.dumps({str(k): v for k, v in results.items()}, indent=2))
        (wd / "accuracy.md").write_text(table + "\n")
        print(table, flush=True)
    return results


def main():
    from absl import app

    from d1jax import main as main_lib

    app.run(main_lib.main)


if __name__ == "__main__":
    main()
