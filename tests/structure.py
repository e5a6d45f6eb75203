"""The package's shape, measured: layers, import edges, cycles, module sizes, and how far a
run's config travels. ``tests/test_package.py`` asserts on these; run this file to print them:

    python tests/structure.py            # the counts docs/training.md ("The layers") quotes
    python tests/structure.py --reach    # also the modules a tiny SFT run's config enters

Imports are read from the source (top-level and inside functions alike), resolved to
d1jax's subpackages and top-level modules, the units of ``LAYERS``, and to d1jax's modules
for the cycles between modules (two modules of one folder that import each other included).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's d1jax, run as a script or imported
PACKAGE = ROOT / "d1jax"

# Lowest first. A unit may import its own layer and the ones below it, never one above.
LAYERS = (
    ("sharding", "metrics", "checkpoint", "distributed", "knobs", "plugins"),  # services
    # without a model; ``plugins``: importing the modules named in $D1JAX_*_MODULES (every
    # registry's: families, objectives, tasks)
    # ``knobs``: how a knob is declared (every layer that has knobs: objectives, config)
    ("model", "tasks"),  # the families; tasks with prompts, rewards, loaders
    ("sampling", "objectives"),  # the jitted pieces users reuse
    ("config",),  # the run configs' defaults and the checks that need no model
    ("run",),  # what every stage uses: spec, build, optim, context, lock, interrupt, oom
    ("train", "eval"),  # the stages
    ("plan",),  # compiles the stages' programs for a TPU slice
    ("cli", "main"),  # the commands (each package's __main__ too)
)
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str | None:
    """``d1jax.model.llada.model`` -> ``model``; None outside d1jax (and for d1jax itself)."""
    parts = module.split(".")
    if parts[0] != "d1jax" or len(parts) < 2:
        return None
    return "cli" if parts[-1] == "__main__" else parts[1]  # a command sits with the commands


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function, as absolute names."""
    found, package = set(), module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def modules() -> dict[str, Path]:
    """d1jax's own modules: not the published code vendored under hf_remote/'s sub-folders
    (shipped beside exports, never imported)."""
    vendored = PACKAGE / "model" / "hf_remote"
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
            if p.parent == vendored or vendored not in p.parents}


def unit_edges() -> set[tuple[str, str]]:
    """(importer unit, imported unit) pairs between different units."""
    edges = set()
    for name, path in modules().items():
        src = unit_of(name)
        for imported in imports(path):
            dst = unit_of(imported)
            if src and dst and src != dst and dst in LAYER_OF:
                edges.add((src, dst))
    return edges


def module_edges() -> set[tuple[str, str]]:
    """(importer module, imported module) pairs: ``from d1jax.model import family`` is an
    edge to ``d1jax.model.family``, ``from d1jax.model import FAMILIES`` one to the package's
    ``__init__`` (``d1jax.model``); a parent package imported on the way does not count."""
    known = modules()

    def resolve(name: str) -> str | None:  # the longest prefix that is a module
        parts = name.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        return ".".join(parts) or None

    edges = set()
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else resolve(base)
                           for a in node.names]
            else:
                continue
            edges.update((name, t) for t in targets if t and t != name)
    return edges


def upward(edges) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in edges if LAYER_OF[b] > LAYER_OF[a])


def cycles(edges) -> list[list[str]]:
    """Strongly connected groups of more than one unit, or module (Tarjan)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def line_counts() -> dict[str, int]:
    return {name: len(path.read_text().splitlines()) for name, path in modules().items()}


def config_reach(run, config) -> tuple[set[str], set[str]]:
    """(the d1jax modules whose functions receive ``config``, the run's ConfigDict, or one of
    its groups as an argument while ``run(config)`` runs; those that receive its translation,
    a ``d1jax.run.spec`` object): how far the config travels in either form."""
    import ml_collections

    ids: set[int] = set()

    def collect(c):
        ids.add(id(c))
        for v in c.values():
            if isinstance(v, ml_collections.ConfigDict):
                collect(v)
    collect(config)
    seen: set[str] = set()
    spec_seen: set[str] = set()

    def tracer(frame, event, arg):
        # Called on every Python call of the run (JAX's tracing and compiling included): the
        # module test comes first, and only d1jax's frames have their locals read.
        if event != "call":
            return None
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("d1jax"):
            return None
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        args = [frame.f_locals.get(n) for n in names]
        if any(id(a) in ids for a in args):
            seen.add(module)
        if any(type(a).__module__ == "d1jax.run.spec" for a in args):
            spec_seen.add(module)
        return None

    previous = sys.getprofile()
    sys.setprofile(tracer)
    try:
        run(config)
    finally:
        sys.setprofile(previous)
    return seen, spec_seen


def sft_config_reach(workdir: str) -> tuple[set[str], set[str]]:
    """``config_reach`` of a one-step tiny SFT run (configs/sft_s1k.py:tiny on a few rows)."""
    from ml_collections import config_flags  # noqa: F401 - the configs' own import
    import importlib.util
    from d1jax.train import sft
    spec = importlib.util.spec_from_file_location("sft_s1k", ROOT / "configs" / "sft_s1k.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("tiny")
    config.train.num_steps, config.train.export_hf = 1, False
    rows = [{"prompt": [{"role": "user", "content": f"add {i} and {i}"}],
             "completion": f"<answer>{2 * i}</answer>"} for i in range(8)]
    return config_reach(lambda c: sft.run(c, workdir, data=sft.SFTData(rows)), config)


def main() -> None:
    edges = unit_edges()
    lines = line_counts()
    biggest = max(lines, key=lines.get)
    print(f"units: {len(LAYER_OF)} in {len(LAYERS)} layers; modules: {len(lines)}")
    print(f"import edges between units: {len(edges)}; upward: {upward(edges) or 'none'}; "
          f"cycles: {cycles(edges) or 'none'}")
    print(f"cycles between modules (inside folders too): {cycles(module_edges()) or 'none'}")
    print(f"largest module: {biggest} ({lines[biggest]} lines); over 450: "
          f"{sorted(n for n, c in lines.items() if c > 450) or 'none'}")
    if "--reach" in sys.argv:
        import tempfile
        config, spec = sft_config_reach(tempfile.mkdtemp(prefix="d1jax-reach-"))
        print(f"modules a tiny SFT run's config enters: {len(config)}: {', '.join(sorted(config))}")
        print(f"modules its spec (d1jax.run.spec) enters: {len(spec)}: {', '.join(sorted(spec))}")


if __name__ == "__main__":
    main()
