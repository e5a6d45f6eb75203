"""Properties of every reward and evaluation parser on arbitrary text: no exception, under
100 ms per item, values in the documented ranges, and nothing executed (no eval/exec, no
process started: watched with an audit hook)."""

import ast
import builtins
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from d1jax.tasks import TASK_NAMES, get_task

PIECES = ["<answer>", "</answer>", "<reasoning>", "</reasoning>", "\n", " ", "\t", "0", "1", "2",
          "3", "4", "7", "16", "\\boxed{", "\\boxed ", "}", "{", "```", "=", "+", "-", "*", "/",
          "**", "//", "(", ")", ".", "$", "\\frac", "\\sqrt", "\\text{ ", "<|eot_id|>",
          "<|endoftext|>", "\u0663", "\u00b2", "\uff13", "\x08oxed", "__import__('os').system('x')",
          "9" * 30, "1234123412341234", "Sudoku puzzle: ", "\\times", "\u00a0"]
TEXTS = (st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
         | st.text(max_size=200)
         | st.lists(st.sampled_from(PIECES), min_size=200, max_size=600).map("".join))

EXAMPLES = {
    "gsm8k": [{"question": "q", "answer": "72", "solution": "#### 72"}],
    "math500": [{"problem": "p", "solution": "\\boxed{\\frac{1}{2}}", "answer": "\\frac{1}{2}"}],
    "sudoku": [{"puzzle": "3102200002100320", "solution": "3142243142131324"}],
    "countdown": [{"nums": [3, 5, 7], "target": 22}, {"nums": [9, 9, 9], "target": 1}],
}
RANGES = {  # documented in the task modules
    "xmlcount_reward_func": lambda r: r <= 0.5,
    "soft_format_reward_func": lambda r: r in (0.0, 0.5),
    "strict_format_reward_func": lambda r: r in (0.0, 0.5),
    "int_reward_func": lambda r: r in (0.0, 0.5),
    "correctness_reward_func": lambda r: r in (0.0, 2.0),
    "correctness_reward_func_math": lambda r: r in (0.0, 2.0),
    "boxed_and_answer_tags_format_reward": lambda r: r in (0.25, 0.5, 0.75, 1.0),
    "sudoku_reward_func": lambda r: 0.0 <= r <= 1.0,
    "countdown_reward_func": lambda r: r in (0.0, 0.1, 1.0),
}
WATCHED = {"exec", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "subprocess.Popen", "ctypes.dlopen"}
_watch = {"on": False, "seen": []}


def _audit(event, args):
    if _watch["on"] and event in WATCHED:
        _watch["seen"].append(event)


sys.addaudithook(_audit)  # hooks cannot be removed; it is inert while "on" is False


def _forbidden(*args, **kwargs):
    raise AssertionError("model text must never reach eval/exec")


def _timed(fn, *args):
    """Runs ``fn`` with eval/exec disabled and the audit hook watching; checks the time."""
    saved = builtins.eval, builtins.exec
    builtins.eval = builtins.exec = _forbidden
    _watch["on"] = True
    try:
        t0 = time.perf_counter()
        out = fn(*args)
        elapsed = time.perf_counter() - t0
    finally:
        _watch["on"] = False
        builtins.eval, builtins.exec = saved
    assert not _watch["seen"], f"executed something: {_watch['seen']}"
    assert elapsed < 0.1, f"{getattr(fn, '__name__', fn)} took {elapsed:.3f}s"
    return out


TASKS = {name: get_task(name) for name in TASK_NAMES}


@pytest.mark.parametrize("name", TASK_NAMES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS)
def test_rewards_total_fast_and_in_range(name, text):
    task = TASKS[name]
    for example in EXAMPLES[name]:
        for f in task.reward_funcs:
            (r,) = _timed(f, [text], [example])
            assert isinstance(r, float) and RANGES[f.__name__](r), (f.__name__, r, text)


@pytest.mark.parametrize("name", TASK_NAMES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS)
def test_eval_parsers_total_fast_and_in_range(name, text):
    task = TASKS[name]
    for example in EXAMPLES[name]:
        v = _timed(task.verdict, task.record(example, text))
        assert 0.0 <= v.credit <= 1.0 and v.hits <= v.total
        assert v.correct == (v.total > 0 and v.hits == v.total)


def test_no_dynamic_execution_in_source():
    """No call to eval / exec / compile / __import__ anywhere in the package, but in the code
    sandbox's scripts, each run in a subprocess of its own: the untrusted child's files
    (``sandbox_os.CHILD_FILES``) and the trusted judge (``sandbox.JUDGE``), which runs a task's
    own test code (tests/test_sandbox*.py)."""
    from d1jax.tasks import sandbox, sandbox_os
    root = Path(__file__).resolve().parents[1] / "d1jax"
    files = sorted(root.rglob("*.py"))
    assert root / "tasks" / "rewards.py" in files and root / "eval" / "score.py" in files
    scripts = [root / "tasks" / n for n in sandbox_os.CHILD_FILES] + [sandbox.JUDGE]
    for script in scripts:
        files.remove(script)
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"eval", "exec", "compile", "__import__"}, f


def test_injection_is_not_run(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    for name, task in TASKS.items():
        for text in (f"<answer>{payload}</answer>", f"\\boxed{{{payload}}}", payload):
            for example in EXAMPLES[name]:
                _timed(task.total_reward, [text], [example])
                _timed(task.verdict, task.record(example, text))
    assert not marker.exists()
