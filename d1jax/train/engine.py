"""GRPOEngine: the jitted pieces of one diffu-GRPO iteration, wired to a mesh.

rollout(): prompts -> G completions each (jitted sampler, in calls of ``grpo.rollout_batch``
rows) -> decoded text -> task rewards
-> group advantages -> old and reference per-token log-probs for all mu mask seeds (one
batched estimator call each, before any update, as d1; the first seed's old ones come from
the first update itself, ``pure_steps.first_old_from_update``; the reference is the base
model with adapters off under LoRA, or the kept copy with ``grpo.sync_ref_model``).
update(): one optimizer step on the rollout with the mask seed of inner iteration ``it``.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from d1jax import config as config_lib
from d1jax import sharding
from d1jax.model.tokenizer import encode_prompts
from d1jax.objectives import advantages as adv_lib
from d1jax.objectives.batch import GRPOBatch
from d1jax.objectives.table import OBJECTIVES
from d1jax.run.build import data_parallel_size
from d1jax.run.spec import RunSpec
from d1jax.train import jit_steps as steps_lib
from d1jax.train import rollout as rl
from d1jax.train.data import ExampleIterator


class GRPOEngine:
    """Holds the train state and the compiled functions of one GRPO run; with a task and
    its training examples, also the ``loop.Engine`` that ``loop.train`` drives."""

    def __init__(self, spec: RunSpec, setup, task=None, examples: list[dict] | None = None):
        self.spec, self.s, self.task = spec, setup, task
        self.mu = spec.grpo.num_iterations
        self.key = jax.random.key(spec.seed)
        self.total, self.desc = spec.train.num_steps, f"grpo {getattr(task, 'name', '')}"
        self.data = None if examples is None else ExampleIterator(
            examples, spec.grpo_run.prompts_per_step, seed=spec.seed)
        # The fast sampler (KV cache, parallel decoding) only changes rollouts; the
        # log-prob estimator is the same one-step estimator either way.
        self.steps = steps_lib.for_run(spec, setup.model, setup.mesh, setup.ids,
                                        spec.train.num_steps)
        self.state = self.steps.init(setup.params)
        g = spec.grpo_run  # rollout sampler calls a step (grpo.rollout_batch rows each)
        self.rollout_chunks = config_lib.rollout_chunks(
            g.prompts_per_step * g.num_generations, g.rollout_batch,
            data_parallel_size(setup.mesh),
            jax.process_count())

    def load(self, state) -> None:
        self.state = state

    def advance(self, step: int):
        """One rollout of the next prompts (each G times) and its mu updates (d1's
        Algorithm 1; ``step`` counts optimizer steps, as TRL does): yields after each
        update, with its metrics on ``train.log_every`` steps and the rollout's last."""
        t, g = self.spec.train, self.spec.grpo_run
        examples = rl.repeat_examples(next(self.data), g.num_generations)
        batch, roll_metrics, texts = self.rollout(self.task, examples, step // self.mu)
        for it in range(self.mu):
            m = self.update(batch, it, step)
            step += 1
            if step % t.log_every == 0 or it == self.mu - 1:
                sample = it == 0 and step % t.sample_every < self.mu
                yield step, {**roll_metrics, **m}, texts if sample else None
            else:
                yield step, None, None
            if step >= self.total:
                return

    def _put(self, a: np.ndarray):
        return sharding.host_to_global(a, self.s.mesh, self.s.rules)

    def _generate(self, ids: np.ndarray, mask: np.ndarray, key):
        """(prompts then completions [B, Lp + gen_length] on the host, the sampler's
        ``decoded_at`` [B, gen_length] on the device: TraceRL's trace).

        In ``rollout_chunks`` calls of ``grpo.rollout_batch`` rows (one compiled program):
        each host's rows split into equal pieces, call c taking piece c of every host, with
        key ``key`` for c = 0 and ``fold_in(key, c)`` after. One call (the default) is the
        rollout as it always was; more draw other samples of the same rows, as the samplers
        draw each step's noise for the whole batch from one key."""
        s, n = self.s, self.rollout_chunks
        params = self.state.policy_params()
        outs = []
        with sharding.activate(s.mesh, s.rules):
            for c, (i, m) in enumerate(zip(np.split(ids, n), np.split(mask, n))):
                outs.append(self.steps.generate(params, self._put(i), self._put(m),
                                                key if c == 0 else jax.random.fold_in(key, c)))
        if n == 1:
            return sharding.global_to_host(outs[0].ids, s.mesh, s.rules), outs[0].decoded_at
        host = [[sharding.global_to_host(x, s.mesh, s.rules) for x in (o.ids, o.decoded_at)]
                for o in outs]
        return (np.concatenate([h[0] for h in host]),
                self._put(np.concatenate([h[1] for h in host])))

    def _said_truncated(self, n: int) -> None:
        """Once a run: prompts longer than max_prompt_length lose their start (as in d1)."""
        if not getattr(self, "_truncation_said", False) and jax.process_index() == 0:
            print(f"grpo: {n} prompts of a rollout are longer than max_prompt_length="
                  f"{self.spec.max_prompt_length} tokens and lose their start, as in d1 (TRL); "
                  "raise max_prompt_length to keep them whole (said once)", flush=True)
        self._truncation_said = True

    def _mask_seeds(self, key) -> np.ndarray:
        if self.spec.grpo_run.random_masking:
            return np.asarray(jax.random.randint(key, (self.mu,), 0, 2 ** 12), np.int32)
        return np.full((self.mu,), 42, np.int32)

    def rollout(self, task, examples: list[dict], rollout_idx: int):
        """One rollout on ``examples`` (each prompt already repeated G times): the batch
        for the mu updates, its metrics and one sample as text."""
        s, g = self.s, self.spec.grpo_run
        t0 = time.perf_counter()
        texts = rl.chat_prompts(s.tokenizer, task, examples)
        ids, mask = encode_prompts(s.tokenizer, texts, self.spec.max_prompt_length,
                                   on_truncate=self._said_truncated)
        k_gen, k_seed = jax.random.split(jax.random.fold_in(self.key, rollout_idx))
        seqs, decoded_at = self._generate(ids, mask, k_gen)
        t_gen = time.perf_counter() - t0
        comp = seqs[:, ids.shape[1]:]
        cmask = adv_lib.completion_mask(comp, s.ids["eos"])
        completions = s.tokenizer.batch_decode(comp, skip_special_tokens=True)
        per_func = task.reward_columns(completions, examples)
        rewards = task.weigh(per_func)  # logged; TraceRL's estimator reads correctness
        advantages = adv_lib.from_columns(g.advantage, task, per_func, g.num_generations)
        t_score = time.perf_counter() - t0 - t_gen
        batch = GRPOBatch(
            prompt_ids=self._put(ids), prompt_mask=self._put(mask),
            completion_ids=self._put(comp.astype(np.int32)), completion_mask=self._put(cmask),
            advantages=self._put(np.asarray(advantages, np.float32)),
            mask_seeds=jax.device_put(self._mask_seeds(k_seed), sharding.replicated(s.mesh)))
        if OBJECTIVES[self.spec.grpo.objective].trace:  # TraceRL scores the rollout's trace
            batch = batch.replace(per_row={"decoded_at": decoded_at})
        batch = batch.replace(**self.steps.rollout_logps(self.state, batch))
        jax.block_until_ready(batch)
        t_logp = time.perf_counter() - t0 - t_gen - t_score
        metrics = rl.reward_metrics(task, sharding.gather_rows(per_func), g.num_generations)
        metrics.update(completion_length=float(sharding.gather_rows(cmask).sum(1).mean()),
                       time_generate=t_gen, time_score=t_score, time_old_ref_logps=t_logp,
                       generated_tokens_per_s=comp.size * jax.process_count() / max(t_gen, 1e-9))
        sample = {"prompt": texts[0], "completion": completions[0], "reward": str(rewards[0])}
        return batch, metrics, sample

    def update(self, batch: GRPOBatch, it: int, step: int) -> dict[str, float]:
        """Inner iteration ``it`` (mask seed ``it``) of the rollout; returns its metrics."""
        t0 = time.perf_counter()
        g = self.spec.grpo_run
        self.state, m = self.steps.grpo_update(
            self.state, batch.replace(iteration=np.int32(it)),
            jax.random.fold_in(self.key, 10_000_019 + step))
        # Only with sync_ref_model (not d1's default under LoRA): mix the reference copy.
        if g.sync_ref_model and self.spec.grpo.beta > 0 and (step + 1) % g.ref_model_sync_steps == 0:
            self.state = self.steps.sync_reference(self.state, g.ref_model_mixup_alpha)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        m["time_update"] = time.perf_counter() - t0
        return m
