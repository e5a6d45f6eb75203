"""The d1 recipe in miniature on a CPU (d1, Table 1): base -> SFT -> diffu-GRPO, evaluated.

  python -m d1jax.main --config=configs/demo_sudoku.py --workdir=/tmp/d1jax_demo

Stages, each a normal run of this package in its own sub-workdir (checkpoints, metrics,
a Hugging Face export in ``<stage>/hf``), so every one can be resumed, evaluated with
``python -m d1jax.eval`` and reused on its own:

1. ``data/``: generated 4x4 puzzles (train pool and a held-out set, none of them in d1's
   test set) and a tokenizer trained on their text, saved in the Hugging Face format.
2. ``base/``: a tiny LLaDA trained from scratch with the masked-diffusion objective on a
   corpus of puzzle conversations whose answers are partly wrong or untagged (``demo_data``):
   the stand-in base model.
3. ``sft/``: masked SFT on clean solution trajectories (d1's stage 1).
4. ``grpo_base_s{seed}/`` and ``d1_s{seed}/``: diffu-GRPO with the Sudoku reward from the
   base and from the SFT model (d1's stage 2), one run per seed.
5. ``results.json``, ``results.md`` (the table) and ``reward_curves.png``: accuracy by d1's
   rule (correct empty cells / empty cells) on the held-out puzzles and on d1's official
   4x4 test set, greedy decoding.

Rerunning the command resumes: finished stages (an ``hf`` export present) are skipped, an
interrupted one continues from its last checkpoint, evaluations already written are kept.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path

import jax
import ml_collections as mlc
import numpy as np

from d1jax import tasks as tasks_lib
from d1jax.eval import evaluate as eval_lib
from d1jax import sampling as smp
from d1jax.tasks import sudoku
from d1jax.tasks.sources import DataUnavailableError
from d1jax.model.tokenizer import load_tokenizer, train_tiny_tokenizer
from d1jax import config as config_lib
from d1jax.train import grpo, sft
from d1jax.demo import data as demo_data
from d1jax.train.rollout import uniform_prompt_length
from d1jax.train.setup import build

# ------------------------------------------------------------------------- stage configs

def _common(c: mlc.ConfigDict, demo: mlc.ConfigDict, data: dict) -> None:
    c.seed = demo.seed
    c.task.name = "sudoku"
    c.task.prompt = "compact"
    c.task.source = data["train"]
    c.task.num_train = 0
    c.model.tokenizer_path = data["tokenizer"]
    c.max_prompt_length = data["prompt_length"]
    c.mesh.shape = tuple(demo.mesh_shape)
    c.train.log_every = 1
    c.train.max_to_keep = 1
    c.train.async_checkpoints = False
    if "sft" in c:
        c.sft.tokenize = "split"


def _sft_stage(demo: mlc.ConfigDict, data: dict, p: mlc.ConfigDict, warmup: float,
               weight_decay: float) -> mlc.ConfigDict:
    """An SFT-loop run (full fine-tuning) with the demo's lengths and stage ``p``'s schedule."""
    c = config_lib.sft("tiny")
    _common(c, demo, data)
    c.lora.enabled = False
    c.sft.batch_size = p.batch_size
    c.sft.max_length = data["prompt_length"] + demo.gen_length
    c.optim.learning_rate = p.learning_rate
    c.optim.warmup_ratio = warmup
    c.optim.max_grad_norm = 1.0
    c.optim.weight_decay = weight_decay
    c.train.num_steps = p.steps
    c.train.save_every = p.save_every
    return c


def pretrain_config(demo: mlc.ConfigDict, data: dict) -> mlc.ConfigDict:
    p = demo.pretrain
    c = _sft_stage(demo, data, p, warmup=0.05, weight_decay=0.01)
    c.model.random_init = demo.model.preset
    c.model.width = demo.model.width
    c.model.n_layers = demo.model.n_layers
    c.model.vocab_size = demo.model.vocab_size
    c.sft.objective = p.objective
    c.sft.answer_noise = p.answer_noise
    c.sft.format_noise = p.format_noise
    return c


def sft_config(demo: mlc.ConfigDict, data: dict, base: Path) -> mlc.ConfigDict:
    c = _sft_stage(demo, data, demo.sft, warmup=0.0, weight_decay=0.0)
    c.model.random_init = ""
    c.model.path = str(base / "hf")
    return c


def grpo_config(demo: mlc.ConfigDict, data: dict, start: Path,
                seed: int) -> mlc.ConfigDict:
    g = demo.grpo
    c = config_lib.grpo("sudoku", "tiny")
    _common(c, demo, data)
    c.seed = seed
    c.model.random_init = ""
    c.model.path = str(start / "hf")
    c.lora.enabled = g.lora_rank > 0
    c.lora.rank = max(g.lora_rank, 1)
    c.lora.alpha = 2.0 * max(g.lora_rank, 1)
    c.lora.dropout = 0.0
    c.sampler.gen_length = demo.gen_length
    c.sampler.block_length = demo.block_length
    c.sampler.steps = demo.gen_length // 2
    c.sampler.temperature = g.temperature
    c.sampler.kv_cache = g.kv_cache
    c.sampler.threshold = g.threshold
    c.grpo.num_generations = g.num_generations
    c.grpo.prompts_per_step = g.prompts_per_step
    c.grpo.num_iterations = g.num_iterations
    c.grpo.beta = g.beta
    c.grpo.p_mask_prompt = g.p_mask_prompt
    c.grpo.ref_model_sync_steps = 64
    c.optim.learning_rate = g.learning_rate
    c.optim.eps = g.adam_eps
    c.optim.warmup_ratio = g.warmup_ratio
    c.optim.weight_decay = 0.0
    c.train.num_steps = g.steps
    c.train.save_every = g.save_every
    c.train.sample_every = 8
    return c


# ------------------------------------------------------------------------- data

def prepare_data(demo: mlc.ConfigDict, wd: Path) -> dict:
    """Train pool, held-out set and tokenizer under ``wd/data`` (kept when present).

    Also measures the prompt length in tokens, which is the same for every puzzle: each
    stage trains and generates on sequences of exactly prompt + ``gen_length`` tokens with
    no padding. (A bidirectional model sees where a sequence ends: trained on one total
    length, it misplaces the answer's closing tokens at another.)
    """
    d = wd / "data"
    d.mkdir(parents=True, exist_ok=True)
    files = {"train": str(d / "train.csv"), "heldout": str(d / "heldout.csv"),
             "tokenizer": str(d / "tokenizer")}
    task = tasks_lib.get_task("sudoku", prompt="compact")
    if not (d / "tokenizer" / "tokenizer.json").exists():
        try:
            d1_test = [r["puzzle"] for r in sudoku.load_test(subsample=None)]
        except DataUnavailableError:
            d1_test = []  # offline: nothing to exclude (and no d1 column in the table)
        empty = tuple(demo.data.num_empty)
        pool = sudoku.generate_puzzles(demo.data.num_train + demo.data.num_heldout,
                                       seed=demo.data.seed, exclude=d1_test, num_empty=empty)
        _write_csv(files["heldout"], pool[:demo.data.num_heldout])
        _write_csv(files["train"], pool[demo.data.num_heldout:])
        # Text like the base model's corpus, at fixed noise rates (not demo.pretrain's:
        # the tokenizer, and so every published demo number, stays put when those change).
        docs = demo_data.pretraining_documents(task, pool[demo.data.num_heldout:][:2000],
                                               0.3, 0, format_noise=0.5)
        texts = [m["content"] for doc in docs for m in doc["prompt"]] + [
            doc["completion"] for doc in docs]
        train_tiny_tokenizer(texts, d / "tokenizer.tmp", demo.model.tokenizer_vocab)
        (d / "tokenizer.tmp").rename(d / "tokenizer")  # present only once complete
    tok = load_tokenizer(files["tokenizer"])
    probe = sudoku.load_test(files["heldout"], subsample=None)[:64]
    length = uniform_prompt_length(tok, [task.eval_prompt(tok, ex) for ex in probe])
    return {**files, "prompt_length": length}


def _write_csv(path: str, rows: list[dict]) -> None:
    tmp = Path(path + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Puzzle", "Solution"])
        w.writerows([r["puzzle"], r["solution"]] for r in rows)
    tmp.replace(path)


# ------------------------------------------------------------------------- stages

def _finished(stage_dir: Path) -> bool:
    return (stage_dir / "hf" / "d1jax_export.json").exists()


def _run_stage(name: str, fn, cfg, stage_dir: Path, log) -> float | None:
    """Runs one stage unless its export exists; returns its wall time, None when skipped."""
    if _finished(stage_dir):
        log(f"[demo] {name}: done before, kept ({stage_dir})")
        return None
    t0 = time.perf_counter()
    log(f"[demo] {name} -> {stage_dir}")
    fn(cfg, str(stage_dir))
    if not _finished(stage_dir):  # stopped early (preempted): leave it resumable
        raise SystemExit(f"[demo] {name} stopped before its last step; rerun to resume")
    dt = time.perf_counter() - t0
    log(f"[demo] {name}: {dt:.0f} s")
    return dt


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
    ``demo.eval.samples`` completions per puzzle
    at the rollout temperature (fixed seeds), scored by the parser and by the GRPO reward:
    the policy GRPO actually trains, measured on puzzles it never saw.
    """
    c = config_lib.eval_config("sudoku-tiny")
    c.model.random_init = ""
    c.model.path = str(model_dir)
    c.task.prompt = "compact"
    c.mesh.shape = tuple(demo.mesh_shape)
    s = build(c, model_dir)
    task = tasks_lib.task_from_config(c)

    def generate(examples, temperature, seed):
        scfg = smp.SamplerConfig(
            gen_length=demo.gen_length, block_length=demo.block_length,
            steps=demo.gen_length // 2, temperature=temperature,
            mask_id=s.model_config.mask_token_id, eos_id=s.ids["eos"])
        return eval_lib.generate_texts(s, task, examples, scfg, demo.eval.batch_size,
                                       data["prompt_length"], seed=seed)

    def score(examples, texts):  # pooled over every (puzzle, completion) pair
        sc = eval_lib.score_records(task, [task.record(ex, t) for ex, t in zip(examples, texts)])
        return sc, float(np.mean(task.total_reward(texts, examples)))

    out = {}
    for name, examples in sets.items():
        texts = generate(examples, 0.0, 0)
        sc, reward = score(examples, texts)
        r = {"accuracy": sc["accuracy"], "solved": sc["solved"], "reward": reward,
             "n": len(examples), "sample": texts[0]}
        if name in demo.eval.sampled_sets and demo.eval.samples > 0:
            sampled = [t for k in range(demo.eval.samples)
                       for t in generate(examples, demo.grpo.temperature, 1000 * (k + 1))]
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


ROWS = (("base", "LLaDA-tiny (base)"), ("sft", "+SFT"), ("grpo_base", "+diffu-GRPO"),
        ("d1", "d1 (SFT + diffu-GRPO)"))


def run(config: mlc.ConfigDict, workdir: str) -> dict:
    """The whole demo; returns the results written to ``results.json``."""
    demo = config.demo
    starts = tuple(demo.grpo.starts)
    if not starts or set(starts) - {"base", "sft"}:
        raise config_lib.ConfigError(f"demo.grpo.starts={starts!r}: a non-empty subset of "
                                     "('base', 'sft')")
    if set(demo.eval.sampled_sets) - {"heldout", "d1_test"}:
        raise config_lib.ConfigError(f"demo.eval.sampled_sets={tuple(demo.eval.sampled_sets)!r}: "
                                     "a subset of ('heldout', 'd1_test')")
    g = demo.grpo  # the rollout sampler's fields, checked by the sampler itself
    config_lib.check_sampler("demo.grpo.", gen_length=demo.gen_length,
                             block_length=demo.block_length, steps=demo.gen_length // 2,
                             temperature=g.temperature, kv_cache=g.kv_cache,
                             threshold=g.threshold)
    wd = config_lib.check_workdir(workdir)
    # Every GRPO run (and evaluation) of the demo compiles the same programs: cache them.
    jax.config.update("jax_compilation_cache_dir", str(wd / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save at INFO
    log = lambda msg: print(msg, flush=True) if jax.process_index() == 0 else None
    t_start = time.perf_counter()
    data = prepare_data(demo, wd)
    times = {"base": _run_stage("pretrain (base model)", sft.run, pretrain_config(demo, data),
                                wd / "base", log)}
    times["sft"] = _run_stage("SFT", sft.run, sft_config(demo, data, wd / "base"), wd / "sft", log)
    runs: dict[str, list[Path]] = {"base": [wd / "base"], "sft": [wd / "sft"],
                                   "grpo_base": [], "d1": []}
    for seed in demo.seeds:
        for kind, start in (("grpo_base", wd / "base"), ("d1", wd / "sft")):
            if start.name not in starts:
                continue
            stage_dir = wd / f"{kind}_s{seed}"
            times[stage_dir.name] = _run_stage(
                f"diffu-GRPO from {start.name}, seed {seed}", grpo.run,
                grpo_config(demo, data, start, seed), stage_dir, log)
            runs[kind].append(stage_dir)
    sets = eval_sets(demo, data)
    evals = {}
    # Evaluations are cached per model, valid only for the settings that produced them.
    cache = wd / "eval_cache.json"
    settings = {"sets": sorted(sets), "sampled_sets": sorted(demo.eval.sampled_sets),
                "samples": demo.eval.samples, "num_examples": demo.eval.num_examples,
                "temperature": demo.grpo.temperature, "gen_length": demo.gen_length,
                "block_length": demo.block_length}
    cached = load_eval_cache(cache, settings, log)
    done = cached["models"]
    for kind, dirs in runs.items():
        for stage_dir in dirs:
            if stage_dir.name not in done:
                done[stage_dir.name] = evaluate_model(demo, data, stage_dir / "hf", sets)
                cache.write_text(json.dumps(cached, indent=1))
            evals[stage_dir.name] = done[stage_dir.name]
    results = summarize(runs, evals, list(sets))
    results["wall_time_s"] = time.perf_counter() - t_start  # this invocation
    # A rerun skips finished stages: keep the times measured when they ran, and every
    # invocation's wall time, instead of overwriting them with zeros.
    prev_path = wd / "results.json"
    prev = json.loads(prev_path.read_text()) if prev_path.exists() else {}
    prev_times = prev.get("stage_times_s", {})
    results["stage_times_s"] = {k: v if v is not None else prev_times.get(k)
                                for k, v in times.items()}
    results["invocation_wall_times_s"] = prev.get(
        "invocation_wall_times_s", [prev["wall_time_s"]] if "wall_time_s" in prev else []) + [
        results["wall_time_s"]]
    if jax.process_index() == 0:
        (wd / "results.json").write_text(json.dumps(results, indent=2))
        table = format_table(results)
        (wd / "results.md").write_text(table + "\n")
        plot_rewards(wd, demo.seeds, wd / "reward_curves.png", evals)
        log(table)
        log(f"[demo] wall time {results['wall_time_s']:.0f} s; workdir {wd}")
    return results


def summarize(runs: dict[str, list[Path]], evals: dict, set_names: list[str]) -> dict:
    """Mean and spread (std over seeds, and min..max) per row and evaluation set."""
    rows = {}
    for kind, _ in ROWS:
        if not runs[kind]:  # a GRPO start the config left out
            continue
        rows[kind] = {}
        for name in set_names:
            vals = [evals[d.name][name]["accuracy"] for d in runs[kind]]
            solved = [evals[d.name][name]["solved"] for d in runs[kind]]
            rows[kind][name] = {"mean": float(np.mean(vals)), "std": float(np.std(vals)),
                                "min": float(np.min(vals)), "max": float(np.max(vals)),
                                "values": vals, "solved_mean": float(np.mean(solved))}
            if "sampled_accuracy" in evals[runs[kind][0].name][name]:
                sampled = [evals[d.name][name]["sampled_accuracy"] for d in runs[kind]]
                rows[kind][name].update(sampled_mean=float(np.mean(sampled)),
                                        sampled_std=float(np.std(sampled)), sampled_values=sampled)
    return {"rows": rows, "sets": set_names, "per_run": evals}


_SET_TITLES = {"heldout": "held-out generated", "d1_test": "d1's 4x4 test set"}


def format_table(results: dict) -> str:
    """Mean ± std over seeds (one run for base and SFT); greedy is d1's protocol."""
    rows = results["rows"]
    cols = []  # (set, key of the mean, title)
    for s in results["sets"]:
        cols.append((s, "", f"{_SET_TITLES[s]}: greedy (d1 protocol)"))
        if "sampled_mean" in rows["base"][s]:
            cols.append((s, "sampled_", f"{_SET_TITLES[s]}: sampled, T=0.9"))
    lines = ["| model | " + " | ".join(t for *_, t in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for kind, title in ROWS:
        if kind not in rows:
            continue
        cells = []
        for s, pre, _ in cols:
            r = rows[kind][s]
            many = len(r["values"]) > 1
            cells.append(f"{r[pre + 'mean']:.1f}" + (f" ± {r[pre + 'std']:.1f}" if many else ""))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_rewards(wd: Path, seeds, out: Path, evals: dict | None = None) -> None:
    """Left: mean rollout reward per optimizer step of every GRPO run (one line per seed,
    running mean over 40 steps, drawn from step 11). Right (with ``evals``): held-out greedy
    cell accuracy of each starting model and of every GRPO run started from it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from d1jax.metrics import read_jsonl
    kinds = (("grpo_base", "base", "tab:blue", "diffu-GRPO from base"),
             ("d1", "sft", "tab:red", "d1: diffu-GRPO from SFT"))
    fig, axes = plt.subplots(1, 2 if evals else 1, figsize=(11 if evals else 7, 4),
                             squeeze=False, gridspec_kw={"width_ratios": [2, 1]} if evals else None)
    ax = axes[0, 0]
    for kind, _, color, title in kinds:
        for i, seed in enumerate(seeds):
            path = wd / f"{kind}_s{seed}" / "metrics.jsonl"
            if not path.exists():  # a GRPO start the config left out
                continue
            rows = [r for r in read_jsonl(path) if "reward" in r]
            steps = [r["step"] for r in rows]
            smooth = _smooth([r["reward"] for r in rows], 40)
            smooth[:10] = np.nan  # a mean of a few rollouts: not drawn
            ax.plot(steps, smooth, color=color, alpha=0.8, label=title if i == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("rollout reward (running mean, 40 steps)")
    ax.set_title("reward on training prompts during diffu-GRPO")
    ax.grid(alpha=0.3)
    ax.legend()
    if evals:
        ax = axes[0, 1]
        for x, (kind, start, color, _) in enumerate(kinds):
            runs = [evals[f"{kind}_s{seed}"]["heldout"]["accuracy"] for seed in seeds
                    if f"{kind}_s{seed}" in evals]
            if start not in evals or not runs:
                continue
            before = evals[start]["heldout"]["accuracy"]
            ax.plot([2 * x, 2 * x + 1], [before, np.mean(runs)], color=color, lw=2)
            ax.scatter([2 * x], [before], color=color, marker="s", zorder=3)
            ax.scatter([2 * x + 1] * len(runs), runs, color=color, zorder=3)
        ax.set_xticks(range(4), ["base", "+GRPO", "SFT", "d1"])
        ax.set_ylabel("held-out greedy cell accuracy %")
        ax.set_title("before / after diffu-GRPO (dots: seeds)")
        ax.grid(alpha=0.3)
    fig.suptitle("4x4 Sudoku, tiny LLaDA on CPU")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _smooth(values: list[float], width: int = 8) -> np.ndarray:
    v = np.asarray(values, float)
    if len(v) < 2:
        return v
    k = min(width, len(v))
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.empty_like(v)
    for i in range(len(v)):
        lo = max(0, i - k + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out
