"""Out of device memory (d1jax/run/oom.py): `python -m d1jax.main` and `python -m d1jax.eval`
end with one line naming the program, the bytes against the device's and the knob, exit 1,
no traceback; the last checkpoint stays and restores, and the workdir's lock is released.

XLA's messages are injected at the seam below the program wrapper (the jitted function a
``Program`` calls, or the sampler ``make_generate_fn`` returns), as jax raises them: a
``jax.errors.JaxRuntimeError`` with a GPU or TPU message. One run gets a real one: XLA:CPU
refusing a 64 TiB buffer under a capped address space.
"""

import subprocess
import sys
from pathlib import Path

import jax
import pytest

from d1jax.run import oom
from d1jax.run import spec as spec_lib
from tests import learnable

# The commands it starts compile optimized (tests/conftest.py): tests/learnable.py's runs,
# whose programs the session's reference compiled optimized (read from the cache).
COMMANDS_OPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
GIB = 2 ** 30
GPU = ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 68719476736 bytes.\n"
       "BufferAssignment OOM Debugging.\nBufferAssignment stats:\n"
       "             parameter allocation:   15.16GiB\n")
TPU_COMPILE = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
               "space hbm. Used 20.58G of 15.48G hbm. Exceeded hbm capacity by 5.10G.\n\n"
               "Total hbm usage >= 21.10G:\n    reserved        530.00M \n    program"
               "          20.58G \n    arguments            0B \n")
TPU_RUN = ("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 12.50G. "
           "That was not possible. There are 3.25G free.; (0x0x0_HBM0)")
TPU_EARLY = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Compilation failure: Aborting "
             "compilation early because it's unlikely to have enough device memory. Requires "
             "41.78G, has 14.71G available. If more detailed logging is desired, set "
             "--xla_tpu_impure_oom_fast_exit_threshold=-1")

HARNESS = """
import dataclasses, resource, runpy, sys
import jax
import tests.learnable
from d1jax import sampling
from d1jax.train import jit_steps

program, call, message, module = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.argv = [module] + sys.argv[5:]

def fail():
    if message != "real":
        raise jax.errors.JaxRuntimeError(message)
    # XLA:CPU refusing a 64 TiB buffer: the address space is capped 4 GiB above its use now.
    used = int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmSize")).split()[1])
    cap = used * 1024 + (4 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    big = jax.jit(lambda x: jax.numpy.broadcast_to(x, (2 ** 46,)) + 1)
    big(jax.numpy.uint8(1)).block_until_ready()

def failing(fn):
    calls = [0]
    def call_or_fail(*args):
        calls[0] += 1
        if calls[0] == call:
            fail()
        return fn(*args)
    return call_or_fail

if program == "init":  # creating the train state, before any program
    init = jit_steps.JittedSteps.init
    jit_steps.JittedSteps.init = lambda self, params: failing(lambda p: init(self, p))(params)
elif program == "sampler":  # the rollout's or the eval's sampler, as make_generate_fn jits it
    make = sampling.make_generate_fn
    sampling.make_generate_fn = lambda *a, **kw: failing(make(*a, **kw))
else:  # the jitted function under the named Program
    named = jit_steps.JittedSteps._named
    def patched(self, name, p):
        p = named(self, name, p)
        return dataclasses.replace(p, jitted=failing(p.jitted)) if name == program else p
    jit_steps.JittedSteps._named = patched
runpy.run_module(module, run_name="__main__")
"""


def run(workdir, *args, fault=None, module="d1jax.main", config=learnable.MAIN_FLAGS):
    cmd = ([sys.executable, "-c", HARNESS, *fault, module] if fault else
           [sys.executable, "-m", module])
    return subprocess.run([*cmd, *config, f"--workdir={workdir}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def failed_in_one_line(r) -> str:
    """The one line of a run that ran out of memory: exit 1, nothing else on stderr's last
    line, no traceback."""
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-4000:])
    assert "Traceback" not in r.stderr and "Fatal Python error" not in r.stderr, r.stderr[-4000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and r.stderr.strip().splitlines()[-1] == errors[0], r.stderr[-4000:]
    return errors[0]


def checkpoints(wd) -> list[int]:
    d = wd / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


# ---------------------------------------------------------------------- the messages
@pytest.mark.parametrize("message,needed,capacity", [
    (GPU, 68719476736, None),
    (TPU_COMPILE, int(20.58 * GIB), int(15.48 * GIB)),
    (TPU_RUN, int(12.50 * GIB), None),
    (TPU_EARLY, int(41.78 * GIB), int(14.71 * GIB)),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. HLO temporaries (15.84G) exceeds "
     "available HBM (15.48G)", int(15.84 * GIB), int(15.48 * GIB)),
    ("RESOURCE_EXHAUSTED: Failed to allocate request for 32.00GiB (34359738368B) on device "
     "ordinal 0", 34359738368, None),
])
def test_sizes_read_from_gpu_and_tpu_messages(message, needed, capacity):
    assert oom.sizes(message) == (needed, capacity)


def test_only_allocation_failures_are_out_of_memory():
    assert oom.is_oom(jax.errors.JaxRuntimeError(GPU))
    assert oom.is_oom(jax.errors.JaxRuntimeError(TPU_COMPILE))
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = jax.errors.JaxRuntimeError(TPU_RUN)
    assert oom.is_oom(wrapped)
    assert not oom.is_oom(jax.errors.JaxRuntimeError("INTERNAL: Mosaic failed to compile"))
    assert not oom.is_oom(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: too many open files"))
    assert not oom.is_oom(RuntimeError("Out of memory"))  # not XLA's: not ours to explain
    with pytest.raises(ValueError):  # anything else passes through `named` untouched
        with oom.named("grpo_update", "x"):
            raise ValueError("bad")


def test_hint_prefers_knobs_a_rerun_resumes_under():
    grpo = lambda **kw: spec_lib.from_config(learnable.config(**kw))
    assert oom.hint(grpo(), "grpo_update").startswith(
        "turn remat on: --config.model.remat=True, or a larger mesh: --config.mesh.shape")
    assert oom.hint(grpo(**{"model.remat": True}), "grpo_update").startswith(
        "split the batch into more micro-batches: --config.optim.grad_accum=2, or")
    # 4 prompts x G 8 = 32 rows over the 8 test devices: 4 a device, 4 micro-batches at most
    assert jax.device_count() == 8
    last = oom.hint(grpo(**{"model.remat": True, "optim.grad_accum": 4}), "grpo_update")
    assert "grad_accum" not in last and "--config.grpo.prompts_per_step (a new run)" in last
    # the rollout: smaller sampler calls first (32 rows in calls of 16), down to 8 (a device's)
    assert oom.hint(grpo(), "rollout sampler").startswith(
        "generate in smaller sampler calls: --config.grpo.rollout_batch=16 (now 32 rows a "
        "call), or a larger mesh")
    assert oom.hint(grpo(**{"grpo.rollout_batch": 16}), "rollout sampler").startswith(
        "generate in smaller sampler calls: --config.grpo.rollout_batch=8 (now 16 rows")
    assert "--config.grpo.prompts_per_step" in oom.hint(grpo(**{"grpo.rollout_batch": 8}),
                                                        "rollout sampler")
    assert oom.hint(grpo(), "model setup").startswith("shard the weights over more devices")


# ---------------------------------------------------------------------- the commands
def test_grpo_update_out_of_memory_at_run_time_keeps_the_checkpoint_and_resumes(tmp_path):
    """The GPU message in step 3's update, after the checkpoint of step 2."""
    r = run(tmp_path, "--config.train.num_steps=4", fault=("grpo_update", "3", GPU))
    hint = oom.hint(spec_lib.from_config(learnable.config()), "grpo_update")
    assert failed_in_one_line(r) == ("error: grpo_update ran out of device memory: needs 64.0 GiB; "
                                     f"{hint}")
    assert hint.startswith("turn remat on: --config.model.remat=True")
    assert checkpoints(tmp_path) == [2] and not (tmp_path / "d1jax.lock").exists()
    r = run(tmp_path, "--config.train.num_steps=4", "--config.model.remat=True")
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"resumed from {tmp_path.resolve()}/checkpoints/2" in r.stdout
    assert checkpoints(tmp_path) == [2, 4] and not (tmp_path / "d1jax.lock").exists()


def test_rollout_sampler_refused_at_compile_time_names_both_sizes(tmp_path):
    """libtpu's compile-time message, on the first rollout: nothing saved yet, nothing made."""
    r = run(tmp_path, fault=("sampler", "1", TPU_COMPILE))
    hint = oom.hint(spec_lib.from_config(learnable.config()), "rollout sampler")
    assert hint == ("generate in smaller sampler calls: --config.grpo.rollout_batch=16 (now 32 "
                    "rows a call), or a larger mesh: --config.mesh.shape (now (-1, 1, 1) on 8 "
                    "devices)")
    assert failed_in_one_line(r) == ("error: rollout sampler ran out of device memory: needs "
                                     f"20.6 GiB, the device has 15.5 GiB; {hint}")
    assert checkpoints(tmp_path) == [] and not (tmp_path / "d1jax.lock").exists()


def test_a_real_xla_out_of_memory_in_rollout_logps(tmp_path):
    """XLA:CPU's own RESOURCE_EXHAUSTED in the second rollout's old/ref pass."""
    r = run(tmp_path, "--config.train.num_steps=4", fault=("rollout_logps", "2", "real"))
    line = failed_in_one_line(r)
    assert line.startswith("error: rollout_logps ran out of device memory: needs 65,536.0 GiB; "
                           "a larger mesh"), line
    assert checkpoints(tmp_path) == [2] and not (tmp_path / "d1jax.lock").exists()


def test_out_of_memory_while_creating_the_state_is_model_setup(tmp_path):
    r = run(tmp_path, fault=("init", "1", TPU_EARLY))
    hint = oom.hint(spec_lib.from_config(learnable.config()), "model setup")
    assert failed_in_one_line(r) == ("error: model setup ran out of device memory: needs 41.8 GiB, "
                                     f"the device has 14.7 GiB; {hint}")
    assert hint.startswith("shard the weights over more devices: a larger mesh")
    assert checkpoints(tmp_path) == [] and not (tmp_path / "d1jax.lock").exists()


def test_eval_sampler_out_of_memory_names_the_eval_batch(tmp_path):
    r = run(tmp_path, "--config.eval.num_examples=8", "--config.eval.batch_size=8",
            fault=("sampler", "1", TPU_RUN), module="d1jax.eval",
            config=("--config=configs/eval.py:sudoku,tiny",))
    line = failed_in_one_line(r)
    assert line.startswith("error: eval sampler (gen_length ") and line.endswith(
        "ran out of device memory: needs 12.5 GiB; a smaller --config.eval.batch_size (now 8), "
        "or a larger mesh: --config.mesh.shape (now (-1, 1, 1) on 8 devices)"), line
    assert not (tmp_path / "d1jax.lock").exists()
