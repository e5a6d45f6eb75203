"""The planner over a grid of configs and TPU slices: docs/tpu_plan.md's table, one command.

  python -m d1jax.plan.grid --json=plan_grid.json            # every d1 config x slice
  python -m d1jax.plan.grid --configs=configs/grpo_sudoku.py --slices=v5p-8,v5e-16
  python -m d1jax.plan.grid --configs=dream --slices=v5p-8,v6e-8 --json=docs/tpu_grid.json
  python -m d1jax.plan.grid --known=configs/grpo_gsm8k.py --configs=configs/grpo_mbpp.py

For each config and slice it compiles the run's programs (``d1jax.plan``) on the mesh of
``mesh_for`` (the weights sharded over every chip; a tensor axis where the batch has fewer
rows than chips). The update is compiled without remat first and, only if that does not
fit, with remat: the row says which one fits. Programs whose lowered HLO is identical to one
already compiled on the same slice and mesh (math500's are GSM8K's, Countdown's Sudoku's) are
not compiled again; their rows name the config they equal. Rows are appended to the JSON
file as they are measured, so an interrupted grid keeps what it has and resumes; ``--markdown``
prints the table from such a file (a config and slice are written when all their
programs are).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from pathlib import Path

from absl import app, flags

SLICES = ("v4-8", "v5e-8", "v5e-16", "v5p-8", "v5p-64", "v6e-8")
GIB = 2**30

_CONFIGS = flags.DEFINE_list("configs", ["llada"], "Config files (.py, ':variant' allowed), "
                             "or a family's name: its record's plan_configs (llada: every "
                             "d1 config; dream: Dream-7B and DiffuCoder-7B).")
_SLICES = flags.DEFINE_list("slices", list(SLICES), "TPU slices or topologies.")
_JSON = flags.DEFINE_string("json", "plan_grid.json", "Rows are appended here as they finish.")
_MARKDOWN = flags.DEFINE_string("markdown", "", "Print the table of this JSON file and exit.")
_SUMMARY = flags.DEFINE_bool("summary", False, "With --markdown: one line per config and "
                             "slice instead of one per program.")
_CACHE = flags.DEFINE_string("cache_dir", None, "Compiled figures kept between plans "
                             "(d1jax/plan/cache.py); default $D1JAX_PLAN_CACHE or "
                             "~/.cache/d1jax/plan; '' for none.")
_KNOWN = flags.DEFINE_list("known", [], "Configs already in --json: their programs are lowered "
                           "(not compiled), so configs that lower to the same HLO take their rows.")
_LAYERS = flags.DEFINE_enum("layers", "config", ["config", "loop", "unrolled"],
                            "Plan each config's own layer layout, or all with the middle "
                            "layers in a loop (minutes to compile at 8B) or unrolled.")


def load_config(path: str):
    """``get_config(variant)`` of a config file given as ``path[:variant]``."""
    from d1jax import config as config_lib
    return config_lib.load_file(path)


def config_name(path: str) -> str:
    """A config's name in the tables: its path under configs/ without ``.py``, variant kept
    (``grpo_gsm8k``, ``dream/grpo_gsm8k``, ``diffucoder/coupled_grpo_sudoku:authors``)."""
    file, colon, variant = path.partition(":")
    p = Path(file)
    parts = p.with_suffix("").parts
    name = "/".join(parts[parts.index("configs") + 1:] if "configs" in parts else parts[-1:])
    return name + colon + variant


def config_sets() -> dict[str, tuple[str, ...]]:
    """The named config sets: each family's ``plan_configs`` (d1jax.model.family)."""
    from d1jax.model import family as family_lib
    family_lib.load_modules()
    return {fam.name: fam.plan_configs for fam in family_lib.FAMILIES.values()
            if fam.plan_configs}


def expand(paths: list[str]) -> list[str]:
    """Config paths with the named sets (``config_sets``) replaced by their files."""
    sets = config_sets()
    return [p for item in paths for p in sets.get(item, (item,))]


def mesh_for(run, chips: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) of a ``RunSpec``: fsdp over every chip while each chip's rows
    still split into the run's ``grad_accum`` micro-batches (``config.check_batch``), the
    remaining factor on the tensor axis (SFT's 8 rows on 16 or 32 chips; GRPO's 96 rows in
    2 micro-batches on 32 chips: fsdp 16, tensor 2)."""
    from d1jax.plan.compile import step_rows
    fsdp = math.gcd(step_rows(run) // run.optim.grad_accum, chips)
    return 1, fsdp, chips // fsdp


def _key(lowered, topology: str, mesh) -> str:
    text = lowered.as_text(dialect="hlo")
    return hashlib.sha1(f"{topology}|{mesh}|{text}".encode()).hexdigest()


def plan_config(path: str, topology: str, seen: dict, progress=None,
                layers: str = "config", cache_dir: str | None = None,
                known: list[dict] | None = None) -> list[dict]:
    """Rows of one config on one slice: every program, the update without remat and, when
    that does not fit, with remat. ``seen`` maps lowered programs already compiled to their
    rows (shared across calls); ``progress`` is called with each row; ``layers`` "loop" or
    "unrolled" overrides the config's ``model.unroll_layers``; ``cache_dir`` as
    ``compile.plan``'s. ``known``: this config's rows measured before (a grid's JSON): its
    programs are lowered, not compiled, and ``seen`` maps them to those rows."""
    from d1jax.plan import cache as plan_cache
    from d1jax.plan import chips as chips_lib
    from d1jax.plan import compile as plan_lib
    from d1jax.plan.programs import PlanSpec, build_programs
    from d1jax.run.build import make_model

    chip, devices = chips_lib.topology_devices(topology)
    root = plan_cache.cache_dir(cache_dir)
    if root is not None:
        plan_cache.use_jax_cache(root)
    base = plan_lib.as_spec(load_config(path))
    if layers != "config":
        base = dataclasses.replace(base, model=dataclasses.replace(
            base.model, unroll_layers=layers == "unrolled"))
    mesh_shape = mesh_for(base, len(devices))
    rows: list[dict] = []
    for remat in (False, True):
        spec = PlanSpec.of(dataclasses.replace(
            base, model=dataclasses.replace(base.model, remat=remat)))
        mesh = dataclasses.replace(spec.run.mesh, shape=mesh_shape).build(devices)
        layout = "unrolled" if make_model(spec.run.model, spec.model_config).unrolled() \
            else "loop"
        fits = True
        for program in build_programs(spec, mesh):
            updates = program.name.endswith("update")
            if remat and not updates:  # remat changes only the gradient programs
                continue
            lowered = plan_lib.lower(program, topology)
            key = _key(lowered, topology, mesh_shape)
            row = {"config": path, "slice": topology, "remat_tried": remat,
                   "layers": layout}
            if known is not None:
                match = [r for r in known if (r["program"], r["remat_tried"], r["layers"]) ==
                         (program.name, remat, layout)]
                if match:
                    seen[key] = dict(match[0])
                continue
            if key in seen:
                row.update(seen[key], config=path, same_as=seen[key]["config"])
            else:
                e = plan_lib.estimate(program, spec, mesh, chip, topology, lowered=lowered,
                                      cache_root=root)
                row.update(e.row(), same_as="")
                seen[key] = dict(row)
            rows.append(row)
            if progress is not None:
                progress(row)
            fits &= (not updates) or bool(row["fits"])
        if fits and known is None:
            break
    return rows


def markdown(rows: list[dict]) -> str:
    """docs/tpu_plan.md's grid table."""
    cols = ("config", "slice", "mesh d,f,t", "layers", "remat", "program", "args GiB", "temp GiB",
            "total / usable GiB", "fits", "[B,L,V] logits", "est. s", "MFU", "tok/s/chip",
            "compile s")
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        m = r["mesh"]
        chips = math.prod(m.values())
        timed = _timed(r)  # a time only where XLA's cost model gives a usable one
        tok = f"{r['tokens'] / chips / r['seconds']:,.0f}" if r.get("tokens") and timed \
            else "-"
        compile_s = f"= {config_name(r['same_as'])}" if r.get("same_as") else \
            f"{r['compile_s']:.0f}"
        out.append("| " + " | ".join([
            config_name(r["config"]), r["slice"],
            f"{m.get('data', 1)},{m.get('fsdp', 1)},{m.get('tensor', 1)}",
            r.get("layers", "?"), "on" if r["remat"] else "off", r["program"],
            f"{r['argument_bytes'] / GIB:.1f}", f"{r['temp_bytes'] / GIB:.1f}",
            f"{r['total_bytes'] / GIB:.1f} / {r['capacity_bytes'] / GIB:.1f}",
            "yes" if r["fits"] else "NO",
            {True: "YES", False: "no"}.get(r.get("logits_materialised"), "?"),
            f"{r['seconds']:.3g}" if timed else "-",
            f"{100 * r['mfu']:.1f}%" if timed else "-", tok, compile_s]) + " |")
    return "\n".join(out)


def _timed(r: dict) -> bool:
    """XLA's cost model gave this row a usable time (a rate within the chip's peak)."""
    chips = math.prod(r["mesh"].values())
    return bool(r["fits"]) and r["seconds"] > 0 and \
        r["flops_xla"] / chips / r["seconds"] <= r["peak_flops"]


def _iterations(path: str) -> int:
    """mu of a GRPO config file, read through its spec."""
    from d1jax.plan.compile import as_spec
    return as_spec(load_config(path)).grpo.num_iterations


def summary(rows: list[dict], iterations=None) -> str:
    """One line per config and slice: the mesh, whether the update needs remat, the largest
    program's HBM, each program's estimated seconds and MFU, and for GRPO the seconds of a
    whole rollout cycle: one rollout, its old/reference log-probs and mu updates.
    ``iterations(config_path)`` gives mu (default: read from the config file)."""
    iterations = iterations or _iterations
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["config"], r["slice"]), []).append(r)
    cols = ("config", "slice", "mesh d,f,t", "update remat", "largest GiB / usable",
            "update s", "update MFU", "rollout s", "rollout MFU", "old/ref logps s",
            "s per rollout cycle")
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (path, slice_), rs in groups.items():
        final = {}  # program -> the row the run would use (the update: the one that fits,
        for r in rs:  # else the last one tried)
            if r["program"] not in final or not final[r["program"]]["fits"]:
                final[r["program"]] = r
        fits = all(r["fits"] for r in final.values())
        update = next(r for name, r in final.items() if name.endswith("update"))
        m = update["mesh"]
        big = max(final.values(), key=lambda r: r["total_bytes"])
        sec = {name: r["seconds"] if _timed(r) else math.nan for name, r in final.items()}
        fmt = lambda x: "-" if math.isnan(x) else f"{x:.3g}"  # noqa: E731
        mfu = lambda r: f"{100 * r['mfu']:.1f}%" if _timed(r) else "-"  # noqa: E731
        roll = final.get("rollout")
        cycle = math.nan
        if roll is not None:
            cycle = sec["rollout"] + sec["rollout_logps"] + \
                iterations(path) * sec[update["program"]]
        out.append("| " + " | ".join([
            config_name(path), slice_,
            f"{m.get('data', 1)},{m.get('fsdp', 1)},{m.get('tensor', 1)}",
            ("on" if update["remat"] else "off") if fits else "does not fit",
            f"{big['total_bytes'] / GIB:.1f} / {big['capacity_bytes'] / GIB:.1f}",
            fmt(sec[update["program"]]), mfu(update),
            fmt(sec["rollout"]) if roll else "-", mfu(roll) if roll else "-",
            fmt(sec["rollout_logps"]) if roll else "-", fmt(cycle)]) + " |")
    return "\n".join(out)


def main(argv):
    del argv
    if _MARKDOWN.value:
        rows = json.loads(Path(_MARKDOWN.value).read_text())
        print(summary(rows) if _SUMMARY.value else markdown(rows))
        return
    out = Path(_JSON.value)
    rows: list[dict] = json.loads(out.read_text()) if out.is_file() else []
    done = {(r["config"], r["slice"]) for r in rows}
    seen: dict = {}

    def progress(row: dict) -> None:
        fits = "fits" if row["fits"] else "DOES NOT FIT"
        print(f"{Path(row['config']).stem} {row['slice']} {row['program']} remat="
              f"{'on' if row['remat'] else 'off'}: {row['total_bytes'] / GIB:.1f} GiB, {fits}, "
              f"MFU {100 * row['mfu']:.1f}%", file=sys.stderr, flush=True)

    for topology in _SLICES.value:
        for path in expand(_KNOWN.value):
            known = [r for r in rows if (r["config"], r["slice"]) == (path, topology)]
            if known:
                plan_config(path, topology, seen, layers=_LAYERS.value, known=known)
        for path in expand(_CONFIGS.value):
            if (path, topology) in done:  # an earlier, interrupted grid measured it
                continue
            t0 = time.perf_counter()
            rows.extend(plan_config(path, topology, seen, progress, _LAYERS.value,
                                    _CACHE.value))
            out.write_text(json.dumps(rows, indent=1, default=float))
            print(f"{path} on {topology}: {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    app.run(main)
