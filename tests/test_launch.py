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
        assert "D1JAX_COORDINATOR=n1:1234" in ln and "D1JAX_PEER_TIMEOUT_S" not in ln
    r = dry("gpu_multinode.sh", "--hosts", "n1,n2", "--peer-timeout", "7", "--", "--config=c.py")
    assert [ln.count("D1JAX_PEER_TIMEOUT_S=7\\ python") for ln in r.stdout.splitlines()] == [1, 1]


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


# A stand-in for `gcloud compute tpus tpu-vm`: a "pod slice" of two workers on this machine.
# `create` and the install do nothing here; the command that runs d1jax.main on --worker=all
# starts once per worker, in its own process group, with the platform's description of the
# worker as JAX reads it on a cluster (Slurm's variables, standing in for the TPU metadata),
# on CPU with gloo collectives. Everything else the workers get comes from the launcher.
FAKE_GCLOUD = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_POD/calls"
[[ "$*" == *"--worker=all"*"d1jax.main"* ]] || exit 0
cmd="${@: -1}"
pids=()
for i in 0 1; do
  cd "$FAKE_POD/home"
  SLURM_JOB_ID=$FAKE_JOB SLURM_STEP_NODELIST=localhost SLURM_NTASKS=2 SLURM_PROCID=$i \
    SLURM_LOCALID=0 JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo \
    setsid bash -c "$cmd" > "$FAKE_POD/worker$i.log" 2>&1 &
  echo $! > "$FAKE_POD/worker$i.pid"; pids+=($!)
done
code=0
for i in 0 1; do
  rc=0; wait "${pids[$i]}" || rc=$?
  echo $rc > "$FAKE_POD/worker$i.rc"; [[ $rc == 0 ]] || code=$rc
done
exit $code
"""


def test_tpu_pod_workers_run_the_watchdog_a_killed_worker_stops_the_other(tmp_path):
    """tpu_pod.sh for real, against the stand-in pod above: both workers join one
    jax.distributed run from the platform (D1JAX_DISTRIBUTED=auto) and train; kill -9 of
    worker 1 ends worker 0 within the --peer-timeout the launcher passed (5 s; the default is
    30), with the watchdog's line and exit 1, and the launcher fails."""
    import os
    import signal
    import socket
    import sys
    import time
    pod, bin_dir = tmp_path / "pod", tmp_path / "bin"
    (pod / "home").mkdir(parents=True)
    (pod / "home" / "d1jax").symlink_to(LAUNCH.parent)
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    job = next(j for j in range(4096) if _port_free(61440 + j, socket))  # Slurm's port rule
    env = {k: v for k, v in os.environ.items() if not k.startswith("D1JAX_")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", FAKE_POD=str(pod), FAKE_JOB=str(job),
               JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONUNBUFFERED="1")
    runs = tmp_path / "runs"
    launcher = subprocess.Popen(
        ["bash", str(LAUNCH / "tpu_pod.sh"), "--name", "d1", "--zone", "local",
         "--bucket", str(runs), "--peer-timeout", "5", "--",
         "--config=configs/grpo_letters.py", "--config.train.num_steps=1000"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs = [pod / f"worker{i}.log" for i in range(2)]
    try:
        deadline = time.time() + 600
        metrics = runs / "d1" / "metrics.jsonl"  # process 0 writes it once a step is done
        while not (metrics.exists() and metrics.read_text().strip()):
            assert launcher.poll() is None and time.time() < deadline, _tails(logs)
            time.sleep(0.5)
        os.killpg(int((pod / "worker1.pid").read_text()), signal.SIGKILL)
        killed = time.time()
        out = launcher.communicate(timeout=300)[0]
        gone_after = time.time() - killed
    finally:
        if launcher.poll() is None:
            for i in range(2):
                os.killpg(int((pod / f"worker{i}.pid").read_text()), signal.SIGKILL)
            launcher.kill()
    calls = (pod / "calls").read_text().splitlines()
    assert len(calls) == 3 and calls[0].startswith("compute tpus tpu-vm create d1"), calls
    log0 = logs[0].read_text()
    assert "resumed from" not in log0 and "Traceback" not in log0, _tails(logs)
    assert log0.strip().splitlines()[-1] == (
        "error: lost process 1 of 2 (no heartbeat for 5 s); rerun all processes to resume "
        "from the last checkpoint"), _tails(logs)
    rcs = [int((pod / f"worker{i}.rc").read_text()) for i in range(2)]
    assert rcs == [1, 128 + signal.SIGKILL] and launcher.returncode != 0, (rcs, out)
    assert gone_after < 60, gone_after  # 5 s of silence, then the watchdog's next look


def _port_free(port: int, socket) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tails(logs) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:] if p.exists() else ''}" for p in logs)
