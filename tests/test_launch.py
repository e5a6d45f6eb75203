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
    assert "D1JAX_DISTRIBUTED=auto\\ python" in lines[2]  # the watchdog runs on pods too
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


def test_distributed_auto_joins_from_the_platform(monkeypatch):
    """D1JAX_DISTRIBUTED=auto (tpu_pod.sh) calls jax.distributed.initialize() with no
    coordinator or ids (the TPU metadata holds them), keeping JAX's heartbeat abort behind
    the watchdog's timeout; an unknown value is refused by name."""
    import jax
    import pytest
    from d1jax import distributed
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: calls.append((a, kw)))
    monkeypatch.delenv("D1JAX_COORDINATOR", raising=False)
    monkeypatch.setenv("D1JAX_DISTRIBUTED", "auto")
    monkeypatch.setenv("D1JAX_PEER_TIMEOUT_S", "50")
    distributed.initialize_from_env()  # one process here: no watchdog to start
    assert calls == [((), {"heartbeat_timeout_seconds": 150})]
    monkeypatch.setenv("D1JAX_DISTRIBUTED", "yes")
    with pytest.raises(ValueError, match="D1JAX_DISTRIBUTED='yes'"):
        distributed.initialize_from_env()
    monkeypatch.delenv("D1JAX_DISTRIBUTED")
    distributed.initialize_from_env()  # neither set: single process, nothing joined
    assert len(calls) == 1
