"""GRPOEngine: the jitted pieces of one diffu-GRPO iteration, wired to a mesh.

rollout(): prompts -> G completions each (jitted sampler) -> decoded text -> task rewards
-> group advantages -> old and reference per-token log-probs for all mu mask seeds (one
batched estimator call each, before any update, as d1).
update(): one optimizer step on the rollout with the mask seed of inner iteration ``it``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from d1jax.objectives import advantages as adv_lib
from d1jax.model import lora as lora_lib
from d1jax import sampling as smp
from d1jax import sharding
from d1jax.train import rollout as rl
from d1jax.train import steps as steps_lib


@dataclasses.dataclass
class Rollout:
    batch: dict[str, Any]  # device arrays for the update step (batch-sharded)
    mask_seeds: np.ndarray  # [mu]


def sampler_config(config, s) -> smp.SamplerConfig:
    sc = config.sampler
    return smp.SamplerConfig(
        gen_length=sc.gen_length, block_length=sc.block_length, steps=sc.steps,
        temperature=sc.temperature, cfg_scale=sc.cfg_scale, remasking=sc.remasking,
        mask_id=s.model_config.mask_token_id, use_attention_mask=sc.use_attention_mask,
        eos_id=s.ids["eos"], eot_id=s.ids["eot"] if s.ids["eot"] is not None else s.ids["eos"],
        kv_cache=sc.kv_cache, threshold=sc.threshold,
        recompute=sc.get("recompute", "block"), cache_refresh=sc.get("cache_refresh", 0))


class GRPOEngine:
    """Holds the train state and the compiled functions of one GRPO run."""

    def __init__(self, config, setup):
        self.config, self.s = config, setup
        g = config.grpo
        self.mu = g.num_iterations
        self.key = jax.random.key(config.seed)
        self.batch_sharding = sharding.batch_sharding(setup.mesh, 2, setup.rules)
        self.sampler_cfg = sampler_config(config, setup)
        # The fast sampler (KV cache, parallel decoding) only changes rollouts; the
        # log-prob estimator is the same one-step estimator either way.
        self._generate = smp.make_generate_fn(smp.llada_fns(setup.model), self.sampler_cfg,
                                              setup.model_config.max_sequence_length)
        self.steps = steps_lib.make_grpo_steps(setup.model, config, setup.mesh, setup.rules)
        with sharding.activate(setup.mesh, setup.rules):
            self.state = self.steps.init_state(setup.params)

    def _put(self, a: np.ndarray):
        return sharding.host_to_global(a, self.s.mesh, self.s.rules)

    def rollout(self, task, examples: list[dict], rollout_idx: int):
        """One rollout on ``examples`` (each prompt already repeated G times)."""
        s, g = self.s, self.config.grpo
        t0 = time.perf_counter()
        texts = rl.chat_prompts(s.tokenizer, task, examples)
        ids, mask = rl.encode_prompts(s.tokenizer, texts, self.config.max_prompt_length)
        key = jax.random.fold_in(self.key, rollout_idx)
        k_gen, k_seed = jax.random.split(key)
        with sharding.activate(s.mesh, s.rules):
            out = self._generate(self.state.policy_params(), self._put(ids), self._put(mask), k_gen)
        seqs = sharding.global_to_host(out.ids, s.mesh, s.rules)
        t_gen = time.perf_counter() - t0
        comp = seqs[:, ids.shape[1]:]
        cmask = rl.completion_mask(comp, s.ids["eos"])
        completions = s.tokenizer.batch_decode(comp, skip_special_tokens=True)
        per_func = rl.score(task, completions, examples)
        rewards = rl.weighted_rewards(task, per_func)
        advantages = adv_lib.compute(g.advantage, rewards, g.num_generations)
        t_score = time.perf_counter() - t0 - t_gen
        if g.random_masking:
            seeds = np.asarray(jax.random.randint(k_seed, (self.mu,), 0, 2 ** 12))
        else:
            seeds = np.full((self.mu,), 42)
        batch = {"prompt_ids": self._put(ids), "prompt_mask": self._put(mask),
                 "completion_ids": self._put(comp.astype(np.int32)),
                 "completion_mask": self._put(cmask), "advantages": self._put(
                     np.asarray(advantages, np.float32))}
        batch["mask_seeds"] = jax.device_put(seeds.astype(np.int32), sharding.replicated(s.mesh))
        with sharding.activate(s.mesh, s.rules):
            batch.update(self.steps.rollout_logps(self.state, batch))
        jax.block_until_ready(batch)
        t_logp = time.perf_counter() - t0 - t_gen - t_score
        metrics = rl.reward_metrics(task, sharding.gather_rows(per_func), g.num_generations)
        metrics.update(completion_length=float(sharding.gather_rows(cmask).sum(1).mean()),
                       time_generate=t_gen,
                       time_score=t_score, time_old_ref_logps=t_logp,
                       generated_tokens_per_s=comp.size * jax.process_count() / max(t_gen, 1e-9))
        sample = {"prompt": texts[0], "completion": completions[0], "reward": str(rewards[0])}
        return Rollout(batch, seeds), metrics, sample

    def update(self, roll: Rollout, it: int, step: int) -> dict[str, float]:
        """Inner iteration ``it`` (mask seed ``it``) of the rollout; returns its metrics."""
        t0 = time.perf_counter()
        with sharding.activate(self.s.mesh, self.s.rules):
            self.state, m = self.steps.update(self.state, roll.batch, jnp.int32(it),
                                              jax.random.fold_in(self.key, 10_000_019 + step))
            g = self.config.grpo
            if g.sync_ref_model and g.beta > 0 and (step + 1) % g.ref_model_sync_steps == 0:
                self.state = self.steps.sync_reference(self.state, g.ref_model_mixup_alpha)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        m["time_update"] = time.perf_counter() - t0
        return m

    def export_params(self) -> dict:
        """Plain LLaDA params (adapters merged) for the Hugging Face export."""
        return lora_lib.merge(self.state.policy_params(), self.s.model.lora)
