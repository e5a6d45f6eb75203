"""Command-line helpers shared by ``d1jax.main``, ``d1jax.eval``, ``d1jax.plan`` and the demo:
the top layer, beside ``main``, so every import from here runs downward."""

from __future__ import annotations

import difflib
import glob
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags


def quiet_defaults() -> None:
    """What every d1jax command prints by default: its own lines, warnings and errors.

    * No TPU probe where no accelerator is attached: with libtpu installed (the ``test`` and
      ``tpu`` extras) JAX would try the TPU backend on every start and print libtpu's error
      lines before falling back to the CPU. JAX is left to choose, as it would without
      d1jax, where a TPU shows (on the PCI bus, JAX's own check, or as /dev/accel* or
      /dev/vfio/N), where a GPU shows (/dev/nvidia*, /dev/dxg, /dev/kfd), where the user set
      ``JAX_PLATFORMS``, or with ``D1JAX_PROBE_TPU=1``. Planning for TPU from a CPU host
      (``d1jax.plan``) loads libtpu itself and does not need the TPU backend.
    * absl INFO lines (Orbax logs about 40 per checkpoint) only with ``--verbosity=0``
      (``-v 0``); the default here is warnings.
    """
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if os.environ.get("JAX_PLATFORMS") or os.environ.get("D1JAX_PROBE_TPU") == "1":
        return
    if importlib.util.find_spec("libtpu") is None or _accelerator_attached():
        return
    import jax
    jax.config.update("jax_platforms", "cpu")  # what JAX falls back to here, minus the probe


def _accelerator_attached() -> bool:
    """A TPU or GPU may be attached (any doubt counts as attached: JAX then probes)."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):  # TPU VMs (v4/v5p, v5e+)
        return True
    if any(os.path.exists(d) for d in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")):
        return True
    try:
        from jax._src import hardware_utils
        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # noqa: BLE001 - JAX moved its helper: let JAX probe as it would
        return True


def user_errors() -> tuple[type[BaseException], ...]:
    """Mistakes in a config, a flag or a file: the commands report these in one line."""
    from d1jax.checkpoint import RestoreError
    from d1jax.config import ConfigError
    from d1jax.model import UnsupportedConfigError
    from d1jax.model.hf_checkpoint import CheckpointError
    from d1jax.plan.compile import DoesNotFit
    from d1jax.run.lock import WorkdirBusy
    from d1jax.run.oom import OutOfMemory
    from d1jax.tasks.sources import BadRecordError, DataUnavailableError
    return (ConfigError, CheckpointError, UnsupportedConfigError, DataUnavailableError,
            DoesNotFit, RestoreError, BadRecordError, WorkdirBusy, OutOfMemory)


def one_line(e: BaseException) -> str:
    """The message a user needs from ``e``: the innermost cause's, on one line
    (ml_collections wraps an error raised in a config file in ``Error whilst parsing config
    file`` and a traceback)."""
    e = _innermost(e)
    return " ".join(str(e).split()) or type(e).__name__


def _innermost(e: BaseException) -> BaseException:
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    return e


def parse_flags(argv: list[str], *, example: str = "configs/grpo_sudoku.py:tiny",
                check_inputs: bool = False) -> list[str]:
    """absl's flag parser, after ``quiet_defaults``, except that a mistake ends in one
    ``error:`` line: an unknown ``--config.KEY`` (with the closest keys), a value of the wrong
    type (with the type expected), a config file that is missing or raises (an unknown
    ``:variant``), no ``--config`` (``example`` shows one); with ``check_inputs``, also a model
    or data path that does not exist or an unknown task (``d1jax.config.check_inputs``).
    From here on Ctrl-C stops the command cleanly (``d1jax.run.interrupt``)."""
    from d1jax.run import interrupt
    interrupt.install_watcher()
    quiet_defaults()
    try:
        rest = _parse(argv)
        if not any(a.split("=")[0] in ("--verbosity", "-v", "--v") for a in argv):
            absl_logging.set_verbosity(absl_logging.WARNING)
        config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
        if config is not None:
            config.get("stage")  # a file that failed to load raises here
    except SystemExit:
        raise
    except flags.IllegalFlagValueError as e:  # "flag --config.x=abc: <the cause>"
        sys.exit(f"error: {_bad_value(argv, e)}")
    except OSError as e:  # ml_collections: "Failed loading config file ..."
        path = _config_path(argv)
        if path and os.path.isdir(path):
            sys.exit(f"error: config file {path!r} is a directory; name a file in it")
        if path and not os.path.isfile(path):
            sys.exit(f"error: config file {path!r} does not exist")
        sys.exit(f"error: config file {path or '?'!r}: {one_line(e)}")
    except Exception as e:  # noqa: BLE001 - an error raised by the config file itself
        path = _config_path(argv)
        sys.exit(f"error: config file {path!r}: {one_line(e)}" if path else f"error: {one_line(e)}")
    if "config" in flags.FLAGS and config is None:
        sys.exit(f"error: --config is required, e.g. --config={example} (--help lists the flags)")
    if check_inputs:
        from d1jax.config import ConfigError, check_inputs as check
        try:
            check(config)
        except ConfigError as e:
            sys.exit(f"error: {e}")
    return rest


def _parse(argv: list[str]) -> list[str]:
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError):  # what ml_collections raises for a missing key
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        config = _plain_config(argv)
        for arg in overrides:
            message = unknown_key_message(config, arg[len("--config."):].split("=", 1)[0])
            if message:
                sys.exit(f"error: {message}")
        raise


def _plain_config(argv: list[str]):
    """The config file's config without the ``--config.KEY`` overrides, loaded by a fresh flag
    set (FLAGS keeps a failed parse)."""
    plain = [a for a in argv if not a.startswith("--config.")]
    fresh = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "", flag_values=fresh,
                                             sys_argv=plain)
    fresh(plain, known_only=True)
    return config.value


def _config_path(argv: list[str]) -> str | None:
    """The file of ``--config=FILE[:variant]`` (or ``--config FILE``), if given."""
    values = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    values += [b for a, b in zip(argv, argv[1:]) if a == "--config"]
    return values[-1].split(":")[0] if values else None


def _bad_value(argv: list[str], e: flags.IllegalFlagValueError) -> str:
    """One line for a flag absl refused: the flag, the value and what was expected."""
    flag, _, body = str(e).removeprefix("flag ").partition(": ")
    if "Traceback" in body:  # an error raised by the config file: its own message
        inner = _innermost(e)
        if isinstance(inner, TypeError) and "get_config()" in str(inner):
            return f"{flag}: {_config_path(argv)} takes no ':variant'; drop it"
        return f"{flag}: {one_line(e)}"
    name, _, value = flag.partition("=")
    if name.startswith("--config."):
        key = name[len("--config."):]
        try:
            node = _plain_config(argv)
            for part in key.split("."):
                node = node[part]
        except Exception:  # noqa: BLE001 - no default to compare with: absl's own message
            node = None
        expected = _expected(node, name)
        if expected:
            return f"{flag}: expected {expected}, got {value!r}"
    return f"{flag}: {' '.join(body.split())}"


def _expected(current, name: str) -> str | None:
    """What a ``--config.KEY`` override must look like, from the config's own value."""
    if isinstance(current, bool):
        return f"true or false (the config has {current})"
    if isinstance(current, int):
        return f"an integer (the config has {current})"
    if isinstance(current, float):
        return f"a float (the config has {current})"
    if isinstance(current, tuple):
        return (f"a tuple such as {name}='{current!r}' (the config's value; quote it for the "
                "shell)")
    if hasattr(current, "keys"):
        field = next(iter(current.keys()), "FIELD")
        return f"one field of this group at a time, e.g. {name}.{field}=..."
    return None


def unknown_key_message(config, key: str) -> str | None:
    """None if the dotted ``key`` names a field of ``config``, else a line naming the closest."""
    node = config
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            candidates = _closest(key, list(_dotted_keys(config)))
            hint = (f"closest valid keys: {', '.join(candidates)}" if candidates else
                    "see the config file for its fields")
            return f"unknown config key {key!r} in --config.{key}=...; {hint}"
        node = node[part]
    return None


def _closest(key: str, valid: list[str], n: int = 3) -> list[str]:
    """Up to n valid keys most like ``key``, by the whole path or by the last name alone."""
    def score(k: str) -> float:
        return max(difflib.SequenceMatcher(None, key, k).ratio(),
                   difflib.SequenceMatcher(None, key.split(".")[-1], k.split(".")[-1]).ratio())
    return [k for k in sorted(valid, key=score, reverse=True)[:n] if score(k) >= 0.6]


def _dotted_keys(config, prefix: str = ""):
    for name, value in config.items():
        yield prefix + name
        if hasattr(value, "keys"):
            yield from _dotted_keys(value, f"{prefix}{name}.")


def compile_cache_dir(config, workdir: str) -> str | None:
    """Where ``config.train.compile_cache`` puts jax's persistent compilation cache: "workdir"
    is ``<workdir>/compile_cache``, "" is none, anything else a path of its own."""
    train = config.get("train")
    where = train.get("compile_cache", "") if train is not None else ""
    if not where:
        return None
    if where == "workdir":  # as check_workdir reads it: "~" expanded
        return os.path.join(os.path.expanduser(str(workdir)), "compile_cache")
    return os.path.expanduser(str(where))


def use_compile_cache(config, workdir: str) -> str | None:
    """Points jax's persistent compilation cache at ``compile_cache_dir`` unless one is set
    already (``JAX_COMPILATION_CACHE_DIR``, or earlier in this process); returns the one in use.
    The cache is keyed by program, backend and versions, so a run whose programs changed only
    compiles anew; it sits beside the run files and a moved-aside run leaves it in place."""
    import jax
    path = compile_cache_dir(config, workdir)
    if path and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", path)
    return jax.config.jax_compilation_cache_dir


def run_stage(config, workdir: str | None, stages: Mapping[str, str | Callable[[Any, Any], Any]],
              before: Callable[[Any], None] | None = None, needs_workdir: bool = True) -> None:
    """The commands' shared body: ``run(config, workdir)`` of the module ``stages`` maps the
    config's ``stage`` to (or the function it maps it to), in ``workdir`` (default
    ``config.workdir``), after ``before(config)``. ``needs_workdir=False``: a command that
    writes no run (``d1jax.plan``) may have none.

    Compiled programs go to the persistent cache ``train.compile_cache`` names, so a rerun
    loads them. A mistake in the config or a file, or a program out of device memory
    (``run.oom``: the program, the bytes, the knob), ends in one ``error:`` line; a run
    stopped with a save (SIGTERM, ``train.stop_after``) exits with its rerun code; in a
    multi-process run an error from a collective ends in the watchdog's line naming the lost
    process.
    """
    from d1jax import distributed
    from d1jax.run import interrupt, oom
    from d1jax.run.context import RunStopped
    from d1jax.run.spec import from_config
    stage = config.get("stage")
    if stage not in stages:
        sys.exit(f"error: config.stage={stage!r} is not one of {sorted(stages)}")
    workdir = workdir or config.get("workdir")
    if not workdir and needs_workdir:
        sys.exit("error: no workdir: pass --workdir=DIR or set config.workdir")
    if workdir and stage in ("sft", "grpo"):  # what Ctrl-C's line names before the loop starts
        interrupt.expect_checkpoints(Path(workdir).expanduser() / "checkpoints")
    run = stages[stage]
    try:
        if workdir:
            use_compile_cache(config, workdir)
        if before is not None:
            before(config)
        if isinstance(run, str):
            run = importlib.import_module(run).run
        # An OOM outside the named programs: loading the weights, creating or restoring the state.
        with oom.named("model setup", lambda: oom.hint(from_config(config), "model setup")):
            run(config, workdir)
    except user_errors() as e:  # a mistake in a config or a file: one clear line
        sys.exit(f"error: {e}")
    except RunStopped as e:  # saved and stopped early: "rerun me", not "done" (docs/training.md)
        distributed.finish()
        print(e, file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except Exception as e:  # a peer died inside a collective: one line naming it
        distributed.on_failure(e)
        raise
    distributed.finish()
