"""The diffu-GRPO loop (d1, Algorithm 1): rollouts with the jitted sampler, task rewards,
group advantages, old/reference log-probs for all mu mask seeds, then mu updates.

  python -m d1jax.main --config=configs/grpo_sudoku.py:tiny --workdir=/tmp/grpo_tiny

Counting follows d1 (TRL): ``step`` counts optimizer steps; one rollout feeds mu of them.
Checkpoints are taken at rollout boundaries, so a resumed run replays nothing and its
metrics continue exactly (same seed -> same rollouts, same mask seeds).
"""

from __future__ import annotations

import dataclasses

import jax

from d1jax import config as config_lib
from d1jax.run import context
from d1jax.run.build import build, data_parallel_size
from d1jax.train import engine, loop
from d1jax.train.data import check_examples


def run(config, workdir: str) -> dict:
    """Runs diffu-GRPO as configured; returns the last step's metrics. Raises
    ``context.RunStopped`` when stopped early (SIGTERM, stop_after) after saving."""
    spec, wd = context.prepare(config, workdir)
    g = spec.grpo_run
    mesh = spec.mesh.build()
    config_lib.check_batch(g.prompts_per_step * g.num_generations, g.num_generations,
                           data_parallel_size(mesh), "prompts_per_step x G",
                           spec.optim.grad_accum)
    config_lib.rollout_chunks(g.prompts_per_step * g.num_generations, g.rollout_batch,
                              data_parallel_size(mesh), jax.process_count())
    task = spec.task.build()
    examples = _train_examples(spec, task)
    total = g.num_steps(len(examples), spec.grpo.num_iterations, spec.train.num_steps)
    check_examples(len(examples), g.prompts_per_step, "grpo.prompts_per_step", spec.task.source)
    if g.num_epochs:  # d1's run length: epochs, counted as TRL counts them
        print(f"grpo: num_epochs {g.num_epochs} of {len(examples)} prompts, "
              f"{g.prompts_per_step} a step, mu {spec.grpo.num_iterations}: {total} optimizer "
              "steps", flush=True)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, num_steps=total))
    s = build(spec, wd, mesh, texts=lambda: _tokenizer_texts(task, examples))
    return loop.train(spec, wd, s, engine.GRPOEngine(spec, s, task, examples))


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
