"""The files beside the weights of a Hugging Face export: remote code, generation config, tokenizer.

``transformers`` opens a LLaDA directory with ``trust_remote_code=True`` by importing the
modules its ``config.json`` names in ``auto_map`` from that same directory. An export is
self-contained only if it carries those modules, so they are copied from the directory the
model was loaded from; without one (a random tiny model) the export names no module it does
not hold and says so in its README.md.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

# Always copied when present: LLaDA's remote code, even if a config forgot to name it.
REMOTE_CODE = ("configuration_llada.py", "modeling_llada.py")
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja")
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


def _source_auto_map(source: Path) -> dict[str, Any]:
    cfg = source / "config.json"
    if not cfg.exists():
        return {}
    try:
        return dict(json.loads(cfg.read_text()).get("auto_map") or {})
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg}: invalid JSON ({e}); pass a Hugging Face model directory "
                         f"as source_dir") from None


def copy_companions(source_dir: str | os.PathLike | None, dest: Path) -> dict[str, Any]:
    """Copies remote code, generation config and tokenizer files of ``source_dir`` to ``dest``.

    Returns the ``auto_map`` the export's config.json should carry: the source's entries
    whose module files exist in ``dest`` ({} without a source), so that every module named
    there can be imported from the export alone. Writes ``dest/README.md`` saying which.
    """
    copied: list[str] = []
    auto_map: dict[str, Any] = {}
    if source_dir is not None:
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"source_dir {source} is not a directory; pass the Hugging "
                                    f"Face directory the model was loaded from, or None")
        source_map = _source_auto_map(source)
        wanted = set(REMOTE_CODE) | auto_map_modules(source_map)
        wanted |= {GENERATION_CONFIG, *TOKENIZER_FILES}
        for name in sorted(wanted):
            if (source / name).is_file():
                shutil.copy2(source / name, dest / name)
                copied.append(name)
        auto_map = {k: v for k, v in source_map.items()
                    if auto_map_modules({k: v}) <= set(copied)}
    (dest / README).write_text(_readme(source_dir, copied, auto_map))
    return auto_map


def _readme(source_dir, copied: list[str], auto_map: dict[str, Any]) -> str:
    lines = ["# LLaDA checkpoint exported by d1jax", "",
             "Weights in the Hugging Face LLaDA layout (`config.json` + safetensors); "
             "`d1jax.model.weights.load_hf_checkpoint` reads them back.", ""]
    if auto_map:
        lines += ["Remote code included (" + ", ".join(f"`{n}`" for n in copied if n.endswith(".py"))
                  + "): open it with `transformers.AutoModel.from_pretrained(path, "
                  "trust_remote_code=True)`."]
    else:
        reason = ("it was not made from a Hugging Face directory" if source_dir is None
                  else "its source directory had none")
        lines += [f"No remote code included ({reason}), so `config.json` has no `auto_map`. "
                  "To open it with `transformers`, copy `configuration_llada.py` and "
                  "`modeling_llada.py` from GSAI-ML/LLaDA-8B-Instruct next to these files and add "
                  "that model's `auto_map` to `config.json`."]
    others = [n for n in copied if not n.endswith(".py")]
    if others:
        lines += ["", "Copied from the source model: " + ", ".join(f"`{n}`" for n in others) + "."]
    return "\n".join(lines) + "\n"
