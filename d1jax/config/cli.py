"""Command-line helpers shared by ``d1jax.main``, ``d1jax.eval`` and ``d1jax.plan``."""

from __future__ import annotations

import difflib
import sys

from absl import flags
from ml_collections import config_flags


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parser, except that an unknown ``--config.KEY`` override ends in one line."""
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
