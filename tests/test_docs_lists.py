"""The README's first screen and the docs name every family, objective and task the
registries hold: a new one without its line in both fails here."""

from pathlib import Path

import pytest

from d1jax import tasks
from d1jax.model import family
from d1jax.objectives.table import OBJECTIVES

ROOT = Path(__file__).resolve().parents[1]
# How the prose names each registered key (a new key must be added here and to the docs).
OBJECTIVE_TITLES = {"diffu_grpo": "diffu-GRPO", "wd1": "wd1", "spg": "SPG",
                    "coupled_grpo": "coupled-GRPO", "justgrpo": "JustGRPO", "tracerl": "TraceRL",
                    "ebpo": "EBPO"}
TASK_TITLES = {"gsm8k": "GSM8K", "math500": "MATH500", "sudoku": "Sudoku",
               "countdown": "Countdown", "humaneval": "HumanEval", "mbpp": "MBPP",
               "letters": "`letters`"}


def first_screen() -> str:
    """The README up to its first section (what the project is)."""
    text = (ROOT / "README.md").read_text()
    return text[:text.index("\n## ")]


def headings(doc: str) -> str:
    return "\n".join(line for line in (ROOT / "docs" / doc).read_text().splitlines()
                     if line.startswith("#"))


@pytest.mark.parametrize("name", list(family.FAMILIES))
def test_every_family_is_named_in_the_readme_and_models_doc(name):
    assert f"`{name}`" in first_screen(), name
    assert f"`{name}`" in (ROOT / "docs" / "models.md").read_text(), name


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_objective_is_named_in_the_readme_and_has_its_section(name):
    assert name in OBJECTIVE_TITLES, f"objective {name!r}: add its title here and its docs"
    title = OBJECTIVE_TITLES[name]
    assert title in first_screen(), title
    assert title in headings("objectives.md"), title


@pytest.mark.parametrize("name", tasks.TASK_NAMES + tasks.CODE_TASKS + tasks.TOY_TASKS)
def test_every_task_is_named_in_the_readme_and_the_evaluation_doc(name):
    assert name in TASK_TITLES, f"task {name!r}: add its title here and its docs"
    title = TASK_TITLES[name]
    assert title in first_screen(), title
    assert title.strip("`") in (ROOT / "docs" / "evaluation.md").read_text(), title
