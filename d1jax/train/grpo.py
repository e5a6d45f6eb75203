"""The diffu-GRPO loop (d1, Algorithm 1): rollouts with the jitted sampler, task rewards,
group advantages, old/reference log-probs for all mu mask seeds, then mu updates.

  python -m d1jax.main --config=configs/grpo_sudoku.py:tiny --workdir=/tmp/grpo_tiny

Counting follows d1 (TRL): ``step`` counts optimizer steps; one rollout feeds mu of them.
Checkpoints are taken at rollout boundaries, so a resumed run replays nothing and its
metrics continue exactly (same seed -> same rollouts, same mask seeds).
"""

from __future__ import annotations

import dataclasses

from d1jax import config as config_lib
from d1jax.config.defaults import grpo_num_steps
from d1jax.metrics import Progress
from d1jax.run import context
from d1jax.run.build import build, data_parallel_size
from d1jax.train import engine, rollout
from d1jax.train.data import ExampleIterator


def run(config, workdir: str) -> dict:
    """Runs diffu-GRPO as configured; returns the last step's metrics. Raises
    ``context.RunStopped`` when stopped early (SIGTERM, stop_after) after saving."""
    spec, wd = context.prepare(config, workdir)
    g, t = spec.grpo_run, spec.train
    mu = spec.grpo.num_iterations
    mesh = spec.mesh.build()
    config_lib.check_batch(g.prompts_per_step * g.num_generations, g.num_generations,
                           data_parallel_size(mesh), "prompts_per_step x G",
                           spec.optim.grad_accum)
    task = spec.task.build()
    examples = _train_examples(spec, task)
    if config.grpo.get("num_epochs"):  # d1's run length: epochs, counted as TRL counts them
        spec = dataclasses.replace(spec, train=dataclasses.replace(
            t, num_steps=grpo_num_steps(config, len(examples))))
        t = spec.train
        print(f"grpo: num_epochs {config.grpo.num_epochs} of {len(examples)} prompts, "
              f"{g.prompts_per_step} a step, mu {mu}: {t.num_steps} optimizer steps", flush=True)
    s = build(spec, wd, mesh, texts=lambda: _tokenizer_texts(task, examples))
    eng = engine.GRPOEngine(spec, s)
    ctx = context.RunContext.create(spec, wd)
    data = ExampleIterator(examples, g.prompts_per_step, seed=spec.seed)
    step, eng.state, meta = ctx.restore(eng.state)
    if meta:
        data.set_state(meta["data"])
    ctx.progress = Progress(t.num_steps, initial=step, desc=f"grpo {task.name}")
    last: dict = {}
    try:
        while step < t.num_steps and not ctx.should_stop(step):
            batch_examples = rollout.repeat_examples(next(data), g.num_generations)
            batch, roll_metrics, texts = eng.rollout(task, batch_examples, step // mu)
            for it in range(mu):
                m = eng.update(batch, it, step)
                step += 1
                if step % t.log_every == 0 or it == mu - 1:
                    sample = it == 0 and step % t.sample_every < mu
                    last = ctx.log(step, {**roll_metrics, **m}, texts if sample else None)
                if step >= t.num_steps:
                    break
            ctx.save(step, eng.state, {"data": data.get_state(), "metrics": last},
                     force=_crossed(step, mu, t.save_every))
        ctx.save(step, eng.state, {"data": data.get_state(), "metrics": last}, force=True)
        ctx.checkpointer.wait()
        if t.export_hf and step >= t.num_steps:
            context.export_hf(wd, s, eng.state, source_dir=spec.model.path or None)
    finally:
        ctx.close()
    ctx.check_finished(step, t.num_steps)
    return last


def _crossed(step: int, per_rollout: int, every: int) -> bool:
    """A save_every boundary fell inside the rollout that ended at ``step``."""
    return every > 0 and (step // every) > ((step - per_rollout) // every)


def _train_examples(spec, task) -> list[dict]:
    examples = list(task.load_train(spec.task.source))
    if spec.task.num_train:
        examples = examples[:spec.task.num_train]
    return examples


def _tokenizer_texts(task, examples) -> list[str]:
    """Text a tiny tokenizer is trained on: prompts plus well-formed answers."""
    texts = []
    for ex in examples[:512]:
        for msg in task.build_messages(ex):
            texts.append(msg["content"])
        texts.append(f"<reasoning>\n</reasoning>\n<answer>\n{task.ground_truth(ex)}\n</answer>")
    return texts
