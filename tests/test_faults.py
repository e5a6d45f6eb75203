"""The fault matrix: a run never loses progress (docs/training.md, "What a run guarantees").

Each scenario is a process of its own (forked from one that imported d1jax.main's modules,
tests/commands.py) running `configs/grpo_letters.py` (the :tiny GRPO config on the
``letters`` task, tests/learnable.py), whose reward a tiny random model raises (30 optimizer steps, mu = 2, checkpoints every 2
steps, the newest 2 kept): a resume that lost the params, the Adam moments, the data order or
the RNG shows in runs that learn. Where a run resumes, its final train state is compared with
an uninterrupted run's bit for bit, and its metrics row by row (each step exactly once, in the
JSONL log and, under TensorBoard's purge rule, in the event files). The 2-process scenario
(one process killed) is in tests/test_multihost.py.

Faults are injected at exact points by a harness that patches one function before running
`d1jax.main` as `python -m` would: SIGTERM or SIGINT (Ctrl-C) to itself during given steps,
SIGKILL right after the asynchronous save of step 2 started. A second writer is a second
`d1jax.main` on the workdir of a live run.
"""

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from d1jax.metrics import read_jsonl
from tests import learnable
from tests.commands import Commands

# The commands it starts compile optimized (tests/conftest.py): tests/learnable.py's runs,
# compared bit for bit with the session's reference.
COMMANDS_OPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
CONFIG = learnable.MAIN_FLAGS  # conftest's learnable_reference runs exactly these
STEPS = learnable.OVERRIDES["train.num_steps"]  # 30: checkpoints 28 and 30 at the end
TIMING = ("time_", "_per_s")  # wall-clock metrics differ between any two runs

HARNESS = """
import os, runpy, signal, sys, time
import tests.learnable
from d1jax import checkpoint
from d1jax.train import engine

mode, at = sys.argv[1], [int(a) for a in sys.argv[2].split(",")]
sys.argv = ["d1jax.main"] + sys.argv[3:]
if mode in ("sigterm", "sigint"):  # SIGTERM or Ctrl-C arriving during optimizer steps `at`
    update = engine.GRPOEngine.update
    signum = signal.SIGTERM if mode == "sigterm" else signal.SIGINT
    def patched(self, batch, it, step):
        if step + 1 in at:
            os.kill(os.getpid(), signum)
        return update(self, batch, it, step)
    engine.GRPOEngine.update = patched
elif mode == "sigterm_loading":  # SIGTERM while the model is built, before the loop
    from d1jax.train import grpo
    build = grpo.build
    def patched(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the watcher ends the process meanwhile
        sys.exit("harness: still running 30 s after SIGTERM")
    grpo.build = patched
elif mode == "kill_in_save":  # kill -9 while the asynchronous save of step `at` is in flight
    save = checkpoint.Checkpointer.save
    def patched(self, step, *args, **kwargs):
        started = save(self, step, *args, **kwargs)
        if started and step in at:
            os.kill(os.getpid(), signal.SIGKILL)
        return started
    checkpoint.Checkpointer.save = patched
runpy.run_module("d1jax.main", run_name="__main__")
"""


_SERVER: list[Commands] = []


@pytest.fixture(scope="module", autouse=True)
def commands(tmp_path_factory):
    """``run``'s processes fork from one that imported d1jax.main's modules (tests/commands.py):
    each is its own process, with its signal handlers, exit status and JAX backend."""
    _SERVER.append(Commands(tmp_path_factory.mktemp("commands")))
    yield _SERVER[0]
    _SERVER.pop().close()


def run(workdir, *args, fault=None, config=CONFIG):
    """``python -c HARNESS *fault *config`` (``learnable.MAIN`` without a fault), forked."""
    code, fault = (HARNESS, fault) if fault else (learnable.MAIN, ())
    return _SERVER[0].run_code(code, *fault, *config, f"--workdir={workdir}", *args)


def ok(r):
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    return r


def no_crash(r) -> None:
    assert "Traceback" not in r.stderr and "Fatal Python error" not in r.stderr, r.stderr[-3000:]


def raw_steps(wd) -> list[int]:
    """The step of every complete row written to metrics.jsonl, repeats included."""
    f = wd / "metrics.jsonl"
    text = f.read_text() if f.exists() else ""
    return [json.loads(ln)["step"] for ln in text.split("\n")[:-1] if ln.strip()]


def error_lines(r) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]


def steps(wd) -> list[int]:
    return sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())


def state(wd, step) -> dict:
    tree = ocp.StandardCheckpointer().restore(wd / "checkpoints" / str(step) / "state")
    return {jax.tree_util.keystr(k): np.asarray(v)
            for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def assert_same_run(got_wd, want_wd, step=STEPS):
    """Bitwise-equal train state at ``step``; equal metrics, each step once."""
    got, want = state(got_wd, step), state(want_wd, step)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    lines = [ln for ln in (got_wd / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    rows = read_jsonl(got_wd / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, step + 1)) and len(lines) == step
    for g, w in zip(rows, read_jsonl(want_wd / "metrics.jsonl")):
        assert {k: v for k, v in g.items() if not any(t in k for t in TIMING)} == \
            {k: v for k, v in w.items() if not any(t in k for t in TIMING)}
    assert tensorboard_steps(got_wd, "loss") == list(range(1, step + 1))


def tensorboard_steps(wd, tag) -> list[int]:
    """Steps of ``tag``'s scalars as TensorBoard shows them: a SessionLog START at step S
    (written on resume) purges the earlier events of steps >= S."""
    from tensorboardX.proto import event_pb2
    events = []
    for f in sorted((wd / "tensorboard").glob("events.out.tfevents.*")):
        data = f.read_bytes()
        pos = 0
        while pos < len(data):  # TFRecord: length, crc, payload, crc
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + n]))
            pos += 12 + n + 4
    seen: list[int] = []
    for e in events:
        if e.HasField("session_log") and e.session_log.status == event_pb2.SessionLog.START:
            seen = [s for s in seen if s < e.step]
        seen += [e.step for v in e.summary.value if v.tag == tag]
    return seen


def snapshot(wd) -> dict:
    return {str(p.relative_to(wd)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in wd.rglob("*")}


def corrupt(wd, step):
    for f in (wd / "checkpoints" / str(step) / "state").rglob("*"):
        if f.is_dir() and f.name in ("d", "ocdbt.process_0"):
            shutil.rmtree(f)


@pytest.fixture(scope="module")
def reference(learnable_reference):
    """The uninterrupted run (``run(wd)`` with no fault: conftest's session-wide run, shared
    with test_multihost), which learns: its reward rises (else the resumed runs compared with
    it would prove little)."""
    wd = learnable_reference
    assert steps(wd) == [STEPS - 2, STEPS]
    rewards = [r["reward"] for r in read_jsonl(wd / "metrics.jsonl")][::2]  # one per rollout
    assert learnable.rise(rewards) > learnable.MIN_RISE, rewards
    return wd


@pytest.fixture(scope="module")
def d1_data():
    from tests.conftest import SHARED_D1
    if not SHARED_D1.is_dir():
        pytest.skip(f"d1 data folder {SHARED_D1} is absent")
    return SHARED_D1


def test_sigterm_saves_exits_75_and_resumes_bitwise_under_a_compatible_change(reference,
                                                                              tmp_path):
    # Preempted during step 3 (after steps of this process finished: SIGTERM while the first
    # step compiles exits at once, below), on a config whose step count and save cadence
    # differ: the rollout's updates (steps 3 and 4) finish and step 4 is saved.
    r = run(tmp_path, "--config.train.num_steps=1000", "--config.train.save_every=1000",
            fault=("sigterm", "3"))
    assert r.returncode == 75, (r.stdout[-2000:], r.stderr[-3000:])
    assert "stopped at step 4 of 1000 (SIGTERM) with a checkpoint saved" in r.stderr
    assert "Traceback" not in r.stderr and steps(tmp_path) == [4]
    assert not (tmp_path / "hf").exists()
    ok(run(tmp_path))  # the plain config: 30 steps, saves every 2
    assert_same_run(tmp_path, reference)


def test_kill_9_during_a_save_resumes_bitwise(reference, tmp_path):
    r = run(tmp_path, fault=("kill_in_save", "2"))
    assert r.returncode == -9, r.stderr[-3000:]
    ok(run(tmp_path))  # from step 2 if its save committed, else from step 0
    assert_same_run(tmp_path, reference)


def test_corrupt_latest_falls_back_keeps_it_aside_and_resumes_bitwise(reference, tmp_path):
    wd = tmp_path / "run"
    shutil.copytree(reference, wd)
    corrupt(wd, STEPS)
    r = ok(run(wd))
    assert f"checkpoint step {STEPS} does not restore" in r.stdout and "resumed from" in r.stdout
    assert [p.name.split(".")[0] for p in (wd / "checkpoints_unreadable").iterdir()] == \
        [str(STEPS)]
    assert_same_run(wd, reference)


def test_no_restorable_checkpoint_exits_1_naming_each_step_and_changes_nothing(reference,
                                                                              tmp_path):
    wd = tmp_path / "run"
    shutil.copytree(reference, wd)
    corrupt(wd, STEPS - 2)
    corrupt(wd, STEPS)
    before = snapshot(wd)
    r = run(wd)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_lines(r) == [f"error: no checkpoint in {wd.resolve()}/checkpoints restores, "
                              "nothing was changed:"]
    assert [ln.split(":")[0].strip() for ln in r.stderr.splitlines()
            if ln.startswith("  step")] == [f"step {STEPS}", f"step {STEPS - 2}"]
    assert snapshot(wd) == before

    # Asked to: the unreadable run moves aside whole and a new one starts at step 0.
    r = ok(run(wd, "--config.train.if_incompatible=move_aside"))
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("starting over")]
    assert line.startswith(f"starting over: no checkpoint restores (step {STEPS}: ")
    assert f"; step {STEPS - 2}: " in line
    (old,) = (wd / "previous").iterdir()
    assert steps(old) == [STEPS - 2, STEPS] and len(read_jsonl(old / "metrics.jsonl")) == STEPS
    assert_same_run(wd, reference)  # the same config from scratch: the same run, bitwise


def test_incompatible_config_is_refused_then_moved_aside_on_request(reference, tmp_path):
    wd = tmp_path / "run"
    shutil.copytree(reference, wd)
    before = snapshot(wd)
    r = run(wd, "--config.lora.rank=4", "--config.optim.learning_rate=0.002")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = error_lines(r)
    assert f"holds a run at step {STEPS} written with another config: lora.rank 8 -> 4; " \
           "optim.learning_rate 0.003 -> 0.002." in line
    assert "--config.train.if_incompatible=move_aside" in line
    assert snapshot(wd) == before  # refused before anything was written

    # 4 steps of the new run suffice (num_steps may change on resume; it changes no state).
    r = ok(run(wd, "--config.lora.rank=4", "--config.train.if_incompatible=move_aside",
               "--config.train.num_steps=4"))
    (old,) = (wd / "previous").iterdir()
    assert "starting over" in r.stdout and steps(old) == [STEPS - 2, STEPS]
    assert [r["step"] for r in read_jsonl(old / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert state(old, STEPS).keys() == state(reference, STEPS).keys()  # the old run, intact
    assert steps(wd) == [2, 4] and len(read_jsonl(wd / "metrics.jsonl")) == 4
    rank = {k: v.shape for k, v in state(wd, 4).items() if "lora_a" in k}
    assert rank and all(s[-1] == 4 for s in rank.values()), rank


def test_sft_stopped_and_resumed_equals_uninterrupted_bitwise(tmp_path, d1_data):
    """The SFT loop's resume: params, Adam moments and data position all come back."""
    sft = ("--config=configs/sft_s1k.py:tiny",)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    ok(run(full, config=sft))
    r = run(resumed, "--config.train.stop_after=2", config=sft)
    assert r.returncode == 75 and "stopped at step 2 of 4" in r.stderr, r.stderr[-3000:]
    ok(run(resumed, config=sft))
    got, want = state(resumed, 4), state(full, 4)
    assert any("mu" in k or "nu" in k for k in want), list(want)[:8]  # the optimizer moments
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    rows = [{k: v for k, v in r.items() if not any(t in k for t in TIMING)}
            for r in read_jsonl(resumed / "metrics.jsonl")]
    assert rows == [{k: v for k, v in r.items() if not any(t in k for t in TIMING)}
                    for r in read_jsonl(full / "metrics.jsonl")]


def test_ctrl_c_saves_after_the_step_exits_130_and_resumes_bitwise(reference, tmp_path):
    # Ctrl-C during step 3: the rollout's updates (steps 3 and 4) finish, step 4 is saved.
    r = run(tmp_path, "--config.train.num_steps=1000", fault=("sigint", "3"))
    assert r.returncode == 130, (r.stdout[-2000:], r.stderr[-3000:])
    no_crash(r)
    assert "Ctrl-C received: saving a checkpoint after this step and stopping" in r.stderr
    assert "stopped at step 4 of 1000 (Ctrl-C) with a checkpoint saved" in r.stderr
    assert steps(tmp_path) == [2, 4] and not (tmp_path / "d1jax.lock").exists()

    # The rerun finds the lock of a process that died (kill -9 leaves it): taken over.
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    (tmp_path / "d1jax.lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": dead, "started": "1", "since": 0.0}))
    r = ok(run(tmp_path))
    assert f"workdir lock: taking over {tmp_path.resolve()}/d1jax.lock from pid {dead} on " \
           f"{socket.gethostname()} since " in r.stdout and "which is gone" in r.stdout
    assert not (tmp_path / "d1jax.lock").exists()
    assert_same_run(tmp_path, reference)


def test_second_ctrl_c_exits_at_once_naming_the_last_checkpoint(tmp_path):
    # Saves synchronous, so step 2's is committed when the second Ctrl-C comes in step 4.
    r = run(tmp_path, "--config.train.num_steps=1000", "--config.train.async_checkpoints=False",
            fault=("sigint", "3,4"))
    assert r.returncode == 130, (r.stdout[-2000:], r.stderr[-3000:])
    no_crash(r)
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("Ctrl-C again")]
    assert line == (f"Ctrl-C again: exiting now; the last checkpoint is step 2 "
                    f"({tmp_path.resolve()}/checkpoints/2): rerun the same command to "
                    "resume from it")
    assert steps(tmp_path) == [2] and "stopped at step" not in r.stderr  # no wait for a save
    assert not (tmp_path / "d1jax.lock").exists()


def test_ctrl_c_while_compiling_exits_at_once_with_one_line(tmp_path):
    # Step 1's update program compiles after the first rollout: Ctrl-C lands in it.
    r = run(tmp_path, fault=("sigint", "1"))
    assert r.returncode == 130, (r.stdout[-2000:], r.stderr[-3000:])
    no_crash(r)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("Ctrl-C")]
    assert lines == [f"Ctrl-C: exiting now; no checkpoint is saved in "
                     f"{tmp_path.resolve()}/checkpoints"]
    assert steps(tmp_path) == [] and not (tmp_path / "d1jax.lock").exists()


@pytest.mark.parametrize("fault", [("sigterm_loading", "0"), ("sigterm", "1")],
                         ids=["loading", "compiling"])
def test_sigterm_while_loading_or_compiling_exits_143_at_once_with_its_own_line(tmp_path,
                                                                                fault):
    # A preemption's grace period is shorter than a compile, and nothing new is there to save:
    # SIGTERM before the first step exits at once, 143 (128 + SIGTERM), not Ctrl-C's 130.
    r = run(tmp_path, fault=fault)
    assert r.returncode == 143, (r.stdout[-2000:], r.stderr[-3000:])
    no_crash(r)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("SIGTERM", "Ctrl-C"))]
    assert lines == [f"SIGTERM: exiting now; no checkpoint is saved in "
                     f"{tmp_path.resolve()}/checkpoints"]
    saved = steps(tmp_path) if (tmp_path / "checkpoints").is_dir() else []
    assert saved == [] and not (tmp_path / "d1jax.lock").exists()
    assert "SIGTERM received" not in r.stdout + r.stderr  # it does not claim to save


def test_a_second_run_on_a_live_workdir_exits_1_naming_the_holder(tmp_path):
    cmd = [sys.executable, "-c", learnable.MAIN, *CONFIG, f"--workdir={tmp_path}",
           "--config.train.num_steps=1000"]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        lock = tmp_path / "d1jax.lock"
        deadline = time.time() + 300
        while not (lock.exists() and lock.read_text()) and first.poll() is None:
            assert time.time() < deadline, "the first run never took the lock"
            time.sleep(0.2)
        holder = json.loads(lock.read_text())
        assert (holder["host"], holder["pid"]) == (socket.gethostname(), first.pid)
        second = run(tmp_path, "--config.train.num_steps=1000")
        while not raw_steps(tmp_path) and first.poll() is None:
            assert time.time() < deadline, "the first run never logged a step"
            time.sleep(0.2)  # then SIGTERM finds it in the loop: it saves and exits 75
        assert second.returncode == 1 and second.stdout == "", second.stderr[-3000:]
        (line,) = error_lines(second)
        assert line.startswith(f"error: workdir {tmp_path.resolve()} is in use by pid "
                               f"{first.pid} on {socket.gethostname()} since ")
        assert line.endswith("(it holds the lock); nothing was changed: wait for it, stop it, "
                             "or pass another --workdir")
        assert second.stderr.strip() == line
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=600)
    assert first.returncode == 75, err[-3000:]  # the first run saved and stopped as asked
    rows = raw_steps(tmp_path)
    assert rows == list(range(1, len(rows) + 1)) and rows  # each step once: one writer
    assert not (tmp_path / "d1jax.lock").exists()
