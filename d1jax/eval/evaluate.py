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
from d1jax.eval import score
from d1jax.model.tokenizer import encode_prompts
from d1jax.run import context
from d1jax.run import lock as lock_lib
from d1jax.run import oom
from d1jax.run.build import build
from d1jax.run.spec import RunSpec, with_tokens


def generate_texts(s, task, examples, scfg: smp.SamplerConfig, batch_size: int,
                   prompt_length: int, seed: int = 0) -> list[str]:
    """Completions (special tokens kept, as d1 decodes them) for ``examples``."""
    gen = smp.make_generate_fn(smp.model_fns(s.model), scfg,
                               s.model_config.max_sequence_length)
    prompts = [task.eval_prompt(s.tokenizer, ex) for ex in examples]
    put = lambda a: jax.device_put(a, sharding.batch_sharding(s.mesh, 2, s.rules))
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        n = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch_size - n)  # fixed shapes: one compile
        ids, mask = encode_prompts(s.tokenizer, chunk, prompt_length)
        with sharding.activate(s.mesh, s.rules):
            res = gen(s.params, put(ids), put(mask), jax.random.key(seed + i))
        comp = sharding.gather_all(res.ids)[:n, prompt_length:]
        out.extend(s.tokenizer.batch_decode(comp, skip_special_tokens=False))
    return out


def evaluate(spec: RunSpec, s, task, examples, workdir: Path) -> list[dict]:
    """Generates at each configured length; writes d1-layout JSON; returns one
    ``score.score_records`` summary per length (with setup, gen_length, wall_time_s)."""
    e = spec.eval
    lengths = [len(s.tokenizer(task.eval_prompt(s.tokenizer, ex), add_special_tokens=False)
                   ["input_ids"]) for ex in examples]
    plen = max(lengths)
    check_positions(s, task.name, plen, lengths.index(plen), [c.gen_length for c in e.samplers],
                    e.samplers[0].block_length)
    results = []
    for scfg in e.samplers:
        scfg = with_tokens(scfg, s.ids)
        gl, steps = scfg.gen_length, scfg.steps
        t0 = time.perf_counter()
        with oom.named(f"eval sampler (gen_length {gl})", lambda: oom.hint(spec, "eval sampler")):
            texts = generate_texts(s, task, examples, scfg, e.batch_size, plen, spec.seed)
        wall = time.perf_counter() - t0
        records = [task.record(ex, t) for ex, t in zip(examples, texts)]
        setup = f"{task.name}_{e.model_name}_{gl}_{steps}"
        results.append({"setup": setup, "gen_length": gl, "wall_time_s": wall,
                        **score.score_records(records, task)})
        if jax.process_index() == 0:
            (workdir / f"{setup}_0_generations.json").write_text(json.dumps({
                "generations": records, "metrics": {"wall_time": wall,
                                                    "total_processed": len(records)},
                "model_path": spec.model.path, "gen_length": gl, "diffusion_steps": steps,
                "block_length": scfg.block_length}, indent=2))
    return results


def check_positions(s, task: str, prompt_length: int, index: int, gen_lengths: list[int],
                    block: int) -> None:
    """ConfigError before any sampler compiles when the longest prompt plus the longest
    ``eval.gen_lengths`` exceeds the model's positions (d1 truncates no eval prompt)."""
    from d1jax.config import ConfigError
    from d1jax.model import family as family_lib
    limit, gl = s.model_config.max_sequence_length, max(gen_lengths)
    if prompt_length + gl <= limit:
        return
    field = family_lib.of(s.model).fields["length"][0]
    most = (limit - prompt_length) // block * block  # a gen length is whole blocks
    fits = tuple(g for g in gen_lengths if g <= most) or (most,)
    todo = (f"lower eval.gen_lengths to at most {most} (whole sampler.block_length {block} "
            f"blocks), e.g. --config.eval.gen_lengths='{fits}'" if most > 0 else
            f"the prompt leaves {max(limit - prompt_length, 0)}, less than one sampler."
            f"block_length {block} block: use a model with more positions, or a test set "
            "(task.source) without that example")
    raise ConfigError(
        f"eval: {task}'s longest prompt (example {index}) is {prompt_length} tokens, and "
        f"eval.gen_lengths {gl} needs {prompt_length} + {gl} = {prompt_length + gl} positions; "
        f"the model has {limit} ({field}): {todo}")


def run(config, workdir: str) -> list[dict]:
    """The evaluation a config describes; writes accuracy.json and the table, accuracy.md."""
    spec, wd = context.prepare(config, workdir)
    try:  # an out-of-memory error ends in one line (an eval sampler's, or the weights')
        with oom.named("model setup", lambda: oom.hint(spec, "model setup")):
            return _evaluate_and_write(spec, wd)
    finally:  # the workdir's lock (context.prepare; process 0's), as a loop's close() does
        held = lock_lib.held(wd)
        if held is not None:
            held.release()


def _check_same_model(spec: RunSpec, wd: Path) -> None:
    """An evaluation workdir holds one model's results: refuses before anything is generated
    when an earlier *_generations.json there names another model path (it would be
    overwritten, and accuracy.json would mix the two)."""
    for path in sorted(wd.glob("*_generations.json")):
        try:
            earlier = json.loads(path.read_text()).get("model_path")
        except (OSError, ValueError, AttributeError):
            continue
        if (earlier or "") != (spec.model.path or ""):
            from d1jax.config import ConfigError
            raise ConfigError(
                f"workdir {wd} holds an evaluation of model_path={earlier!r} ({path.name}); "
                f"this one is of {spec.model.path!r}: use another --workdir, or move its "
                "*_generations.json and accuracy.* away first")


def _evaluate_and_write(spec: RunSpec, wd: Path) -> list[dict]:
    _check_same_model(spec, wd)
    task = spec.task.build()
    examples = list(task.load_test(spec.task.source))
    if spec.eval.num_examples:
        examples = examples[:spec.eval.num_examples]
    s = build(spec, wd, spec.mesh.build(), texts=lambda: [
        m["content"] for ex in examples[:256] for m in task.build_eval_messages(ex)])
    results = evaluate(spec, s, task, examples, wd)
    table = score.format_table(results)
    if jax.process_index() == 0:
        by_length = {str(r["gen_length"]): score.percentages(r) for r in results}
        (wd / "accuracy.json").write_text(json.dumps(by_length, indent=2))
        (wd / "accuracy.md").write_text(table + "\n")
        print(table, flush=True)
    return results
