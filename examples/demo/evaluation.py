"""The demo's evaluations: each exported stage on held-out puzzles and d1's test set."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import ml_collections as mlc
import numpy as np

from d1jax.eval import evaluate as eval_lib
from d1jax.eval.score import percentages, score_records
from d1jax.run import spec as spec_lib
from d1jax.run.build import build
from d1jax.tasks import DataUnavailableError, sudoku
from examples.demo import config as demo_config


def eval_sets(demo: mlc.ConfigDict, data: dict) -> dict[str, list[dict]]:
    """Held-out generated puzzles and d1's official 4x4 test set (d1's 256 subset)."""
    sets = {"heldout": sudoku.load_test(data["heldout"], subsample=None)[:demo.eval.num_examples]}
    try:
        sets["d1_test"] = sudoku.load_test()[:demo.eval.num_examples]
    except DataUnavailableError as e:
        print(f"[demo] d1's test set is unavailable ({e}); reporting held-out only", flush=True)
    return sets


def evaluate_model(demo: mlc.ConfigDict, data: dict, model_dir: Path,
                   sets: dict[str, list[dict]]) -> dict[str, dict]:
    """Accuracy of one exported model on each evaluation set, two ways.

    ``accuracy``: d1's protocol (greedy, steps = gen_length / 2), d1's parser.
    ``sampled_accuracy`` / ``sampled_reward`` (for the sets in ``demo.eval.sampled_sets``):
    ``demo.eval.samples`` completions per puzzle at the rollout temperature (fixed seeds),
    scored by the parser and by the GRPO reward: the policy GRPO actually trains, measured
    on puzzles it never saw.
    """
    spec = spec_lib.from_config(demo_config.eval_config(demo, model_dir))
    s = build(spec, model_dir, spec.mesh.build())
    task = spec.task.build()
    greedy = spec_lib.with_tokens(spec.eval.samplers[0], s.ids)

    def generate(examples, temperature, seed):
        scfg = dataclasses.replace(greedy, temperature=temperature)
        return eval_lib.generate_texts(s, task, examples, scfg, spec.eval.batch_size,
                                       data["prompt_length"], seed=seed)

    def score(examples, texts):  # pooled over every (puzzle, completion) pair
        records = [task.record(ex, t) for ex, t in zip(examples, texts)]
        return (percentages(score_records(records, task)),
                float(np.mean(task.total_reward(texts, examples))))

    out = {}
    for name, examples in sets.items():
        texts = generate(examples, 0.0, 0)
        sc, reward = score(examples, texts)
        r = {"accuracy": sc["accuracy"], "solved": sc["solved"], "reward": reward,
             "n": len(examples), "sample": texts[0]}
        if name in demo.eval.sampled_sets and demo.eval.samples > 0:
            sampled = [t for k in range(demo.eval.samples)
                       for t in generate(examples, demo.sampler.temperature, 1000 * (k + 1))]
            sc, reward = score(examples * demo.eval.samples, sampled)
            r.update(sampled_accuracy=sc["accuracy"], sampled_reward=reward)
        out[name] = r
    return out


def load_eval_cache(path: Path, settings: dict, log) -> dict:
    """``{"settings": ..., "models": {stage: evaluation}}`` from ``path`` when it was made with
    exactly ``settings``; otherwise (absent, older layout, other settings) an empty cache."""
    cached = json.loads(path.read_text()) if path.exists() else {}
    if cached.get("settings") == settings:
        return cached
    if cached:
        log(f"[demo] {path.name} was made with other evaluation settings: re-evaluating")
    return {"settings": settings, "models": {}}


def eval_settings(demo: mlc.ConfigDict, sets: dict[str, list[dict]]) -> dict:
    """What an evaluation depends on besides the model: the sampler, the counts, and each
    set's puzzles (a digest: ``demo.data.box_needed`` swaps the held-out set)."""
    digest = {name: hashlib.sha256("\n".join(ex["puzzle"] for ex in examples).encode())
              .hexdigest()[:16] for name, examples in sets.items()}
    return {"sets": sorted(sets), "sampled_sets": sorted(demo.eval.sampled_sets),
            "samples": demo.eval.samples, "num_examples": demo.eval.num_examples,
            "temperature": demo.sampler.temperature, "gen_length": demo.sampler.gen_length,
            "block_length": demo.sampler.block_length, "puzzles": digest}


def evaluate_all(demo: mlc.ConfigDict, data: dict, runs: dict[str, list[Path]], wd: Path,
                 log) -> tuple[dict, list[str]]:
    """Evaluations of every stage in ``runs`` (cached per model in ``eval_cache.json``,
    valid only for the settings that produced them) and the names of the sets."""
    sets = eval_sets(demo, data)
    cache = wd / "eval_cache.json"
    cached = load_eval_cache(cache, eval_settings(demo, sets), log)
    done, evals = cached["models"], {}
    for dirs in runs.values():
        for stage_dir in dirs:
            if stage_dir.name not in done:
                done[stage_dir.name] = evaluate_model(demo, data, stage_dir / "hf", sets)
                cache.write_text(json.dumps(cached, indent=1))
            evals[stage_dir.name] = done[stage_dir.name]
    return evals, list(sets)
