"""Lowers and compiles a run's programs for a TPU topology from any host, and turns XLA's
memory and cost analyses into per-chip figures: HBM against capacity, loop-aware FLOPs,
estimated seconds, MFU and sampler throughput.

``check_fits(run, topology)`` is the opt-in check a training entry point can run before it
loads weights (``run``: a ``RunSpec``, or a config translated once): it raises
``DoesNotFit`` with one line naming the program, the bytes it needs against the bytes
available and the change that would make it fit.

A program XLA refuses to compile for lack of HBM is a program that does not fit: its
estimate carries the total XLA's message names (``Estimate.refused``). Any other compile
failure is one ``DoesNotFit`` line naming the program and XLA's reason.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import time

import jax

from d1jax import config as config_lib
from d1jax import sharding as shd
from d1jax.plan import cache as plan_cache
from d1jax.plan import chips, hlo
from d1jax.plan.programs import PlanSpec, PlannedProgram, build_programs
from d1jax.run import spec as spec_lib
from d1jax.run.oom import oom_bytes

# A compiled program whose largest tensor with the vocabulary axis reaches this share of
# the float32 [B, L, V] logits of a chip's rows is reported as materialising them (a
# bfloat16 copy counts; the chunked head's or the sampler block's logits stay far below).
LOGITS_SHARE = 0.5


class DoesNotFit(RuntimeError):
    """A run cannot run on the topology: a program needs more HBM per chip than a chip has,
    or does not compile for it; the message is one line."""


@dataclasses.dataclass
class Estimate:
    """Per-chip figures of one compiled program (bytes per chip, FLOPs global per call)."""

    program: str
    topology: str
    chip: str
    mesh: dict
    remat: bool
    compile_s: float
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    capacity_bytes: int  # usable HBM per chip
    argument_bytes_by_rules: int  # what the shardings say the arguments take per chip
    flops_model: float  # analytic, no recomputation
    flops_hardware: float  # analytic, with recomputation
    flops_xla: float  # loop-aware count of the lowered program's matmuls
    flops_xla_once: float  # the same with every loop body once (cost_analysis' view)
    xla_seconds_once: float  # cost_analysis()["optimal_seconds"]: loop bodies once
    peak_flops: float
    weight_bytes: int
    logits_bytes_per_chip: int
    vocab_tensor_bytes: int | None  # largest per-chip tensor with the vocab axis; None: refused
    tokens: int = 0
    sequences: int = 0
    calls: int = 1  # calls of the program a step (figures above are per call)
    # Share of the weights' elements a chip's weight arguments hold (``weight_share``).
    weight_share: float = 0.0
    cached: bool = False  # figures read from the plan cache (compile_s: lowering and reading)
    # XLA refused to compile it for lack of HBM: total_bytes is what its message names (the
    # arguments by the rules, the rest as temporaries); no time, no vocab figure.
    refused: bool = False

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes \
            + self.code_bytes

    @property
    def fits(self) -> bool:
        return not self.refused and self.total_bytes <= self.capacity_bytes

    @property
    def chips(self) -> int:
        return math.prod(self.mesh.values())

    @property
    def seconds(self) -> float:
        """XLA's estimate scaled by the loops' trip counts (its loop-once estimate times the
        loop-aware over loop-once matmul FLOPs of the same program); NaN where XLA's cost
        model gives no usable time (none, or a rate above the chip's peak)."""
        s = self.xla_seconds_once * self.flops_xla / max(self.flops_xla_once, 1.0)
        if not s > 0 or self.flops_xla / self.chips / s > self.peak_flops:
            return math.nan
        return s

    @property
    def mfu(self) -> float:
        return self.flops_model / self.chips / max(self.seconds, 1e-30) / self.peak_flops

    @property
    def weights_replicated(self) -> bool:
        """A chip holds a whole copy of the weights (fine on one chip, waste on many): its
        weight arguments, by their shardings, hold every element. Counted in elements, not
        bytes: full fine-tuning's float32 master weights and AdamW moments, sharded, take
        more bytes a chip than the bfloat16 weights while holding a 1/fsdp share."""
        return self.chips > 1 and self.weight_share >= 1.0

    @property
    def logits_materialised(self) -> bool | None:
        """Whether some tensor of the compiled program holds the chip's [B, L, V] logits
        (None: not compiled, XLA refused it for lack of HBM)."""
        if self.vocab_tensor_bytes is None:
            return None
        return self.vocab_tensor_bytes >= LOGITS_SHARE * self.logits_bytes_per_chip

    def row(self) -> dict:
        """Flat JSON-ready figures."""
        out = dataclasses.asdict(self)
        out.update(total_bytes=self.total_bytes, fits=self.fits, seconds=self.seconds,
                   mfu=self.mfu, weights_replicated=self.weights_replicated,
                   logits_materialised=self.logits_materialised,
                   tokens_per_s_per_chip=self.tokens / self.chips / max(self.seconds, 1e-30),
                   sequences_per_s_per_chip=self.sequences / self.chips
                   / max(self.seconds, 1e-30))
        return out


def weight_share(weights) -> float:
    """Elements a chip holds of ``weights`` (ShapeDtypeStructs or arrays with shardings) over
    their global count: 1.0 for a whole copy on every chip, 1/n sharded n ways."""
    leaves = jax.tree.leaves(weights)
    total = sum(math.prod(a.shape) for a in leaves)
    held = sum(math.prod(a.sharding.shard_shape(a.shape) if a.sharding is not None else a.shape)
               for a in leaves)
    return held / total if total else 0.0


def _per_chip_bytes(args) -> int:
    total = 0
    for a in jax.tree.leaves(args):
        shape = a.sharding.shard_shape(a.shape) if a.sharding is not None else a.shape
        total += math.prod(shape) * a.dtype.itemsize
    return total


_HLO_DTYPES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16", "float64": "f64"}


def _largest_vocab_activation(text: str, args, vocab: int, tensor: int, chips: int) -> int:
    """Bytes per chip of the compiled program's largest array with the vocabulary axis
    (V, or V / tensor where the rules shard activations' vocab over ``tensor``) that is
    not a weight (logits, their softmax or gradient). Left out: arrays shaped as a vocab
    weight or its shard (any dtype: gradients, moments), and in the weight's own dtype,
    copies gathered over some of the mesh axes (each axis of the weight divided by a
    divisor of the chip count). A float32 array of a gathered bf16 weight's shape counts:
    at 8B, one row's 4096 positions of logits have the shape of the head gathered over
    fsdp."""
    divisors = [k for k in range(1, chips + 1) if chips % k == 0]
    shapes, typed = set(), set()
    for a in jax.tree.leaves(args):
        if vocab in a.shape:
            shapes.add(hlo.shape_key(a.shape))
            if a.sharding is not None:
                shapes.add(hlo.shape_key(a.sharding.shard_shape(a.shape)))
            sizes = [{n // k for k in divisors if n % k == 0} for n in a.shape]
            dtype = _HLO_DTYPES.get(a.dtype.name, a.dtype.name)
            typed.update((dtype, hlo.shape_key(s)) for s in itertools.product(*sizes))
    return hlo.largest_with_dim(text, {vocab, -(-vocab // tensor)}, frozenset(shapes),
                                frozenset(typed))


def _xla_seconds(cost: dict, text: str | None, min_seconds: float) -> float:
    """XLA's loop-once time estimate, with the -1 s that libtpu's cost model books for some
    custom calls it cannot price (``hlo.UNPRICED_CUSTOM_CALLS``) given back: of the n such
    calls, the fewest k whose seconds make the estimate no faster than the chip's peak
    (``min_seconds``). Not every call costs the -1: an 8B rollout on v4-8 has ten and
    estimates -9.92 s (k = 10), an 8B remat update on v5e-8 has 11 calls more than its
    count of -1s. The result is exact when the program's time is within 1 s of its
    peak-rate bound (every 8B program here: under 0.3 s loop-once)."""
    return _given_back(float(cost.get("optimal_seconds", math.nan)),
                       hlo.unpriced_custom_calls(text) if text else 0, min_seconds)


def _given_back(seconds: float, n: int, min_seconds: float) -> float:
    """``_xla_seconds`` of an estimate with ``n`` unpriced custom calls."""
    return seconds + min(n, max(0, math.ceil(min_seconds - seconds))) if n else seconds


def lower(program: PlannedProgram, topology: str):
    """``program.lower()``, a tracing error as one ValueError naming the program."""
    try:
        return program.lower()
    except (TypeError, ValueError) as e:  # the run itself would fail the same way
        first = str(e).strip().splitlines()[0]
        raise ValueError(f"{program.name} does not trace on {topology}: {first}") from e


def estimate(program: PlannedProgram, spec: PlanSpec, mesh, chip: chips.Chip, topology: str,
             lowered=None, cache_root=None, lower_s: float = 0.0) -> Estimate:
    """Compiles ``program`` (lowered here unless ``lowered`` is given, in ``lower_s``
    seconds) on ``mesh``; its per-chip figures. With ``cache_root`` (``cache.cache_dir``)
    a program compiled before is read back instead (``Estimate.cached``)."""
    t0 = time.perf_counter() - lower_s
    if lowered is None:
        lowered = lower(program, topology)
    n = math.prod(mesh.shape.values())
    name = plan_cache.key(lowered, chips.parse_topology(topology)[1]) if cache_root else ""
    got = plan_cache.read(cache_root, name) if cache_root else None
    cached = got is not None
    if got is None:
        try:
            got = _compile(lowered, lambda text: _largest_vocab_activation(
                text, program.args, spec.model_config.output_vocab,
                mesh.shape.get("tensor", 1), n))
        except jax.errors.JaxRuntimeError as e:  # not for lack of HBM: XLA's first line
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise DoesNotFit(f"{program.name} does not compile for {topology}: {reason}") \
                from None
        if cache_root:
            plan_cache.write(cache_root, name, got)
    compile_s = time.perf_counter() - t0
    walk = hlo.LoopFlops(lowered.as_text(dialect="hlo"), default_trips=program.loop_bound)
    by_rules, mem = _per_chip_bytes(program.args), got.memory
    if got.refused:  # XLA's figure is the total: the arguments by the rules, the rest temp
        mem = dict(mem, argument_size_in_bytes=by_rules,
                   temp_size_in_bytes=max(mem["temp_size_in_bytes"] - by_rules, 0))
    return Estimate(
        program=program.name, topology=topology, chip=chip.name, mesh=dict(mesh.shape),
        remat=bool(spec.run.model.remat), compile_s=compile_s,
        argument_bytes=mem["argument_size_in_bytes"] or by_rules,
        output_bytes=mem["output_size_in_bytes"],
        alias_bytes=mem["alias_size_in_bytes"], temp_bytes=mem["temp_size_in_bytes"],
        code_bytes=mem["generated_code_size_in_bytes"], capacity_bytes=chip.usable_hbm_bytes,
        argument_bytes_by_rules=by_rules,
        flops_model=program.flops_model, flops_hardware=program.flops_hardware,
        flops_xla=walk.total(), flops_xla_once=walk.once(),
        xla_seconds_once=_given_back(got.optimal_seconds, got.unpriced_calls,
                                     walk.once() / n / chip.peak_bf16_flops),
        peak_flops=chip.peak_bf16_flops, weight_bytes=program.weight_bytes,
        logits_bytes_per_chip=program.logits_bytes // n,
        vocab_tensor_bytes=got.vocab_tensor_bytes,
        tokens=program.tokens,
        sequences=program.sequences, calls=program.calls,
        weight_share=weight_share(program.weight_args),
        cached=cached, refused=got.refused)


def _compile(lowered, vocab_bytes) -> plan_cache.Compiled:
    """The figures of a lowered program compiled: memory and cost analyses, the unpriced
    custom calls and ``vocab_bytes(compiled HLO text)``; a program too large for HBM is
    ``refused``, with the total XLA's message names as its temporaries, no time and no
    vocab figure. Any other compile error is raised."""
    fields = dict.fromkeys(plan_cache.MEMORY_FIELDS, 0)
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        needed = oom_bytes(str(e))
        if needed is None:
            raise
        fields["temp_size_in_bytes"] = needed
        return plan_cache.Compiled(fields, math.nan, 0, None, refused=True)
    mem, text = compiled.memory_analysis(), compiled.as_text()
    fields.update({f: getattr(mem, f) for f in plan_cache.MEMORY_FIELDS})
    return plan_cache.Compiled(
        fields, float(compiled.cost_analysis().get("optimal_seconds", math.nan)),
        hlo.unpriced_custom_calls(text), vocab_bytes(text))


def require_libtpu() -> None:
    """Planning compiles with libtpu; without it, one DoesNotFit line says how to get it."""
    import importlib.util
    if importlib.util.find_spec("libtpu") is None:
        raise DoesNotFit("planning for TPU needs libtpu (no TPU): python -m pip install -e "
                         "\".[tpu]\" (or \".[test]\"), then rerun")


def plan(run, topology: str, mesh_shape: tuple[int, ...] | None = None,
         on_estimate=None, cache_dir: str | None = None,
         programs: tuple[str, ...] = ()) -> list[Estimate]:
    """Estimates for every program of ``run`` (a ``RunSpec``, or a config translated here
    once) on ``topology`` ("v5p:2x2x1", "v5e-8", ...); ``mesh_shape`` (data, fsdp, tensor, and
    expert for a family with experts) overrides the spec's mesh shape (``with_mesh``).
    ``on_estimate`` is called with each estimate as soon as it is ready (8B programs take
    minutes). ``cache_dir``: where compiled figures are kept (``cache.cache_dir``: default
    $D1JAX_PLAN_CACHE or ~/.cache/d1jax/plan; "" for none).
    ``programs``: plan only those (by name; default all).

    The programs are traced one after the other and compiled at the same time, one thread
    each: XLA releases the GIL while it compiles."""
    chip, devices = chips.topology_devices(topology)
    spec = PlanSpec.of(with_mesh(as_spec(run), mesh_shape))
    check_expert_mesh(spec)
    mesh = spec.run.mesh.build(devices)
    root = plan_cache.cache_dir(cache_dir)
    if root is not None:
        plan_cache.use_jax_cache(root)
    built = build_programs(spec, mesh)
    names = [p.name for p in built]
    unknown = sorted(set(programs) - set(names))
    if unknown:
        raise ValueError(f"no program {unknown[0]!r} in this run: its programs are "
                         f"{', '.join(names)}")
    programs, lowered = [p for p in built if not programs or p.name in programs], []
    for program in programs:
        t0 = time.perf_counter()
        lowered.append((lower(program, topology), time.perf_counter() - t0))
    with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
        futures = [pool.submit(estimate, p, spec, mesh, chip, topology, lowered=low,
                               cache_root=root, lower_s=s) for p, (low, s) in zip(programs, lowered)]
        for done in concurrent.futures.as_completed(futures):
            if on_estimate is not None:
                on_estimate(done.result())
    return [f.result() for f in futures]


def with_mesh(run: spec_lib.RunSpec, shape: tuple[int, ...] | None) -> spec_lib.RunSpec:
    """``run`` on a mesh of ``shape`` (None: its own), with the rules
    ``run.spec.from_config`` gives that shape: a fourth entry (expert) maps the experts'
    logical axis to the expert mesh axis unless the config's rules map it."""
    if shape is None:
        return run
    shape, rules = tuple(shape), dict(run.mesh.rules)
    if len(shape) == 4:  # from_config's rule for a four-entry shape, unless the config's
        rules = {shd.EXPERT: shd.EXPERT_AXIS, **rules}
    elif rules.get(shd.EXPERT) == shd.EXPERT_AXIS:  # from a four-entry config: no such axis
        del rules[shd.EXPERT]
    return dataclasses.replace(run, mesh=dataclasses.replace(run.mesh, shape=shape,
                                                             rules=tuple(rules.items())))


def check_expert_mesh(spec: PlanSpec) -> None:
    """ConfigError (one line) for a four-entry mesh (data, fsdp, tensor, expert) on a family
    without experts: its expert axis would hold copies of everything."""
    shape = tuple(spec.run.mesh.shape)
    if len(shape) == 4 and not getattr(spec.model_config, "num_experts", 0):
        raise config_lib.ConfigError(
            f"mesh.shape={shape}: the fourth entry is the expert axis and "
            f"{spec.run.model.family} has no experts; give three sizes data,fsdp,tensor")


def as_spec(run) -> spec_lib.RunSpec:
    """``run`` if it is a ``RunSpec``, else the spec of the config it is: the run's one
    translation (``run.spec.from_config``), accepting a config that names no weights
    (planning needs shapes, not weights)."""
    return run if isinstance(run, spec_lib.RunSpec) else spec_lib.from_config(run, weights=False)


def step_rows(run: spec_lib.RunSpec) -> int:
    """Rows of one optimizer step (all hosts): GRPO's prompts x G, SFT's batch, an eval's
    generate batch."""
    if run.stage == "grpo":
        return run.grpo_run.prompts_per_step * run.grpo_run.num_generations
    return run.sft_run.batch_size if run.stage == "sft" else run.eval.batch_size


def _batch_accepted(run: spec_lib.RunSpec, data_parallel: int, grad_accum: int) -> bool:
    """Whether ``config.check_batch`` accepts the run's step on that many data-parallel
    devices in that many micro-batches."""
    group = run.grpo_run.num_generations if run.stage == "grpo" else 1
    try:
        config_lib.check_batch(step_rows(run), group, data_parallel, "batch", grad_accum)
    except config_lib.ConfigError:
        return False
    return True


def advice(e: Estimate, run: spec_lib.RunSpec) -> str:
    """The change most likely to make ``e`` fit, as the config flag a user sets (only changes
    that ``config.check_batch`` accepts: each chip's rows split into the micro-batches), from
    optim.grad_accum, sft.max_length, sampler.gen_length, grpo.prompts_per_step."""
    n, fsdp, accum = e.chips, e.mesh.get("fsdp", 1), run.optim.grad_accum
    if e.program.endswith("update") and not e.remat:
        return "turn remat on: --config.model.remat=True"
    if e.weights_replicated or (fsdp < n and _batch_accepted(run, n, accum)):
        tail = ",1" * (len(e.mesh) - 2)  # tensor 1 (and expert 1: a mesh of four sizes)
        return (f"shard the weights over a larger fsdp axis: --config.mesh.shape="
                f"'(1,{n}{tail})' (d1jax.plan: --mesh=1,{n}{tail})")
    if e.program.endswith("update"):
        if _batch_accepted(run, e.mesh.get("data", 1) * fsdp, 2 * accum):
            return f"split the batch into more micro-batches: --config.optim.grad_accum={2 * accum}"
        if run.stage == "sft":
            return (f"use more chips, a chip with more HBM, or shorter sequences "
                    f"(--config.sft.max_length={run.sft_run.max_length // 2})")
    if e.program == "rollout_logps":  # the old/ref pass holds every row of the step at once
        return ("fewer prompts per step (--config.grpo.prompts_per_step), more chips or a "
                "chip with more HBM")
    if run.sampler is not None and e.program == "rollout":
        g, dp = run.grpo_run, e.mesh.get("data", 1) * fsdp
        rows = step_rows(run)
        k = config_lib.smaller_rollout_batch(rows, g.rollout_batch, dp)
        if k is not None:
            return (f"generate in smaller sampler calls: --config.grpo.rollout_batch={k} "
                    f"(now {g.rollout_batch or rows} rows a call), or a shorter completion "
                    f"(--config.sampler.gen_length={run.sampler.gen_length // 2})")
        return (f"generate a shorter completion (--config.sampler.gen_length="
                f"{run.sampler.gen_length // 2}) or fewer prompts per step "
                f"(--config.grpo.prompts_per_step)")
    return "use more chips or a chip with more HBM"


def failure_line(e: Estimate, run: spec_lib.RunSpec) -> str:
    gib = 2**30
    how = " (XLA's figure: it refused to compile it)" if e.refused else ""
    return (f"{e.program} does not fit on {e.topology} ({e.chip}): needs "
            f"{e.total_bytes / gib:,.1f} GiB per chip{how}, {e.capacity_bytes / gib:.1f} GiB "
            f"usable; {advice(e, run)}")


def attached_topology() -> str:
    """The topology name of this host's TPU devices (for ``check_fits`` on a TPU VM)."""
    devices = jax.devices()
    kinds = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p",
             "TPU v6 lite": "v6e"}
    kind = kinds.get(devices[0].device_kind)
    if jax.default_backend() != "tpu" or kind is None:
        raise ValueError(f"no TPU attached (backend {jax.default_backend()!r}, device kind "
                         f"{devices[0].device_kind!r}): pass topology='v5p:2x2x1' or similar")
    coords = [d.coords for d in devices]
    grid = [max(c[i] for c in coords) + 1 for i in range(len(coords[0]))]
    dims = grid if kind in ("v4", "v5p") else grid[:2]
    return f"{kind}:{'x'.join(map(str, dims))}"


def check_fits(run, topology: str | None = None,
               mesh_shape: tuple[int, ...] | None = None) -> list[Estimate]:
    """Compiles every program of ``run`` (a ``RunSpec`` or a config, translated once) for
    ``topology`` (default: the attached TPU) and raises ``DoesNotFit`` (one line) for the
    first that needs more HBM than a chip has, XLA's refusals included, or when the run
    cannot be planned there (a topology libtpu does not build, a program that does not
    trace or compile on the mesh).

    Call it before loading weights; it needs libtpu but no TPU. Returns the estimates.
    """
    run = as_spec(run)
    try:
        estimates = plan(run, topology or attached_topology(), mesh_shape)
    except (ValueError, ImportError) as e:  # the planner's one-line reasons
        raise DoesNotFit(" ".join(str(e).split())) from None
    for e in estimates:
        if not e.fits:
            raise DoesNotFit(failure_line(e, run))
    return estimates
