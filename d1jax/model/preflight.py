"""What a run reads from a Hugging Face checkpoint, checked against its family before the
run writes anything (``d1jax.config.check_inputs`` calls it after the commands parse their
flags). Apart from ``family`` (the registry) because it reads the tokenizer, and the
tokenizer reads the registry (every family's turn-end tokens)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Collection

from d1jax.model import hf_checkpoint
from d1jax.model.family import FAMILIES, detect, get
from d1jax.model.tokenizer import load_tokenizer, special_ids


def check_checkpoint(path: str | os.PathLike, name: str,
                     tokenizer_path: str | os.PathLike | None = None,
                     algs: Collection[str] | None = None, weights: bool = True
                     ) -> dict[str, int | None]:
    """What a run reads from the Hugging Face checkpoint at ``path``, checked before it writes
    anything; returns the special ids (``tokenizer.special_ids``). CheckpointError, one line:

    - its config.json names another family than ``name`` (``model_type``), or no
      ``mask_token_id`` (the config classes would fill in the 7-8B checkpoints' id);
    - its tokenizer (at ``tokenizer_path``, else ``path``) has no mask token, names special
      ids config.json contradicts, or has no chat template (the tasks prompt in chat turns);
    - its vocabulary (config.json's ``vocab_size``, the embedding's rows) is smaller than the
      tokenizer;
    - its generation_config.json names an ``alg`` not among ``algs`` (the sampler's,
      ``d1jax.sampling.dream.ALGS``, passed by the caller: the model layer does not import
      the sampler; None skips the check).

    ``weights`` False: the weight files are neither required nor read (the planner needs
    config.json and the tokenizer only).
    """
    path, fam = Path(path), get(name)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise hf_checkpoint.CheckpointError(f"{cfg_file} is missing: not a Hugging Face checkpoint")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise hf_checkpoint.CheckpointError(f"{cfg_file}: invalid JSON ({e})") from None
    model_type = raw.get("model_type")
    found = detect(path)
    if found != name:
        what = (f"a {get(found).title} checkpoint" if found else
                f"no {fam.title} checkpoint (config.json model_type={model_type!r})")
        hint = f"set --config.model.family={found}" if found else (
            f"d1jax reads {', '.join(f.title for f in FAMILIES.values())} checkpoints")
        if not found and "stage" in raw and (path / "hf" / "config.json").is_file():
            hint = f"this is a d1jax run's workdir: its model is {path / 'hf'}"
        raise hf_checkpoint.CheckpointError(f"it holds {what} but config.model.family={name!r}: "
                                      f"{hint}")
    config = fam.read_config(path)
    tok = load_tokenizer(tokenizer_path or path)
    if raw.get("mask_token_id") is None:  # the config class would fill in the 7-8B id
        named = (f"the tokenizer's mask token: {tok.mask_token!r}" if tok.mask_token
                 else "nor does its tokenizer")
        raise hf_checkpoint.CheckpointError(f"its config.json names no mask_token_id ({named}): "
                                      f"add the id the model was trained with")
    ids = special_ids(tok, config)
    if not tok.chat_template:
        raise hf_checkpoint.CheckpointError(
            f"its tokenizer{'' if tokenizer_path is None else ' at ' + str(tokenizer_path)} has no "
            f"chat template, and d1jax's tasks prompt in chat turns: set "
            f"config.model.tokenizer_path to the Instruct model's directory")
    rows = hf_checkpoint.open_checkpoint(path) if weights else {}
    rows = rows[fam.embedding].shape(fam.embedding)[0] if fam.embedding in rows else None
    for what, n in (("config.json vocab_size", config.vocab_size), ("embedding rows", rows)):
        if n is not None and n < len(tok):
            raise hf_checkpoint.CheckpointError(
                f"its {what}={n} is smaller than the tokenizer's {len(tok)} tokens "
                f"(ids {n}..{len(tok) - 1} have no embedding row): not this tokenizer's model")
    gen_file = path / "generation_config.json"
    if gen_file.is_file() and algs is not None:
        try:
            alg = json.loads(gen_file.read_text()).get("alg")
        except json.JSONDecodeError as e:
            raise hf_checkpoint.CheckpointError(f"{gen_file}: invalid JSON ({e})") from None
        if alg is not None and alg not in algs:
            raise hf_checkpoint.CheckpointError(
                f"{gen_file}: alg={alg!r} is not an algorithm d1jax's sampler runs "
                f"({', '.join(algs)})")
    return ids
