"""launch/ scripts: --dry-run prints the commands that would run, and bad usage fails clearly."""

import subprocess
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[1] / "launch"


def dry(script, *args):
    return subprocess.run(["bash", str(LAUNCH / script), "--dry-run", *args],
                          capture_output=True, text=True, timeout=60)


def test_tpu_pod_dry_run_creates_installs_and_runs_on_all_workers():
    r = dry("tpu_pod.sh", "--name", "d1", "--zone", "us-east5-a", "--type", "v5p-64",
            "--bucket", "gs://b/runs", "--", "--config=configs/grpo_gsm8k.py")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("gcloud compute tpus tpu-vm create d1") and "v5p-64" in lines[0]
    assert "--worker=all" in lines[1] and "pip\\ install\\ -e\\ \\'.\\[tpu\\]\\'" in lines[1]
    assert "--worker=all" in lines[2] and "d1jax.main" in lines[2]
    assert "--workdir=gs://b/runs/d1" in lines[2] and "grpo_gsm8k.py" in lines[2]


def test_gpu_node_dry_run():
    r = dry("gpu_node.sh", "--workdir", "/tmp/w", "--", "--config=configs/grpo_sudoku.py")
    assert r.returncode == 0, r.stderr
    assert "pip install -e .\\[cuda12\\]" in r.stdout
    assert "d1jax.main --workdir=/tmp/w --config=configs/grpo_sudoku.py" in r.stdout


def test_gpu_multinode_dry_run_sets_process_ids():
    r = dry("gpu_multinode.sh", "--hosts", "n1,n2,n3", "--", "--config=c.py")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [ln.split()[1] for ln in lines] == ["n1", "n2", "n3"]
    for i, ln in enumerate(lines):
        assert f"D1JAX_PROCESS_ID={i}" in ln and "D1JAX_NUM_PROCESSES=3" in ln
        assert "D1JAX_COORDINATOR=n1:1234" in ln


def test_missing_arguments_fail_with_a_message():
    r = dry("tpu_pod.sh", "--", "--config=x")
    assert r.returncode == 2 and "--name and --zone are required" in r.stderr
    r = dry("gpu_node.sh")
    assert r.returncode == 2 and "give the d1jax.main flags" in r.stderr
