"""d1jax.plan on the block-diffusion family (SDAR/TraDo): the family's planner configs, and
a tiny TraceRL run's programs (the block sampler, the old/reference pass and the update,
whose rows carry the rollout's trace ``per_row["decoded_at"]``) compiled for a 4-chip TPU
v5e topology (skipped without libtpu)."""

import pytest

from d1jax.model import sdar
from d1jax.plan import grid
from tests.test_plan import needs_tpu  # the compile-only TPU topology check

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True


def test_the_family_names_its_planner_configs():
    assert grid.expand(["sdar"]) == list(sdar.FAMILY.plan_configs)
    assert "configs/sdar/tracerl_math.py" in sdar.FAMILY.plan_configs


@needs_tpu
def test_tiny_tracerl_programs_compile_with_the_trace():
    import dataclasses

    from d1jax.plan import chips, compile as plan_lib
    from d1jax.plan.programs import PlanSpec, build_programs
    c = grid.load_config("configs/sdar/tracerl_math.py:tiny")
    estimates = plan_lib.plan(c, "v5e:2x2", (1, 4, 1), cache_dir="")
    assert [e.program for e in estimates] == ["rollout", "rollout_logps", "grpo_update"]
    assert all(e.fits for e in estimates)
    # mu 1 and no reference term (TraceRL's KL is to the old policy, which the update reads
    # itself): the old/reference pass computes nothing
    assert [e.flops_hardware > 0 for e in estimates] == [True, False, True]
    # the analytic counts (flops.block_sampler; flops.stream_estimator: the clean row and its
    # R noised copies in one forward) against XLA's loop-aware count: 1.13 and 1.08 here,
    # 1.18 and 1.05 at 8B on v5p-8 (the sampler's scores over its static buffer, softmax)
    rollout, _, update = estimates
    assert 1.0 <= rollout.flops_xla / rollout.flops_hardware < 1.2
    assert 1.0 <= update.flops_xla / update.flops_hardware < 1.15
    # the update and the old/reference pass receive the trace as the engine hands it over
    _, devices = chips.topology_devices("v5e:2x2")
    spec = PlanSpec.of(plan_lib.as_spec(c))
    mesh = dataclasses.replace(spec.run.mesh, shape=(1, 4, 1)).build(devices)
    for program in build_programs(spec, mesh)[1:]:
        batch = program.args[1]
        rows, completion = batch.completion_ids.shape
        assert batch.per_row["decoded_at"].shape == (rows, completion), program.name


@needs_tpu
def test_the_rollout_is_planned_at_rollout_batch_rows():
    """grpo.rollout_batch: the sampler program takes that many rows, one of the step's calls
    (nothing compiled here); a size the run would refuse is refused the same way."""
    import dataclasses

    from d1jax.config import ConfigError
    from d1jax.plan import chips, compile as plan_lib, report
    from d1jax.plan.programs import PlanSpec, build_programs
    _, devices = chips.topology_devices("v5e:2x2")
    c = grid.load_config("configs/sdar/tracerl_math.py:tiny")
    rows = c.grpo.prompts_per_step * c.grpo.num_generations  # 8, on 4 chips
    c.grpo.rollout_batch = 4
    spec = PlanSpec.of(plan_lib.as_spec(c))
    mesh = dataclasses.replace(spec.run.mesh, shape=(1, 4, 1)).build(devices)
    rollout, logps, update = build_programs(spec, mesh)
    assert rollout.args[1].shape[0] == 4 and rollout.calls == rows // 4
    assert rollout.sequences == 4 and logps.args[1].completion_ids.shape[0] == rows
    fields = {f.name: 0 for f in dataclasses.fields(plan_lib.Estimate)}
    fields.update(program="rollout", mesh=dict(mesh.shape), calls=rollout.calls, refused=True)
    assert "| rollout (1 of 2 calls) | 1,4,1 |" in report.table([plan_lib.Estimate(**fields)])
    c.grpo.rollout_batch = 2  # not a multiple of the 4 data-parallel chips
    with pytest.raises(ConfigError, match="grpo.rollout_batch=2 is not a multiple of the "
                                          "data-parallel size 4"):
        build_programs(PlanSpec.of(plan_lib.as_spec(c)), mesh)
