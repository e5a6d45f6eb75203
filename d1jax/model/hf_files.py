"""The files beside the weights of a Hugging Face export: remote code, generation config, tokenizer.

``transformers`` opens a LLaDA or Dream directory with ``trust_remote_code=True`` by importing
the modules its ``config.json`` names in ``auto_map`` from that same directory (and the modules
those import with ``from .x import``). Each family names its own remote code in its record
(``Family.remote_code``, a ``RemoteCode``); d1jax's for LLaDA and Dream is package data in
``hf_remote/``: same class names, ``model_type`` and weight names as the official code,
loading under transformers 4.x and 5.x.

- LLaDA: every export carries d1jax's ``configuration_llada.py`` and ``modeling_llada.py``;
  LLaDA's official ``modeling_llada.py`` fails under transformers 5, so a source directory's
  own copies are not shipped (its other ``auto_map`` modules are).
- SDAR/TraDo: the published ``configuration_sdar.py`` and ``modeling_sdar.py`` (Gen-Verse/dLLM-RL
  ``models/sdar/``), vendored unchanged in ``hf_remote/sdar/`` (``SOURCE.md``), or the source
  directory's own as for Dream. They do not import under transformers 5.x.
- Dream: an export of a source directory with remote code of its own (Dream's and
  DiffuCoder's ``modeling_dream.py`` with its ``generation_utils.py``, and their
  ``diffusion_generate``) carries those files byte for byte and the source's ``auto_map``;
  one without (a random init) carries d1jax's ``configuration_dream.py`` and
  ``modeling_dream.py``.

The export's README.md says which code it holds.

Tokenizer files are copied byte for byte from the directory the tokenizer was loaded from,
with the modules its ``tokenizer_config.json`` ``auto_map`` names. Only a directory that
transformers 4 cannot read (``tokenizer_class`` "TokenizersBackend", which transformers 5's
``save_pretrained`` writes, e.g. d1jax's trained tiny tokenizer) is written again: its
``tokenizer.json`` as is, and a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast``,
the class LLaDA's own tokenizer uses, with the chat template inline.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class RemoteCode:
    """d1jax's own Hugging Face code for one family and what its export's README says."""

    title: str  # "LLaDA", "Dream"
    files: tuple[str, ...]  # in ``directory``; () for a family without remote code
    auto_map: Mapping[str, str]  # the config.json entries naming them
    reference: str  # the official checkpoint whose class, model_type and weight names it keeps
    loader: str  # the d1jax function that reads the weights back
    # True: a source directory's own remote code is shipped instead (Dream); False: d1jax's
    # always replaces it (LLaDA's official code fails under transformers 5).
    keep_source: bool
    forward: str  # README: what ``model(...).logits`` is
    directory: str = ""  # where ``files`` are: hf_remote/ ("") or a folder relative to it
    # Non-empty: ``files`` are the family's published code vendored unchanged, and this says
    # whose, from which commit, and what it needs (the export's README); "": d1jax's own.
    published: str = ""

    def path(self, name: str) -> Path:
        """The file ``name`` of this code."""
        return remote_code_dir() / self.directory / name


GENERATION_CONFIG = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")
TOKENIZER_CONFIG = "tokenizer_config.json"
# tokenizer_class values that only transformers 5 knows.
V5_ONLY_TOKENIZER_CLASSES = ("TokenizersBackend",)
README = "README.md"
# A module's relative imports, as transformers' dynamic-module loader finds them.
_RELATIVE_IMPORT = re.compile(r"^\s*(?:import|from)\s+\.(\w+)", re.MULTILINE)


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
    """The folder of d1jax's built-in remote code (``hf_remote/``: LLaDA's and Dream's)."""
    return Path(str(importlib.resources.files("d1jax.model") / "hf_remote"))


def _auto_map(file: Path) -> dict[str, Any]:
    """The ``auto_map`` of a config.json or tokenizer_config.json ({} when it has none)."""
    if not file.is_file():
        return {}
    try:
        return dict(json.loads(file.read_text()).get("auto_map") or {})
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: invalid JSON ({e}); pass a Hugging Face model directory "
                         f"as source_dir") from None


def own_remote_code(source: Path | None, code: RemoteCode) -> bool:
    """Whether an export of ``code``'s family from ``source`` ships the source's model code:
    the family keeps it, and the source's config.json maps every class d1jax's code maps
    (AutoConfig, AutoModel) to a module present in the directory."""
    if source is None or not code.keep_source:
        return False
    source_map = _auto_map(source / "config.json")
    entries = {k: source_map[k] for k in code.auto_map if k in source_map}
    return (entries.keys() == code.auto_map.keys()
            and all((source / m).is_file() for m in auto_map_modules(entries)))


def copy_companions(source_dir: str | os.PathLike | None, dest: Path, tokenizer: Any,
                    code: RemoteCode) -> dict[str, Any]:
    """Writes the remote code, generation config and tokenizer files of an export to ``dest``.

    Args:
      source_dir: the Hugging Face directory the model was loaded from, or None. Its
        ``generation_config.json`` and the modules of its ``auto_map`` (with the modules
        they import) are copied, except its copies of d1jax's files when the family always
        ships d1jax's (``code.keep_source`` False: LLaDA); so are its tokenizer files when
        ``tokenizer`` is None.
      tokenizer: the ``transformers`` tokenizer to ship (see the module docstring), or None.
      code: the family's remote code (``Family.remote_code``).
    Returns the ``auto_map`` the export's config.json should carry: the source's, when its
    own code is shipped (``own_remote_code``), else ``code.auto_map`` plus the source's other
    entries whose modules were copied. Writes ``dest/README.md`` saying which code it holds.
    """
    source = None if source_dir is None else Path(source_dir)
    if source is not None and not source.is_dir():
        raise FileNotFoundError(f"source_dir {source} is not a directory; pass the Hugging "
                                f"Face directory the model was loaded from, or None")
    own = own_remote_code(source, code)
    auto_map: dict[str, Any] = {} if own else dict(code.auto_map)
    if not own:
        for name in code.files:
            shutil.copyfile(code.path(name), dest / name)
    copied: list[str] = []
    if source is not None:
        source_map = _auto_map(source / "config.json")
        wanted = {GENERATION_CONFIG, *auto_map_modules(source_map)}
        if not own:
            wanted -= set(code.files)
        if tokenizer is None:
            wanted |= {*TOKENIZER_FILES, *auto_map_modules(_auto_map(source / TOKENIZER_CONFIG))}
        copied = _copy(source, dest, sorted(wanted))
        auto_map.update({k: v for k, v in source_map.items() if k not in auto_map
                         and auto_map_modules({k: v}) <= set(copied)})
    tokenizer_note = ship_tokenizer(tokenizer, dest) if tokenizer is not None else ""
    (dest / README).write_text(_readme(code, source, own, copied, tokenizer_note))
    return auto_map


def _copy(source: Path, dest: Path, names: list[str]) -> list[str]:
    """Copies the ``names`` present in ``source``, and the modules those import
    (``from .x import``) that ``dest`` does not hold yet; returns what it copied."""
    present = [n for n in names if (source / n).is_file()]
    for name in present:
        shutil.copy2(source / name, dest / name)
    todo = [n for n in present if n.endswith(".py")]
    while todo:
        for module in _RELATIVE_IMPORT.findall((source / todo.pop()).read_text()):
            name = module + ".py"
            if (source / name).is_file() and not (dest / name).exists():
                shutil.copy2(source / name, dest / name)
                present.append(name)
                todo.append(name)
    return present


def ship_tokenizer(tokenizer: Any, dest: Path) -> str:
    """Tokenizer files into ``dest``; returns the README's sentence on where they came from."""
    where = Path(str(tokenizer.name_or_path))
    config = where / TOKENIZER_CONFIG
    readable = config.is_file() and (json.loads(config.read_text()).get("tokenizer_class")
                                     not in V5_ONLY_TOKENIZER_CLASSES)
    if readable:
        names = _copy(where, dest, [*TOKENIZER_FILES, *auto_map_modules(_auto_map(config))])
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


def _readme(code: RemoteCode, source: Path | None, own: bool, copied: list[str],
            tokenizer_note: str) -> str:
    lines = [f"# {code.title} checkpoint exported by d1jax", "",
             f"Weights in the Hugging Face {code.title} layout (`config.json` + safetensors); "
             f"`{code.loader}` reads them back.", ""]
    opening = ("Open them with `transformers.AutoModel.from_pretrained(path, "
               "trust_remote_code=True)`" + (" (or `AutoModelForCausalLM`)"
                                             if "AutoModelForCausalLM" in code.auto_map else ""))
    if not code.files:
        lines.append(f"Remote code: none; {code.forward}")
    elif code.published and not own:
        lines.append(f"Remote code: {code.published}: {_names(code.files)}. {opening}; "
                     f"{code.forward}")
    elif own:
        other = ("" if code.published else
                 f" d1jax's own {_names(code.files)} (package data in `d1jax/model/hf_remote/`) "
                 f"read the same weights under transformers 4.x and 5.x, should the source's "
                 f"code not load under yours.")
        lines.append(f"Remote code: the source model's own, copied unchanged from `{source}` "
                     f"(listed below).{other} {opening}.")
    else:
        official = (f" ({code.title}'s official `{code.files[1]}` fails under 5.x)"
                    if not code.keep_source else "")
        lines.append(f"Remote code: d1jax's own `{code.files[0]}` and `{code.files[1]}`, "
                     f"written to load under transformers 4.x and 5.x{official}. Class names, "
                     f"`model_type` and weight names are those of {code.reference}, so either "
                     f"code opens these weights. {opening}; {code.forward}")
    replaced = [n for n in code.files if not own and source is not None
                and (source / n).is_file()
                and (source / n).read_bytes() != code.path(n).read_bytes()]
    if replaced:
        lines += ["", f"The source directory's own {_names(replaced)} (`{source}`) "
                  "were not copied."]
    if copied:
        lines += ["", "Copied from the source model: " + _names(copied) + "."]
    if tokenizer_note:
        lines += ["", tokenizer_note]
    return "\n".join(lines) + "\n"
