"""Commands run as a user starts them, ``python -m MODULE ARGS``, without paying the imports.

``Commands(preload)`` starts one server process that imports ``preload`` (the modules the
commands import: jax, d1jax, transformers' tokenizer; never the command's own module, which
``python -m`` runs fresh, and no JAX backend, so forking is safe). Each ``run(module, *args)``
forks it: the child runs ``module`` as ``python -m`` does (runpy as ``__main__``, its flags,
its input checks, its own JAX backend, signal handlers and atexit handlers, its exit status;
stdout and stderr to files), without the 1-3 s of CPU those imports cost each fresh start;
``run_code(code, *args)`` runs ``python -c code *args`` so. The environment is the server's
(``env``), fixed when it starts.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SERVER = """
import importlib, json, os, runpy, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
for line in sys.stdin:
    module, code, argv, out, err = json.loads(line)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.close(0)
        if code is None:
            sys.argv = [module, *argv]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *argv]
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
        sys.exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""

# What `python -m d1jax.main` (and d1jax.plan, d1jax.eval) imports before it parses its flags.
D1JAX_MAIN = ("d1jax.cli", "d1jax.distributed", "d1jax.eval.evaluate", "d1jax.train.grpo",
              "d1jax.train.sft", "d1jax.metrics", "orbax.checkpoint",
              "transformers.tokenization_utils_fast")


class Commands:
    """``run(module, *args)``: the subprocess.CompletedProcess of ``python -m module *args``
    run from the repository root, forked from the server (see the module docstring)."""

    def __init__(self, logs: Path, preload=D1JAX_MAIN, env: dict | None = None,
                 timeout: float = 900):
        self.logs, self.n, self.timeout = Path(logs), 0, timeout
        self.logs.mkdir(parents=True, exist_ok=True)
        self.server = subprocess.Popen([sys.executable, "-c", _SERVER, *preload], cwd=ROOT,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env=env)

    def run(self, module: str, *args: str) -> subprocess.CompletedProcess:
        return self._fork(module, None, args)

    def run_code(self, code: str, *args: str) -> subprocess.CompletedProcess:
        """``python -c code *args``, forked as ``run``'s commands are."""
        return self._fork("-c", code, args)

    def _fork(self, module: str, code: str | None, args) -> subprocess.CompletedProcess:
        self.n += 1
        out, err = (self.logs / f"{self.n}.{name}" for name in ("out", "err"))
        message = [module, code, list(args), str(out), str(err)]
        self.server.stdin.write(json.dumps(message) + "\n")
        self.server.stdin.flush()
        ready = select.select([self.server.stdout], [], [], self.timeout)[0]
        line = self.server.stdout.readline() if ready else ""
        assert line.strip(), f"the fork server gave no exit status for {module} {args}"
        return subprocess.CompletedProcess([module, *args], int(line), out.read_text(),
                                           err.read_text())

    def close(self) -> None:
        self.server.stdin.close()
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a command that hung (its run failed the test)
            self.server.kill()


def commands_fixture(tmp_path_factory, preload=D1JAX_MAIN, env: dict | None = None):
    """A generator for a pytest fixture: one server for the fixture's scope."""
    c = Commands(tmp_path_factory.mktemp("commands"), preload, env)
    yield c
    c.close()
