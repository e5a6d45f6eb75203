"""Model families: one record per family (``Family``) holding every fact that differs
between them, and the registry of those records.

Everything downstream (sampler, estimator, SFT, objectives, train loops, planner, config
builders, exports) takes a model module with the interface of
``d1jax.model.predictor.MaskPredictor`` and asks this registry for the rest; none of it asks
which family it holds. A run picks its family once, by ``model.family`` (checked against a
checkpoint's ``config.json``).

Built in (each a package under ``d1jax/model/``, registered by ``d1jax/model/__init__.py``):

- ``llada``: LLaDA-8B-Base/Instruct (``LLaDAModelLM``), ``d1jax.model.llada``.
- ``dream``: Dream-v0-7B and DiffuCoder-7B (model_type "Dream", Qwen2 blocks),
  ``d1jax.model.dream``.
- ``sdar``: SDAR-*-Chat, TraDo-*-Instruct (block diffusion), ``d1jax.model.sdar``.
- ``llada2``: LLaDA2.0/2.1-mini and -flash (mixture of experts, block diffusion),
  ``d1jax.model.llada2``.

Another family registers with ``register(Family(...))`` from its own module; a run names
that module in ``$D1JAX_FAMILY_MODULES`` (comma-separated, importable from PYTHONPATH) and
``get`` imports it when asked for a family it does not know yet (docs/models.md, "Adding a
family").
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from d1jax import plugins
from d1jax.model import hf_files, predictor

# Modules that register families, imported by ``load_modules`` (comma-separated).
MODULES_ENV = "D1JAX_FAMILY_MODULES"


@dataclasses.dataclass(frozen=True)
class Family:
    """How one model family is built, loaded, saved, adapted, planned and named."""

    name: str  # config.model.family
    title: str  # for messages: "LLaDA", "Dream"
    module: type  # the flax module (a predictor.MaskPredictor)
    config_class: type
    model_types: tuple[str, ...]  # config.json model_type values of its checkpoints
    presets: Mapping[str, dict]  # named architectures (random_init)
    make_config: Callable[..., Any]  # (preset name, **overrides) -> config
    # The config's field names of what ``sized_config`` sets: vocab, mask, eos, pad, length,
    # width, mlp, layers (each a tuple of the fields that take the value).
    fields: Mapping[str, tuple[str, ...]]
    lora_targets: tuple[str, ...]  # projection names LoRA may target (its module names)
    # d1's GRPO target list (diffu_grpo_train.py's [q, k, v, o, up, down, gate]_proj) as it
    # lands on this family's names: PEFT matches names exactly, so the absent ones drop out.
    grpo_targets: tuple[str, ...]
    # (path, mesh, dtype, rules) -> (config, params)
    load: Callable[..., tuple[Any, dict]]
    # (path, config, params, max_shard_size, dtype, *, source_dir, tokenizer, lora)
    save: Callable[..., None]
    # path -> config: a checkpoint's config.json alone (the planner: shapes, no weights)
    read_config: Callable[..., Any]
    remote_code: hf_files.RemoteCode  # the Hugging Face code an export ships
    default_preset: str  # the released checkpoints' architecture (llada-8b, dream-7b)
    embedding: str  # HF name of the input embedding (its rows: the vocabulary)
    # The checkpoint kinds a config builder names (``d1jax.config.grpo(..., checkpoint=)``):
    # kind -> (environment variable giving model.path, tiny random preset).
    checkpoints: Mapping[str, tuple[str, str]]
    # The published checkpoints of the family (README, docs/models.md).
    published: tuple[str, ...] = ()
    # Config files the planner grid runs for this family (``python -m d1jax.plan.grid
    # --configs=<name>``), docs/tpu_plan.md's rows.
    plan_configs: tuple[str, ...] = ()
    # Tokens that close a chat turn in its tokenizers (``tokenizer.special_ids``' eot).
    turn_ends: tuple[str, ...] = ()
    # The first and last layers run outside the layer loop (LLaDA): the last runs only the
    # rows the output reads, and XLA drops the first's q/k/v input gradient under LoRA.
    peeled_ends: bool = False
    # The SFT stage's loss under sft.loss "family": "masked" (d1's), "block" or
    # "block_dfactory" (block SFT's recipes, d1jax.objectives.blockwise: a model taking
    # positions= and mask= in ``hidden``).
    sft_loss: str = "masked"
    # config.json keys its checkpoints hold when another family shares a model_type
    # (LLaDA-MoE's release says "llada", as LLaDA-8B's does; its num_experts tells them apart):
    # ``detect`` takes the family whose marks are all present, the most marks first.
    marks: tuple[str, ...] = ()

    def model(self, config: Any, **kwargs: Any):
        """The flax module of architecture ``config`` (kwargs: dtype, remat, lora, ...)."""
        if not isinstance(config, self.config_class):
            raise TypeError(f"{self.title} needs a {self.config_class.__name__}, got "
                            f"{type(config).__name__}")
        return self.module(config, **kwargs)

    def sized_config(self, name: str, *, vocab: int, mask: int, eos: int, pad: int,
                     width: int = 0, n_layers: int = 0) -> Any:
        """Preset ``name`` sized to a tokenizer (vocabulary and special ids), 1024 positions,
        with the width (MLP 3x) and depth overrides of a random model (0: the preset's)."""
        values = dict(vocab=vocab, mask=mask, eos=eos, pad=pad, length=1024)
        if width:
            values.update(width=width, mlp=3 * width)
        if n_layers:
            values["layers"] = n_layers
        return self.make_config(name, **{f: v for key, v in values.items()
                                         for f in self.fields[key]})


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Adds ``family`` to the registry (its module checked against ``MaskPredictor``);
    registering the same record again is a no-op, another under a taken name a ValueError."""
    known = FAMILIES.get(family.name)
    if known is not None and known != family:
        raise ValueError(f"model family {family.name!r} is already registered "
                         f"({known.module.__name__})")
    predictor.check_module(family.module)
    missing = [k for k in ("vocab", "mask", "eos", "pad", "length", "width", "mlp", "layers")
               if k not in family.fields]
    if missing:
        raise ValueError(f"family {family.name!r}: fields lacks {missing}")
    FAMILIES[family.name] = family
    return family


def load_modules() -> None:
    """Imports the modules that register families, named in ``$D1JAX_FAMILY_MODULES``."""
    plugins.import_named(MODULES_ENV, "family")


def get(name: str) -> Family:
    """The family called ``name``; ValueError listing the known ones."""
    if name not in FAMILIES:
        load_modules()
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; choose one of "
                         f"{', '.join(FAMILIES)}") from None


def of(model: Any) -> Family:
    """The family of a model module: the one whose module is its class, else the first it
    is an instance of (a family's module may subclass another's)."""
    for fam in FAMILIES.values():
        if type(model) is fam.module:
            return fam
    for fam in FAMILIES.values():
        if isinstance(model, fam.module):
            return fam
    raise TypeError(f"{type(model).__name__} is not a d1jax model family's module")


def detect(path: str | os.PathLike) -> str | None:
    """The family of the Hugging Face checkpoint at ``path`` by its config.json's
    ``model_type`` and, where families share one, their ``marks`` (None when there is no
    config.json or the type is unknown)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    raw = json.loads(cfg.read_text())
    found = [fam for fam in FAMILIES.values()
             if raw.get("model_type") in fam.model_types and all(k in raw for k in fam.marks)]
    return max(found, key=lambda fam: len(fam.marks)).name if found else None
