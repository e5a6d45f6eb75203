"""The d1 recipe in miniature on a CPU (d1, Table 1): base -> SFT -> diffu-GRPO, evaluated.

  python -m examples.demo --config=configs/demo_sudoku.py --workdir=/tmp/d1jax_demo

Stages, each an ordinary d1jax run (``d1jax.train.sft.run``, ``d1jax.train.grpo.run``) in
its own sub-workdir (checkpoints, metrics, a Hugging Face export in ``<stage>/hf``), so
every one can be resumed, evaluated (``python -m examples.demo`` with an eval config, see
``__main__``) and reused on its own:

1. ``data/``: generated 4x4 puzzles (train pool and a held-out set, none of them in d1's
   test set) and a tokenizer trained on their text, saved in the Hugging Face format.
2. ``base/``: a tiny LLaDA trained from scratch with the masked-diffusion objective on a
   corpus of puzzle conversations whose answers are partly wrong or untagged (``data``):
   the stand-in base model.
3. ``sft/``: masked SFT on clean solution trajectories (d1's stage 1).
4. ``grpo_base_s{seed}/`` and ``d1_s{seed}/``: diffu-GRPO with the Sudoku reward from the
   base and from the SFT model (d1's stage 2), one run per seed; with more
   ``demo.grpo.objectives``, ``{objective}_{base,sft}_s{seed}/`` for each (wd1, SPG,
   coupled-GRPO), on the same rollout and update budget.
5. ``results.json``, ``results.md`` (the tables) and ``reward_curves.png``: accuracy by d1's
   rule (correct empty cells / empty cells) on the held-out puzzles and on d1's official
   4x4 test set, greedy decoding; and per GRPO row the mechanism its metrics.jsonl logged
   (equal-reward groups, within-group reward spread, KL, clipped tokens: ``report.mechanism``).

Rerunning the command resumes: finished stages (an ``hf`` export present) are skipped, an
interrupted one continues from its last checkpoint, evaluations already written are kept.

SIGTERM or Ctrl-C stops the demo at the first safe point, in one line and a non-zero exit: in
a stage's training loop, that stage saves and stops (d1jax/run/interrupt.py; exit 75 for
SIGTERM, 130 for Ctrl-C); a signal that came during a stage's last step lets it finish and
starts no other stage; elsewhere (data, setup, evaluation: nothing unsaved) it exits at once.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
from pathlib import Path

import jax
import ml_collections as mlc

from d1jax import config as config_lib
from d1jax.run import interrupt
from d1jax.run import spec as spec_lib
from d1jax.train import grpo, sft
from examples.demo import config as demo_config
from examples.demo import data as demo_data
from examples.demo import evaluation, report


def finished(stage_dir: Path) -> bool:
    """Whether a stage ran to its last step (its Hugging Face export is written last)."""
    return (stage_dir / "hf" / "d1jax_export.json").exists()


# Exit code of a demo stopped by SIGTERM between stages: train.stopped_exit_code's default
# (EX_TEMPFAIL, "rerun me"), as a stage stopped inside its loop exits.
STOPPED_EXIT_CODE = 75


def stop_if_asked(where: str) -> None:
    """Ends the demo (one line, exit 75 or 130) when a stage's loop was asked to stop: a signal
    during a stage's last step let it finish, and must not start the next stage."""
    reason = interrupt.requested()
    if reason:
        print(f"[demo] {reason}: stopped {where}; rerun the same command to resume",
              file=sys.stderr, flush=True)
        raise SystemExit(interrupt.CTRL_C_EXIT if reason == "Ctrl-C" else STOPPED_EXIT_CODE)


def _run_stage(name: str, fn, cfg, stage_dir: Path, log) -> float | None:
    """Runs one stage unless its export exists; returns its wall time, None when skipped."""
    if finished(stage_dir):
        log(f"[demo] {name}: done before, kept ({stage_dir})")
        return None
    stop_if_asked(f"before {name}")
    t0 = time.perf_counter()
    log(f"[demo] {name} -> {stage_dir}")
    fn(cfg, str(stage_dir))
    if not finished(stage_dir):  # stopped early (preempted): leave it resumable
        raise SystemExit(f"[demo] {name} stopped before its last step; rerun to resume")
    dt = time.perf_counter() - t0
    log(f"[demo] {name}: {dt:.0f} s")
    stop_if_asked(f"after {name} (finished, kept)")
    return dt


def _train_stages(demo: mlc.ConfigDict, data: dict, wd: Path, log
                  ) -> tuple[dict[str, list[Path]], dict[str, float | None]]:
    """Base, SFT and every GRPO run: (stage dirs per table row, wall time per stage)."""
    def pretrain(cfg, stage_wd):  # the corpus is built only when the stage runs
        return sft.run(cfg, stage_wd, data=demo_data.pretraining_corpus(demo, data))
    times = {"base": _run_stage("pretrain (base model)", pretrain,
                                demo_config.pretrain_config(demo, data), wd / "base", log)}
    def fine_tune(cfg, stage_wd):
        return sft.run(cfg, stage_wd, data=demo_data.sft_corpus(demo, data))
    times["sft"] = _run_stage("SFT", fine_tune, demo_config.sft_config(demo, data, wd / "base"),
                              wd / "sft", log)
    runs: dict[str, list[Path]] = {"base": [wd / "base"], "sft": [wd / "sft"]}
    for seed in demo.seeds:
        for objective in demo.grpo.objectives:
            for start in ("base", "sft"):
                if start not in demo.grpo.starts:
                    continue
                stage_dir = wd / demo_config.stage_name(objective, start, seed)
                times[stage_dir.name] = _run_stage(
                    f"{objective} from {start}, seed {seed}", grpo.run,
                    demo_config.grpo_config(demo, data, wd / start, seed, objective),
                    stage_dir, log)
                runs.setdefault(demo_config.row_kind(objective, start), []).append(stage_dir)
    return runs, times


def _with_times(results: dict, times: dict, wd: Path) -> dict:
    """A rerun skips finished stages: keep the times measured when they ran, and every
    invocation's wall time, instead of overwriting them with zeros."""
    prev_path = wd / "results.json"
    prev = json.loads(prev_path.read_text()) if prev_path.exists() else {}
    prev_times = prev.get("stage_times_s", {})
    results["stage_times_s"] = {k: v if v is not None else prev_times.get(k)
                                for k, v in times.items()}
    results["invocation_wall_times_s"] = prev.get(
        "invocation_wall_times_s", [prev["wall_time_s"]] if "wall_time_s" in prev else []) + [
        results["wall_time_s"]]
    return results


def run(config: mlc.ConfigDict, workdir: str) -> dict:
    """The whole demo; returns the results written to ``results.json``."""
    demo = config.demo
    demo_config.check(demo)
    interrupt.clear_requested()  # a stop asked before this run (a notebook) is not for it
    s = demo.sampler  # every GRPO stage's rollout sampler: checked before any stage runs
    spec_lib.sampler_config(s, "demo.sampler.", s.gen_length, s.steps)
    wd = config_lib.check_workdir(workdir)
    # Every GRPO run (and evaluation) of the demo compiles the same programs: cache them.
    jax.config.update("jax_compilation_cache_dir", str(wd / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save at INFO
    log = lambda msg: print(msg, flush=True) if jax.process_index() == 0 else None
    t_start = time.perf_counter()
    plot = importlib.util.find_spec("matplotlib") is not None
    if not plot:  # said before the work, not found after it: the table needs no plot
        log("[demo] matplotlib is not installed (pip install -e \".[demo]\"): the demo writes "
            "its table without the reward plot")
    data = demo_data.prepare_data(demo, wd)
    runs, times = _train_stages(demo, data, wd, log)
    evals, set_names = evaluation.evaluate_all(demo, data, runs, wd, log)
    results = report.summarize(runs, evals, set_names, demo.grpo.num_iterations)
    results.update(report.provenance())
    results["sft_corpus"] = demo.sft.corpus  # which SFT data (and so which docs block)
    results["rollout_temperature"] = demo.sampler.temperature  # the sampled columns
    results["wall_time_s"] = time.perf_counter() - t_start  # this invocation
    results = _with_times(results, times, wd)
    if jax.process_index() == 0:
        (wd / "results.json").write_text(json.dumps(results, indent=2))
        table = report.results_table(results)
        if any("mechanism" in r for r in results["rows"].values()):
            table += "\n\n" + report.mechanism_table(results)
        (wd / "results.md").write_text(table + "\n")
        if plot:
            report.plot_rewards(wd, runs, wd / "reward_curves.png", evals,
                                mu=demo.grpo.num_iterations)
        log(table)
        log(f"[demo] wall time {results['wall_time_s']:.0f} s; workdir {wd}")
    return results
