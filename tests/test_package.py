"""The installed package: importable from any directory, every subpackage shipped, and a
cheap top-level import that exposes the public API."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})


def test_estimator_and_sampler_import_from_another_directory(tmp_path):
    r = run_python("import d1jax.objectives.logprob, d1jax.sampling, d1jax;"
                   "print(d1jax.__file__)", cwd=tmp_path)
    assert r.returncode == 0, f"is d1jax installed (pip install -e .)? {r.stderr[-1500:]}"
    assert Path(r.stdout.strip()).resolve().parent == ROOT / "d1jax"


def test_every_subpackage_is_shipped():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    setuptools = pytest.importorskip("setuptools")  # the build backend; not in every venv
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = config["tool"]["setuptools"]["packages"]["find"]
    shipped = set(setuptools.find_packages(str(ROOT), include=find["include"]))
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "d1jax").rglob("__init__.py")}
    assert shipped == on_disk and "d1jax.objectives" in shipped


def test_top_level_import_is_cheap_and_subpackages_load_on_use():
    r = run_python(
        "import sys, d1jax\n"
        "heavy = [m for m in ('d1jax.train', 'd1jax.sampling', 'd1jax.eval', 'd1jax.tasks')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert d1jax.sampling.generate and d1jax.objectives and d1jax.tasks.get_task\n"
        "assert all(hasattr(d1jax, name) for name in d1jax.__all__)\n"
        "print(sorted(d1jax.__all__))", cwd=ROOT)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "'LLaDA'" in r.stdout and "'objectives'" in r.stdout


def test_unknown_attribute_is_an_attribute_error():
    import d1jax
    try:
        d1jax.samplng  # noqa: B018
    except AttributeError as e:
        assert "samplng" in str(e)
    else:
        raise AssertionError("d1jax.samplng should not exist")


def _imports(path: Path) -> set[str]:
    """Every module a file imports (at the top or inside a function), resolved to absolute
    dotted names."""
    import ast
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_evaluation_and_lower_layers_import_nothing_from_training_or_the_command_line():
    """Evaluation runs without the training package; only the commands (main, each
    ``__main__``) import the command-line layer, which sits on top of everything."""
    package = ROOT / "d1jax"
    for path in (package / "eval").rglob("*.py"):
        bad = {m for m in _imports(path) if m == "d1jax.train" or m.startswith("d1jax.train.")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    commands = {package / "main.py", package / "cli.py"} | set(package.rglob("__main__.py"))
    for path in set(package.rglob("*.py")) - commands:
        bad = {m for m in _imports(path) if m == "d1jax.cli" or m.startswith("d1jax.cli.")}
        assert not bad, f"{path.relative_to(ROOT)} imports the command line: {sorted(bad)}"


def test_the_model_layer_imports_no_higher_layer():
    """d1jax.model (every family package included) sits below the sampler, the objectives,
    training, the run and the planner: a family never reaches up into them."""
    higher = ("sampling", "objectives", "train", "run", "plan", "eval", "tasks", "config")
    for path in (ROOT / "d1jax" / "model").rglob("*.py"):
        if "hf_remote" in path.parts:
            continue  # Hugging Face remote code, never imported by d1jax
        bad = {m for m in _imports(path)
               if any(m == f"d1jax.{h}" or m.startswith(f"d1jax.{h}.") for h in higher)}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_layers_import_only_downward_without_cycles_and_modules_stay_small():
    """The layers of tests/structure.py (docs/training.md, "The package's layers"): no unit
    imports one above it, no two units import each other, nor two modules (of one folder or
    not; imports inside functions count), no module passes 450 lines."""
    from tests import structure
    edges = structure.unit_edges()
    assert structure.upward(edges) == []
    assert structure.cycles(edges) == []
    assert structure.cycles(structure.module_edges()) == []
    assert set(structure.LAYER_OF) == {p.name for p in (ROOT / "d1jax").iterdir()
                                       if p.is_dir() and (p / "__init__.py").exists()} | {
        p.stem for p in (ROOT / "d1jax").glob("*.py") if p.stem != "__init__"}
    big = {m: n for m, n in structure.line_counts().items() if n > 450}
    assert not big, big


def test_a_run_config_is_translated_once_near_the_entry(tmp_path):
    """A tiny SFT run's ConfigDict reaches only its stage, the context that prepares the run
    and the translation into a typed spec (with the declared groups' own, config.knobs); the
    spec then reaches a handful of modules."""
    from tests import structure
    config_modules, spec_modules = structure.sft_config_reach(str(tmp_path))
    assert config_modules == {"d1jax.train.sft", "d1jax.run.context", "d1jax.run.spec",
                              "d1jax.config.knobs"}
    assert len(config_modules | spec_modules) <= 10, sorted(config_modules | spec_modules)
