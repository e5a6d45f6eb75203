"""The CPU demo (examples/demo), shortened (configs/demo_sudoku.py:ci): base -> SFT ->
diffu-GRPO on 4x4 Sudoku through `python -m examples.demo`, then resume, evaluate and export
its workdir; its task, data and stage configs, built on d1jax's public API."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from d1jax import tasks
from d1jax.tasks import get_task, sudoku
from d1jax.train.sft_data import encode_sft
from tests.commands import D1JAX_MAIN, commands_fixture

# The commands it starts compile optimized (tests/conftest.py): its stages must learn as
# docs/demo.md measured them.
COMMANDS_OPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples/ sits beside the package, not in it
from examples.demo import config as demo_config  # noqa: E402
from examples.demo import data as demo_data  # noqa: E402
from examples.demo import evaluation as demo_eval  # noqa: E402
from examples.demo import report as demo_report  # noqa: E402
from examples.demo import table as demo_table  # noqa: E402
from examples.demo import task as demo_task  # noqa: E402


# The demo the module's fixtures run: :ci on a smaller model (width 64, 2 layers against :ci's
# 128 and 4): the same stages, steps, puzzles and assertions at about half the CPU time (83 s
# against 164 s, 2026-11-29). :ci itself (docs/demo.md's numbers, its spec snapshot) is unchanged.
SMALLER = {"model.width": 64, "model.n_layers": 2}
DEMO = ("--config=configs/demo_sudoku.py:ci",
        *(f"--config.demo.{k}={v}" for k, v in SMALLER.items()))


def demo_ci():
    """The ``config.demo`` the fixtures' runs use: :ci's with ``SMALLER``."""
    demo = demo_config.get_config("ci").demo
    for k, v in SMALLER.items():
        group, name = k.split(".")
        demo[group][name] = v
    return demo


@pytest.fixture(scope="module")
def demo_commands(tmp_path_factory):
    """``python -m examples.demo`` runs forked from one process (tests/commands.py), in
    run_main's environment."""
    yield from commands_fixture(tmp_path_factory, (*D1JAX_MAIN, "examples.demo.run"),
                                {**os.environ, "XLA_FLAGS": ""})


def run_main(*args, env=None, module="examples.demo"):
    # One CPU device: the demo is a single-core workload; 8 fake devices only slow it down.
    env = {**os.environ, "XLA_FLAGS": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=env)


@pytest.fixture(scope="module")
def interrupted_demo(tmp_path_factory):
    """The demo (``DEMO``) sent SIGTERM once its base stage has logged steps: (workdir, exit
    code, output, the stage folders and the base's checkpoint steps right after it exited)."""
    from tests.conftest import SHARED_D1
    if not SHARED_D1.is_dir():
        pytest.skip(f"d1 data folder {SHARED_D1} is absent (it sits beside the repo in CI)")
    wd = tmp_path_factory.mktemp("demo")
    p = subprocess.Popen([sys.executable, "-m", "examples.demo", *DEMO, f"--workdir={wd}"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "XLA_FLAGS": ""})
    metrics, deadline = wd / "base" / "metrics.jsonl", time.time() + 600
    while (p.poll() is None and time.time() < deadline
           and not (metrics.exists() and metrics.read_text().count("\n") >= 3)):
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=600)[0]
    ckpts = wd / "base" / "checkpoints"
    steps = sorted(int(d.name) for d in ckpts.iterdir() if d.name.isdigit()) if ckpts.is_dir() else []
    return wd, p.returncode, out, sorted(d.name for d in wd.iterdir() if d.is_dir()), steps


@pytest.fixture(scope="module")
def demo_run(interrupted_demo):
    """The same command rerun to its end: it resumes the stopped base stage."""
    wd = interrupted_demo[0]
    r = run_main(*DEMO, f"--workdir={wd}")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    return wd, r.stdout


def test_sigterm_stops_the_demo_in_its_stage_and_the_rerun_resumes_it(interrupted_demo,
                                                                       demo_run):
    """SIGTERM during the base stage: it saves and the demo exits 75 in one line, starting no
    later stage; the rerun continues the base from that checkpoint (every step logged once),
    not from scratch. (Resumed steps equal uninterrupted ones: tests/test_resume.py.)"""
    wd, code, out, dirs, steps = interrupted_demo
    assert code == 75, out[-3000:]
    assert "stopped at step" in out.strip().splitlines()[-1], out[-1000:]
    assert "[demo] SFT" not in out and "sft" not in dirs and "d1_s1" not in dirs
    n = demo_ci().pretrain.steps
    assert steps and 0 < steps[-1] < n
    rows = [json.loads(line) for line in (wd / "base" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, n + 1))


def test_a_signal_in_a_stages_last_step_starts_no_other_stage(tmp_path, monkeypatch, capsys):
    """A stop asked while a stage ends (its loop done, exporting) lets that stage finish and
    keeps the next from starting: exit 75 (SIGTERM) in one line, resumable."""
    from d1jax.run import interrupt
    from examples.demo import run as demo_main
    monkeypatch.setattr(interrupt, "_REQUESTED", "")
    ran = []

    def stage(cfg, stage_wd):  # the signal comes during the last step; the export follows
        ran.append(Path(stage_wd).name)
        interrupt.StopRequest().on_signal(signal.SIGTERM)
        (Path(stage_wd) / "hf").mkdir(parents=True)
        (Path(stage_wd) / "hf" / "d1jax_export.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        demo_main._run_stage("pretrain", stage, None, tmp_path / "base", print)
    assert e.value.code == 75 and demo_main.finished(tmp_path / "base")
    with pytest.raises(SystemExit):
        demo_main._run_stage("SFT", stage, None, tmp_path / "sft", print)
    assert ran == ["base"]
    err = capsys.readouterr().err
    assert "[demo] SIGTERM: stopped after pretrain (finished, kept); rerun" in err
    assert "[demo] SIGTERM: stopped before SFT; rerun" in err


CHILD = """import os, signal, sys, time
from pathlib import Path
flag = Path(sys.argv[sys.argv.index("--mark") + 1])
signal.signal(signal.SIGTERM, lambda *a: (flag.write_text("SIGTERM"), sys.exit(75)))
flag.write_text("started")
time.sleep(60)
"""


def test_seeds_passes_sigterm_to_the_running_demo_and_starts_no_other(tmp_path):
    """examples.demo.seeds, SIGTERM while its first run's demo runs: the demo receives it
    (here a stand-in process), the second run never starts, exit 75 in one line."""
    script = (f"import sys; from examples.demo import seeds; "
              f"seeds.demo_command = lambda c, s, v, wd, e: [sys.executable, '-c', {CHILD!r}, "
              f"'--mark', str(wd / 'mark')]; seeds.main(sys.argv[1:])")
    p = subprocess.Popen([sys.executable, "-c", script, f"--workdir={tmp_path}",
                          "--pretrain_seeds=0,1", "--variants=loop", "--jobs=1"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mark, deadline = tmp_path / "p0_loop" / "mark", time.time() + 60
    while time.time() < deadline and not mark.exists():
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=60)[0]
    assert p.returncode == 75, out
    assert mark.read_text() == "SIGTERM" and not (tmp_path / "p1_loop").exists()
    assert out.strip().splitlines()[-1].startswith("[seeds] SIGTERM: stopped; rerun"), out


def test_stages_improve_in_the_order_the_recipe_builds_them(demo_run):
    wd, _ = demo_run
    rows = json.loads((wd / "results.json").read_text())["rows"]
    # SFT on clean trajectories lifts the noisy base model on both evaluation sets (DEMO's
    # model, demo.seed 0 / 1 / 2: +27.2 / +22.6 / +23.6 held-out, +24.8 / +24.4 / +23.4 on d1's
    # test set, the base at 0; :ci's own model +10.0 / +8.4 at seed 0, docs/demo.md).
    for s in ("heldout", "d1_test"):
        assert rows["sft"][s]["mean"] > rows["base"][s]["mean"] + 5.0, rows


def test_diffu_grpo_keeps_heldout_reward_of_its_starting_checkpoint(demo_run):
    wd, _ = demo_run
    per_run = json.loads((wd / "results.json").read_text())["per_run"]
    # Mean Sudoku reward of the sampled policy (2 completions at T=0.9 for each of 64
    # held-out puzzles that no stage trained on), before and after 24 diffu-GRPO steps from
    # the SFT model. On this short single-seed run the change is noise-sized (DEMO's model,
    # demo.seed 0 / 1 / 2: base 0.000, SFT 0.270 / 0.227 / 0.220, after GRPO 0.247 / 0.234 /
    # 0.236; :ci's model 0.000, 0.267, 0.240; 2026-11-29; at 60 steps and 128 puzzles -0.005 to -0.026 over
    # seeds 0-3 with all seven LoRA targets and reference sync, -0.042 for seed 1 with d1's
    # q/k/v/up targets and the base model as reference), so the test guards against
    # collapse, not for a gain: diffu-GRPO keeps most of what SFT gained over the
    # base. Learning is tested on tests/learnable.py's task (test_train_objectives.py).
    base = per_run["base"]["heldout"]["sampled_reward"]
    before = per_run["sft"]["heldout"]["sampled_reward"]
    after = per_run["d1_s1"]["heldout"]["sampled_reward"]
    assert after - base > 0.75 * (before - base), (base, before, after)
    assert per_run["sft"]["heldout"]["sampled_reward"] > per_run["base"]["heldout"][
        "sampled_reward"] + 0.05


def test_results_table_plot_and_stage_exports(demo_run):
    wd, stdout = demo_run
    res = json.loads((wd / "results.json").read_text())
    assert res["sets"] == ["heldout", "d1_test"]
    # The ci variant runs diffu-GRPO from the SFT model only (demo.grpo.starts).
    assert set(res["rows"]) == {"base", "sft", "d1"}
    for kind in ("base", "sft", "d1"):
        for s in res["sets"]:
            row = res["rows"][kind][s]
            assert 0.0 <= row["min"] <= row["mean"] <= row["max"] <= 100.0
    table = (wd / "results.md").read_text()
    assert "d1 (SFT + diffu-GRPO)" in table and table.strip() in stdout
    assert res["commit"] != "unknown" and table.splitlines()[0] == demo_report.caption(res)
    assert "| +diffu-GRPO |" not in table
    assert (wd / "reward_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (wd / "grpo_base_s1").exists()
    # The GRPO row's mechanism (report.mechanism, checked by hand on fabricated metrics in
    # test_mechanism_summarizes_each_grpo_run_by_hand), from the run's own metrics.jsonl.
    mech = res["rows"]["d1"]["mechanism"]
    assert set(mech) == {"zero_std_ratio", "reward_std", "kl", "clip_ratio"}
    assert mech == demo_report.mechanism_row([wd / "d1_s1"], mu=2)
    for name in ("zero_std_ratio", "reward_std"):
        assert all(0.0 <= mech[name][k] <= 1.0 for k in ("mean", "first", "last"))
    assert 0.0 <= mech["kl"]["mean"] <= mech["kl"]["max"]
    assert 0.0 <= mech["clip_ratio"]["mean"] <= mech["clip_ratio"]["max"] <= 1.0
    assert demo_report.mechanism_table(res) in table and res["sft_corpus"] == "sudoku"
    for stage in ("base", "sft", "d1_s1"):
        hf = wd / stage / "hf"
        assert json.loads((hf / "config.json").read_text())["model_type"] == "llada"
        assert (hf / "model.safetensors").exists() and (hf / "tokenizer.json").exists()
        assert (wd / stage / "metrics.jsonl").exists()


NO_MATPLOTLIB = ("import importlib.util as u, runpy, sys; f = u.find_spec; "
                 "u.find_spec = lambda n, *a: None if n == 'matplotlib' else f(n, *a); "
                 "sys.modules['matplotlib'] = None; sys.argv = ['examples.demo'] + sys.argv[1:]; "
                 "runpy.run_module('examples.demo', run_name='__main__')")


def test_rerun_resumes_without_recomputing(demo_run):
    """Rerun where matplotlib is missing (`pip install -e .` without the demo extra): said in
    one line before any work, and the run still ends with its table and exit code 0."""
    wd, _ = demo_run
    before = (wd / "results.json").read_text()
    r = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, *DEMO, f"--workdir={wd}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=3600,
                       env={**os.environ, "XLA_FLAGS": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout.find("[demo] matplotlib is not installed")
    assert 0 <= said < r.stdout.find("done before, kept"), r.stdout[:1000]
    assert r.stdout.count("done before, kept") == 3  # base, SFT, d1_s1
    after = json.loads((wd / "results.json").read_text())
    assert json.loads(before)["rows"] == after["rows"]
    # The first run's measured stage times survive the rerun, which adds its own wall time.
    assert after["stage_times_s"] == json.loads(before)["stage_times_s"]
    assert min(after["stage_times_s"].values()) > 0
    assert len(after["invocation_wall_times_s"]) == 2
    assert after["invocation_wall_times_s"][0] == json.loads(before)["wall_time_s"]


def test_eval_cli_scores_the_exported_d1_model(demo_run, tmp_path):
    """d1jax's evaluation (an eval config, through the demo's command so that the demo's
    task is registered) scores the exported d1 model as the demo's own evaluation did."""
    wd, _ = demo_run
    r = run_main("--config=configs/eval.py:sudoku,tiny", f"--config.task.name={demo_task.NAME}",
                 f"--config.model.path={wd / 'd1_s1' / 'hf'}",
                 f"--config.eval.num_examples={demo_ci().eval.num_examples}",
                 "--config.sampler.block_length=32", "--config.eval.batch_size=64",
                 f"--workdir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    acc = json.loads((tmp_path / "accuracy.json").read_text())["32"]["accuracy"]
    res = json.loads((wd / "results.json").read_text())
    # Same model, same puzzles of d1's test set (its first 64), same greedy protocol.
    assert acc == pytest.approx(res["per_run"]["d1_s1"]["d1_test"]["accuracy"], abs=1e-6)


def test_sampler_gap_scores_greedy_as_the_table_and_pairs_the_two_samplers(demo_run,
                                                                          monkeypatch):
    """examples.demo.sampler_gap on the CI run's SFT export, rolling out with the shipped
    demo's fast sampler: its greedy exact reward is the table's (the same 64 held-out
    puzzles, d1's protocol), the fast and exact samples differ and the paired gap is the
    difference of their means; with :ci's own rollout sampler, the exact one, the gap is zero
    completion for completion (on 16 of the puzzles)."""
    from examples.demo import sampler_gap
    from examples.demo.data import prepare_data
    wd, _ = demo_run
    demo = demo_ci()
    assert (demo.sampler.kv_cache, demo.sampler.threshold) == ("none", 1.0)
    data = prepare_data(demo, wd)  # the run's own, kept
    exact_rollouts = demo.sampler.to_dict()
    demo.sampler.kv_cache, demo.sampler.threshold = "dual", 0.9
    fast = sampler_gap.measure(demo, data, wd / "sft" / "hf", samples=1)
    row = json.loads((wd / "results.json").read_text())["per_run"]["sft"]["heldout"]
    greedy = fast["exact, greedy (evaluation)"]
    assert greedy["completions"] == row["n"] == demo.eval.num_examples
    assert greedy["reward"] == pytest.approx(row["reward"], abs=1e-12)
    assert fast["rollout (fast)"] != fast["exact, sampled"]
    for metric in ("reward", "accuracy"):  # accuracy in points in both
        gap = fast[f"fast - exact, {metric}"]
        assert gap["se"] > 0 and gap["mean"] == pytest.approx(
            fast["rollout (fast)"][metric] - fast["exact, sampled"][metric], abs=1e-9)

    eval_sets = sampler_gap.evaluation.eval_sets
    monkeypatch.setattr(sampler_gap.evaluation, "eval_sets", lambda *a: {
        k: v[:16] for k, v in eval_sets(*a).items()})
    demo.sampler.update(exact_rollouts)
    same = sampler_gap.measure(demo, data, wd / "sft" / "hf", samples=1)
    assert same["rollout (fast)"] == same["exact, sampled"]
    assert same["rollout (fast)"]["completions"] == 16
    assert same["fast - exact, reward"] == same["fast - exact, accuracy"] == {"mean": 0.0, "se": 0.0}


@pytest.mark.parametrize("flag,field", [
    ("--config.demo.grpo.starts=('sft', 'rl')", "demo.grpo.starts"),
    ("--config.demo.sampler.kv_cache=dual2", "demo.sampler.kv_cache='dual2'"),
    ("--config.demo.eval.sampled_sets=('heldout', 'test')", "demo.eval.sampled_sets"),
    ("--config.demo.grpo.objectives=('wd1', 'ppo')", "demo.grpo.objectives"),
    ("--config.demo.pretrain.solved_depth=-1", "demo.pretrain.solved_depth=-1"),
    ("--config.demo.grpo.num_generations=1", "demo.grpo.num_generations=1: must be >= 2"),
    ("--config.demo.data.num_empty=(20, 20)", "demo.data.num_empty=(20, 20)"),
    ("--config.demo.data.num_empty=(8, 8, 8)", "demo.data.num_empty=(8, 8, 8): empty cells"),
    ("--config.demo.pretrain.latin_guess_share=1.5", "demo.pretrain.latin_guess_share=1.5")])
def test_bad_demo_switches_fail_before_any_stage_runs(tmp_path, flag, field, demo_commands):
    wd = tmp_path / "wd"
    r = demo_commands.run("examples.demo", "--config=configs/demo_sudoku.py:ci", flag,
                          f"--workdir={wd}")
    assert r.returncode != 0
    assert field in r.stderr and "Traceback" not in r.stderr
    assert not wd.exists()  # nothing written: no data, no base model


def test_pretraining_documents_are_noisy_as_configured():
    task = get_task(demo_task.NAME)
    rows = sudoku.generate_puzzles(400, seed=3)
    docs = demo_data.pretraining_documents(task, rows, noise=0.25, seed=0, format_noise=0.5)
    untagged = [(ex, d) for ex, d in zip(rows, docs) if "<answer>" not in d["completion"]]
    assert 0.4 < len(untagged) / len(docs) < 0.6
    wrong = total = 0
    for ex, d in zip(rows, docs):
        grid = "".join(c for c in d["completion"] if c.isdigit())
        for i in range(16):
            if ex["puzzle"][i] == "0":
                total += 1
                wrong += grid[i] != ex["solution"][i]
            else:
                assert grid[i] == ex["solution"][i]  # given cells are never corrupted
    assert 0.2 < wrong / total < 0.3
    # The reward reads the tagged answers and gives the untagged ones nothing.
    rewards = task.total_reward([d["completion"] for _, d in untagged], [ex for ex, _ in untagged])
    assert max(rewards) == 0.0


def _left_digits(grid: str, i: int) -> set[str]:
    """Independent of examples/demo/data.py: the digits no filled peer of cell i holds."""
    r, c = divmod(i, 4)
    row = grid[4 * r:4 * r + 4]
    col = grid[c::4]
    box = "".join(grid[4 * rr + cc] for rr in (r // 2 * 2, r // 2 * 2 + 1)
                  for cc in (c // 2 * 2, c // 2 * 2 + 1))
    return set("1234") - set(row + col + box)


def test_solver_depths_are_the_passes_of_naked_singles_and_the_writer_guesses_beyond():
    rows = sudoku.generate_puzzles(300, seed=6, num_empty=(6, 12))
    for ex in rows:
        depth = demo_data.solver_depths(ex["puzzle"])
        assert set(depth) == {i for i, d in enumerate(ex["puzzle"]) if d == "0"}
        for k in range(1, max(depth.values()) + 1):  # pass k: cells its predecessors decide
            grid = "".join(ex["solution"][i] if (ex["puzzle"][i] != "0" or depth[i] < k) else "0"
                           for i in range(16))
            assert {i for i in depth if depth[i] >= k and len(_left_digits(grid, i)) == 1} == {
                i for i in depth if depth[i] == k}
    # solved_depth=1: cells of the first pass are the solution's but for answer_noise; every
    # deeper cell is a digit the givens leave it, right about 1 / len(candidates) of the time.
    import random
    rng = random.Random(0)
    right = expected = n = wrong1 = n1 = 0
    for ex in rows:
        grid = demo_data.noisy_grid(ex["puzzle"], ex["solution"], 0.2, rng, solved_depth=1)
        for i, k in demo_data.solver_depths(ex["puzzle"]).items():
            if k == 1:
                n1 += 1
                wrong1 += grid[i] != ex["solution"][i]
            else:
                left = _left_digits(ex["puzzle"], i)
                assert grid[i] in left
                n += 1
                right += grid[i] == ex["solution"][i]
                expected += 1 / len(left)
        assert all(grid[i] == d for i, d in enumerate(ex["puzzle"]) if d != "0")
    assert abs(wrong1 / n1 - 0.2) < 0.04 and n > 500
    assert abs(right - expected) < 3 * np.sqrt(n / 4)
    # solved_depth=0 leaves every cell to answer_noise alone (the default corpus).
    same = [demo_data.noisy_grid(ex["puzzle"], ex["solution"], 0.0, rng) for ex in rows]
    assert same == [ex["solution"] for ex in rows]


def test_the_latin_guessing_writer_keeps_rows_and_columns_and_its_share():
    """latin_guess: the cells beyond the first pass are filled one by one, each a digit its
    filled row and column peers leave it; most grids come out Latin (a guess can leave a
    cell no digit), where independent guesses rarely do. latin_guess_share: that writer's
    share of the documents; 0 is the corpus as before, document for document."""
    import random
    from tests.sudoku_units import COLS, ROWS, units_ok
    latin_ok = lambda grid: units_ok(grid, ROWS + COLS)  # noqa: E731
    rows = sudoku.generate_puzzles(300, seed=6, num_empty=(8, 12))
    deep_rows = [ex for ex in rows
                 if any(k > 1 for k in demo_data.solver_depths(ex["puzzle"]).values())]
    rng = random.Random(0)
    latin = [demo_data.noisy_grid(ex["puzzle"], ex["solution"], 0.0, rng, 1, latin_guess=True)
             for ex in deep_rows]
    plain = [demo_data.noisy_grid(ex["puzzle"], ex["solution"], 0.0, rng, 1)
             for ex in deep_rows]
    for ex, grid in zip(deep_rows, latin):
        for i, k in demo_data.solver_depths(ex["puzzle"]).items():
            if k == 1:
                assert grid[i] == ex["solution"][i]
        assert all(grid[i] == d for i, d in enumerate(ex["puzzle"]) if d != "0")
    consistent = np.mean([latin_ok(g) for g in latin])
    assert len(deep_rows) > 100 and consistent > 0.7  # 0.79 here
    assert np.mean([latin_ok(g) for g in plain]) < consistent - 0.4
    task = get_task(demo_task.NAME)
    def grids(**share) -> list[str]:
        docs = demo_data.pretraining_documents(task, deep_rows, 0.0, 0, 0.0, 1, **share)
        return ["".join(c for c in d["completion"] if c.isdigit()) for d in docs]
    assert grids(latin_guess_share=0.0) == grids()
    shares = [np.mean([latin_ok(g) for g in grids(latin_guess_share=share)])
              for share in (0.0, 0.5, 1.0)]
    assert shares[0] < shares[1] < shares[2] and shares[2] > 0.7


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from d1jax.model.tokenizer import train_tiny_tokenizer
    texts = [sudoku.question(ex) for ex in sudoku.generate_puzzles(50, seed=2)] + [
        demo_task.answer("1234" * 4), "Solution:\n\n1234 3412 2143 4321\n"]
    return train_tiny_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=320)


def test_demo_task_is_d1_sudoku_with_the_question_alone(tiny_tokenizer):
    """The demo's task, by name through d1jax's registry: d1's Sudoku rewards, parser and
    data, the question alone as the prompt (no system prompt) and no <reasoning> prefill."""
    task, d1 = get_task(demo_task.NAME), get_task("sudoku")
    assert isinstance(task, demo_task.CompactSudoku) and task.name == demo_task.NAME
    ex = sudoku.generate_puzzles(1, seed=4)[0]
    user = [{"role": "user", "content": f"Solve the following Sudoku puzzle: {ex['puzzle']}\n"}]
    assert task.build_messages(ex) == task.build_eval_messages(ex) == user
    assert task.system_prompt == task.eval_system_prompt == ""
    assert task.eval_prompt(tiny_tokenizer, ex) == tiny_tokenizer.apply_chat_template(
        user, add_generation_prompt=True, tokenize=False)
    assert d1.eval_prompt(tiny_tokenizer, ex).endswith(tasks.EVAL_PREFILL)  # d1's untouched
    assert (task.reward_funcs, task.verdict, task.load_train) == (
        d1.reward_funcs, d1.verdict, d1.load_train)
    assert task.total_reward([demo_task.answer(ex["solution"])], [ex]) == [1.0]
    with pytest.raises(ValueError, match="one of d1's"):
        tasks.register_task("sudoku", demo_task.make_task)
    with pytest.raises(ValueError, match=demo_task.NAME):  # named among the choices
        get_task("sudoku_tiny")


def test_sft_corpus_is_clean_and_pretraining_noises_whole_documents(tmp_path, tiny_tokenizer):
    rows = sudoku.generate_puzzles(64, seed=5)
    path = tmp_path / "train.csv"
    demo_data.write_csv(str(path), rows)  # the demo's own train-pool writer
    clean = demo_data.sft_corpus(demo_config.get_config("ci").demo, {"train": str(path)})
    assert [ex["completion"] for ex in clean.rows] == [f"<answer>\n{r['solution']}\n</answer>"
                                                       for r in rows]
    d = demo_config.get_config("ci").demo
    d.unlock()
    d.sft.solved_depth = 1  # a writer of one pass: right where that pass fills, a guess beyond
    for ex, r in zip(demo_data.sft_corpus(d, {"train": str(path)}).rows, rows):
        grid = ex["completion"].split("\n")[1]
        first = [i for i, k in demo_data.solver_depths(r["puzzle"]).items() if k == 1]
        assert ex["completion"].startswith("<answer>") and len(grid) == 16
        assert all(grid[i] == r["solution"][i] for i in first)
    assert [ex["prompt"] for ex in clean.rows] == [get_task(demo_task.NAME).build_messages(r)
                                                   for r in rows]
    d.sft.solved_depth = 0
    d.pretrain.format_noise = 1.0  # every document untagged
    corpus = demo_data.pretraining_corpus(d, {"train": str(path)})
    assert len(corpus.rows) == 64 and corpus.encode is clean.encode is encode_sft
    assert all("<answer>" not in ex["completion"] for ex in corpus.rows)
    d.pretrain.objective = "pretrain"  # whole documents under the loss: prompt length 0
    whole = demo_data.pretraining_corpus(d, {"train": str(path)})
    enc = whole.encode(tiny_tokenizer, whole.rows[:4], 96, split=True)
    ref = encode_sft(tiny_tokenizer, whole.rows[:4], 96, split=True)
    np.testing.assert_array_equal(enc["input_ids"], ref["input_ids"])
    assert (enc["prompt_len"] == 0).all() and (ref["prompt_len"] > 0).all()


def test_eval_cache_is_reused_only_with_the_same_settings(tmp_path):
    path, logs = tmp_path / "eval_cache.json", []
    settings = {"sets": ["d1_test", "heldout"], "sampled_sets": ["heldout"], "samples": 2}
    assert demo_eval.load_eval_cache(path, settings, logs.append) == {"settings": settings,
                                                                  "models": {}}
    path.write_text(json.dumps({"settings": settings, "models": {"sft": {"heldout": {}}}}))
    assert demo_eval.load_eval_cache(path, dict(settings), logs.append)["models"] == {
        "sft": {"heldout": {}}}
    assert logs == []
    other = {**settings, "sampled_sets": ["d1_test", "heldout"]}
    assert demo_eval.load_eval_cache(path, other, logs.append) == {"settings": other, "models": {}}
    path.write_text(json.dumps({"sft": {"heldout": {}}}))  # the layout before settings
    assert demo_eval.load_eval_cache(path, settings, logs.append)["models"] == {}
    assert len(logs) == 2 and "other evaluation settings" in logs[0]


def test_demo_model_switches_give_bench_tiny_shape(tiny_tokenizer):
    """demo.model.preset / width 0 / n_layers 0 / vocab_size: the base model has BENCH.md's
    bench-tiny shape (embedding rows beyond the tokenizer's unused); a vocabulary smaller
    than the tokenizer's is refused."""
    from d1jax.model import PRESETS
    from d1jax.run import build as setup
    from d1jax.run import spec as spec_lib
    tok = tiny_tokenizer
    d = demo_config.get_config(None).demo
    d.unlock()
    d.model.preset, d.model.width, d.model.n_layers, d.model.vocab_size = "bench-tiny", 0, 0, 8192
    c = demo_config.pretrain_config(d, {"prompt_length": 43, "train": "", "tokenizer": ""})
    m = setup.random_model_config(spec_lib.from_config(c).model, tok)
    bench = PRESETS["bench-tiny"]
    for k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size", "vocab_size"):
        assert getattr(m, k) == bench[k], k
    assert m.mask_token_id < len(tok) <= 320
    c.model.vocab_size = 100
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        setup.random_model_config(spec_lib.from_config(c).model, tok)


def test_stage_configs_take_the_sampler_from_the_demo(tmp_path):
    from d1jax.run import spec as spec_lib
    d = demo_config.get_config(None).demo
    d.unlock()
    d.sampler.threshold = 0.8
    data = {"prompt_length": 43, "train": "", "tokenizer": ""}
    start = tmp_path / "sft"
    (start / "hf").mkdir(parents=True)
    grpo = spec_lib.from_config(demo_config.grpo_config(d, data, start, seed=1))
    rollout = grpo.sampler
    assert (rollout.kv_cache, rollout.threshold, rollout.temperature, rollout.steps) == (
        "dual", 0.8, 0.9, 16)
    evaluation = spec_lib.from_config(demo_config.eval_config(d, start / "hf"))
    greedy = evaluation.eval.samplers
    for spec in (grpo, evaluation):  # d1jax's loops build the demo's task from its name
        assert isinstance(spec.task.build(), demo_task.CompactSudoku)
    assert [(s.gen_length, s.steps, s.kv_cache, s.temperature) for s in greedy] == [
        (32, 16, "none", 0.0)]


def test_compare_variant_runs_every_objective_on_one_budget(tmp_path):
    """configs/demo_sudoku.py:compare: one GRPO-loop run per objective and seed from SFT, the
    rollout and update budget identical across objectives (the learning rate is each
    objective's); beta only where the objective has a reference term (wd1 and SPG refuse one)."""
    from d1jax.run import spec as spec_lib
    from d1jax.train.pure_steps import OBJECTIVES
    d = demo_config.get_config("compare").demo
    # JustGRPO's exact likelihood costs one forward per completion position (docs/objectives.md:
    # 22x diffu-GRPO's update at bench-tiny's shape): not in the demo's CPU budget. TraceRL
    # scores a block-diffusion rollout's trace (SDAR, TraDo), and EBPO's blocks need a block
    # diffusion family too, not the demo's LLaDA.
    assert set(d.grpo.objectives) == set(OBJECTIVES) - {"justgrpo", "tracerl", "ebpo"}
    assert tuple(d.grpo.starts) == ("sft",) and tuple(d.seeds) == (0, 1, 2)
    data = {"prompt_length": 43, "train": "", "tokenizer": ""}
    start = tmp_path / "sft"
    (start / "hf").mkdir(parents=True)
    budgets, names = set(), set()
    for objective in d.grpo.objectives:
        spec = spec_lib.from_config(demo_config.grpo_config(d, data, start, 0, objective))
        assert spec.grpo.objective == objective
        assert spec.grpo.beta == (0.0 if objective in ("wd1", "spg") else d.grpo.beta)
        g = spec.grpo_run
        budgets.add((g.prompts_per_step, g.num_generations, spec.grpo.num_iterations,
                     spec.train.num_steps, spec.model.lora, spec.sampler))
        lr = d.grpo.objective_learning_rate[objective] or d.grpo.learning_rate
        assert spec.optim.adamw.learning_rate == pytest.approx(lr)
        names |= {demo_config.stage_name(objective, s, 0) for s in ("base", "sft")}
    assert len(budgets) == 1
    assert len(names) == 2 * len(d.grpo.objectives) and {"d1_s0", "grpo_base_s0"} <= names


def test_reward_rise_reads_one_reward_per_rollout(tmp_path):
    """Each rollout logs its reward on its mu optimizer steps; the rise compares the last
    quarter of the rollouts with the first, its error from their spread (numpy by hand)."""
    from examples.demo import report
    rng = np.random.default_rng(0)
    runs, diffs, var = [], [], 0.0
    for seed in range(2):
        rollout = 0.3 + 0.002 * np.arange(40) + 0.05 * rng.standard_normal(40)
        d = tmp_path / f"run{seed}"
        d.mkdir()
        with open(d / "metrics.jsonl", "w") as f:
            for step in range(1, 81):  # mu = 2: steps 2k+1 and 2k+2 share rollout k
                f.write(json.dumps({"step": step, "reward": float(rollout[(step - 1) // 2]),
                                    "loss": float(step)}) + "\n")
        runs.append(d)
        diffs.append(rollout[30:].mean() - rollout[:10].mean())
        var += rollout[30:].var(ddof=1) / 10 + rollout[:10].var(ddof=1) / 10
    r = report.reward_rise(runs, mu=2)
    assert r["values"] == pytest.approx(diffs)
    assert r["mean"] == pytest.approx(np.mean(diffs))
    assert r["se"] == pytest.approx(np.sqrt(var) / 2)
    report.plot_rewards(tmp_path, {"d1": runs, "wd1_sft": runs}, tmp_path / "p.png", mu=2)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def _write_grpo_metrics(d: Path, rollout: dict, update: dict, mu: int = 2) -> None:
    """A GRPO run's metrics.jsonl as the loop writes it: each optimizer step's row holds its
    rollout's metrics (the same on its mu steps) and its own update metrics."""
    d.mkdir(parents=True)
    n = len(next(iter(rollout.values())))
    with open(d / "metrics.jsonl", "w") as f:
        for step in range(1, mu * n + 1):
            row = {"step": step, "reward": 0.5, "loss": 0.0}
            row.update({k: v[(step - 1) // mu] for k, v in rollout.items()})
            row.update({k: v[step - 1] for k, v in update.items()})
            f.write(json.dumps(row) + "\n")


def test_mechanism_summarizes_each_grpo_run_by_hand(tmp_path):
    """Equal-reward groups and within-group reward std once per rollout (first and last
    quarter), KL and clipped tokens per optimizer step (mean, max); per row the mean over
    seeds and the largest max. Expected values computed by hand."""
    from examples.demo import report
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    # 7 rollouts, mu = 2: a quarter is 1 rollout (counting each rollout twice would make it 3
    # rows of the doubled list, and change the first and last quarters).
    _write_grpo_metrics(a, {"zero_std_ratio": [1.0, 0.75, 0.5, 0.5, 0.25, 0.25, 0.0],
                            "reward_std": [0.0, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4]},
                        {"kl": [0.01 * s for s in range(1, 15)],
                         "clip_ratio": [0.5 if s == 5 else 0.0 for s in range(1, 15)]})
    _write_grpo_metrics(b, {"zero_std_ratio": [0.5] * 7, "reward_std": [0.1] * 7},
                        {"kl": [0.02] * 14, "clip_ratio": [0.0] * 14})
    _write_grpo_metrics(c, {"zero_std_ratio": [0.5] * 7, "reward_std": [0.1] * 7},
                        {"clip_ratio": [0.0] * 14})  # an objective without a KL term
    m = report.mechanism(a, mu=2)
    assert m["zero_std_ratio"] == pytest.approx({"mean": 3.25 / 7, "first": 1.0, "last": 0.0})
    assert m["reward_std"] == pytest.approx({"mean": 1.5 / 7, "first": 0.0, "last": 0.4})
    assert m["kl"] == pytest.approx({"mean": 0.075, "max": 0.14})
    assert m["clip_ratio"] == pytest.approx({"mean": 0.5 / 14, "max": 0.5})
    assert "kl" not in report.mechanism(c, mu=2)
    row = report.mechanism_row([a, b], mu=2)
    assert row["zero_std_ratio"]["first"] == pytest.approx(0.75)
    assert row["zero_std_ratio"]["last"] == pytest.approx(0.25)
    assert row["reward_std"]["last"] == pytest.approx(0.25)
    assert (row["kl"]["mean"], row["kl"]["max"]) == pytest.approx((0.0475, 0.14))
    assert (row["clip_ratio"]["mean"], row["clip_ratio"]["max"]) == pytest.approx(
        (0.25 / 14, 0.5))
    assert "kl" not in report.mechanism_row([a, c], mu=2)  # not logged by every seed
    results = {"rows": {"d1": {"mechanism": row, "reward_rise": {"mean": 0.01, "se": 0.005}}},
               "commit": "abc1234", "date": "2026-11-27"}
    line = report.mechanism_table(results).splitlines()[-1]
    assert line == ("| d1 (SFT + diffu-GRPO) | 75% -> 25% | 0.050 -> 0.250 | 0.0475 (0.1400) "
                    "| 0.0179 (0.5000) | +0.010 ± 0.005 |")
    # The multi-seed aggregate: each run's row statistics, spread over the runs.
    from examples.demo import aggregate
    runs = _fake_runs()
    for name, rows in zip(runs, ((a, b), (b,), (a,))):
        runs[name]["rows"]["d1"]["mechanism"] = {
            k: {s: v for s, v in st.items() if s != "values"}
            for k, st in report.mechanism_row(list(rows), mu=2).items()}
    res = aggregate.aggregate(runs, {"missing": []})
    zs = res["rows"]["d1"]["mechanism"]["zero_std_ratio"]
    assert zs["first"]["values"] == pytest.approx([0.75, 0.5, 1.0])
    assert res["rows"]["d1"]["mechanism"]["kl"]["max"]["max"] == pytest.approx(0.14)
    assert "mechanism" not in res["rows"]["grpo_base"]
    line = aggregate.mechanism_table(res).splitlines()[-1]
    assert line.startswith("| d1 (SFT + diffu-GRPO) | 75% -> 25% (0%..50%) | ")
    # Where each result's blocks go: a :d1like run's to its own blocks of docs/demo.md.
    assert set(demo_table.targets(results | {"sft_corpus": "latin"})[0]) == {
        "demo-d1like-table", "demo-d1like-mechanism"}
    assert set(demo_table.targets({"rows": {"d1": {}}})[0]) == {"demo-table"}
    assert "demo-seeds-mechanism" in demo_table.targets(res)[0]


def test_published_demo_tables_are_generated_from_the_published_results():
    """README's and docs/demo.md's demo tables are ``python -m examples.demo.table
    docs/demo_results.json --write`` of a clean commit's run, not hand-edited copies."""
    results = json.loads(demo_table.PUBLISHED.read_text())
    assert len(results["commit"]) == 7 and int(results["commit"], 16) >= 0, results["commit"]
    want = demo_table.block(results)
    assert results["commit"] in want.splitlines()[1]
    for doc in demo_table.DOCS:
        assert demo_table.published_block(doc.read_text()) == want, doc.name


def test_published_multi_seed_blocks_are_generated_from_the_published_results():
    """docs/demo.md's multi-seed table and the README's claims are ``python -m
    examples.demo.table <seeds workdir>/results.json --write`` of a clean commit's runs."""
    results = json.loads(demo_table.PUBLISHED_SEEDS.read_text())
    assert results["kind"] == "multi_seed" and not results["missing"]
    assert len(results["commit"]) == 7 and int(results["commit"], 16) >= 0, results["commit"]
    for name, docs in demo_table.SEEDS_BLOCKS.items():
        want = demo_table.block(results, name)
        for doc in docs:
            assert demo_table.published_block(doc.read_text(), name) == want, (doc.name, name)
    claims = demo_table.published_block(demo_table.README.read_text(), "demo-seeds-held")
    assert f"commit {results['commit']}" in claims.splitlines()[1]


def test_published_d1like_blocks_are_generated_from_the_published_results():
    """docs/demo.md's `:d1like` table and mechanism are ``python -m examples.demo.table
    docs/demo_d1like_results.json --write`` of a clean commit's run."""
    results = json.loads(demo_table.PUBLISHED_D1LIKE.read_text())
    assert results["sft_corpus"] == "latin"
    assert len(results["commit"]) == 7 and int(results["commit"], 16) >= 0, results["commit"]
    blocks, published = demo_table.targets(results)
    assert published == demo_table.PUBLISHED_D1LIKE
    assert blocks == {"demo-d1like-table": (demo_table.DEMO_DOC,),
                      "demo-d1like-mechanism": (demo_table.DEMO_DOC,)}
    for name, docs in blocks.items():
        for doc in docs:
            assert demo_table.published_block(doc.read_text(), name) == demo_table.block(
                results, name), name
    # Its multi-seed runs: their own blocks, never the ':seeds' toy's.
    seeds = json.loads(demo_table.PUBLISHED_D1LIKE_SEEDS.read_text())
    blocks, published = demo_table.targets(seeds)
    assert published == demo_table.PUBLISHED_D1LIKE_SEEDS and seeds["kind"] == "multi_seed"
    assert set(blocks) == {f"demo-d1like-seeds-{b}" for b in ("table", "claims", "runs",
                                                               "mechanism")}
    for name, docs in blocks.items():
        for doc in docs:
            assert demo_table.published_block(doc.read_text(), name) == demo_table.block(
                seeds, name), name
    begin, end = demo_table.markers("demo-d1like-seeds-mechanism")
    assert demo_table.block(seeds, "demo-d1like-seeds-mechanism") == (
        f"{begin}\n{demo_table.aggregate.mechanism_table(seeds)}\n{end}")


def test_provenance_names_this_checkout():
    p = demo_report.provenance()
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, cwd=ROOT).stdout.strip()
    assert p["commit"].split("+")[0] == head



# ------------------------------------------------------------------ the multi-seed table

def _fake_demo_results(base, sft, d1, grpo_base, rise_d1, rise_base, commit="abc1234"):
    """A demo run's results.json in summarize()'s layout: greedy accuracy per set per row
    (lists for the GRPO rows' seeds), and each GRPO row's rollout reward rise (mean, se)."""
    def row(vals, rise=None):
        vals = np.atleast_2d(np.asarray(vals, float).T).T  # [seeds, sets]
        r = {s: {"mean": float(vals[:, i].mean()), "values": vals[:, i].tolist(),
                 "reward_mean": float(vals[:, i].mean()) + 0.5}
             for i, s in enumerate(("heldout", "d1_test"))}
        r["heldout"]["sampled_mean"] = float(vals[:, 0].mean()) - 1.0
        if rise is not None:
            r["reward_rise"] = {"mean": rise[0], "se": rise[1], "values": [rise[0]]}
        return r
    return {"rows": {"base": row([base]), "sft": row([sft]), "grpo_base": row(grpo_base, rise_base),
                     "d1": row(d1, rise_d1)},
            "sets": ["heldout", "d1_test"], "commit": commit, "date": "2026-11-26",
            "device": "cpu", "jax": "0.10.2", "wall_time_s": 1.0}


def _fake_runs():
    from examples.demo import aggregate
    runs = {
        # base, SFT, d1 seeds, diffu-GRPO-from-base seeds: [(held-out, d1 test), ...]
        "p0_unrolled": _fake_demo_results((28, 27), (42, 44), [(44, 45), (46, 47)],
                                          [(30, 29), (30, 31)], (0.05, 0.01), (0.01, 0.01)),
        "p0_loop": _fake_demo_results((30, 29), (48, 49), [(52, 53), (50, 51)],
                                      [(29, 30), (31, 30)], (0.02, 0.02), (-0.01, 0.01)),
        "p1_unrolled": _fake_demo_results((26, 27), (40, 41), [(41, 42), (40.5, 41.5)],
                                          [(27, 28), (29, 28)], (0.03, 0.01), (0.02, 0.005)),
    }
    return {k: {"pretrain_seed": int(k[1]), "variant": k.split("_")[1],
                **aggregate.run_summary(v)} for k, v in runs.items()}


def test_multi_seed_rows_are_mean_and_spread_of_each_runs_row_mean():
    """Each run counts once per row (its mean over GRPO seeds); the spread is over runs,
    checked against numpy on the inputs by hand."""
    from examples.demo import aggregate
    res = aggregate.aggregate(_fake_runs(), {"missing": []})
    d1 = res["rows"]["d1"]["heldout"]["greedy"]
    want = [45.0, 51.0, 40.75]
    assert d1["values"] == pytest.approx(want)
    assert (d1["mean"], d1["std"], d1["min"], d1["max"]) == pytest.approx(
        (np.mean(want), np.std(want), 40.75, 51.0))
    gain = res["rows"]["d1"]["d1_test"]["gain"]["values"]
    assert gain == pytest.approx([46 - 44, 52 - 49, 41.75 - 41])
    base_gain = res["rows"]["grpo_base"]["heldout"]["gain"]["values"]  # over the base
    assert base_gain == pytest.approx([30 - 28, 30 - 30, 28 - 26])
    rise = res["rows"]["d1"]["reward_rise"]
    assert rise["values"] == pytest.approx([0.05, 0.02, 0.03]) and rise["above_2se"] == 2
    assert res["rows"]["sft"]["heldout"]["sampled"]["values"] == pytest.approx([41, 47, 39])
    assert (res["commit"], res["device"]) == ("abc1234", "cpu")


def test_sampled_columns_name_the_rollout_temperature():
    """The sampled evaluations run at the rollout temperature: the tables say which (results
    written before it was recorded ran at the demo's 0.9)."""
    from examples.demo import aggregate
    one = _fake_demo_results((28, 27), (42, 44), [(44, 45)], [(30, 29)], (0.05, 0.01),
                             (0.01, 0.01))
    assert "held-out: sampled, T=0.9 |" in demo_report.results_table(one)
    assert "held-out: sampled, T=1.5 |" in demo_report.results_table(
        {**one, "rollout_temperature": 1.5})
    runs = _fake_runs()
    assert "held-out: sampled, T=0.9 |" in aggregate.seeds_table(
        aggregate.aggregate(runs, {"missing": []}))
    runs["p0_loop"]["rollout_temperature"] = 1.5
    assert "held-out: sampled, T=0.9/1.5 |" in aggregate.seeds_table(
        aggregate.aggregate(runs, {"missing": []}))


def test_multi_seed_claims_are_those_that_hold_in_every_run():
    from examples.demo import aggregate
    res = aggregate.aggregate(_fake_runs(), {"missing": []})
    held = {c["claim"]: c for c in res["claims"]}
    assert held["d1's ordering: d1 (SFT + diffu-GRPO) > SFT > base"]["all"]
    assert held["SFT > diffu-GRPO from the base (SFT beats RL from the base)"]["all"]
    assert not held["diffu-GRPO from the base > SFT (RL from the base beats SFT)"]["count"]
    # From the base: +2 / 0 / +2 held-out; the tie in run p0_loop breaks "on every set".
    assert held["diffu-GRPO from the base > base"]["held"] == [True, False, True]
    assert held["d1 (SFT + diffu-GRPO): rollout reward rises by more than 2 s.e."]["count"] == 2
    assert held["diffu-GRPO from the base: rollout reward rises (last quarter > first)"][
        "count"] == 2
    # Issue 60's: held-out, by more than 2 s.e. of the difference over the GRPO seeds (by
    # hand: d1 45 +- 1.0 / 51 +- 1.0 / 40.75 +- 0.25 against SFT 42 / 48 / 40; from the base
    # 30 +- 0 / 30 +- 1.0 / 28 +- 1.0 against 28 / 30 / 26, the last by exactly 2 s.e.).
    two_se = lambda c: held[c + " by more than 2 s.e. (held-out)"]["held"]  # noqa: E731
    assert held["d1 > SFT by more than 2 s.e. of the GRPO seeds (held-out)"]["held"] == [
        True, True, True]
    assert two_se("diffu-GRPO from the base > base") == [True, False, False]
    assert two_se("d1 > diffu-GRPO from the base") == [True, True, True]
    assert two_se("all three") == [True, False, False]
    text = aggregate.claims_list(res)
    head, tail = text.split("Not in all")
    assert "- SFT > base" in head and "- diffu-GRPO from the base > base: 2 of 3" in tail
    # A claim on a row one run lacks (wd1 from SFT) is not made.
    runs = _fake_runs()
    runs["p0_loop"]["rows"]["wd1_sft"] = runs["p0_loop"]["rows"]["d1"]
    res = aggregate.aggregate(runs, {"missing": []})
    assert "wd1_sft" not in res["rows"] and not any("wd1" in c["claim"] for c in res["claims"])


def test_multi_seed_blocks_are_generated_with_commit_and_device(tmp_path):
    from examples.demo import aggregate
    res = aggregate.aggregate(_fake_runs(), {"missing": []})
    res["loss"] = {"base": [3.0, 1.0, 0.8, 0.75, 0.74], "sft": [0.6, 0.5, 0.45, 0.44, 0.44]}
    table = demo_table.block(res, "demo-seeds-table")
    lines = table.splitlines()
    assert lines[1] == aggregate.caption(res) and "commit abc1234" in lines[1]
    assert "3 runs on cpu" in lines[1]
    # Runs resumed on another machine record only their last one: --devices names them all.
    mixed = aggregate.caption({**res, "devices": "GPU (base, SFT) and cpu (GRPO)"})
    assert mixed.endswith("3 runs on GPU (base, SFT) and cpu (GRPO) -->")
    d1 = next(line for line in lines if line.startswith("| d1 (SFT + diffu-GRPO) |"))
    assert "45.6 ± 4.2 (40.8..51.0)" in d1 and "(2 of 3)" in d1
    assert "| -1.3% |" in demo_table.block(res, "demo-seeds-loss")
    # --write of multi-seed results replaces only the seeds blocks, in copies of the docs.
    docs = {}
    for name in ("README.md", "demo.md"):
        docs[name] = tmp_path / name
        docs[name].write_text("x\n" + "\n".join(
            "\n".join(demo_table.markers(b)) for b in ("demo-table", *demo_table.SEEDS_BLOCKS)))
    blocks = {b: tuple(docs[d.name] for d in ds) for b, ds in demo_table.SEEDS_BLOCKS.items()}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    orig = (demo_table.SEEDS_BLOCKS, demo_table.PUBLISHED_SEEDS)
    try:
        demo_table.SEEDS_BLOCKS, demo_table.PUBLISHED_SEEDS = blocks, tmp_path / "pub.json"
        demo_table.main([str(path), "--write"])
    finally:
        demo_table.SEEDS_BLOCKS, demo_table.PUBLISHED_SEEDS = orig
    for name, targets in blocks.items():
        for d in targets:
            assert demo_table.published_block(d.read_text(), name) == demo_table.block(res, name)
    for d in docs.values():
        assert demo_table.published_block(d.read_text(), "demo-table").count("\n") == 1  # kept
    held = demo_table.published_block(docs["README.md"].read_text(), "demo-seeds-held")
    assert "- SFT > base" in held and "Not in all" not in held
    assert json.loads((tmp_path / "pub.json").read_text()) == res


def test_seeds_command_aggregates_finished_runs_and_names_the_missing(tmp_path, capsys):
    """examples.demo.seeds --aggregate_only: finished runs' results.json (and their stages'
    loss curves) in, one results.json and results.md out; an unfinished run is named."""
    from examples.demo import seeds
    for name, res in (("p0_unrolled", _fake_demo_results((28, 27), (42, 44), [(44, 45)],
                                                          [(30, 29)], (0.05, 0.01), (0.0, 0.01))),
                      ("p0_loop", _fake_demo_results((30, 29), (48, 49), [(52, 53)],
                                                     [(29, 30)], (0.02, 0.02), (0.0, 0.01)))):
        wd = tmp_path / name
        (wd / "base").mkdir(parents=True)
        (wd / "results.json").write_text(json.dumps(res))
        (wd / "base" / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "loss": float(10 - i)}) + "\n" for i in range(10)))
    with pytest.raises(SystemExit):  # p1 is missing: said, and the exit code says so
        seeds.main([f"--workdir={tmp_path}", "--pretrain_seeds=0,1", "--aggregate_only"])
    out = capsys.readouterr().out
    assert "unfinished runs, left out: p1_unrolled, p1_loop" in out
    res = json.loads((tmp_path / "results.json").read_text())
    assert list(res["runs"]) == ["p0_unrolled", "p0_loop"]
    assert res["loss"]["base"] == pytest.approx([9.5, 7.5, 5.5, 3.5, 1.5])
    assert res["missing"] == ["p1_unrolled", "p1_loop"]
    assert (tmp_path / "results.md").read_text().startswith(aggregate_caption(res))
    assert "2 runs on cpu, jax" in aggregate_caption(res)
    with pytest.raises(SystemExit):  # --devices: the caption names where the runs ran
        seeds.main([f"--workdir={tmp_path}", "--pretrain_seeds=0,1", "--aggregate_only",
                    "--devices=GPU (base) and cpu (GRPO)"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["devices"] == "GPU (base) and cpu (GRPO)"
    assert "2 runs on GPU (base) and cpu (GRPO) -->" in (tmp_path / "results.md").read_text()
    with pytest.raises(SystemExit, match="variants from"):
        seeds.main([f"--workdir={tmp_path}", "--variants=bf16"])
    # --include: an earlier aggregate's summaries stand in for the runs not in the workdir.
    earlier = {"runs": {"p1_unrolled": res["runs"]["p0_unrolled"],
                        "p1_loop": res["runs"]["p0_loop"], "p0_loop": "not taken"}}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    seeds.main([f"--workdir={tmp_path}", "--pretrain_seeds=0,1", "--aggregate_only",
                f"--include={tmp_path / 'earlier.json'}"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["missing"] == [] and list(res["runs"]) == ["p0_unrolled", "p0_loop",
                                                           "p1_unrolled", "p1_loop"]
    assert res["runs"]["p0_loop"]["variant"] == "loop"  # its own results.json, not earlier's


def aggregate_caption(res):
    from examples.demo import aggregate
    return aggregate.caption(res)


def test_seeds_variants_change_only_the_layer_loop(tmp_path):
    """The rounding variants reach every stage's model (training and evaluation) and nothing
    else; ':seeds' changes only its toy (puzzles, writers), budgets, GRPO rate and seeds."""
    from d1jax.run import spec as spec_lib
    from examples.demo import seeds
    data = {"prompt_length": 43, "train": "", "tokenizer": ""}
    (tmp_path / "hf").mkdir()
    for variant, flags in seeds.VARIANTS.items():
        d = demo_config.get_config("seeds").demo
        d.unlock()
        d.model.unroll_layers = flags[0].endswith("True")
        specs = [spec_lib.from_config(c) for c in (
            demo_config.pretrain_config(d, data), demo_config.sft_config(d, data, tmp_path),
            demo_config.grpo_config(d, data, tmp_path, 0), demo_config.eval_config(d, tmp_path))]
        assert {s.model.unroll_layers for s in specs} == {variant == "unrolled"}
    default, long = demo_config.get_config(None).demo, demo_config.get_config("seeds").demo
    assert (long.pretrain.steps, long.sft.steps) == (demo_config.SEEDS_PRETRAIN_STEPS,
                                                     demo_config.SEEDS_SFT_STEPS)

    def flat(c, prefix=""):
        out = {}
        for k, v in c.items():
            out.update(flat(v, f"{prefix}{k}.") if hasattr(v, "items") else {prefix + k: v})
        return out
    a, b = flat(default), flat(long)
    assert {k for k in a if a[k] != b[k]} == {
        "data.num_empty", "pretrain.solved_depth", "sft.solved_depth", "pretrain.steps",
        "sft.steps", "pretrain.save_every", "sft.save_every", "grpo.learning_rate", "seeds"}
    assert (b["pretrain.solved_depth"], b["sft.solved_depth"]) == (1, 2)


def test_plateau_summary_reads_each_budgets_loss_by_fifth_and_refuses_bad_budgets(tmp_path):
    """examples.demo.plateau: per budget, the loss by fifth of its steps, its last fifth
    against the previous budget's, and the accuracy of its export."""
    from examples.demo import plateau
    dirs = {}
    for steps, final in ((10, 1.0), (30, 0.9)):
        dirs[steps] = tmp_path / f"base_{steps}"
        dirs[steps].mkdir()
        losses = np.linspace(2.0, final, steps)
        (dirs[steps] / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "loss": float(x)}) + "\n" for i, x in enumerate(losses)))
    rows = plateau.summary(dirs, {10: {"heldout": 50.0}})
    assert [r["steps"] for r in rows] == [10, 30]
    assert rows[0]["loss_by_fifth"] == pytest.approx(
        [np.mean(c) for c in np.array_split(np.linspace(2.0, 1.0, 10), 5)], abs=1e-4)
    last = [np.mean(np.array_split(np.linspace(2.0, f, n), 5)[-1]) for n, f in ((10, 1), (30, .9))]
    assert rows[1]["last_fifth_vs_previous_budget"] == f"{100 * (last[1] / last[0] - 1):+.1f}%"
    assert "last_fifth_vs_previous_budget" not in rows[0]
    assert rows[0]["greedy_accuracy"] == {"heldout": 50.0} and rows[1]["greedy_accuracy"] is None
    # Every setting that changes a run names its folder, so no two runs share one.
    assert plateau.run_name("base", 2000) == "base_2000"
    assert plateau.run_name("base", 2000, 3e-3, 1) == "base_2000_lr0.003_s1"
    assert plateau.run_name("sft", 500, base=tmp_path / "base_6000") == "sft_500_from_base_6000"
    for argv, match in ((["--budgets=2x"], "comma-separated"), (["--budgets=3"], "5\\+ steps"),
                        (["--stage=sft", "--budgets=10"], "needs --base")):
        stage = [] if any(a.startswith("--stage") for a in argv) else ["--stage=base"]
        with pytest.raises(SystemExit, match=match):
            plateau.main([*stage, *argv, f"--workdir={tmp_path}"])


def test_reuse_copies_the_supervised_stages_and_only_their_evaluations(tmp_path):
    """examples.demo.reuse: data, base and SFT (finished) and their cached evaluations go to a
    new workdir, where the demo then runs only the RL stages; an unfinished source or a used
    target is refused."""
    from examples.demo import reuse
    src = tmp_path / "src"
    for stage in ("base", "sft", "d1_s0"):
        (src / stage / "hf").mkdir(parents=True)
        (src / stage / "hf" / "d1jax_export.json").write_text("{}")
    (src / "data").mkdir()
    (src / "data" / "train.csv").write_text("puzzle,solution\n")
    (src / "eval_cache.json").write_text(json.dumps(
        {"settings": {"n": 1}, "models": {"base": 1, "sft": 2, "d1_s0": 3}}))
    reuse.main([str(src), str(tmp_path / "alt")])
    alt = tmp_path / "alt"
    assert sorted(p.name for p in alt.iterdir()) == ["base", "data", "eval_cache.json", "sft"]
    assert json.loads((alt / "eval_cache.json").read_text()) == {
        "settings": {"n": 1}, "models": {"base": 1, "sft": 2}}
    with pytest.raises(SystemExit, match="is not empty"):
        reuse.main([str(src), str(alt)])
    (src / "sft" / "hf" / "d1jax_export.json").unlink()
    with pytest.raises(SystemExit, match="has not finished"):
        reuse.main([str(src), str(tmp_path / "alt2")])


def test_compare_lists_each_runs_grpo_rows_and_issue_45s_claims(tmp_path, capsys):
    """examples.demo.compare: per labelled run, the change of each GRPO row over its start on
    both sets and the three claims, judged on both sets (here d1 > SFT and d1 > RL from the
    base hold; RL from the base gains held-out only, so it does not)."""
    from examples.demo import compare
    res = _fake_demo_results((30, 29), (48, 49), [(52, 53), (50, 51)], [(31, 30), (31, 28)],
                             (0.02, 0.01), (-0.01, 0.01))
    mech = {"zero_std_ratio": {"first": 0.25, "last": 0.125}, "kl": {"mean": 0.01}}
    for kind in ("grpo_base", "d1"):
        res["rows"][kind]["mechanism"] = mech
    (tmp_path / "r.json").write_text(json.dumps(res))
    compare.main([f"fast={tmp_path / 'r.json'}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| fast (2 GRPO seeds) | +diffu-GRPO | 31.0 / 29.0 | +1.0 / +0.0 | ")
    assert "| 25% -> 12% | 0.0100 | yes / no / yes |" in lines[2]
    assert lines[3].startswith("| | d1 (SFT + diffu-GRPO) | 51.0 / 52.0 | +3.0 / +3.0 | 50.0 | +0.020")
    with pytest.raises(SystemExit, match="label=<an existing results.json>"):
        compare.main([str(tmp_path / "r.json")])


def test_compare_tallies_the_claims_per_run_of_multi_seed_results(tmp_path, capsys):
    """Multi-seed results (examples.demo.seeds) under two settings: one line per run, the
    changes over each start and the claims under each label, then the counts, by hand."""
    from examples.demo import compare

    def multi(runs):  # per run: (held-out, d1 test) greedy of base, SFT, RL from base, d1
        rows = lambda *models: {k: {"heldout": {"greedy": v[0]}, "d1_test": {"greedy": v[1]}}
                                for k, v in zip(("base", "sft", "grpo_base", "d1"), models)}
        return {"kind": "multi_seed",
                "runs": {name: {"rows": rows(*v)} for name, v in runs.items()}}
    fast = multi({"p0_loop": ((30, 29), (40, 41), (29, 30), (42, 40)),      # no / no / yes
                  "p1_loop": ((50, 50), (60, 60), (51, 51), (61, 62))})     # yes / yes / yes
    slow = multi({"p0_loop": ((30, 29), (40, 41), (31, 30), (41, 42)),      # yes / yes / yes
                  "p1_loop": ((50, 50), (60, 60), (50, 51), (59, 61))})     # no / no / yes
    for name, r in (("fast", fast), ("slow", slow)):
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    compare.main([f"fast={tmp_path / 'fast.json'}", f"slow={tmp_path / 'slow.json'}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("| p0_loop | 30.0 / 29.0 | 40.0 / 41.0 | -1.0 / +1.0 | +2.0 / -1.0 | "
                        "no / no / yes | +1.0 / +1.0 | +1.0 / +1.0 | yes / yes / yes |")
    assert lines[3].endswith("| +1.0 / +1.0 | +1.0 / +2.0 | yes / yes / yes | +0.0 / +1.0 | "
                             "-1.0 / +1.0 | no / no / yes |")
    tally = ("d1 > SFT 1 of 2, RL from base > base 1 of 2, d1 > RL from base 2 of 2, "
             "all three 1 of 2")
    assert lines[-2:] == [f"- fast: {tally}", f"- slow: {tally}"]
    slow["runs"].pop("p1_loop")
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    with pytest.raises(SystemExit, match="runs \\['p0_loop'\\] are not"):
        compare.main([f"fast={tmp_path / 'fast.json'}", f"slow={tmp_path / 'slow.json'}"])
    (tmp_path / "one.json").write_text(json.dumps(_fake_demo_results(
        (30, 29), (48, 49), [(52, 53)], [(31, 30)], (0.02, 0.01), (-0.01, 0.01))))
    with pytest.raises(SystemExit, match="mixed"):
        compare.main([f"fast={tmp_path / 'fast.json'}", f"one={tmp_path / 'one.json'}"])
