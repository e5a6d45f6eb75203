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


# ---------------------------------------------------------------------------- TraceRL's signal

def _config_spec(rel_path, variant=None):
    from d1jax.run.spec import from_config
    from tests.config_files import load_config
    return from_config(load_config(rel_path, variant), weights=False)


def _math_rollout(counts, group, seed=0):
    """Completions of one math500 prompt per entry of ``counts`` (that many of ``group``
    right), answer tags on some rows, right and wrong alike, so the weighted reward (2.0
    correct + 0.25 / 0.75 format) varies inside each correctness class."""
    rng = np.random.default_rng(seed)
    texts, examples, correct = [], [], []
    for i, k in enumerate(counts):
        ex = {"problem": f"What is {i} + 3?", "solution": f"So \\boxed{{{i + 3}}}."}
        for j, ok in enumerate(rng.permutation([True] * k + [False] * (group - k))):
            box = f"\\boxed{{{i + 3 if ok else i + 4}}}"
            tagged = (i + j) % 3 != 0
            texts.append(f"<reasoning>{i} and 3</reasoning><answer>{box}</answer>" if tagged
                         else f"It is {box}.")
            examples.append(ex)
            correct.append(bool(ok))
    return texts, examples, np.array(correct).reshape(len(counts), group)


@pytest.mark.parametrize("rel_path,variant", [("configs/tracerl_math.py", None),
                                              ("configs/tracerl_math.py", "dream"),
                                              ("configs/sdar/tracerl_math.py", None)])
def test_tracerl_configs_advantages_are_theirs_on_correctness(rel_path, variant):
    """dLLM-RL reward/rl_reward.py: z-scores of each task's correctness, tasks with a share
    correct outside [0.2, 0.8] dropped (A = 0 here), whatever d1's weighted reward says."""
    torch = pytest.importorskip("torch")  # noqa: F841  (the port imports it)
    import dllm_rl_port as port
    spec = _config_spec(rel_path, variant)
    g, task = spec.grpo_run, spec.task.build()
    assert (task.name, g.advantage) == ("math500", "zscore_filtered")
    group = g.num_generations
    # 0 right (kept by the weighted reward's format spread), half right (dropped by it),
    # 1/G, G-1 of G and all right (dropped), the shares nearest 0.2 and 0.8 inside, 3 of G
    counts = [0, group // 2, 1, group - 1, group, 3,
              int(np.ceil(0.2 * group)), int(np.floor(0.8 * group))]
    texts, examples, correct = _math_rollout(counts, group)
    columns = task.reward_columns(texts, examples)
    np.testing.assert_array_equal(columns[:, 0] > 0, correct.reshape(-1))  # the rollout's truth
    got = advantages.from_columns(g.advantage, task, columns, group)  # the GRPO loop's call
    want = port.their_rl_rewards(correct.tolist())
    want_b = np.array([want.get((i, j), 0.0) for i in range(len(counts)) for j in range(group)])
    np.testing.assert_allclose(got, want_b, rtol=1e-6, atol=1e-6)
    kept = {i for i, _ in want}
    assert kept == {i for i, k in enumerate(counts) if 0.2 <= k / group <= 0.8}
    assert {1, 6, 7} <= kept and not {0, 2, 3, 4} & kept
    assert all(got.reshape(len(counts), group)[i].any() for i in kept)
    # the logged reward is still d1's weighted one
    np.testing.assert_allclose(task.weigh(columns), columns @ np.array([1.0, 1.0]))


@pytest.mark.parametrize("group", [5, 8, 16])
def test_zscore_filtered_is_their_rl_reward_on_random_groups(group):
    """Every share of G, the edges 0.2 and 0.8 exactly (G = 5) kept as theirs keeps them."""
    pytest.importorskip("torch")
    import dllm_rl_port as port
    rng = np.random.default_rng(group)
    correct = [rng.permutation([True] * k + [False] * (group - k)).tolist()
               for k in list(range(group + 1)) * 3]
    got = advantages.compute("zscore_filtered", np.array(correct, np.float32).reshape(-1), group)
    want = port.their_rl_rewards(correct)
    want_b = [want.get((i, j), 0.0) for i in range(len(correct)) for j in range(group)]
    np.testing.assert_allclose(got, want_b, rtol=1e-6, atol=1e-6)
    if group == 5:
        assert {(1, 0), (4, 0)} <= set(want)  # shares 0.2 and 0.8 are kept


def test_reward_estimators_read_the_weighted_reward():
    from d1jax.tasks import get_task
    task = get_task("math500")
    texts, examples, _ = _math_rollout([2, 1], 4)
    columns = task.reward_columns(texts, examples)
    for name in ("group_mean", "grpo", "dr_grpo", "leave_one_out"):
        np.testing.assert_array_equal(advantages.from_columns(name, task, columns, 4),
                                      advantages.compute(name, task.weigh(columns), 4))


def test_correctness_without_a_declared_reward_must_be_a_share():
    """letters' reward is a share in [0, 1], read as is; a reward beyond [0, 1] with no
    correctness column declared is refused, naming the task and the field."""
    import dataclasses

    from d1jax.tasks import get_task
    letters = get_task("letters")
    cols = np.array([[0.25], [1.0]], np.float32)
    np.testing.assert_array_equal(advantages.signal("zscore_filtered", letters, cols), [0.25, 1])
    math = get_task("math500")
    undeclared = dataclasses.replace(math, correct_reward=None)
    with pytest.raises(ValueError, match="math500.*correct_reward"):
        advantages.signal("zscore_filtered", undeclared, np.array([[2.0, 0.75]], np.float32))
    with pytest.raises(ValueError, match="correct_reward=2"):
        dataclasses.replace(math, correct_reward=2)


def test_gsm8k_and_countdown_correctness_is_the_right_answer_alone():
    """The tasks d1 trains on read correctness as dLLM-RL does (1 right, 0 wrong): gsm8k's
    correctness column (2.0) whatever its four format rewards add, countdown's 1.0 and not
    its 0.1 for a well-formed miss."""
    from d1jax.tasks import get_task
    gsm = get_task("gsm8k")
    ex = {"question": "q", "answer": "72"}
    texts = ["<reasoning>\nr\n</reasoning>\n<answer>\n72\n</answer>\n",  # right, well formed
             "<reasoning>\nr\n</reasoning>\n<answer>\n71\n</answer>\n",  # wrong, well formed
             "72", "nothing"]  # right without tags (d1's extract_xml_answer); wrong
    cols = gsm.reward_columns(texts, [ex] * 4)
    assert gsm.weigh(cols)[1] > 0  # the format rewards pay the wrong answer something
    np.testing.assert_array_equal(advantages.signal("zscore_filtered", gsm, cols), [1, 0, 1, 0])
    cd = get_task("countdown")
    ex = {"nums": [3, 4, 5], "target": 17}
    texts = ["<answer>3 * 4 + 5</answer>", "<answer>3 + 4 + 5</answer>", "no answer"]
    cols = cd.reward_columns(texts, [ex] * 3)
    np.testing.assert_allclose(cols[:, 0], [1.0, 0.1, 0.0])
    np.testing.assert_array_equal(advantages.signal("zscore_filtered", cd, cols), [1, 0, 0])
