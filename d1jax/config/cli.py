"""Command-line helpers shared by ``d1jax.main``, ``d1jax.eval`` and ``d1jax.plan``."""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags


def quiet_defaults() -> None:
    """What every d1jax command prints by default: its own lines, warnings and errors.

    * No TPU probe where no TPU is attached: with libtpu installed (the ``test`` and ``tpu``
      extras) JAX would try the TPU backend on every start and print libtpu's error lines.
      A TPU on the PCI bus (JAX's own check), ``JAX_PLATFORMS`` set by the user, or
      ``D1JAX_PROBE_TPU=1`` leaves JAX's choice alone. Planning for TPU from a CPU host
      (``d1jax.plan``) does not need the TPU backend.
    * absl INFO lines (Orbax logs about 40 per checkpoint) only with ``--verbosity=0``
      (``-v 0``); the default here is warnings.
    """
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if os.environ.get("JAX_PLATFORMS") or os.environ.get("D1JAX_PROBE_TPU") == "1":
        return
    if importlib.util.find_spec("libtpu") is None:
        return
    try:
        from jax._src import hardware_utils
        chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
        gpu = hardware_utils.has_visible_nvidia_gpu()
    except Exception:  # noqa: BLE001 - JAX moved its helper: let JAX probe as it would
        return
    if chips:
        return
    import jax
    cuda = gpu and any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))
    jax.config.update("jax_platforms", "cuda,cpu" if cuda else "cpu")


def user_errors() -> tuple[type[BaseException], ...]:
    """Mistakes in a config, a flag or a file: the commands report these in one line."""
    from d1jax.checkpoint import RestoreError
    from d1jax.config import ConfigError
    from d1jax.model import UnsupportedConfigError
    from d1jax.model.weights import CheckpointError
    from d1jax.plan.compile import DoesNotFit
    from d1jax.tasks.sources import BadRecordError, DataUnavailableError
    return (ConfigError, CheckpointError, UnsupportedConfigError, DataUnavailableError,
            DoesNotFit, RestoreError, BadRecordError)


def one_line(e: BaseException) -> str:
    """The message a user needs from ``e``: the innermost cause's, on one line
    (ml_collections wraps an error raised in a config file in ``Error whilst parsing config
    file`` and a traceback)."""
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    return " ".join(str(e).split()) or type(e).__name__


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parser, after ``quiet_defaults``, except that a bad flag ends in one line:
    an unknown ``--config.KEY`` (with the closest keys), a value of the wrong type, a config
    file that is missing or raises (an unknown ``:variant``)."""
    quiet_defaults()
    try:
        rest = _parse(argv)
        if not any(a.split("=")[0] in ("--verbosity", "-v", "--v") for a in argv):
            absl_logging.set_verbosity(absl_logging.WARNING)
        if "config" in flags.FLAGS and flags.FLAGS["config"].value is not None:
            flags.FLAGS["config"].value.get("stage")  # a file that failed to load raises here
        return rest
    except SystemExit:
        raise
    except flags.IllegalFlagValueError as e:  # "flag --config.x=abc: <the cause>"
        flag, _, body = str(e).removeprefix("flag ").partition(": ")
        wrapped = "Traceback" in body  # an error raised by the config file: its own message
        sys.exit(f"error: {flag}: {one_line(e) if wrapped else ' '.join(body.split())}")
    except OSError as e:  # ml_collections: "Failed loading config file ..."
        path = [a.split("=", 1)[1].split(":")[0] for a in argv if a.startswith("--config=")]
        if path and not os.path.isfile(path[-1]):
            sys.exit(f"error: config file {path[-1]!r} does not exist")
        sys.exit(f"error: config file {path[-1] if path else '?'!r}: {one_line(e)}")
    except Exception as e:  # noqa: BLE001 - an error raised by the config file itself
        sys.exit(f"error: {one_line(e)}")


def _parse(argv: list[str]) -> list[str]:
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError):  # what ml_collections raises for a missing key
        overrides = [a for a in argv[1:] if a.startswith("--config.")]
        # The config without overrides, loaded by a fresh flag set (FLAGS keeps the failed parse).
        plain = [a for a in argv if a not in overrides]
        fresh = flags.FlagValues()
        config = config_flags.DEFINE_config_file("config", None, "", flag_values=fresh,
                                                 sys_argv=plain)
        fresh(plain, known_only=True)
        for arg in overrides:
            message = unknown_key_message(config.value, arg[len("--config."):].split("=", 1)[0])
            if message:
                sys.exit(f"error: {message}")
        raise


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
