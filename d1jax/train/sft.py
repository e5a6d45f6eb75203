"""Masked SFT (d1's stage 1, SFT/sft_train.py): prompt kept, completion masked with
t ~ U(eps, 1), cross-entropy on masked tokens weighted by 1/t.

  python -m d1jax.main --config=configs/sft_s1k.py:tiny --workdir=/tmp/sft_tiny
"""

from __future__ import annotations

import time

import jax
import numpy as np

from d1jax import sharding
from d1jax import tasks as tasks_lib
from d1jax.metrics import Progress
from d1jax import config as config_lib
from d1jax.train import loop
from d1jax.train import steps as steps_lib
from d1jax.train.data import ExampleIterator
from d1jax.train.setup import build, data_parallel_size
from d1jax.train.sft_data import encode_sft, trajectory_examples


def sft_examples(config) -> list[dict]:
    """(prompt messages, completion text) pairs for the configured SFT data."""
    name = config.task.name
    noisy = _noisy_corpus(config)
    if name == "s1k":
        from d1jax.tasks import s1k
        rows = s1k.load_train(config.task.source or None)
    else:  # a generated task: d1's prompt and a solution trajectory (offline stand-in)
        task = tasks_lib.task_from_config(config)
        rows = task.load_train(config.task.source or None)
        if not noisy:
            rows = trajectory_examples(task, rows)
    if config.task.num_train:
        rows = rows[:config.task.num_train]
    if noisy:
        from d1jax.demo import data as demo_data
        rows = demo_data.pretraining_documents(task, rows, config.sft.answer_noise, config.seed,
                                              config.sft.format_noise)
    return rows


def _pretrain(config) -> bool:
    objective = config.sft.get("objective", "sft")
    if objective not in ("sft", "pretrain"):
        raise config_lib.ConfigError(f"sft.objective={objective!r}: sft or pretrain")
    if objective == "pretrain" and config.task.name != "sudoku":
        raise config_lib.ConfigError("sft.objective=pretrain builds documents from generated "
                                     f"sudoku puzzles; task.name={config.task.name!r}")
    return objective == "pretrain"


def _noisy_corpus(config) -> bool:
    """Train on ``demo_data`` documents (answers partly wrong / untagged) instead of clean
    trajectories: always for the pretraining objective, and for SFT when a noise is set."""
    noisy = _pretrain(config) or config.sft.answer_noise > 0 or config.sft.format_noise > 0
    if noisy and config.task.name != "sudoku":
        raise config_lib.ConfigError("sft.answer_noise / format_noise corrupt generated sudoku "
                                     f"answers; task.name={config.task.name!r}")
    return noisy


def num_steps(config, n_examples: int) -> int:
    if config.sft.num_epochs:
        return config.sft.num_epochs * (n_examples // config.sft.batch_size)
    return config.train.num_steps


def run(config, workdir: str) -> dict:
    """Runs masked SFT as configured; returns the last step's metrics."""
    wd = loop.prepare(config, workdir)
    rows = sft_examples(config)
    pretrain = _pretrain(config)
    s = build(config, wd, texts=lambda: [m["content"] for r in rows[:512] for m in r["prompt"]]
              + [r["completion"] for r in rows[:512]])
    config_lib.check_batch(config.sft.batch_size, 1, data_parallel_size(s.mesh), "sft.batch_size")
    total = num_steps(config, len(rows))
    steps = steps_lib.make_sft_steps(s.model, config, s.mesh, s.rules, total_steps=total)
    with sharding.activate(s.mesh, s.rules):
        state = steps.init_state(s.params)
    ctx = loop.RunContext.create(config, wd)
    data = ExampleIterator(rows, config.sft.batch_size, seed=config.seed)
    step, state, meta = ctx.restore(state)
    if meta:
        data.set_state(meta["data"])
    ctx.progress = Progress(total, initial=step, desc="sft")
    key = jax.random.key(config.seed)
    last: dict = {}
    try:
        while step < total and not ctx.should_stop(step, config):
            t0 = time.perf_counter()
            enc = encode_sft(s.tokenizer, next(data), config.sft.max_length, train_prompt=pretrain,
                             split=config.sft.get("tokenize", "joint") == "split")
            batch = {k: sharding.host_to_global(v, s.mesh, s.rules) for k, v in enc.items()}
            with sharding.activate(s.mesh, s.rules):
                state, m = steps.update(state, batch, jax.random.fold_in(key, step))
            step += 1
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            dt = time.perf_counter() - t0
            m.update(time_step=dt, tokens_per_s=enc["input_ids"].size / dt)
            last = ctx.log(step, m)
            ctx.checkpointer.save(step, state, {"data": data.get_state(), "metrics": last})
        ctx.checkpointer.save(step, state, {"data": data.get_state(), "metrics": last}, force=True)
        ctx.checkpointer.wait()
        if config.train.export_hf and step >= total:
            from d1jax.model import lora as lora_lib
            loop.export_hf(wd, s.model_config, lora_lib.merge(state.policy_params(), s.model.lora),
                           s.tokenizer)
    finally:
        ctx.close()
    return last
