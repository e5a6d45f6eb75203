"""The diffu-GRPO loop (d1, Algorithm 1): rollouts with the jitted sampler, task rewards,
group advantages, old/reference log-probs for all mu mask seeds, then mu updates.

  python -m d1jax.main --config=configs/grpo_sudoku.py:tiny --workdir=/tmp/grpo_tiny

Counting follows d1 (TRL): ``step`` counts optimizer steps; one rollout feeds mu of them.
Checkpoints are taken at rollout boundaries, so a resumed run replays nothing and its
metrics continue exactly (same seed -> same rollouts, same mask seeds).
"""

from __future__ import annotations

from d1jax import tasks as tasks_lib
from d1jax.metrics import Progress
from d1jax import config as config_lib
from d1jax.train import engine, loop, rollout
from d1jax.train.data import ExampleIterator
from d1jax.train.setup import build, data_parallel_size, make_mesh


def run(config, workdir: str) -> dict:
    """Runs diffu-GRPO as configured; returns the last step's metrics."""
    wd = loop.prepare(config, workdir)
    g = config.grpo
    G, P = g.num_generations, g.prompts_per_step
    config_lib.check_batch(P * G, G, data_parallel_size(make_mesh(config)[0]), "prompts_per_step x G")
    task = tasks_lib.task_from_config(config)
    examples = _train_examples(config, task)
    s = build(config, wd, texts=lambda: _tokenizer_texts(task, examples))
    eng = engine.GRPOEngine(config, s)
    ctx = loop.RunContext.create(config, wd)
    data = ExampleIterator(examples, P, seed=config.seed)
    step, eng.state, meta = ctx.restore(eng.state)
    if meta:
        data.set_state(meta["data"])
    ctx.progress = Progress(config.train.num_steps, initial=step, desc=f"grpo {task.name}")
    last: dict = {}
    try:
        while step < config.train.num_steps and not ctx.should_stop(step, config):
            rollout_idx = step // g.num_iterations
            batch_examples = rollout.repeat_examples(next(data), G)
            roll, roll_metrics, texts = eng.rollout(task, batch_examples, rollout_idx)
            for it in range(g.num_iterations):
                m = eng.update(roll, it, step)
                step += 1
                if step % config.train.log_every == 0 or it == g.num_iterations - 1:
                    last = ctx.log(step, {**roll_metrics, **m},
                                   texts if (it == 0 and step % config.train.sample_every < g.num_iterations) else None)
                if step >= config.train.num_steps:
                    break
            ctx.checkpointer.save(step, eng.state, {"data": data.get_state(), "metrics": last},
                                  force=_crossed(step, g.num_iterations, config.train.save_every))
        ctx.checkpointer.save(step, eng.state, {"data": data.get_state(), "metrics": last}, force=True)
        ctx.checkpointer.wait()
        if config.train.export_hf and step >= config.train.num_steps:
            loop.export_hf(wd, s.model_config, eng.export_params(), s.tokenizer)
    finally:
        ctx.close()
    return last


def _crossed(step: int, per_rollout: int, every: int) -> bool:
    """A save_every boundary fell inside the rollout that ended at ``step``."""
    return every > 0 and (step // every) > ((step - per_rollout) // every)


def _train_examples(config, task) -> list[dict]:
    examples = list(task.load_train(config.task.source or None))
    if config.task.num_train:
        examples = examples[:config.task.num_train]
    return examples


def _tokenizer_texts(task, examples) -> list[str]:
    """Text a tiny tokenizer is trained on: prompts plus well-formed answers."""
    texts = []
    for ex in examples[:512]:
        for msg in task.build_messages(ex):
            texts.append(msg["content"])
        texts.append(f"<reasoning>\n</reasoning>\n<answer>\n{task.ground_truth(ex)}\n</answer>")
    return texts
