"""Advantage estimators by name, against hand computations."""

import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.objectives import advantages


def test_group_mean_is_d1s_baseline():
    r = np.array([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0])
    np.testing.assert_allclose(advantages.compute("group_mean", r, 4),
                               [0.5, -0.5, 0.0, 0.0, 0, 0, 0, 0])


def test_grpo_divides_by_unbiased_std():
    r = np.array([1.0, 0.0, 1.0, 0.0])
    std = np.std([1, 0, 1, 0], ddof=1)
    np.testing.assert_allclose(advantages.compute("grpo", r, 4), (r - 0.5) / (std + 1e-4),
                               rtol=1e-6)


def test_dr_grpo_and_errors():
    r = np.array([3.0, 1.0])
    np.testing.assert_allclose(advantages.compute("dr_grpo", r, 2), [1.0, -1.0])
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        advantages.compute("ppo", r, 2)
    with pytest.raises(ValueError, match="groups of 3"):
        advantages.compute("group_mean", r, 3)


def test_estimators_accept_jax_arrays():
    r = jnp.array([1.0, 0.0, 1.0, 0.0, 3.0, 3.0, 3.0, 3.0])
    np.testing.assert_allclose(np.asarray(advantages.group_mean(r, 4)),
                               [0.5, -0.5, 0.5, -0.5, 0, 0, 0, 0])
    std = np.std([1, 0, 1, 0], ddof=1)
    np.testing.assert_allclose(np.asarray(advantages.grpo(r, 4)),
                               [0.5 / (std + 1e-4), -0.5 / (std + 1e-4)] * 2 + [0] * 4, rtol=1e-5)


def test_completion_mask_keeps_up_to_and_including_first_eos():
    eos = 9
    ids = np.array([[1, 2, 9, 3, 9],    # first EOS at 2
                    [9, 9, 9, 9, 9],    # EOS first: only it
                    [1, 2, 3, 4, 5]])   # no EOS: everything
    want = [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    np.testing.assert_array_equal(advantages.completion_mask(ids, eos), want)
    np.testing.assert_array_equal(np.asarray(advantages.completion_mask(jnp.array(ids), eos)), want)
