"""The files beside the weights of a Hugging Face export: remote code, generation config, tokenizer.

``transformers`` opens a LLaDA directory with ``trust_remote_code=True`` by importing the
modules its ``config.json`` names in ``auto_map`` from that same directory. Every export
carries d1jax's own ``configuration_llada.py`` and ``modeling_llada.py`` (package data in
``hf_remote/``): same class names, ``model_type`` and weight names as LLaDA's official code,
but they load under transformers 4.x and 5.x, where the official file fails under 5.x. A source
directory's own copies of those two files are therefore not shipped (its other ``auto_map``
modules are); the export's README.md says which code it holds.

Tokenizer files are copied byte for byte from the directory the tokenizer was loaded from. Only
a directory that transformers 4 cannot read (``tokenizer_class`` "TokenizersBackend", which
transformers 5's ``save_pretrained`` writes, e.g. d1jax's trained tiny tokenizer) is written
again: its ``tokenizer.json`` as is, and a ``tokenizer_config.json`` naming
``PreTrainedTokenizerFast``, the class LLaDA's own tokenizer uses, with the chat template inline.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
from pathlib import Path
from typing import Any

REMOTE_CODE = ("configuration_llada.py", "modeling_llada.py")
AUTO_MAP = {"AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"}
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")
TOKENIZER_CONFIG = "tokenizer_config.json"
# tokenizer_class values that only transformers 5 knows.
V5_ONLY_TOKENIZER_CLASSES = ("TokenizersBackend",)
README = "README.md"


def auto_map_modules(auto_map: dict[str, Any]) -> set[str]:
    """File names of the modules an ``auto_map`` refers to.

    Values are ``"module.Class"``, a ``[slow, fast]`` pair (tokenizers, entries may be None)
    or ``"repo--module.Class"`` (code in another Hub repo: not a local file, skipped).
    """
    refs = []
    for value in auto_map.values():
        refs.extend(value if isinstance(value, (list, tuple)) else [value])
    return {ref.rsplit(".", 1)[0] + ".py" for ref in refs if ref and "--" not in ref}


def remote_code_dir() -> Path:
    """The folder of d1jax's ``configuration_llada.py`` and ``modeling_llada.py``."""
    return Path(str(importlib.resources.files("d1jax.model") / "hf_remote"))


def _source_auto_map(source: Path) -> dict[str, Any]:
    cfg = source / "config.json"
    if not cfg.exists():
        return {}
    try:
        return dict(json.loads(cfg.read_text()).get("auto_map") or {})
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg}: invalid JSON ({e}); pass a Hugging Face model directory "
                         f"as source_dir") from None


def copy_companions(source_dir: str | os.PathLike | None, dest: Path,
                    tokenizer: Any = None) -> dict[str, Any]:
    """Writes d1jax's remote code, and the generation config and tokenizer files, to ``dest``.

    Args:
      source_dir: the Hugging Face directory the model was loaded from, or None. Its
        ``generation_config.json`` and the modules of its ``auto_map`` other than LLaDA's two
        are copied; so are its tokenizer files when ``tokenizer`` is None.
      tokenizer: the ``transformers`` tokenizer to ship (see the module docstring), or None.
    Returns the ``auto_map`` the export's config.json should carry: ``AUTO_MAP`` plus the
    source's other entries whose modules were copied. Writes ``dest/README.md`` saying so.
    """
    for name in REMOTE_CODE:
        shutil.copyfile(remote_code_dir() / name, dest / name)
    copied: list[str] = []
    auto_map = dict(AUTO_MAP)
    source = None
    if source_dir is not None:
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"source_dir {source} is not a directory; pass the Hugging "
                                    f"Face directory the model was loaded from, or None")
        source_map = _source_auto_map(source)
        wanted = {GENERATION_CONFIG, *(auto_map_modules(source_map) - set(REMOTE_CODE))}
        if tokenizer is None:
            wanted |= set(TOKENIZER_FILES)
        copied = _copy(source, dest, sorted(wanted))
        auto_map.update({k: v for k, v in source_map.items() if k not in AUTO_MAP
                         and auto_map_modules({k: v}) <= set(copied)})
    tokenizer_note = ship_tokenizer(tokenizer, dest) if tokenizer is not None else ""
    (dest / README).write_text(_readme(source, copied, tokenizer_note))
    return auto_map


def _copy(source: Path, dest: Path, names: list[str]) -> list[str]:
    present = [n for n in names if (source / n).is_file()]
    for name in present:
        shutil.copy2(source / name, dest / name)
    return present


def ship_tokenizer(tokenizer: Any, dest: Path) -> str:
    """Tokenizer files into ``dest``; returns the README's sentence on where they came from."""
    where = Path(str(tokenizer.name_or_path))
    config = where / TOKENIZER_CONFIG
    readable = config.is_file() and (json.loads(config.read_text()).get("tokenizer_class")
                                     not in V5_ONLY_TOKENIZER_CLASSES)
    if readable:
        names = _copy(where, dest, list(TOKENIZER_FILES))
        return f"Tokenizer files copied unchanged from `{where}`: " + _names(names) + "."
    if (where / "tokenizer.json").is_file():
        shutil.copy2(where / "tokenizer.json", dest / "tokenizer.json")
    else:
        tokenizer.backend_tokenizer.save(str(dest / "tokenizer.json"))
    (dest / TOKENIZER_CONFIG).write_text(json.dumps(portable_tokenizer_config(tokenizer),
                                                    indent=2) + "\n")
    return ("Tokenizer: `tokenizer.json` and a `tokenizer_config.json` (`PreTrainedTokenizerFast`, "
            "chat template inline) that transformers 4.x and 5.x both read.")


def portable_tokenizer_config(tokenizer: Any) -> dict[str, Any]:
    """A ``tokenizer_config.json`` for a fast tokenizer that transformers 4.x and 5.x read."""
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                           "clean_up_tokenization_spaces": False}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "sep_token",
                "cls_token"):
        token = getattr(tokenizer, key, None)
        if token is not None:
            cfg[key] = str(token)
    cfg.update(model_max_length=tokenizer.model_max_length, padding_side=tokenizer.padding_side)
    if tokenizer.chat_template:
        cfg["chat_template"] = tokenizer.chat_template
    return cfg


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _readme(source: Path | None, copied: list[str], tokenizer_note: str) -> str:
    lines = ["# LLaDA checkpoint exported by d1jax", "",
             "Weights in the Hugging Face LLaDA layout (`config.json` + safetensors); "
             "`d1jax.model.weights.load_hf_checkpoint` reads them back.", "",
             "Remote code: d1jax's own `configuration_llada.py` and `modeling_llada.py`, "
             "written to load under transformers 4.x and 5.x (LLaDA's official "
             "`modeling_llada.py` fails under 5.x). Class names, `model_type` and weight names "
             "are those of GSAI-ML/LLaDA-8B-Instruct, so either code opens these weights. Open "
             "them with `transformers.AutoModel.from_pretrained(path, trust_remote_code=True)` "
             "(or `AutoModelForCausalLM`); `model(input_ids, attention_mask=...).logits` is "
             "one bidirectional pass."]
    replaced = [n for n in REMOTE_CODE if source is not None and (source / n).is_file()
                and (source / n).read_bytes() != (remote_code_dir() / n).read_bytes()]
    if replaced:
        lines += ["", f"The source directory's own {_names(replaced)} (`{source}`) "
                  "were not copied."]
    if copied:
        lines += ["", "Copied from the source model: " + _names(copied) + "."]
    if tokenizer_note:
        lines += ["", tokenizer_note]
    return "\n".join(lines) + "\n"
