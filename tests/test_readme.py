"""README.md: its marked Python snippets run, its set-up commands are CI's, and the user docs
stay short and free of machine-local paths."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from d1jax.model import llada

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = "<!-- readme-test -->"
INSTALL = 'python -m pip install -e ".[test]" -c requirements.txt'
TESTS = "XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python -m pytest -q -n 2 --dist loadfile tests"


def marked_snippets(text: str) -> list[str]:
    """The ```python blocks that directly follow the marker line."""
    return re.findall(re.escape(MARKER) + r"\n```python\n(.*?)\n```", text, flags=re.S)


def test_marked_snippets_are_found():
    text = README.read_text()
    snippets = marked_snippets(text)
    assert len(snippets) == text.count(MARKER) == 4  # a marker not before a python block is a typo


def test_readme_snippets_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the snippets write their checkpoints to the working directory
    namespace: dict = {}
    for snippet in marked_snippets(README.read_text()):
        exec(compile(snippet, str(README), "exec"), namespace)  # noqa: S102 - our own README
    config = namespace["config"]
    assert namespace["logits_blv"].shape == (1, 4, config.vocab_size)
    completion = np.asarray(namespace["completion_ids"])
    assert completion.shape == (2, 16) and not (completion == config.mask_token_id).any()
    logps = np.asarray(namespace["logps_sbc"])
    assert logps.shape == (2, 2, 16) and (logps <= 0).all()
    assert int(namespace["state"].step) == 2
    export = tmp_path / "llada-tiny-grpo"
    assert json.loads((export / "config.json").read_text())["auto_map"] == dict(llada.REMOTE_CODE.auto_map)


DOCS = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_python_snippet_is_run(path):
    """A doc snippet that does not run is a defect: each ```python block of a user doc is
    marked, so a test runs it (README's below, the others' in the next test)."""
    text = path.read_text()
    assert text.count("```python") == len(marked_snippets(text)), path.name


@pytest.mark.parametrize("path", [p for p in DOCS if MARKER in p.read_text()],
                         ids=lambda p: p.name)
def test_doc_snippets_run_in_order(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for snippet in marked_snippets(path.read_text()):
        exec(compile(snippet, str(path), "exec"), namespace)  # noqa: S102 - our own docs
    if path.name == "tpu_plan.md":  # the planner's answer: programs that fit, per chip
        assert namespace["estimates"] and all(e.fits for e in namespace["estimates"])


def test_ci_runs_exactly_the_readme_commands():
    readme, ci = README.read_text(), (ROOT / ".ci" / "run").read_text()
    for command in (INSTALL, TESTS):
        assert command in readme.splitlines(), command
        assert command in ci, command


@pytest.mark.parametrize("path", [README, *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_user_docs_name_no_machine_local_paths(path):
    assert "/tmp/" not in path.read_text()


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 350
