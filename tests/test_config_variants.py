"""d1jax/config/variants.py: one variant syntax for every config file (comma-separated words
from the words the file declares), one error that names the file and lists them, and every
``configs/<file>.py:ARG`` the docs, the config files and the scripts show builds."""

import re
from pathlib import Path

import pytest

from d1jax.config import ConfigError, variants
from tests.config_files import load_module

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.py")
                 if p.name != "forward_demo.py")  # takes no argument (the CLI says so)
# Where commands are written for users; tests/ names bad variants on purpose.
DOCUMENTED = ["README.md", "docs", "configs", "examples", "bench", "launch", "d1jax"]
COMMAND = re.compile(r"(configs/[\w/]+\.py):([\w,.-]*\w)")  # ARG, TASK: placeholders


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the errors name config files relative to the working directory


@pytest.mark.parametrize("path", CONFIGS)
def test_an_unknown_word_names_the_file_and_lists_its_words(path):
    with pytest.raises(ConfigError) as e:
        load_module(ROOT / path).get_config("bogus")
    assert str(e.value).startswith(f"unknown config variant 'bogus' for {path}: use "
                                   "comma-separated words from "), str(e.value)


def test_each_word_is_from_the_files_declared_set():
    def words(path, arg="bogus"):
        with pytest.raises(ConfigError) as e:
            load_module(ROOT / path).get_config(arg)
        return str(e.value).split("words from ")[1].removesuffix(", or nothing")
    assert words("configs/grpo_sudoku.py") == "tiny, full, authors, generated"
    assert words("configs/sft_s1k.py") == "tiny, full"
    assert words("configs/tracerl_math.py") == "dream, tiny, full, authors, generated"
    assert words("configs/sdar/sft_s1k.py") == "trado, tiny, full"
    assert words("configs/demo_sudoku.py") == "ci, compare, seeds, d1like"
    assert words("configs/grpo_code_toy.py") == "sft, diffu_grpo, coupled_grpo, justgrpo"
    assert words("configs/grpo_letters.py", "full") == "tiny"
    assert words("configs/eval.py").startswith("tiny, gsm8k, math500, sudoku, countdown, ")


def test_the_old_eval_spelling_is_refused_with_the_new_one():
    with pytest.raises(ConfigError, match=r"unknown config variant 'sudoku-tiny' for "
                       r"configs/dream/eval.py: .*\(':sudoku,tiny', not ':sudoku-tiny'\)$"):
        load_module(ROOT / "configs/dream/eval.py").get_config("sudoku-tiny")


def test_words_come_in_any_order_and_nothing_is_the_full_run():
    from tests import spec_snapshot
    def record(path, arg):
        return spec_snapshot.config_record(load_module(ROOT / path).get_config(arg))
    assert record("configs/eval.py", "tiny,sudoku") == record("configs/eval.py", "sudoku,tiny")
    assert record("configs/spg_sudoku.py", "tiny,authors") == record("configs/spg_sudoku.py",
                                                                     "authors,tiny")
    assert record("configs/sft_s1k.py", "full") == record("configs/sft_s1k.py", None)
    assert record("configs/sdar/tracerl_math.py", "tiny,sdar") == record(
        "configs/sdar/tracerl_math.py", "sdar,tiny")


@pytest.mark.parametrize("path,arg,message", [
    ("configs/eval.py", "sudoku,gsm8k", "names sudoku and gsm8k: choose one of gsm8k, "),
    ("configs/grpo_sudoku.py", "tiny,full", "names tiny and full: choose one of tiny, full"),
    ("configs/demo_sudoku.py", "seeds,ci", "names seeds and ci: choose one of compare, seeds, ci"),
    ("configs/grpo_code_toy.py", "sft,justgrpo", "names sft and justgrpo: choose one of sft, "),
])
def test_words_that_exclude_each_other_are_one_line(path, arg, message):
    with pytest.raises(ConfigError, match=re.escape(f"config variant {arg!r} for {path} "
                                                    f"{message}")):
        load_module(ROOT / path).get_config(arg)


def test_outside_a_config_file_the_error_names_none():
    with pytest.raises(ConfigError, match=r"^unknown config variant 'x': use comma-separated "
                       r"words from a, b, or nothing$"):
        variants.parse("a,x", ("a", "b"))
    assert variants.parse(" b , a,", ("a", "b")) == {"a", "b"}
    with pytest.raises(ConfigError, match="it takes none"):
        variants.parse("a", ())


def test_every_documented_command_builds():
    """Each ``configs/<file>.py:ARG`` in the docs, the config files' docstrings, the examples,
    the benchmarks and the launch scripts builds its config."""
    found = set()
    for place in DOCUMENTED:
        files = [ROOT / place] if (ROOT / place).is_file() else (ROOT / place).rglob("*")
        for f in files:
            if f.suffix in (".md", ".py", ".sh") and f.is_file():
                found.update(COMMAND.findall(f.read_text(errors="replace")))
    found = {(path, arg) for path, arg in found if not any(w.isupper() for w in arg.split(","))}
    assert len(found) > 30, sorted(found)
    for path, arg in sorted(found):
        load_module(ROOT / path).get_config(arg)
