"""Model families: the one table that knows each family's module, configs, checkpoints and
LoRA names.

Everything downstream (sampler, estimator, SFT, objectives, train loops, planner) takes a
model module with the mask-predictor interface of ``d1jax.model.predictor`` and never asks
which family it is; a run picks its family once, by ``model.family`` (checked against a
checkpoint's ``config.json``), and ``run.build`` asks this table for the rest.

- ``llada``: LLaDA-8B-Base/Instruct (``LLaDAModelLM``), ``d1jax.model.LLaDA``.
- ``dream``: Dream-v0-7B and DiffuCoder-7B (model_type "Dream", Qwen2 blocks),
  ``d1jax.model.dream.Dream``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from d1jax.model import dream_weights, lora as lora_lib, weights
from d1jax.model.config import PRESETS, LLaDAConfig, preset
from d1jax.model.dream import Dream
from d1jax.model.dream_config import DREAM_PRESETS, DreamConfig, dream_preset
from d1jax.model.llada import LLaDA


@dataclasses.dataclass(frozen=True)
class Family:
    """How one model family is built, loaded, saved and adapted."""

    name: str
    title: str  # for messages: "LLaDA", "Dream"
    module: type  # the flax module (LLaDA, Dream)
    config_class: type
    model_types: tuple[str, ...]  # config.json model_type values of its checkpoints
    presets: Mapping[str, dict]  # named architectures (random_init)
    make_config: Callable[..., Any]  # (preset name, **overrides) -> config
    # The config's field names of what ``sized_config`` sets: vocab, mask, eos, pad, length,
    # width, mlp, layers (each a tuple of the fields that take the value).
    fields: Mapping[str, tuple[str, ...]]
    lora_targets: tuple[str, ...]  # projection names LoRA may target
    # (path, mesh, dtype, rules) -> (config, params)
    load: Callable[..., tuple[Any, dict]]
    # (path, config, params, max_shard_size, dtype, *, source_dir, tokenizer, lora)
    save: Callable[..., None]
    # path -> config: a checkpoint's config.json alone (the planner: shapes, no weights)
    read_config: Callable[..., Any] | None = None
    default_preset: str = ""  # the released checkpoints' architecture (llada-8b, dream-7b)
    embedding: str = ""  # HF name of the input embedding (its rows: the vocabulary)
    # The published checkpoints of the family (README, docs/models.md).
    published: tuple[str, ...] = ()
    # The first and last layers run outside the layer loop (LLaDA): the last runs only the
    # rows the output reads, and XLA drops the first's q/k/v input gradient under LoRA.
    peeled_ends: bool = False

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


_LLADA_FIELDS = dict(
    vocab=("vocab_size", "embedding_size"), mask=("mask_token_id",), eos=("eos_token_id",),
    pad=("pad_token_id",), length=("max_sequence_length",), width=("d_model",),
    mlp=("mlp_hidden_size",), layers=("n_layers",))
_DREAM_FIELDS = dict(
    vocab=("vocab_size",), mask=("mask_token_id",), eos=("eos_token_id", "bos_token_id"),
    pad=("pad_token_id",), length=("max_position_embeddings",), width=("hidden_size",),
    mlp=("intermediate_size",), layers=("num_hidden_layers",))


FAMILIES: dict[str, Family] = {
    "llada": Family(
        "llada", "LLaDA", LLaDA, LLaDAConfig, ("llada", "LLaDA"), PRESETS, preset, _LLADA_FIELDS,
        lora_lib.TARGETS, weights.load_hf_checkpoint, weights.save_hf_checkpoint,
        read_config=weights.read_config, default_preset="llada-8b", peeled_ends=True,
        embedding=weights.PREFIX + "wte.weight",
        published=("GSAI-ML/LLaDA-8B-Instruct", "GSAI-ML/LLaDA-8B-Base")),
    "dream": Family(
        "dream", "Dream", Dream, DreamConfig, ("Dream", "dream"), DREAM_PRESETS, dream_preset,
        _DREAM_FIELDS, lora_lib.DREAM_TARGETS, dream_weights.load_dream_checkpoint,
        dream_weights.save_dream_checkpoint,
        read_config=dream_weights.read_dream_config, default_preset="dream-7b",
        embedding="model.embed_tokens.weight",
        published=("Dream-org/Dream-v0-Instruct-7B", "Dream-org/Dream-v0-Base-7B",
                   "apple/DiffuCoder-7B-Instruct", "apple/DiffuCoder-7B-cpGRPO",
                   "apple/DiffuCoder-7B-Base")),
}


def get(name: str) -> Family:
    """The family called ``name``; ValueError listing the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; choose one of "
                         f"{', '.join(FAMILIES)}") from None


def of(model: Any) -> Family:
    """The family of a model module (LLaDA or Dream instance)."""
    for fam in FAMILIES.values():
        if isinstance(model, fam.module):
            return fam
    raise TypeError(f"{type(model).__name__} is not a d1jax model family's module")


def detect(path: str | os.PathLike) -> str | None:
    """The family of the Hugging Face checkpoint at ``path`` by its config.json's
    ``model_type`` (None when there is no config.json or the type is unknown)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    model_type = json.loads(cfg.read_text()).get("model_type")
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam.name
    return None


def check_checkpoint(path: str | os.PathLike, name: str,
                     tokenizer_path: str | os.PathLike | None = None) -> dict[str, int | None]:
    """What a run reads from the Hugging Face checkpoint at ``path``, checked before it writes
    anything; returns the special ids (``tokenizer.special_ids``). CheckpointError, one line:

    - its config.json names another family than ``name`` (``model_type``), or no
      ``mask_token_id`` (the config classes would fill in the 7-8B checkpoints' id);
    - its tokenizer (at ``tokenizer_path``, else ``path``) has no mask token, names special
      ids config.json contradicts, or has no chat template (the tasks prompt in chat turns);
    - its vocabulary (config.json's ``vocab_size``, the embedding's rows) is smaller than the
      tokenizer;
    - its generation_config.json names an ``alg`` the sampler lacks.
    """
    from d1jax.model.tokenizer import load_tokenizer, special_ids
    from d1jax.sampling.dream import ALGS
    path, fam = Path(path), get(name)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise weights.CheckpointError(f"{cfg_file} is missing: not a Hugging Face checkpoint")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise weights.CheckpointError(f"{cfg_file}: invalid JSON ({e})") from None
    model_type = raw.get("model_type")
    found = detect(path)
    if found != name:
        what = (f"a {get(found).title} checkpoint" if found else
                f"no {fam.title} checkpoint (config.json model_type={model_type!r})")
        hint = f"set --config.model.family={found}" if found else (
            f"d1jax reads {', '.join(f.title for f in FAMILIES.values())} checkpoints")
        raise weights.CheckpointError(f"it holds {what} but config.model.family={name!r}: "
                                      f"{hint}")
    config = fam.read_config(path)
    tok = load_tokenizer(tokenizer_path or path)
    if raw.get("mask_token_id") is None:  # the config class would fill in the 7-8B id
        named = (f"the tokenizer's mask token: {tok.mask_token!r}" if tok.mask_token
                 else "nor does its tokenizer")
        raise weights.CheckpointError(f"its config.json names no mask_token_id ({named}): "
                                      f"add the id the model was trained with")
    ids = special_ids(tok, config)
    if not tok.chat_template:
        raise weights.CheckpointError(
            f"its tokenizer{'' if tokenizer_path is None else ' at ' + str(tokenizer_path)} has no "
            f"chat template, and d1jax's tasks prompt in chat turns: set "
            f"config.model.tokenizer_path to the Instruct model's directory")
    rows = weights._open_checkpoint(path)
    rows = rows[fam.embedding].shape(fam.embedding)[0] if fam.embedding in rows else None
    for what, n in (("config.json vocab_size", config.vocab_size), ("embedding rows", rows)):
        if n is not None and n < len(tok):
            raise weights.CheckpointError(
                f"its {what}={n} is smaller than the tokenizer's {len(tok)} tokens "
                f"(ids {n}..{len(tok) - 1} have no embedding row): not this tokenizer's model")
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        try:
            alg = json.loads(gen_file.read_text()).get("alg")
        except json.JSONDecodeError as e:
            raise weights.CheckpointError(f"{gen_file}: invalid JSON ({e})") from None
        if alg is not None and alg not in ALGS:
            raise weights.CheckpointError(
                f"{gen_file}: alg={alg!r} is not an algorithm d1jax's sampler runs "
                f"({', '.join(ALGS)})")
    return ids
