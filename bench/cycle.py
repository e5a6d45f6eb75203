"""One diffu-GRPO cycle as d1jax's training loop runs it, beside the same cycle of d1's code.

    bench/reference/setup.sh                           # once: the PyTorch reference
    python bench/cycle.py --rounds 3 --out cycle.json  # first run: trains the model (below)
    python bench/cycle.py --model-dir DIR --reference-json ref.json   # reuse both

A cycle is what one rollout costs in d1's Algorithm 1 at mu = 4: 8 completions (4 prompts
x G = 2) of gen 128 in blocks of 32 with 64 steps at temperature 0 from prompts left-padded
to 64 tokens, the old and the reference log-probs for all 4 mask seeds, then 4 updates
(full fine-tuning, AdamW with d1's settings, gradient clipping at 0.2, beta 0.04,
p_mask_prompt 0.15). d1jax runs it with the training loop's own pieces: ``GRPOEngine``'s
``rollout`` (jitted sampler, decoding and Sudoku rewards, group advantages, the one jitted
old/ref program) and ``update`` (the jitted GRPO step), on a Sudoku run config; once with
the exact sampler and once with ``SamplerConfig.fast()`` (dual KV cache refreshed every 8
tokens, parallel decoding at tau 0.99).

The model is docs/fast_sampler.md's "trained bench-tiny-shaped model" (bench-tiny's
shape, vocabulary 8192, trained through the CPU demo's data, base and SFT stages: 150 +
1,300 steps), built on the first run into --cache-dir and reused after (about 45 minutes
of a quiet 2-core CPU; --model-dir takes an existing one). Parallel decoding needs a
trained model: on random weights no token reaches tau. The exact sampler's cost does not
depend on the weights.

The reference (``bench/reference/run.py --sections cycle``, in its own venv) runs the same
cycle with LLaDA's ``generate()`` and d1's ``_get_per_token_logps`` and ``compute_loss``
on bench-tiny with random weights: its cost does not depend on the weights either. Each
round runs the reference in a child process, then d1jax's cycles, so that both share the
machine's load. Ratios: the reference's median cycle seconds over d1jax's, over all
rounds (> 1: d1jax is faster). Prints a markdown table and one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]

PROMPTS, G, MU = 4, 2, 4  # 8 completions per rollout, mu = 4 updates
WORKLOAD = dict(prompt_length=64, gen_length=128, block_length=32, steps=64, temperature=0.0)
# d1's diffu-GRPO settings (the reference's, bench/reference/run.py).
D1 = dict(beta=0.04, epsilon=0.5, p_mask_prompt=0.15, learning_rate=3e-6, weight_decay=0.1,
          max_grad_norm=0.2)
# docs/fast_sampler.md's model: the CPU demo's command with these overrides.
TRAINED_RECIPE = {"model.preset": "bench-tiny", "model.width": 0, "model.n_layers": 0,
                  "model.vocab_size": 8192, "sampler.gen_length": 128, "seeds": (),
                  "pretrain.steps": 150, "sft.steps": 1300}
SAMPLERS = ("exact", "fast")
PARTS = ("generate_s", "score_s", "old_ref_logps_s", "updates_s", "total_s")
REFERENCE_PARTS = ("generate_s", "old_logps_s", "ref_logps_s", "updates_s", "total_s")


# ----------------------------------------------------------------------------- the model
def demo_recipe(sft_steps: int = TRAINED_RECIPE["sft.steps"]):
    """The demo config's ``demo`` group with TRAINED_RECIPE applied."""
    from examples.demo import config as demo_config
    config = demo_config.get_config(None)
    with config.unlocked():
        for path, value in {**TRAINED_RECIPE, "sft.steps": sft_steps}.items():
            *parents, leaf = path.split(".")
            node = config.demo
            for p in parents:
                node = node[p]
            node[leaf] = value
    return config.demo


def model_workdir(cache_dir: str, sft_steps: int) -> Path:
    """The demo workdir of the recipe's model (another one for a shorter SFT)."""
    name = "bench-tiny-sudoku"
    return Path(cache_dir) / (name if sft_steps == TRAINED_RECIPE["sft.steps"]
                              else f"{name}-sft{sft_steps}")


def trained_model(cache_dir: str, sft_steps: int, log) -> tuple[Path, dict]:
    """(HF directory of the SFT model, the demo's data files): the demo's data, base and
    SFT stages (no GRPO runs, no evaluations), each run once; an interrupted one resumes."""
    from examples.demo import data as demo_data
    from examples.demo import run as demo_run

    demo, wd = demo_recipe(sft_steps), model_workdir(cache_dir, sft_steps)
    data = demo_data.prepare_data(demo, wd)
    if not (wd / "sft" / "hf" / "d1jax_export.json").exists():
        log(f"training the model in {wd} (once: reruns reuse it)")
        demo_run._train_stages(demo, data, wd, log)  # the demo's stages, seeds=() in the recipe
    return wd / "sft" / "hf", data


def run_config(model_dir: Path, data: dict, sampler: str):
    """The GRPO run config of the cycle: the demo's Sudoku GRPO stage from ``model_dir``
    with the workload's lengths, d1's settings and full fine-tuning."""
    from examples.demo import config as demo_config
    c = demo_config.grpo_config(demo_recipe(), data, model_dir.parent, seed=0)
    c.model.path, c.model.tokenizer_path = str(model_dir), ""  # its own tokenizer
    c.lora.enabled = False
    c.max_prompt_length = WORKLOAD["prompt_length"]
    s = c.sampler
    s.gen_length, s.block_length = WORKLOAD["gen_length"], WORKLOAD["block_length"]
    s.steps, s.temperature = WORKLOAD["steps"], WORKLOAD["temperature"]
    if sampler == "fast":  # SamplerConfig.fast()'s fields
        s.kv_cache, s.threshold, s.cache_refresh, s.parallel_rule = "dual", 0.99, 8, "budget"
    else:
        s.kv_cache, s.threshold, s.cache_refresh = "none", 1.0, 0
    g = c.grpo
    g.prompts_per_step, g.num_generations, g.num_iterations = PROMPTS, G, MU
    g.beta, g.epsilon, g.p_mask_prompt = D1["beta"], D1["epsilon"], D1["p_mask_prompt"]
    c.optim.learning_rate, c.optim.weight_decay = D1["learning_rate"], D1["weight_decay"]
    c.optim.max_grad_norm = D1["max_grad_norm"]
    c.train.num_steps = 1_000_000
    return c


# ----------------------------------------------------------------------------- d1jax's side
class Ours:
    """One GRPOEngine (the training loop's rollout and update) per sampler, compiled."""

    def __init__(self, model_dir: Path, data: dict, samplers: list[str], cycles: int, log):
        from d1jax.run import spec as spec_lib
        from d1jax.run.build import build

        from d1jax.train.engine import GRPOEngine
        self.engines, self.steps = {}, {}
        for name in samplers:
            spec = spec_lib.from_config(run_config(model_dir, data, name))
            setup = build(spec, tempfile.mkdtemp(prefix="d1jax-cycle-"), spec.mesh.build())
            self.engines[name], self.steps[name] = GRPOEngine(spec, setup), 0
        self.task = spec.task.build()
        pool = list(self.task.load_train(spec.task.source))
        self.groups = [pool[i * PROMPTS:(i + 1) * PROMPTS] for i in range(cycles)]
        self.facts = {"compile_and_first_cycle_s": {}}
        for name in samplers:  # compiles every program
            t0 = time.perf_counter()
            self.cycle(name, self.groups[0])
            self.facts["compile_and_first_cycle_s"][name] = round(time.perf_counter() - t0, 2)
            log(f"d1jax {name} cycle compiled")

    def cycle(self, name: str, prompts: list[dict]) -> dict:
        """One rollout of the prompts (each G times), then MU updates: seconds by part."""
        from d1jax.train import rollout
        eng = self.engines[name]
        t0 = time.perf_counter()
        batch, m, _ = eng.rollout(self.task, rollout.repeat_examples(prompts, G),
                                  self.steps[name] // MU)
        updates = 0.0
        for it in range(MU):
            updates += eng.update(batch, it, self.steps[name])["time_update"]
            self.steps[name] += 1
        total = time.perf_counter() - t0
        return {"generate_s": round(m["time_generate"], 4), "score_s": round(m["time_score"], 4),
                "old_ref_logps_s": round(m["time_old_ref_logps"], 4),
                "updates_s": round(updates, 4), "total_s": round(total, 4),
                "completion_length": m["completion_length"]}

    def round(self) -> dict[str, list[dict]]:
        """Every sampler's cycles on the same prompt groups, samplers interleaved."""
        out = {name: [] for name in self.engines}
        for prompts in self.groups:
            for name in self.engines:
                out[name].append(self.cycle(name, prompts))
        return out


# ----------------------------------------------------------------------------- the reference
def reference_python(ref_dir: str) -> str:
    python = os.path.join(ref_dir, "venv", "bin", "python")
    if not os.path.exists(python):
        raise SystemExit(f"the PyTorch reference is not built in {ref_dir}: run "
                         f"bench/reference/setup.sh {ref_dir} first (docs/benchmarks.md)")
    return python


def run_reference(ref_dir: str, cycles: int, device: str = "cpu") -> dict:
    """One ``bench/reference/run.py --sections cycle`` in the reference's venv."""
    cmd = [reference_python(ref_dir), os.path.join(HERE, "reference", "run.py"), "--ref-dir", ref_dir,
           "--sections", "cycle", "--cycle-runs", str(cycles), "--cycle-mu", str(MU),
           "--device", device]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the reference failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def load_reference_cycle(path: str) -> dict:
    with open(path) as f:
        ref = json.load(f)
    if "cycle" not in ref:
        raise SystemExit(f"{path} has no cycle: pass what bench/reference/run.py printed "
                         "with the cycle section")
    return ref


# ----------------------------------------------------------------------------- summary
def medians(cycles: list[dict], parts) -> dict[str, float]:
    return {k: round(statistics.median(c[k] for c in cycles), 4) for k in parts}


def summarize(reference: list[dict], ours: dict[str, list[dict]]) -> dict:
    """Median seconds by part on each side over all rounds, and the speed-ups."""
    ref = medians(reference, REFERENCE_PARTS)
    ref["old_ref_logps_s"] = round(statistics.median(
        c["old_logps_s"] + c["ref_logps_s"] for c in reference), 4)
    out = {"reference_s": ref}
    for name, cycles in ours.items():
        mine = medians(cycles, PARTS)
        out[name] = {"d1jax_s": mine,
                     "speedup": round(ref["total_s"] / mine["total_s"], 2),
                     "speedup_by_part": {k: round(ref[k] / mine[k], 2) for k in (
                         "generate_s", "old_ref_logps_s", "updates_s")},
                     "share_of_total": {k: round(mine[k] / mine["total_s"], 3)
                                        for k in PARTS[:-1]},
                     "completion_length_mean": round(statistics.mean(
                         c["completion_length"] for c in cycles), 1)}
    return out


def table(summary: dict, ranges: dict) -> str:
    """Markdown: one row per part; each side's range of round medians and the ratio."""
    names = [n for n in SAMPLERS if n in summary]
    head = "| part | PyTorch reference, s | " + " | ".join(
        f"d1jax {n}, s | ratio" for n in names) + " |"
    lines = [head, "|---|---|" + "---|---|" * len(names)]
    labels = {"generate_s": "generate (8 completions)", "score_s": "decode + rewards",
              "old_ref_logps_s": "old + reference log-probs, mu = 4",
              "updates_s": "4 updates", "total_s": "**cycle**"}
    for k, label in labels.items():
        cells = [ranges["reference"].get(k, "n/a")]
        for n in names:
            ratio = summary[n]["speedup"] if k == "total_s" else summary[n][
                "speedup_by_part"].get(k)
            cells += [ranges[n][k], "n/a" if ratio is None else f"{ratio:.2f}x"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def round_ranges(rounds: list[list[dict]], parts) -> dict[str, str]:
    """Per part, the range of the rounds' medians, as text."""
    out = {}
    for k in parts:
        meds = [statistics.median(c[k] for c in r) for r in rounds if r]
        lo, hi = f"{min(meds):.3g}", f"{max(meds):.3g}"
        out[k] = lo if lo == hi else f"{lo}-{hi}"
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref-dir", default=os.path.join(tempfile.gettempdir(), "d1jax-ref"),
                   help="what bench/reference/setup.sh built (default: $TMPDIR/d1jax-ref)")
    p.add_argument("--reference-json", nargs="+", default=[],
                   help="bench/reference/run.py outputs (with the cycle) from this sitting, "
                        "used instead of running the reference")
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "d1jax-bench"),
                   help="where the trained model is built once and then reused")
    p.add_argument("--sft-steps", type=int, default=TRAINED_RECIPE["sft.steps"],
                   help="SFT steps of the recipe's model (default: docs/fast_sampler.md's "
                        "1,300); another count is trained and cached apart")
    p.add_argument("--model-dir", help="an existing trained model (HF directory with its "
                   "tokenizer, from the recipe above) instead of --cache-dir's")
    p.add_argument("--samplers", default=",".join(SAMPLERS), help="exact,fast or one of them")
    p.add_argument("--rounds", type=int, default=3, help="alternating reference/d1jax rounds")
    p.add_argument("--cycles", type=int, default=2, help="timed cycles per side and round")
    p.add_argument("--reference-device", default="cpu",
                   help="torch device of the reference: cpu, or cuda beside d1jax on a GPU")
    p.add_argument("--out", help="also write the JSON here")
    a = p.parse_args(argv)
    samplers = [s for s in a.samplers.split(",") if s]
    if not samplers or set(samplers) - set(SAMPLERS):
        p.error(f"--samplers {a.samplers!r}: exact, fast or both")
    if not a.reference_json:
        reference_python(a.ref_dir)  # stops with the setup command when it is not built

    from bench import common  # jax loads only once the arguments are good
    log = lambda msg: print(f"[cycle] {msg}", file=sys.stderr, flush=True)
    if a.model_dir:
        model_dir, data = Path(a.model_dir), demo_data_files(a.cache_dir, a.sft_steps)
    else:
        model_dir, data = trained_model(a.cache_dir, a.sft_steps, log)
    ours = Ours(model_dir, data, samplers, a.cycles, log)

    refs = [load_reference_cycle(f) for f in a.reference_json]
    ref_rounds, our_rounds, loads = [], [], []
    for i in range(a.rounds):
        if not a.reference_json:
            refs.append(run_reference(a.ref_dir, a.cycles, a.reference_device))
        if i < len(refs):
            ref_rounds.append(refs[i]["cycle"]["cycles"])
        our_rounds.append(ours.round())
        loads.append(round(os.getloadavg()[1], 2))  # 5-minute: spans the round's two halves
        log(f"round {i + 1}/{a.rounds} done, load {loads[-1]}")
    summary = summarize([c for r in ref_rounds for c in r],
                        {n: [c for r in our_rounds for c in r[n]] for n in samplers})
    ranges = {"reference": round_ranges(ref_rounds, REFERENCE_PARTS)}
    ranges["reference"]["old_ref_logps_s"] = round_ranges(
        [[{"x": c["old_logps_s"] + c["ref_logps_s"]} for c in r] for r in ref_rounds],
        ["x"])["x"]
    for n in samplers:
        ranges[n] = round_ranges([r[n] for r in our_rounds], PARTS)
    text = table(summary, ranges)
    result = {"machine": common.machine(), "rounds": a.rounds, "cycles_per_round": a.cycles,
              "load_average_5m_rounds": loads,
              "command": "python bench/cycle.py " + " ".join(argv or sys.argv[1:]),
              "workload": {**WORKLOAD, "completions": PROMPTS * G, "prompts": PROMPTS, "G": G,
                           "mu": MU, "updates": MU, **D1},
              "model_dir": str(model_dir), "sft_steps": a.sft_steps, "summary": summary,
              "reference_env": refs[-1].get("env", {}), "facts": ours.facts,
              "reference_rounds": ref_rounds, "ours_rounds": our_rounds, "table": text}
    print(text)
    out = json.dumps(result, indent=1)
    print(out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(out + "\n")
    return result


def demo_data_files(cache_dir: str, sft_steps: int) -> dict:
    """The demo's puzzle files (prompts for the rollouts), made once in --cache-dir."""
    from examples.demo import data as demo_data
    return demo_data.prepare_data(demo_recipe(sft_steps), model_workdir(cache_dir, sft_steps))


if __name__ == "__main__":
    main()
