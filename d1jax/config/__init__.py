"""Run configs: the ml_collections defaults that configs/*.py build on, and the checks
that need no model (``d1jax.run.spec`` translates and validates the rest)."""

import importlib.util
from pathlib import Path
from types import ModuleType

from d1jax.config import defaults, variants
from d1jax.config.defaults import (ConfigError, base, check_batch, check_workdir,
                                   checkpoint_word, dllm_rl, eval_config, full_finetuning, grpo,
                                   rollout_chunks, sampler_fields, sft, smaller_rollout_batch)

__all__ = ["ConfigError", "base", "check_batch", "check_inputs", "check_workdir",
           "checkpoint_word", "config_module", "dllm_rl", "eval_config", "full_finetuning",
           "grpo", "load_file", "rollout_chunks", "sampler_fields", "sft", "sibling",
           "smaller_rollout_batch", "variants"]


def config_module(path: str | Path, name: str | None = None) -> ModuleType:
    """The config file ``path`` imported fresh, as ``--config=`` imports it, under ``name``
    (default ``_config_<stem>``): a module of its own, not shared with another file of that
    stem. ValueError (one line) when there is no such file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no config file {str(path)!r}")
    spec = importlib.util.spec_from_file_location(name or f"_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_file(path: str):
    """``get_config(arg)`` of a config file given as the command line gives it,
    ``file[:arg]``."""
    file, _, arg = str(path).partition(":")
    return config_module(file).get_config(arg or None)


def sibling(file: str | Path, stem: str) -> ModuleType:
    """The config module ``stem``.py in the folder of the config file ``file`` (a config's
    ``__file__``): how one config file builds on another beside it."""
    return config_module(Path(file).with_name(f"{stem}.py"))


def check_inputs(config, data: bool = True, weights: bool = True) -> None:
    """``defaults.check_inputs`` (paths, data source, task), then the checkpoint at
    config.model.path against config.model.family and its own tokenizer
    (``d1jax.model.preflight.check_checkpoint``; ``weights`` False: its config.json and
    tokenizer only, as the planner needs): all before anything is written (the commands
    call it after parsing their flags)."""
    defaults.check_inputs(config, data)
    model = config.get("model") or {}
    path = model.get("path")
    if not path:
        return  # random weights (defaults.check_inputs refused a folder without config.json)
    from d1jax.model import family, preflight
    from d1jax.model.hf_checkpoint import CheckpointError, UnsupportedConfigError
    from d1jax.sampling.dream import ALGS
    name = model.get("family", "llada")
    try:
        family.load_modules()
    except ValueError as e:
        raise ConfigError(f"${family.MODULES_ENV}: {e}") from None
    if name not in family.FAMILIES:
        return  # the spec names the families in one line
    tokenizer = model.get("tokenizer_path") or None
    try:
        preflight.check_checkpoint(Path(path).expanduser(), name,
                                   tokenizer and Path(tokenizer).expanduser(), ALGS,
                                   weights=weights)
    except (CheckpointError, UnsupportedConfigError) as e:
        raise ConfigError(f"config.model.path={path!r}: {e}") from None
