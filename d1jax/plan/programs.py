"""What a run jits, rebuilt from its spec with abstract params (no weights, no data).

``build_programs(spec, mesh)`` is the one place that knows the training and sampling
interfaces; everything else in ``d1jax.plan`` sees only ``PlannedProgram`` values. The programs
are the run's own: ``d1jax.train.jit_steps.for_run`` builds the jitted rollout sampler and
update steps exactly as training does, and the planner only lowers them with abstract
inputs.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable

import jax
from jax.sharding import Mesh

from d1jax import config as config_lib
from d1jax import sharding as shd
from d1jax.model import family as family_lib, predictor
from d1jax.model.tokenizer import MASK
from d1jax.objectives import logprob, registry
from d1jax.plan import flops as fl
from d1jax.run import build as build_lib
from d1jax.run import spec as spec_lib
from d1jax.train import jit_steps as steps_lib
from d1jax.train import pure_steps


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """A run as the planner sees it: its typed spec and its architecture (its family's
    config class: ``LLaDAConfig``, ``DreamConfig``)."""

    run: spec_lib.RunSpec
    model_config: Any

    @classmethod
    def of(cls, run: spec_lib.RunSpec) -> "PlanSpec":
        return cls(run, architecture(run.model))


@dataclasses.dataclass(frozen=True)
class PlannedProgram:
    """One jitted program of a run: ``lower()`` returns its ``jax.stages.Lowered`` for the
    abstract ``args`` (ShapeDtypeStruct trees carrying NamedShardings); FLOPs are global
    per call, loop-aware."""

    name: str
    lower: Callable[[], Any]
    args: tuple
    flops_model: float  # Without recomputation (the MFU convention).
    flops_hardware: float  # With remat recomputation: what the chips execute.
    loop_bound: int  # Trip count assumed for loops XLA cannot count (the sampler's steps).
    weight_bytes: int  # Global bytes of the model weights the program reads.
    logits_bytes: int  # Global bytes of float32 [B, L, V] logits of its batch.
    tokens: int = 0  # Tokens generated per call (samplers).
    sequences: int = 0  # Sequences generated per call (samplers).
    calls: int = 1  # Calls a step (the rollout sampler: grpo.rollout_batch rows a call).
    # The arguments holding the model's weights (params, or the state's trainable and
    # frozen params: float32 master weights under full fine-tuning): whether a chip holds a
    # whole copy is read from their shardings (``compile.weight_share``).
    weight_args: Any = None


class _TokenizerShape:
    """What ``build.random_model_config`` reads of a tokenizer, for a random model planned
    without training its tokenizer: ``tokenizer_vocab`` tokens, mask, EOS and pad among
    the last ids, no EoT. Like the tiny tokenizer it names no ``mask_token``: the mask is
    found by LLaDA's token name."""

    mask_token, eos_token, pad_token = None, "<eos>", "<eos>"

    def __init__(self, n: int):
        self.n, self.eos_token_id, self.pad_token_id, self.unk_token_id = n, n - 2, n - 2, -1

    def __len__(self) -> int:
        return self.n

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.n - 1 if token == MASK else self.unk_token_id

    def get_vocab(self) -> dict[str, int]:
        """Only the tokens a planner's caller looks up by name (no chat-turn end)."""
        return {MASK: self.n - 1, self.eos_token: self.eos_token_id}


def architecture(m: spec_lib.ModelSpec) -> Any:
    """The run's architecture in its family's config class (``model.family``): model.path's
    config.json, the random_init preset as ``run.build`` sizes it (tiny configs), or the
    family's released size (LLaDA-8B, Dream-7B) when model.path is unset or holds no
    config.json."""
    fam = family_lib.get(m.family)
    if m.path and (Path(m.path).expanduser() / "config.json").is_file():
        return fam.read_config(Path(m.path).expanduser())
    if m.random:
        return build_lib.random_model_config(m, _TokenizerShape(m.tokenizer_vocab))
    return fam.make_config(fam.default_preset)


def _nbytes(tree) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def _on_accelerator(run: spec_lib.RunSpec, rows: int, positions: int, vocab: int
                    ) -> spec_lib.RunSpec:
    """``run`` with the head chunk an accelerator's ``auto_chunk`` picks for ``rows`` x
    ``positions`` (this host is a CPU, where it would pick the CPU budget); an objective
    with its own automatic chunk (``hparams.seq_chunk`` None) gets the one for its
    estimator's rows (``flops.estimator_rows``)."""
    chunk = logprob.auto_chunk(rows, positions, vocab, logprob.ACCELERATOR_CHUNK_BYTES)
    if run.grpo is not None:
        hp, entry = run.grpo.hparams, registry.get(run.grpo.objective)
        if entry.on_accelerator is not None:  # an objective's own automatic chunk
            hp = entry.on_accelerator(hp, rows, run.max_prompt_length, positions)
        if getattr(hp, "seq_chunk", 0) is None:
            hp = dataclasses.replace(hp, seq_chunk=logprob.auto_chunk(
                rows * fl.estimator_rows(run.grpo), positions, vocab,
                logprob.ACCELERATOR_CHUNK_BYTES))
        run = dataclasses.replace(run, grpo=dataclasses.replace(run.grpo, seq_chunk=chunk,
                                                                hparams=hp))
    if run.sft is not None:
        run = dataclasses.replace(run, sft=dataclasses.replace(run.sft, seq_chunk=chunk))
    return run


def _peeled(model) -> bool:
    """Whether the model's first and last layers run outside its layer loop (flops.py)."""
    return family_lib.of(model).peeled_ends


def _steps(run: spec_lib.RunSpec, model, mesh: Mesh) -> steps_lib.JittedSteps:
    """The run's jitted steps; token ids are the architecture's (no tokenizer here). A run
    sized in epochs (``train.num_steps`` 0) has a length only its data gives: its schedule is
    planned over ``EPOCH_RUN_STEPS`` (a constant inside the program either way)."""
    mcfg = model.config
    ids = {"mask": mcfg.mask_token_id, "eos": mcfg.eos_token_id, "eot": mcfg.eos_token_id}
    return steps_lib.for_run(run, model, mesh, ids, run.train.num_steps or EPOCH_RUN_STEPS)


# The optimizer steps a plan assumes for a run sized in epochs (its warmup and decay need one).
EPOCH_RUN_STEPS = 1000


def build_programs(spec: PlanSpec, mesh: Mesh) -> list[PlannedProgram]:
    """The programs a run of ``spec`` jits on ``mesh`` (by its stage). Call outside a mesh
    context: each ``PlannedProgram.lower`` enters the run's mesh and rules itself."""
    builders = {"grpo": _grpo_programs, "sft": _sft_programs, "eval": _eval_programs}
    model = build_lib.make_model(spec.run.model, spec.model_config)
    return builders[spec.run.stage](spec.run, model, mesh)


def _sampler_program(name: str, steps: steps_lib.JittedSteps, rows: int, prompt: int,
                     calls: int = 1) -> PlannedProgram:
    """The run's rollout / eval sampler on [rows, prompt] prompts (one of ``calls`` a
    step)."""
    model, scfg = steps.model, steps.sampler
    params = steps.abstract_state().policy_params()
    ids, mask = steps.prompts_like(rows, prompt)
    args = (params, ids, mask, steps.rng_like())

    def lower():
        with shd.activate(steps.mesh, steps.rules):  # as the run calls it
            return steps.generate.lower(*args)
    fwd = fl.sampler(model.config, scfg, rows, prompt, model.lora, peeled=_peeled(model),
                     shifted=predictor.is_shifted(model)).total
    length = prompt + scfg.gen_length
    return PlannedProgram(name, lower, args, fwd, fwd, loop_bound=scfg.loop_steps,
                   weight_bytes=_nbytes(params),
                   logits_bytes=4 * rows * length * model.config.output_vocab,
                   tokens=rows * scfg.gen_length, sequences=rows, calls=calls,
                   weight_args=params)


def _step_program(name: str, steps: steps_lib.JittedSteps, args: tuple, batch, **figures
                  ) -> PlannedProgram:
    """``steps.program(name)`` lowered on ``args`` (the state first, ``batch`` among them)."""
    state = args[0]
    return PlannedProgram(name, lambda: steps.program(name, batch).lower(*args), args,
                          weight_args=(state.params, state.frozen), **figures)


def _grpo_programs(run: spec_lib.RunSpec, model, mesh: Mesh) -> list[PlannedProgram]:
    mcfg, g, cfg = model.config, run.grpo_run, run.grpo
    rows, prompt, comp = g.prompts_per_step * g.num_generations, run.max_prompt_length, \
        run.sampler.gen_length
    mu, v, micro = cfg.num_iterations, mcfg.output_vocab, rows // cfg.grad_accum
    config_lib.check_batch(rows, g.num_generations, build_lib.data_parallel_size(mesh),
                           "prompts_per_step x G", cfg.grad_accum)  # as the run checks
    # The sampler generates the step's rows in calls of grpo.rollout_batch rows (0: one).
    calls = config_lib.rollout_chunks(rows, g.rollout_batch, build_lib.data_parallel_size(mesh))
    # The old/ref pass sees every row at once, the update one micro-batch at a time.
    logps_steps = _steps(_on_accelerator(run, rows, comp, v), model, mesh)
    update_steps = _steps(_on_accelerator(run, micro, comp, v), model, mesh)
    state, rng = update_steps.abstract_state(), update_steps.rng_like()
    weights = _nbytes(state.policy_params())
    logits = 4 * rows * (prompt + comp) * v

    cost = registry.get(cfg.objective).flops_model(model, update_steps.grpo, comp)
    if cost.layout == "ar":  # one forward per completion position, in chunks
        est = functools.partial(fl.ar_estimator, mcfg, rows, prompt, comp, chunk=cost.chunk,
                                peeled=_peeled(model))
    elif cost.layout == "stream":  # the clean row and its noised copies, one forward
        est = functools.partial(fl.stream_estimator, mcfg, rows, prompt, comp, cost.copies)
    else:
        est = functools.partial(fl.estimator, mcfg, rows, prompt, comp, copies=cost.copies,
                                peeled=_peeled(model))
    ref_lora = model.lora if run.keep_reference else None  # LoRA without a copy: base is ref
    old_passes = mu - 1 if pure_steps.first_old_from_update(cfg) else mu * (mu > 1)
    logps_flops = (old_passes * est(lora=model.lora).total
                   + mu * (cfg.beta != 0) * est(lora=ref_lora).total)
    hp = update_steps.grpo.hparams  # an objective's own head chunk, if it has one
    chunk = getattr(hp, "seq_chunk", None) or update_steps.grpo.seq_chunk
    ar = cost.layout == "ar"  # its chunks are rematerialised, head included
    model_f, hw_f = fl.train_step(est(lora=model.lora), lora=model.lora is not None,
                                  remat=run.model.remat or ar, head_remat=ar or chunk < comp,
                                  peeled=_peeled(model))
    r = logps_steps.grpo_batch_like(rows, prompt, comp, for_update=False)
    b = update_steps.grpo_batch_like(rows, prompt, comp)
    return [
        _sampler_program("rollout", update_steps, rows // calls, prompt, calls),
        _step_program("rollout_logps", logps_steps, (state, r), r, flops_model=logps_flops,
                      flops_hardware=logps_flops, loop_bound=1, weight_bytes=weights,
                      logits_bytes=logits),
        _step_program("grpo_update", update_steps, (state, b, rng), b, flops_model=model_f,
                      flops_hardware=hw_f, loop_bound=1, weight_bytes=weights,
                      logits_bytes=logits // cfg.grad_accum),
    ]


def _sft_programs(run: spec_lib.RunSpec, model, mesh: Mesh) -> list[PlannedProgram]:
    mcfg, s = model.config, run.sft_run
    micro = s.batch_size // run.sft.grad_accum
    config_lib.check_batch(s.batch_size, 1, build_lib.data_parallel_size(mesh), "sft.batch_size",
                           run.sft.grad_accum)
    steps = _steps(_on_accelerator(run, micro, s.max_length, mcfg.output_vocab), model, mesh)
    state, rng = steps.abstract_state(), steps.rng_like()
    batch = steps.sft_batch_like(s.batch_size, s.max_length)
    fwd = fl.forward(mcfg, s.batch_size, s.max_length, s.max_length, s.max_length, model.lora)
    model_f, hw_f = fl.train_step(fwd, lora=model.lora is not None, remat=run.model.remat,
                                  head_remat=steps.sft.seq_chunk < s.max_length,
                                  peeled=_peeled(model))
    return [_step_program(
        "sft_update", steps, (state, batch, rng), batch, flops_model=model_f,
        flops_hardware=hw_f, loop_bound=1, weight_bytes=_nbytes(state.policy_params()),
        logits_bytes=4 * micro * s.max_length * mcfg.output_vocab)]


def _eval_programs(run: spec_lib.RunSpec, model, mesh: Mesh) -> list[PlannedProgram]:
    """One sampler per eval length; ``steps.generate`` is the function the eval run builds
    (``make_generate_fn`` of the model's fns for that sampler config)."""
    return [_sampler_program(f"eval_sampler_{scfg.gen_length}",
                             _steps(dataclasses.replace(run, sampler=scfg), model, mesh),
                             run.eval.batch_size, run.max_prompt_length)
            for scfg in run.eval.samplers]
