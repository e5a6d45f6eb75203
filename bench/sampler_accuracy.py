"""Accuracy and speed of each sampler variant of a trained model on 4x4 Sudoku.

    python bench/sampler_accuracy.py --model-dir runs/demo_sudoku/export \
        --puzzles $D1JAX_DATA_DIR/4x4_test_sudoku.csv --png sudoku_samplers.png --out sudoku.json
    python bench/sampler_accuracy.py --model-dir DIR --puzzles CSV --num 64 --taus 0.7,0.9 \
        --repeats 1
    python bench/sampler_accuracy.py --model-dir DIR --puzzles CSV --taus 0.9 --refresh 8 \
        --rules budget,fast_dllm --reference-json ref.json   # ref.json: bench/reference/run.py, same sitting

The model is a Hugging Face LLaDA directory (config.json, *.safetensors, tokenizer). Prompts
are the CPU demo's Sudoku prompt (examples/demo/task.py: no system prompt, no <reasoning>
prefill), all of one token
length, so there is no padding. Variants: ``exact`` (no cache, tau 1), the ``prefix`` and
``dual`` KV caches, and for each tau of --taus ``{none,prefix,dual}+tau{t}`` (Fast-dLLM
parallel decoding; with --rules fast_dllm also ``...+fastdllm``: Fast-dLLM's threshold rule,
SamplerConfig.parallel_rule); temperature 0, low-confidence remasking. Per variant: d1's cell
accuracy (100 * correct cells / empty cells) and ``solved`` (% of puzzles fully right),
both also as the difference to ``exact`` in points; generated tokens/s (N * gen_length /
wall time: each variant compiled and run once, then the best of --repeats passes over all
N puzzles, the variants interleaved within each round so that they share the machine's
load) and ``speedup_vs_exact``; model evaluations per generated token (the sampler's
``block_steps``: a cached variant's full forward at each block start and its cheaper
block forwards count alike), and per block the mean of them (``block_steps_mean``). With
--reference-json (what ``bench/reference/run.py`` printed in this sitting),
``speedup_vs_reference``: median tokens/s over the reference exact sampler's on bench-tiny's
workload (its speed does not depend on the weights; the JSON says whether this run's shape
matches it). Prints one JSON object; --png plots accuracy against tokens/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from common import device_name, load_reference  # noqa: E402  (bench/common.py)
from sampler import compile_mode  # noqa: E402  (bench/sampler.py)
from d1jax import sampling as smp
from d1jax import sharding, tasks
from d1jax.eval.score import percentages, score_records  # noqa: E402
from d1jax.model import LLaDA  # noqa: E402
from d1jax.model.llada import weights  # noqa: E402
from d1jax.model.tokenizer import load_tokenizer, special_ids  # noqa: E402
from d1jax.run.build import Setup  # noqa: E402
from d1jax.tasks import sudoku  # noqa: E402
from d1jax.model.tokenizer import encode_prompts, uniform_prompt_length  # noqa: E402
from examples.demo import task as demo_task  # noqa: E402  (the demo's models' prompt)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def load(model_dir: str, dtype: str = "float32") -> Setup:
    """Tokenizer, model and params of an HF-layout directory, batch sharded over all devices."""
    mesh, rules = sharding.make_mesh(), sharding.DEFAULT_RULES
    mcfg, params = weights.load_hf_checkpoint(model_dir, mesh=mesh, dtype=DTYPES[dtype],
                                              rules=rules)
    tok = load_tokenizer(model_dir)
    model = LLaDA(mcfg, dtype=DTYPES[dtype], param_dtype=DTYPES[dtype])
    return Setup(mesh, rules, tok, model, mcfg, params, special_ids(tok))


KV_MODES = {"none": ("none", "block"), "prefix": ("prefix", "block"), "dual": ("dual", "block"),
            "dual_masked": ("dual", "masked")}  # name -> (kv_cache, recompute)
# Parallel-decoding threshold rule -> variant name suffix. "budget": unmask at least the exact
# schedule's tokens per step; "fast_dllm": at least one, plus every token above tau.
RULES = {"budget": "", "fast_dllm": "+fastdllm"}


def variants(taus, refreshes=(), rules=("budget",)
             ) -> dict[str, tuple[str, str, float, int, str]]:
    """Variant name -> (kv_cache, recompute, threshold, cache_refresh, parallel_rule)."""
    out = {"exact": ("none", "block", 1.0, 0, "budget")}
    out.update({kv: (*KV_MODES[kv], 1.0, 0, "budget")
                for kv in ("prefix", "dual", "dual_masked")})
    for rule in rules:
        sfx = RULES[rule]
        for tau in taus:
            out.update({f"{kv}+tau{tau:g}{sfx}": (*KV_MODES[kv], tau, 0, rule) for kv in KV_MODES})
        for r in refreshes:
            if rule == "budget":  # tau 1: no parallel decoding, so no rule to vary
                out[f"dual+refresh{r}"] = ("dual", "block", 1.0, r, rule)
            out.update({f"{kv}+tau{tau:g}+refresh{r}{sfx}": (*KV_MODES[kv], tau, r, rule)
                        for kv in ("dual", "dual_masked") for tau in taus})
    return out


def sampler_config(name: str, variant: tuple, **base) -> smp.SamplerConfig:
    """The SamplerConfig of a ``variants()`` entry; ``base``: the fields all variants share."""
    kv, recompute, tau, refresh, rule = variant
    rule_field = {} if rule == "budget" else {"parallel_rule": rule}
    known = {f.name for f in dataclasses.fields(smp.SamplerConfig)}
    if rule_field and "parallel_rule" not in known:
        raise ValueError(f"variant {name!r} needs SamplerConfig.parallel_rule={rule!r}, which this "
                         "d1jax does not have yet: drop fast_dllm from --rules")
    return smp.SamplerConfig(**base, kv_cache=kv, recompute=recompute, threshold=tau,
                             cache_refresh=refresh, **rule_field)


def run(model_dir: str, puzzles: str, num: int = 256, gen_length: int = 32,
        block_length: int = 32, steps: int | None = None, batch_size: int = 64,
        taus=(0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99), repeats: int = 3,
        dtype: str = "float32", s: Setup | None = None, refreshes=(),
        prompt_length: int | None = None, only=(), rules=("budget",),
        reference: dict | None = None) -> dict:
    """The benchmark's result (see the module docstring); ``s``: an already loaded model;
    ``prompt_length``: left-pad every prompt to this many tokens (masked out of attention);
    ``only``: keep these variant names (``exact`` always runs); ``rules``: threshold rules
    (RULES); ``reference``: bench/reference/run.py's JSON from this sitting."""
    s = s or load(model_dir, dtype)
    task = tasks.get_task(demo_task.NAME)
    examples = sudoku.load_test(puzzles, subsample=None)[:num]
    n, bs = len(examples), min(batch_size, len(examples))
    texts = [task.eval_prompt(s.tokenizer, ex) for ex in examples]
    own = uniform_prompt_length(s.tokenizer, texts)
    if prompt_length is not None and prompt_length < own:
        raise ValueError(f"--prompt-length {prompt_length} is shorter than the prompts' {own} "
                         "tokens")
    ids, mask = encode_prompts(s.tokenizer, texts + texts[-1:] * (-n % bs), prompt_length or own)
    put = lambda a: jax.device_put(a, sharding.batch_sharding(s.mesh, 2, s.rules))
    padded = bool(mask.min() == 0)
    batches = [(put(ids[i:i + bs]), put(mask[i:i + bs]) if padded else None)
               for i in range(0, len(ids), bs)]
    names = variants(taus, refreshes, rules)
    unknown = set(only) - set(names)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; these exist: {sorted(names)}")
    if only:
        names = {m: v for m, v in names.items() if m == "exact" or m in only}
    cfgs = {name: sampler_config(
        name, v, gen_length=gen_length, block_length=block_length,
        steps=steps or gen_length // 2, temperature=0.0, remasking="low_confidence",
        mask_id=s.model_config.mask_token_id, eos_id=s.ids["eos"]) for name, v in names.items()}
    compile_s, times, outs = time_variants(s, cfgs, batches, repeats)
    rows = {}
    for m, cfg in cfgs.items():
        comp = np.concatenate([np.asarray(o.ids) for o in outs[m]])[:n, ids.shape[1]:]
        steps_run = np.stack([np.asarray(o.block_steps) for o in outs[m]])  # [batches, blocks]
        completions = s.tokenizer.batch_decode(comp, skip_special_tokens=False)
        sc = percentages(score_records(
            [task.record(ex, t) for ex, t in zip(examples, completions)], task))
        rows[m] = {"kv_cache": cfg.kv_cache, "recompute": cfg.recompute, "threshold": cfg.threshold,
                   "cache_refresh": cfg.cache_refresh, "parallel_rule": names[m][4],
                   "accuracy": sc["accuracy"], "solved": sc["solved"],
                   "tokens_per_s": n * gen_length / min(times[m]),
                   "tokens_per_s_median": n * gen_length / statistics.median(times[m]),
                   "wall_s": min(times[m]), "compile_s": compile_s[m],
                   "forwards_per_token": float(steps_run.sum(1).mean()) / gen_length,
                   "block_steps_mean": [round(float(v), 2) for v in steps_run.mean(0)]}
    add_comparisons(rows, reference)
    cfg = cfgs["exact"]
    return {"model_dir": str(model_dir), "puzzles": str(puzzles), "device": device_name(),
            "num": n, "prompt_length": int(ids.shape[1]), "gen_length": gen_length,
            "block_length": block_length, "steps": cfg.steps, "batch_size": bs,
            "repeats": repeats, "dtype": dtype,
            **(reference_facts(reference, ids.shape[1], cfg) if reference else {}),
            "variants": rows}


def time_variants(s: Setup, cfgs: dict, batches: list, repeats: int
                  ) -> tuple[dict[str, float], dict[str, list[float]], dict[str, list]]:
    """Compile seconds, wall seconds of each pass over all batches, and the last pass's
    outputs, per variant; each round runs every variant once (load changes hit all alike).
    Variants with equal configs (``dual`` and ``dual+tau1``: tau 1 decodes nothing in
    parallel) share one compiled program and its compile seconds; each is timed on its own."""
    fns, rng = smp.model_fns(s.model), jax.random.key(0)
    with sharding.activate(s.mesh, s.rules):
        programs = {cfg: None for cfg in cfgs.values()}
        for cfg in programs:
            programs[cfg] = compile_mode(fns, s.params, *batches[0], cfg)
        compiled = {m: programs[cfg] for m, cfg in cfgs.items()}
        times, outs = {m: [] for m in cfgs}, {}
        for _ in range(repeats):
            for m, (fn, _, _) in compiled.items():
                t0 = time.perf_counter()
                outs[m] = jax.block_until_ready([fn(s.params, b, bm, rng) for b, bm in batches])
                times[m].append(time.perf_counter() - t0)
    return {m: c[1] for m, c in compiled.items()}, times, outs


def add_comparisons(rows: dict, reference: dict | None) -> None:
    """Adds each variant's differences to ``exact`` (and speed-up over the reference), and
    rounds the row's floats."""
    ex = rows["exact"]
    ref_tokens_per_s = reference_tokens_per_s(reference) if reference else None
    for r in rows.values():
        r.update(speedup_vs_exact=r["tokens_per_s"] / ex["tokens_per_s"],
                 accuracy_vs_exact=r["accuracy"] - ex["accuracy"],
                 solved_vs_exact=r["solved"] - ex["solved"])
        if ref_tokens_per_s:
            r["speedup_vs_reference"] = r["tokens_per_s_median"] / ref_tokens_per_s
    for r in rows.values():
        r.update({k: round(v, 1 if k.startswith("tokens") else 4) + 0.0  # + 0.0: no -0.0
                  for k, v in r.items() if isinstance(v, float)})


def reference_tokens_per_s(reference: dict) -> float:
    """The reference exact sampler's generated tokens/s over its median generate() time."""
    ref = reference["sampler"]
    return ref["batch"] * ref["gen_length"] / statistics.median(ref["times_s"])


def reference_facts(reference: dict, prompt_length: int, cfg: smp.SamplerConfig) -> dict:
    """The reference's tokens/s, workload, and whether this run's shape matches it."""
    ref = reference["sampler"]
    shape = {"prompt_len": prompt_length, "gen_length": cfg.gen_length,
             "block_length": cfg.block_length, "steps": cfg.steps}
    return {"reference_tokens_per_s": round(reference_tokens_per_s(reference), 1),
            "reference_workload": {k: ref[k] for k in ("batch", *shape)},
            "reference_workload_matches": all(ref[k] == v for k, v in shape.items())}


def plot(result: dict, path: str) -> None:
    """Accuracy against tokens/s: one line per cache mode over tau (1: no parallel decoding),
    the exact sampler (no cache, tau 1) as a star."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = result["variants"]
    key = lambda r: (r["kv_cache"], r.get("recompute", "block"), r.get("cache_refresh", 0),
                     r.get("parallel_rule", "budget"))
    lines = sorted({key(r) for r in rows.values()},
                   key=lambda k: (("none", "prefix", "dual").index(k[0]), *k[1:]))
    for kv, recompute, refresh, rule in lines:
        pts = sorted({(r["threshold"], r["tokens_per_s"], r["accuracy"])  # tau 1: no parallel
                      for r in rows.values() if key(r) == (kv, recompute, refresh, rule)})
        label = (f"{kv} cache" + (", recompute masked" if recompute == "masked" else "")
                 + (f", refresh every {refresh} tokens" if refresh else "")
                 + (", Fast-dLLM threshold rule" if rule == "fast_dllm" else ""))
        line, = ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", alpha=0.8, label=label)
        for tau, x, y in pts:
            ax.annotate(f"{tau:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=7, color=line.get_color())
    ex = rows["exact"]
    ax.plot(ex["tokens_per_s"], ex["accuracy"], "k*", ms=14, label="exact", zorder=5)
    ax.set(xlabel="generated tokens/s", ylabel="cell accuracy (%)",
           title=f"4x4 Sudoku, {result['num']} puzzles, gen {result['gen_length']}, "
                 f"block {result['block_length']}, {result['steps']} steps (labels: tau)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rule_names(text: str) -> list[str]:
    """--rules' comma-separated names, checked against RULES."""
    names = [r for r in text.split(",") if r]
    unknown = set(names) - set(RULES)
    if unknown:
        raise ValueError(f"--rules {text!r}: unknown {sorted(unknown)}; use {sorted(RULES)}")
    return names


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True, help="HF-layout LLaDA directory")
    p.add_argument("--puzzles", required=True, help="CSV with Puzzle,Solution columns")
    p.add_argument("--num", type=int, default=256, help="first N puzzles of the CSV")
    p.add_argument("--gen-length", type=int, default=32)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--steps", type=int, default=None, help="default gen_length // 2")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--taus", default="0.5,0.6,0.7,0.8,0.9,0.95,0.99")
    p.add_argument("--refresh", default="",
                   help="comma-separated cache_refresh values: adds dual (+ each tau) variants "
                        "that refresh the cache after that many decoded tokens")
    p.add_argument("--prompt-length", type=int, default=None,
                   help="left-pad the prompts to this many tokens (bench-tiny's workload: 64)")
    p.add_argument("--only", default="",
                   help="comma-separated variant names to run (exact always runs)")
    p.add_argument("--rules", default="budget",
                   help="comma-separated threshold rules for the tau variants: budget, fast_dllm "
                        "(adds ...+fastdllm variants)")
    p.add_argument("--reference-json",
                   help="bench/reference/run.py's JSON from this sitting: adds speedup_vs_reference")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--png", help="write the accuracy-vs-speed plot here")
    p.add_argument("--out", help="also write the JSON here")
    a = p.parse_args(argv)
    result = {"load_average_1m_at_start": round(os.getloadavg()[0], 2),
              **run(a.model_dir, a.puzzles, a.num, a.gen_length, a.block_length, a.steps,
                    a.batch_size, [float(t) for t in a.taus.split(",")], a.repeats, a.dtype,
                    refreshes=[int(r) for r in a.refresh.split(",") if r],
                    prompt_length=a.prompt_length, only=[m for m in a.only.split(",") if m],
                    rules=rule_names(a.rules),
                    reference=load_reference(a.reference_json) if a.reference_json else None),
              "load_average_1m": round(os.getloadavg()[0], 2)}
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if a.png:
        plot(result, a.png)
    return result


if __name__ == "__main__":
    main()
