"""Know it fits before paying for the pod: compile a run's programs for a TPU topology from
any host (libtpu, no TPU) and read per-chip HBM, loop-aware FLOPs, time and MFU.

  python -m d1jax.plan --config=configs/grpo_gsm8k.py --topology=v5p:2x2x1 --mesh=1,4,1

``check_fits(run, topology)`` is the same check for a training entry point, before it
loads weights (docs/tpu_plan.md); ``run`` is the ``RunSpec`` (``as_spec(config)``).
"""

from d1jax.plan.compile import DoesNotFit, Estimate, as_spec, check_fits, plan, require_libtpu

__all__ = ["DoesNotFit", "Estimate", "as_spec", "check_fits", "plan", "require_libtpu"]
