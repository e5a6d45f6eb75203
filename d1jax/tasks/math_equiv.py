"""Answer equivalence for MATH: d1's string rules by default, ``math-verify`` as an option.

d1's rules (eval/parser_helper.py, diffu-grpo/math500_utils.py) are the Hendrycks MATH
``strip_string`` normalisation followed by string equality; where the normalisation raises
(a few malformed inputs, see ``_Unnormalizable``) d1 compares the raw strings. All of it is
plain string work in linear time.

``math-verify`` (optional: ``pip install math-verify``) compares answers symbolically. It
runs in a separate worker process that is killed after ``timeout_s``, so a pathological
answer cannot hang the caller, and it parses LaTeX only: its plain-expression parser is
not used because it goes through sympy's ``parse_expr``, which calls ``eval``.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing


class _Unnormalizable(Exception):
    """Where d1's ``strip_string`` raises (assertion, index or int() errors)."""


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1b`` -> ``\\frac{1}{b}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for sub in parts[1:]:
        out += "\\frac"
        if not sub:
            raise _Unnormalizable("\\frac with nothing after it")
        if sub[0] == "{":
            out += sub
            continue
        if len(sub) < 2:
            return s
        a, b, rest = sub[0], sub[1], sub[2:]
        out += "{" + a + "}" + (b if b == "{" else "{" + b + "}") + rest
    return out


def _fix_a_slash_b(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` for plain integers."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError as e:  # d1 catches only AssertionError here, so strip_string raises
        raise _Unnormalizable(str(e)) from e
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if s == f"{a}/{b}" else s


def _remove_right_units(s: str) -> str:
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise _Unnormalizable("more than one '\\text{ '")
    return parts[0]


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``."""
    if "\\sqrt" not in s:
        return s
    parts = s.split("\\sqrt")
    out = parts[0]
    for sub in parts[1:]:
        if not sub:
            raise _Unnormalizable("\\sqrt with nothing after it")
        out += "\\sqrt" + sub if sub[0] == "{" else "\\sqrt{" + sub[0] + "}" + sub[1:]
    return out


_REMOVALS = (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
             ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""))


def strip_string(s: str) -> str:
    """Hendrycks MATH normalisation, step for step as d1; raises ``_Unnormalizable``."""
    for old, new in _REMOVALS:
        s = s.replace(old, new)
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace("\\%", "")  # twice, as d1: removal can form a new one
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" -> "3"
        s = sides[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def d1_equiv(a: str | None, b: str | None) -> bool:
    """d1's training ``is_equiv`` (math500_utils.py): normalised strings equal."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return strip_string(a) == strip_string(b)
    except _Unnormalizable:
        return a == b


def d1_eval_equiv(a, b) -> bool:
    """d1's evaluation ``is_equiv`` (parser_helper.py): floats within 1e-6, else as above."""
    if type(a) is float or type(b) is float:
        try:
            return abs(float(a) - float(b)) < 1e-6
        except (TypeError, ValueError):
            return False
    return d1_equiv(a, b)


# ---------------------------------------------------------------------------- math-verify


def require_math_verify() -> None:
    """Raises a clear ImportError when the optional ``math-verify`` is missing."""
    try:
        import math_verify  # noqa: F401
    except ImportError as e:
        raise ImportError("equivalence='math_verify' needs the optional package math-verify: "
                          "pip install math-verify (or use the default equivalence='d1')") from e


def _math_verify_job(gold: str, pred: str) -> bool:
    """Runs in the worker: LaTeX parsing only (no sympy ``parse_expr``, hence no eval)."""
    from math_verify import LatexExtractionConfig, parse, verify
    config = [LatexExtractionConfig()]
    gold_p = parse(f"${gold}$", extraction_config=config, parsing_timeout=None)
    pred_p = parse(f"${pred}$", extraction_config=config, parsing_timeout=None)
    return bool(gold_p and pred_p and verify(gold_p, pred_p, timeout_seconds=None))


def _ready(module: str | None = None) -> bool:
    """Worker warm-up: start-up imports (and ``module``) before any timed call."""
    if module:
        importlib.import_module(module)
    return True


class TimeLimitedWorker:
    """One spawned worker process; a call that overruns ``timeout_s`` kills it and counts
    as a failure (the next call starts a fresh worker). A new worker first imports
    ``warm_module`` within ``startup_s``, so start-up time never eats into a call's limit.
    """

    def __init__(self, timeout_s: float = 5.0, warm_module: str | None = None,
                 startup_s: float = 120.0):
        self.timeout_s, self.warm_module, self.startup_s = timeout_s, warm_module, startup_s
        self._pool = None

    def call(self, fn, *args, default=False):
        try:
            if self._pool is None:
                self._pool = multiprocessing.get_context("spawn").Pool(1)
                self._pool.apply_async(_ready, (self.warm_module,)).get(self.startup_s)
            return self._pool.apply_async(fn, args).get(self.timeout_s)
        except multiprocessing.TimeoutError:
            self.close()
            return default
        except Exception:  # an error inside the job: not equivalent
            return default

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


_WORKERS: dict[float, TimeLimitedWorker] = {}


@atexit.register
def _close_workers() -> None:
    for worker in _WORKERS.values():
        worker.close()


def math_verify_equiv(gold: str | None, pred: str | None, timeout_s: float = 5.0) -> bool:
    """Symbolic equivalence with ``math-verify``; False on a parse failure or timeout."""
    if gold is None or pred is None:
        return False
    if d1_equiv(gold, pred):  # cheap exact path first
        return True
    require_math_verify()
    worker = _WORKERS.setdefault(timeout_s, TimeLimitedWorker(timeout_s, "math_verify"))
    return worker.call(_math_verify_job, str(gold), str(pred))
