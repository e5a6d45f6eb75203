"""What a run jits, rebuilt from its config with abstract params (no weights, no data).

``build_programs(spec, mesh)`` is the one place that knows the training and sampling
interfaces; everything else in ``d1jax.plan`` sees only ``Program`` values.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
from pathlib import Path
from typing import Any, Callable

import flax.core
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from d1jax import sampling as smp
from d1jax import sharding as shd
from d1jax.model import LLaDA, LLaDAConfig, preset
from d1jax.objectives import logprob
from d1jax.plan import flops as fl
from d1jax.train import engine, optim, setup, steps
from d1jax.train import update as upd


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """A run as the planner sees it: its config, the architecture and the sharding rules."""

    config: Any  # ml_collections.ConfigDict of the run (overrides applied).
    model_config: LLaDAConfig
    rules: tuple
    # Trainable leaves and their optimizer state in float32 (PEFT's adapter dtype) instead
    # of model.param_dtype.
    trainable_f32: bool = False

    @classmethod
    def from_config(cls, config, trainable_f32: bool = False) -> "PlanSpec":
        rules = dict(shd.DEFAULT_RULES)
        rules.update(dict(config.mesh.rules))
        return cls(config, model_config(config), tuple(rules.items()), trainable_f32)


@dataclasses.dataclass(frozen=True)
class Program:
    """One jitted function of a run, ready to lower: ``jax.jit(fn, out_shardings=...,
    donate_argnums=...).lower(*args)``; FLOPs are global per call, loop-aware."""

    name: str
    fn: Callable
    args: tuple  # jax.ShapeDtypeStruct trees carrying NamedShardings.
    out_shardings: Any
    donate_argnums: tuple[int, ...]
    flops_model: float  # Without recomputation (the MFU convention).
    flops_hardware: float  # With remat recomputation: what the chips execute.
    loop_bound: int  # Trip count assumed for loops XLA cannot count (the sampler's steps).
    weight_bytes: int  # Global bytes of the model weights the program reads.
    logits_bytes: int  # Global bytes of float32 [B, L, V] logits of its batch.
    tokens: int = 0  # Tokens generated per call (samplers).
    sequences: int = 0  # Sequences generated per call (samplers).


def model_config(config) -> LLaDAConfig:
    """The run's architecture: model.path's config.json, the random_init preset (tiny
    configs), or LLaDA-8B when model.path is unset or holds no config.json."""
    path = Path(config.model.path).expanduser() if config.model.path else None
    if path is not None and (path / "config.json").is_file():
        return LLaDAConfig.from_hf_dict(json.loads((path / "config.json").read_text()))
    m = config.model
    if m.random_init and path is None:
        over: dict[str, Any] = {}
        if m.width:
            over.update(d_model=m.width, mlp_hidden_size=3 * m.width)
        if m.n_layers:
            over["n_layers"] = m.n_layers
        vocab = m.vocab_size or -(-m.tokenizer_vocab // 64) * 64  # as setup: rounded to 64
        over.update(vocab_size=vocab, embedding_size=vocab, mask_token_id=vocab - 1,
                    eos_token_id=vocab - 2, pad_token_id=vocab - 2, max_sequence_length=1024)
        return preset(m.random_init, **over)
    return preset("llada-8b")


def _model(spec: PlanSpec) -> LLaDA:
    m = spec.config.model
    return LLaDA(spec.model_config, dtype=setup._dtype(m.dtype),
                 param_dtype=setup._dtype(m.param_dtype), remat=m.remat,
                 lora=setup.lora_config(spec.config))


def _placed(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def abstract_params(model: LLaDA, mesh: Mesh, rules) -> dict:
    """The model's params as ShapeDtypeStructs placed by the logical rules."""
    boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    sh = flax.core.meta.unbox(shd.logical_to_sharding(boxed["params"], mesh, rules))
    return _placed(flax.core.meta.unbox(boxed["params"]), sh)


def _f32(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        a.shape, jnp.float32 if jnp.issubdtype(a.dtype, jnp.floating) else a.dtype), tree)


def _abstract_state(spec: PlanSpec, model, opt, mesh, lora: bool, keep_ref: bool
                    ) -> upd.TrainState:
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                          abstract_params(model, mesh, spec.rules))
    init = functools.partial(upd.init_train_state, optimizer=opt, lora=lora,
                             keep_reference=keep_ref)
    state = jax.eval_shape(init, params)
    if spec.trainable_f32:
        state = state.replace(params=_f32(state.params), ref=_f32(state.ref),
                              opt_state=_f32(state.opt_state))
    sh = upd.state_shardings(model, mesh, opt, lora=lora, keep_reference=keep_ref,
                             rules=spec.rules)
    return _placed(state, sh)


def _batch(mesh: Mesh, rules, **shapes) -> dict:
    """Abstract batch of ``name=(shape, dtype)`` placed as the update steps place it."""
    tree = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes.items()}
    return _placed(tree, upd.batch_shardings(mesh, tree, rules))


def _scalar(mesh: Mesh, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((), dtype, sharding=shd.replicated(mesh))


def _key(mesh: Mesh) -> jax.ShapeDtypeStruct:
    return _scalar(mesh, jax.eval_shape(lambda: jax.random.key(0)).dtype)


def _nbytes(tree) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def _chunk(rows: int, positions: int, vocab: int) -> int:
    """The head chunk the run picks on an accelerator (this host is a CPU; ``auto_chunk``
    would pick the CPU budget)."""
    return logprob.auto_chunk(rows, positions, vocab, logprob.ACCELERATOR_CHUNK_BYTES)


def _optimizer(config, total_steps: int):
    return optim.make_optimizer(optim.OptimConfig.from_config(config.optim, total_steps))


def build_programs(spec: PlanSpec, mesh: Mesh) -> list[Program]:
    """The programs a run of ``spec.config`` jits on ``mesh`` (by config.stage); lower them
    inside ``sharding.activate(mesh, spec.rules)``, as the run does."""
    stage = spec.config.stage
    builders = {"grpo": _grpo_programs, "sft": _sft_programs, "eval": _eval_programs}
    if stage not in builders:
        raise ValueError(f"config.stage={stage!r}: the planner knows {sorted(builders)}")
    return builders[stage](spec, _model(spec), mesh)


def _sampler_program(name, spec, model, mesh, scfg, rows: int, prompt: int) -> Program:
    mcfg = model.config
    params = abstract_params(model, mesh, spec.rules)
    ids = _batch(mesh, spec.rules, ids=((rows, prompt), jnp.int32))["ids"]

    def generate(params, prompt_ids, prompt_mask, rng):
        return smp.generate(smp.llada_fns(model), params, prompt_ids, prompt_mask, rng, scfg,
                            mcfg.max_sequence_length)
    fwd = fl.sampler(mcfg, scfg, rows, prompt, model.lora).total
    length = prompt + scfg.gen_length
    return Program(name, generate, (params, ids, ids, _key(mesh)), None, (), fwd, fwd,
                   loop_bound=scfg.loop_steps, weight_bytes=_nbytes(params),
                   logits_bytes=4 * rows * length * mcfg.embedding_size,
                   tokens=rows * scfg.gen_length, sequences=rows)


def _grpo_programs(spec: PlanSpec, model: LLaDA, mesh: Mesh) -> list[Program]:
    config, mcfg = spec.config, spec.model_config
    g, lora = config.grpo, config.lora.enabled
    rows, prompt, comp = g.prompts_per_step * g.num_generations, config.max_prompt_length, \
        config.sampler.gen_length
    ids = types.SimpleNamespace(model_config=mcfg, ids={"eos": mcfg.eos_token_id, "eot": None})
    rollout = _sampler_program("rollout", spec, model, mesh,
                               engine.sampler_config(config, ids), rows, prompt)
    opt = _optimizer(config, config.train.num_steps)
    keep_ref = g.beta != 0 and (g.sync_ref_model or not lora)  # as steps.make_grpo_steps
    state = _abstract_state(spec, model, opt, mesh, lora, keep_ref)
    cfg = steps.grpo_config(config, model)
    mu, v = cfg.num_iterations, mcfg.embedding_size
    f32, i32 = jnp.float32, jnp.int32
    rows_ = dict(prompt_ids=((rows, prompt), i32), prompt_mask=((rows, prompt), i32),
                 completion_ids=((rows, comp), i32), completion_mask=((rows, comp), i32),
                 advantages=((rows,), f32), mask_seeds=((mu,), i32))
    logps_cfg = dataclasses.replace(cfg, seq_chunk=_chunk(rows, comp, v))
    logps = _batch(mesh, spec.rules, **rows_)

    def rollout_logps(state, batch):
        return upd.rollout_logps(model, logps_cfg, state, batch)
    est = functools.partial(fl.estimator, mcfg, rows, prompt, comp, cfg_scale=cfg.cfg_scale)
    ref_lora = model.lora if keep_ref else None  # LoRA without a copy: the base is the ref
    logps_flops = mu * ((mu > 1) * est(lora=model.lora).total
                        + (cfg.beta != 0) * est(lora=ref_lora).total)
    seeds = {k: ((mu, rows, comp), f32) for k, on in
             (("old_logps", mu > 1), ("ref_logps", cfg.beta != 0)) if on}
    batch = _batch(mesh, spec.rules, **rows_, **seeds)
    micro = rows // cfg.grad_accum
    update_cfg = dataclasses.replace(cfg, seq_chunk=_chunk(micro, comp, v))

    def grpo_update(state, batch, it, rng):
        return upd.grpo_update_step(model, opt, update_cfg, state, {**batch, "iteration": it},
                                    rng)
    model_f, hw_f = fl.train_step(est(lora=model.lora), lora=lora, remat=config.model.remat,
                                  head_remat=update_cfg.seq_chunk < comp)
    st_sh = jax.tree.map(lambda a: a.sharding, state)
    weights = _nbytes(abstract_params(model, mesh, spec.rules))
    logits = 4 * rows * (prompt + comp) * v
    return [
        rollout,
        Program("rollout_logps", rollout_logps, (state, logps), None, (), logps_flops,
                logps_flops, 1, weights, logits),
        Program("grpo_update", grpo_update, (state, batch, _scalar(mesh, i32), _key(mesh)),
                (st_sh, None), (0,), model_f, hw_f, 1, weights, logits // cfg.grad_accum),
    ]


def _sft_programs(spec: PlanSpec, model: LLaDA, mesh: Mesh) -> list[Program]:
    config, mcfg = spec.config, spec.model_config
    s, lora = config.sft, config.lora.enabled
    opt = _optimizer(config, max(config.train.num_steps, 1))
    state = _abstract_state(spec, model, opt, mesh, lora, False)
    micro = s.batch_size // config.optim.grad_accum
    cfg = upd.SFTConfig(eps=s.eps, grad_accum=config.optim.grad_accum,
                        lora_dropout=lora and config.lora.dropout > 0,
                        seq_chunk=_chunk(micro, s.max_length, mcfg.embedding_size))
    batch = _batch(mesh, spec.rules, input_ids=((s.batch_size, s.max_length), jnp.int32),
                   prompt_len=((s.batch_size,), jnp.int32))

    def sft_update(state, batch, rng):
        return upd.sft_update_step(model, opt, cfg, state, batch, rng)
    fwd = fl.forward(mcfg, s.batch_size, s.max_length, s.max_length, s.max_length, model.lora)
    model_f, hw_f = fl.train_step(fwd, lora=lora, remat=config.model.remat,
                                  head_remat=cfg.seq_chunk < s.max_length)
    st_sh = jax.tree.map(lambda a: a.sharding, state)
    logits = 4 * micro * s.max_length * mcfg.embedding_size
    return [Program("sft_update", sft_update, (state, batch, _key(mesh)), (st_sh, None), (0,),
                    model_f, hw_f, 1, _nbytes(abstract_params(model, mesh, spec.rules)), logits)]


def _eval_programs(spec: PlanSpec, model: LLaDA, mesh: Mesh) -> list[Program]:
    e, mcfg = spec.config.eval, spec.model_config
    out = []
    for gl in e.gen_lengths:
        scfg = smp.SamplerConfig(
            gen_length=gl, block_length=e.block_length, steps=gl // 2,
            temperature=e.temperature, mask_id=mcfg.mask_token_id,
            use_attention_mask=e.use_attention_mask, eos_id=mcfg.eos_token_id,
            kv_cache=e.kv_cache, threshold=e.threshold, recompute=e.get("recompute", "block"),
            cache_refresh=e.get("cache_refresh", 0))
        out.append(_sampler_program(f"eval_sampler_{gl}", spec, model, mesh, scfg,
                                    e.batch_size, spec.config.max_prompt_length))
    return out
