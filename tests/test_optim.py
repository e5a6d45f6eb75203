"""d1jax.run.optim's learning-rate schedules against transformers' own lambdas (the Trainer's
``lr_scheduler_type`` values the configs name), runs shorter than their warmup included: a
one-step run at a 3% warmup ratio (dFactory's bd-SFT recipe) used to be refused."""

import functools

import numpy as np
import pytest
from transformers import optimization as hf

from d1jax.run import optim

COMPILE_UNOPTIMIZED = True

HF = {
    "linear": hf._get_linear_schedule_with_warmup_lr_lambda,
    "constant_with_warmup": hf._get_constant_schedule_with_warmup_lr_lambda,
    "cosine_with_min_lr": functools.partial(hf._get_cosine_schedule_with_warmup_lr_lambda,
                                            num_cycles=0.5, min_lr_rate=0.1),
}


@pytest.mark.parametrize("schedule", list(HF))
@pytest.mark.parametrize("total,warmup", [(12, 2), (10, 0), (1, 1), (3, 3), (2, 5)])
def test_schedules_are_hfs_over_the_run(schedule, total, warmup):
    cfg = optim.OptimConfig(learning_rate=0.5, warmup_steps=warmup, total_steps=total,
                            schedule=schedule, min_lr_rate=0.1)
    ours = optim.lr_schedule(cfg)
    kw = {"num_warmup_steps": warmup}
    if schedule != "constant_with_warmup":
        kw["num_training_steps"] = total
    for s in range(total):  # the optimizer steps a run of `total` steps takes
        np.testing.assert_allclose(float(ours(s)), 0.5 * HF[schedule](s, **kw), rtol=1e-6,
                                   atol=1e-8, err_msg=f"step {s}")


def test_a_decaying_schedule_without_a_length_is_refused():
    cfg = optim.OptimConfig(learning_rate=1.0, total_steps=0, schedule="cosine_with_min_lr")
    with pytest.raises(ValueError, match="total_steps=0"):
        optim.lr_schedule(cfg)
