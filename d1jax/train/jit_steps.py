"""The one jit layer of the update steps, used by training, tests, benchmarks and the planner.

``make_jitted_steps`` jits, for one model, optimizer and mesh: ``rollout_logps``, the GRPO
and SFT updates and ``sync_reference`` (``d1jax.train.pure_steps``), with explicit shardings
(state by ``state_shardings``, batch by its type, rng and metrics replicated), the moving
part of the state donated, the frozen base and the reference copy (kept only with
``keep_reference``: full fine-tuning, or a synced reference) passed through untouched.

Each program is also reachable for compilation without weights or data::

    spec = spec_lib.from_config(config)             # d1jax.run.spec
    mesh = spec.mesh.build(devices)                 # e.g. a TPU topology's devices
    model = build.make_model(spec.model, llada_config)
    steps = for_run(spec, model, mesh, ids, total_steps)
    state = steps.abstract_state()                  # ShapeDtypeStructs with shardings
    rng = steps.rng_like()
    prompt_ids, prompt_mask = steps.prompts_like(rows=B, prompt_len=P)
    steps.generate.lower(state.policy_params(), prompt_ids, prompt_mask, rng).compile()
    rollout = steps.grpo_batch_like(B, P, C, for_update=False)
    steps.program("rollout_logps", rollout).lower(state, rollout).compile()
    batch = steps.grpo_batch_like(B, P, C)
    steps.program("grpo_update", batch).lower(state, batch, rng).compile()
    sft_batch = steps.sft_batch_like(rows=B, length=L)
    steps.program("sft_update", sft_batch).lower(state, sft_batch, rng).compile()
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from d1jax import sampling as smp
from d1jax import sharding as shd
from d1jax.model.predictor import MaskPredictor
from d1jax.objectives.batch import GRPOBatch, SFTBatch
from d1jax.objectives.table import OBJECTIVES, GRPOConfig, SFTConfig
from d1jax.run import oom, optim
from d1jax.run.spec import RunSpec, with_tokens
from d1jax.train import pure_steps
from d1jax.train import state as state_lib
from d1jax.train.state import Params, TrainState

Array = jax.Array
PROGRAMS = ("rollout_logps", "grpo_update", "sft_update")


@dataclasses.dataclass(frozen=True)
class Program:
    """A jitted function behind the step's own signature.

    ``split`` maps the step's arguments (e.g. ``state, batch, rng``) to the jitted
    function's; ``join`` maps its outputs back. ``lower`` accepts the same arguments as
    a call, concrete or ``jax.ShapeDtypeStruct``s. Both trace under ``context`` (the mesh
    and logical-axis rules), so the model's activation constraints take effect.
    """

    jitted: Any
    split: Callable[..., tuple]
    join: Callable[[tuple, Any], Any]
    context: Callable[[], Any]
    name: str = "program"
    # What shrinks it, for the one line an out-of-memory error becomes (``run.oom``).
    oom_hint: Callable[[str], str] = lambda name: "use more devices, or smaller batches"

    def __call__(self, *args):
        with self.context(), oom.named(self.name, lambda: self.oom_hint(self.name)):
            return self.join(args, self.jitted(*self.split(*args)))

    def lower(self, *args):
        with self.context():
            return self.jitted.lower(*self.split(*args))


def _update_split(state: TrainState, batch, rng):
    return state.moving(), state.fixed(), batch, rng


def _update_join(args, out):
    state = args[0]
    moving, metrics = out
    return moving.replace(frozen=state.frozen, ref=state.ref), metrics


@dataclasses.dataclass
class JittedSteps:
    """The update functions jitted for one model, optimizer and mesh (``mesh=None``:
    unsharded). Batches are ``GRPOBatch`` / ``SFTBatch`` or dicts of their fields, numpy
    or device arrays; a program is compiled once per batch structure (which optional
    fields are present)."""

    model: MaskPredictor
    optimizer: optax.GradientTransformation
    mesh: Mesh | None
    lora: bool
    keep_reference: bool = False
    grpo: GRPOConfig | None = None
    sft: SFTConfig | None = None
    sampler: smp.SamplerConfig | None = None
    rules: tuple = shd.DEFAULT_RULES
    # Full fine-tuning: the dtype of the trainable params and AdamW moments (float32 master
    # weights, ``state.init_train_state``); None updates in the model's param_dtype.
    master_dtype: Any = jnp.float32
    # program name -> the change that shrinks it, named when it runs out of memory
    # (``for_run``: ``oom.hint`` of the run's spec).
    oom_hint: Callable[[str], str] | None = None
    _programs: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.grpo is not None and self.grpo.narrow_last_layer is None:  # one device: on
            self.grpo = dataclasses.replace(
                self.grpo, narrow_last_layer=self.mesh is None or self.mesh.size == 1)
        self.state_shardings = None if self.mesh is None else state_lib.state_shardings(
            self.model, self.mesh, self.optimizer, lora=self.lora,
            keep_reference=self.keep_reference, rules=self.rules,
            master_dtype=self.master_dtype)
        self.replicated = None if self.mesh is None else shd.replicated(self.mesh)
        # The rollout sampler: its shardings follow its inputs (params by the rules,
        # prompts over the batch axes).
        self.generate = None if self.sampler is None else self._named("rollout sampler", Program(
            smp.make_generate_fn(smp.model_fns(self.model), self.sampler,
                                 self.model.config.max_sequence_length),
            lambda *args: args, lambda args, out: out, self._context))
        self._mix = jax.jit(pure_steps.mix_reference, donate_argnums=(1,))

    # ------------------------------------------------------------------ state
    def init(self, params: Params) -> TrainState:
        with shd.activate(self.mesh, self.rules):
            return state_lib.init_train_state(params, self.optimizer, lora=self.lora,
                                              keep_reference=self.keep_reference,
                                              shardings=self.state_shardings,
                                              master_dtype=self.master_dtype)

    def abstract_state(self) -> TrainState:
        """The state as ShapeDtypeStructs with their shardings (call outside a mesh
        context: the probe of the params' shapes runs unsharded)."""
        return state_lib.abstract_state(self.model, self.optimizer, lora=self.lora,
                                        keep_reference=self.keep_reference,
                                        shardings=self.state_shardings,
                                        master_dtype=self.master_dtype)

    # ------------------------------------------------------------------ programs
    def program(self, name: str, batch) -> Program:
        """The jitted ``rollout_logps`` / ``grpo_update`` / ``sft_update`` for batches
        shaped like ``batch`` (its type and present fields)."""
        if name not in PROGRAMS:
            raise ValueError(f"unknown program {name!r}: one of {PROGRAMS}")
        key = (name, jax.tree.structure(batch))
        if key not in self._programs:
            self._programs[key] = self._named(name, getattr(self, f"_build_{name}")(batch))
        return self._programs[key]

    def _named(self, name: str, program: Program) -> Program:
        hint = {} if self.oom_hint is None else {"oom_hint": self.oom_hint}
        return dataclasses.replace(program, name=name, **hint)

    def _build_update(self, step_fn, batch) -> Program:
        def inner(moving, fixed, batch, rng):
            state = moving.replace(frozen=fixed[0], ref=fixed[1])
            new, metrics = step_fn(self.model, self.optimizer, state, batch, rng)
            return new.moving(), metrics
        kw = {}
        if self.mesh is not None:
            sh, batch_sh = self.state_shardings, batch.shardings(self.mesh, self.rules)
            kw = dict(in_shardings=(sh.moving(), sh.fixed(), batch_sh, self.replicated),
                      out_shardings=(sh.moving(), self.replicated))
        return Program(jax.jit(inner, donate_argnums=(0,), **kw), _update_split, _update_join,
                       self._context)

    def _build_grpo_update(self, batch: GRPOBatch) -> Program:
        cfg = self._need("grpo")
        return self._build_update(
            lambda m, o, s, b, r: pure_steps.grpo_update_step(m, o, cfg, s, b, r), batch)

    def _build_sft_update(self, batch: SFTBatch) -> Program:
        cfg = self._need("sft")
        return self._build_update(
            lambda m, o, s, b, r: pure_steps.sft_update_step(m, o, cfg, s, b, r), batch)

    def _build_rollout_logps(self, batch: GRPOBatch) -> Program:
        cfg = self._need("grpo")
        kw = {}
        if self.mesh is not None:
            kw = dict(in_shardings=(self.state_shardings, batch.shardings(self.mesh, self.rules)))
        jitted = jax.jit(lambda s, b: pure_steps.rollout_logps(self.model, cfg, s, b), **kw)
        return Program(jitted, lambda state, batch: (state, batch), lambda args, out: out,
                       self._context)

    def _context(self):
        return shd.activate(self.mesh, self.rules)

    def _need(self, name: str):
        cfg = getattr(self, name)
        if cfg is None:
            raise ValueError(f"these steps were built without a {name} config: pass "
                             f"{name}=... to make_jitted_steps")
        return cfg

    # ------------------------------------------------------------------ calls
    def rollout_logps(self, state: TrainState, batch) -> dict[str, Array]:
        """{"old_logps", "ref_logps"}: [mu, B, C] each, when the config needs them."""
        batch = GRPOBatch.of(batch)
        return self.program("rollout_logps", batch)(state, batch)

    def grpo_update(self, state: TrainState, batch, rng: Array) -> tuple[TrainState, dict]:
        """One optimizer step; the moving part of ``state`` is donated."""
        batch = GRPOBatch.of(batch)
        return self.program("grpo_update", batch)(state, batch, rng)

    def sft_update(self, state: TrainState, batch, rng: Array) -> tuple[TrainState, dict]:
        """One masked-SFT optimizer step; the moving part of ``state`` is donated."""
        batch = SFTBatch.of(batch)
        return self.program("sft_update", batch)(state, batch, rng)

    def sync_reference(self, state: TrainState, alpha: float) -> TrainState:
        """``pure_steps.sync_reference`` with the old reference copy donated (a no-op when
        the state holds no copy: a LoRA run scoring the base model, d1's default)."""
        if state.ref is None:
            return state
        return state.replace(ref=self._mix(state.params, state.ref, jnp.float32(alpha)))

    # ------------------------------------------------------------------ abstract inputs
    def _like(self, shape, dtype, axes):
        sharding = None if self.mesh is None else NamedSharding(
            self.mesh, nn.logical_to_mesh_axes(axes, list(self.rules)))
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    def grpo_batch_like(self, rows: int, prompt_len: int, completion_len: int,
                        for_update: bool = True) -> GRPOBatch:
        """A GRPOBatch of ShapeDtypeStructs, shaped as this run's update receives it (with
        the rollout's log-probs and the iteration), or, ``for_update=False``, as the
        old/ref pass receives it (without them); TraceRL's rows carry the rollout's trace
        (``per_row["decoded_at"]``) in both, as the engine hands them over."""
        cfg = self._need("grpo")
        mu, i32 = cfg.num_iterations, jnp.int32
        ratio = OBJECTIVES[cfg.objective].logps is not None  # old/ref passes exist
        with_old = for_update and ratio and mu > 1
        with_ref = for_update and ratio and cfg.beta != 0.0
        b = GRPOBatch(
            prompt_ids=jax.ShapeDtypeStruct((rows, prompt_len), i32),
            prompt_mask=jax.ShapeDtypeStruct((rows, prompt_len), i32),
            completion_ids=jax.ShapeDtypeStruct((rows, completion_len), i32),
            completion_mask=jax.ShapeDtypeStruct((rows, completion_len), i32),
            advantages=jax.ShapeDtypeStruct((rows,), jnp.float32),
            mask_seeds=jax.ShapeDtypeStruct((mu,), i32),
            old_logps=(jax.ShapeDtypeStruct((mu, rows, completion_len), jnp.float32)
                       if with_old else None),
            ref_logps=(jax.ShapeDtypeStruct((mu, rows, completion_len), jnp.float32)
                       if with_ref else None),
            iteration=jax.ShapeDtypeStruct((), i32) if for_update else None,
            per_row=({"decoded_at": jax.ShapeDtypeStruct((rows, completion_len), i32)}
                     if OBJECTIVES[cfg.objective].trace else None))
        return b.abstract(self.mesh, self.rules)

    def sft_batch_like(self, rows: int, length: int) -> SFTBatch:
        b = SFTBatch(input_ids=jax.ShapeDtypeStruct((rows, length), jnp.int32),
                     prompt_len=jax.ShapeDtypeStruct((rows,), jnp.int32))
        return b.abstract(self.mesh, self.rules)

    def prompts_like(self, rows: int, prompt_len: int) -> tuple[Any, Any]:
        """(prompt ids, prompt mask) [rows, prompt_len] as the rollout sampler receives them."""
        one = self._like((rows, prompt_len), jnp.int32, (shd.BATCH, None))
        return one, one

    def rng_like(self):
        return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=self.replicated)


def make_jitted_steps(model: MaskPredictor, mesh: Mesh | None, optimizer: optax.GradientTransformation,
                      *, lora: bool, keep_reference: bool = False,
                      grpo: GRPOConfig | None = None, sft: SFTConfig | None = None,
                      sampler: smp.SamplerConfig | None = None,
                      rules=shd.DEFAULT_RULES, master_dtype: Any = jnp.float32,
                      oom_hint: Callable[[str], str] | None = None) -> JittedSteps:
    """The jitted steps of one run (see the module doc); ``mesh=None`` runs unsharded.
    ``master_dtype``: full fine-tuning's master weights (None: none). ``oom_hint``: program
    name -> what to change when it runs out of memory."""
    return JittedSteps(model, optimizer, mesh, lora, keep_reference, grpo, sft, sampler,
                       tuple(rules), master_dtype, oom_hint)


def for_run(spec: RunSpec, model: MaskPredictor, mesh: Mesh, ids: dict, total_steps: int
            ) -> JittedSteps:
    """The jitted programs of a run: the rollout sampler, the old/ref pass and the GRPO
    update, or the SFT update. ``ids``: the tokenizer's special ids (``special_ids``; from
    the model config when planning without a tokenizer); the warmup spans ``total_steps``."""
    optimizer = optim.make_optimizer(spec.optim.build(total_steps))
    sampler = with_tokens(spec.sampler, ids) if spec.sampler is not None else None
    return make_jitted_steps(
        model, mesh, optimizer, lora=spec.model.lora is not None,
        keep_reference=spec.keep_reference, grpo=spec.grpo, sft=spec.sft, sampler=sampler,
        rules=spec.mesh.rules, master_dtype=spec.optim.master_dtype,
        oom_hint=functools.partial(oom.hint, spec))
