"""GRPOEngine's rollout in sampler calls of ``grpo.rollout_batch`` rows: one compiled program
for every call, the ids and TraceRL's trace (``decoded_at``) put back in row order, call c
drawing from the rollout's key (c = 0) or ``fold_in(key, c)``; bad chunk sizes refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest

from d1jax import sharding as shd
from d1jax.config import ConfigError, rollout_chunks
from d1jax.model.tokenizer import encode_prompts
from d1jax.run.build import build
from d1jax.run.spec import from_config
from d1jax.train import engine, grpo
from d1jax.train import rollout as rl
from tests.config_files import load_config

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
ROWS, CHUNK = 16, 8  # 4 prompts x G 4, on 8 devices (fsdp 8): two calls of 8 rows


def _config():
    c = load_config("configs/sdar/tracerl_math.py", "tiny")
    c.grpo.prompts_per_step = ROWS // c.grpo.num_generations
    return c


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny TraDo-shaped TraceRL run (block sampler, its trace) on 8 fake devices."""
    spec = from_config(_config())
    task = spec.task.build()
    examples = grpo._train_examples(spec, task)[:64]
    s = build(spec, tmp_path_factory.mktemp("engine"), spec.mesh.build(),
              texts=lambda: grpo._tokenizer_texts(task, examples))
    return spec, s, task, examples


def _engine(setup, rollout_batch, programs=None):
    spec, s, task, examples = setup
    spec = dataclasses.replace(spec, grpo_run=dataclasses.replace(
        spec.grpo_run, rollout_batch=rollout_batch))
    eng = engine.GRPOEngine(spec, s, task, examples)
    if programs is not None:  # the same jitted programs: one compile for the test
        eng.steps = programs.steps
    return eng


def _rollout(eng, examples):
    examples = rl.repeat_examples(examples[:ROWS // 4], 4)
    batch, _, _ = eng.rollout(eng.task, examples, 3)
    return (np.asarray(batch.completion_ids), np.asarray(batch.per_row["decoded_at"]),
            examples)


def test_chunked_rollout_is_each_call_on_its_rows_with_its_key(setup):
    spec, s, task, examples = setup
    whole = _engine(setup, 0)
    ids0, trace0, rows = _rollout(whole, examples)
    assert whole.rollout_chunks == 1
    # rollout_batch = every row is the default's one call, bit for bit
    same = _engine(setup, ROWS, whole)
    ids1, trace1, _ = _rollout(same, examples)
    np.testing.assert_array_equal(ids1, ids0)
    np.testing.assert_array_equal(trace1, trace0)

    chunked = _engine(setup, CHUNK, whole)
    assert chunked.rollout_chunks == 2
    ids2, trace2, _ = _rollout(chunked, examples)
    # Reference: our own loop over the two halves, the sampler called on each with the
    # rollout's key (first) and fold_in(key, 1) (second), outside the engine.
    texts = rl.chat_prompts(s.tokenizer, task, rows)
    p_ids, p_mask = encode_prompts(s.tokenizer, texts, spec.max_prompt_length)
    key = jax.random.split(jax.random.fold_in(jax.random.key(spec.seed), 3))[0]
    want_ids, want_trace = [], []
    with shd.activate(s.mesh, s.rules):
        for c, k in enumerate([key, jax.random.fold_in(key, 1)]):
            rows_c = slice(c * CHUNK, (c + 1) * CHUNK)
            out = whole.steps.generate(
                whole.state.policy_params(), shd.host_to_global(p_ids[rows_c], s.mesh, s.rules),
                shd.host_to_global(p_mask[rows_c], s.mesh, s.rules), k)
            want_ids.append(np.asarray(out.ids)[:, p_ids.shape[1]:])
            want_trace.append(np.asarray(out.decoded_at))
    np.testing.assert_array_equal(ids2, np.concatenate(want_ids))
    np.testing.assert_array_equal(trace2, np.concatenate(want_trace))
    assert trace2.shape == trace0.shape and (trace2 >= 0).any()
    # The samplers draw a step's noise for the whole batch from one key: the second call's
    # rows are other samples than the same rows in one call (what chunking changes).
    assert not np.array_equal(ids2[CHUNK:], ids0[CHUNK:])


@pytest.mark.parametrize("rows,chunk,dp,procs,needle", [
    (16, 6, 8, 1, "positive divisor of the rollout's 16 rows"),
    (16, -8, 8, 1, "positive divisor"),
    (32, 4, 8, 1, "not a multiple of the data-parallel size 8"),
    (32, 8, 8, 16, "does not split over the 16 processes"),
])
def test_bad_rollout_batch_is_refused_naming_it(rows, chunk, dp, procs, needle):
    with pytest.raises(ConfigError, match=f"grpo.rollout_batch={chunk}.*") as e:
        rollout_chunks(rows, chunk, dp, procs)
    assert needle in str(e.value)


def test_rollout_chunks_counts_the_calls():
    assert rollout_chunks(1024, 0, 4) == 1
    assert rollout_chunks(1024, 128, 4) == 8
    assert rollout_chunks(1024, 1024, 8, 2) == 1


def test_prompts_longer_than_max_prompt_length_lose_their_start_and_are_counted(setup):
    """TRL's max_prompt_length keeps a prompt's last tokens; the engine is told how many were
    cut (it says so once a run)."""
    s = setup[1]
    tokens = lambda t: s.tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    long, short = "Write letters. abcd efgh " * 6, "Write letters."
    n = len(tokens(long))
    seen = []
    ids, mask = encode_prompts(s.tokenizer, [long, short], n - 3, on_truncate=seen.append)
    assert seen == [1]
    assert ids[0].tolist() == tokens(long)[3:] and mask[0].all()
    assert mask[1].sum() == len(tokens(short)) and ids[1, -mask[1].sum():].tolist() == tokens(short)
    encode_prompts(s.tokenizer, [long, short], n, on_truncate=seen.append)
    assert seen == [1]  # nothing cut: not called


def test_rollout_advantages_read_correctness_for_tracerl(setup):
    """TraceRL's rollout on a task with math500's reward layout (correctness 2.0 or 0, and a
    format reward; ``Task.correct_reward``) z-scores the groups' correctness and drops the groups whose share correct lies outside [0.2, 0.8]
    (dLLM-RL), while the weighted reward it logs would drop other groups: the batch's
    advantages against the rule applied here to the designed reward columns."""
    spec, s, task, examples = setup
    g = spec.grpo_run.num_generations
    right = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], bool)
    fmt = np.array([[0.25, 0.75, 0.25, 0.75], [0.75, 0.25, 0.75, 0.25],
                    [0.25, 0.75, 0.75, 0.25], [0.75, 0.25, 0.25, 0.75]])
    assert right.shape == (ROWS // g, g) == fmt.shape
    designed = dataclasses.replace(task, reward_funcs=(
        lambda c, e: list(2.0 * right.reshape(-1)), lambda c, e: list(fmt.reshape(-1))),
        reward_weights=(1.0, 1.0), correct_reward=0, correct_at=2.0)
    batch, _, _ = _engine(setup, 0).rollout(designed, rl.repeat_examples(examples[:ROWS // g], g),
                                            0)
    want = np.zeros_like(fmt)
    for i, row in enumerate(right.astype(float)):
        if 0.2 <= row.mean() <= 0.8:  # kept: z-scores of correctness (population std)
            want[i] = (row - row.mean()) / row.std()
    np.testing.assert_allclose(np.asarray(batch.advantages), want.reshape(-1), atol=1e-5)
    assert np.abs(want[1]).sum() == 0 and np.abs(want[0]).sum() > 0
