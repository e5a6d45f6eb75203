"""bench/compare.py's bookkeeping on a canned reference JSON (nothing here is timed)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import common, compare  # noqa: E402

# The parts of ref_bench.py's printed JSON that the benchmarks read.
CANNED_REFERENCE = {
    "sampler": {"batch": 8, "prompt_len": 64, "gen_length": 128, "block_length": 32,
                "steps": 64, "times_s": [8.0, 8.2], "median_s": 8.1,
                "generated_tokens_per_s": 126.42},
    "estimator": {"p_mask_prompt": 0.15, "mu1": {"times_s": [0.11, 0.13, 0.12]},
                  "mu4": {"times_s": [0.5, 0.48, 0.52]}},
    "grpo_update": {"mu": 1, "times_s": [0.34, 0.36, 0.30]},
}


def test_reference_seconds_reads_every_measure(tmp_path):
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(CANNED_REFERENCE))
    secs = common.reference_seconds(common.load_reference(str(path)))
    assert secs == {"sampler": [8.0, 8.2], "update_mu1": [0.34, 0.36, 0.30],
                    "estimator_mu1": [0.11, 0.13, 0.12], "estimator_mu4": [0.5, 0.48, 0.52]}
    path.write_text(json.dumps({"sampler": {}}))
    with pytest.raises(ValueError, match="bench/reference/run.py"):
        common.load_reference(str(path))


def test_summary_and_table_from_two_rounds():
    ref_rounds = [common.reference_seconds(CANNED_REFERENCE),
                  {"sampler": [7.8], "estimator_mu1": [0.1], "update_mu1": [0.32]}]
    ours_rounds = [{"sampler_exact": [4.0, 4.4], "estimator_mu1": [0.08], "update_mu1": [0.6],
                    "forward": [0.1], "forward_backward": [0.3]},
                   {"sampler_exact": [4.2], "estimator_mu1": [0.09], "update_mu1": [0.64],
                    "forward": [0.12], "forward_backward": [0.34]}]
    rows = compare.summarize(ref_rounds, ours_rounds, tokens_per_call=8 * 128)
    assert set(rows) == {"sampler_exact", "estimator_mu1", "update_mu1", "forward",
                         "forward_backward"}  # rows without our timings are left out
    # Pooled medians: reference sampler 8.0 of (8.0, 8.2, 7.8), ours 4.2 of (4.0, 4.4, 4.2).
    assert rows["sampler_exact"]["speedup"] == round(8.0 / 4.2, 2)
    assert rows["estimator_mu1"]["speedup"] == round(0.115 / 0.085, 2)
    assert rows["update_mu1"]["speedup"] == round(0.33 / 0.62, 2)
    assert "speedup" not in rows["forward"]  # the reference has no bare forward

    table = compare.format_table(rows, compare.notes(rows, {"tokens_equal_to_reference": 1.0}))
    lines = table.splitlines()
    assert lines[0] == "| measure | PyTorch reference | d1jax | ratio |"
    # Round medians as tokens/s: 1024 / 8.1 = 126.4, 1024 / 7.8 = 131.3; ours 1024 / 4.2.
    assert "| exact sampler, generated tokens/s | 126-131 | 244 | 1.90x |" in lines
    assert "| estimator mu = 1, s | 0.1-0.12 | 0.08-0.09 | 1.35x |" in lines
    assert "| forward [8, 192], s | n/a | 0.1-0.12 | n/a |" in lines
    assert "exact sampler tokens equal to the reference's: 100.00%" in lines
    assert f"d1jax backward / forward: {(0.32 - 0.11) / 0.11:.2f}" in lines


def test_missing_reference_venv_says_how_to_build_it(tmp_path):
    with pytest.raises(SystemExit, match="run bench/reference/setup.sh"):
        compare.reference_paths(str(tmp_path / "not-built"))
    built = tmp_path / "built"
    (built / "venv" / "bin").mkdir(parents=True)
    (built / "venv" / "bin" / "python").write_text("")
    with pytest.raises(SystemExit, match="sources.json"):  # a venv without its sources
        compare.reference_paths(str(built))
    (built / "sources.json").write_text("{}")
    assert compare.reference_paths(str(built))["script"].endswith("bench/reference/run.py")


def test_help_runs_without_the_reference():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "compare.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--ref-dir" in out and "--reference-json" in out


@pytest.mark.parametrize("script", ["block_parts.py", "compare.py", "forward.py", "sampler.py",
                                    "update.py", "sampler_accuracy.py"])
def test_bench_scripts_run_as_documented(script, tmp_path):
    """Each script's documented form, ``python bench/SCRIPT``, from outside the repository."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
