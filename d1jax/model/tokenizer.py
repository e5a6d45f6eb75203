"""Tokenizers: load a Hugging Face tokenizer directory, or train a tiny one for CPU runs.

Two published layouts load, neither running code from the checkpoint:

- LLaDA-8B-Base/Instruct: ``tokenizer.json`` (``PreTrainedTokenizerFast``). Its config names
  no mask token; the mask is ``<|mdm_mask|>``, the id config.json's ``mask_token_id`` gives.
- Dream-v0-Base/Instruct-7B, DiffuCoder-7B-*: ``vocab.json`` + ``merges.txt`` read by the
  checkpoint's own ``tokenization_dream.DreamTokenizer``, which is Qwen2's byte-level BPE:
  transformers' Qwen2 tokenizer reads the same files, with the added tokens (``<|mask|>``,
  DiffuCoder's ``<|dlm_pad|>`` pad) of ``tokenizer_config.json``.

``special_ids`` takes the mask / eos / pad ids from the checkpoint (the tokenizer's tokens,
checked against config.json), never from a family's constants.

The tiny tokenizer is a byte-level BPE (digits split individually) with LLaDA's special
tokens and LLaDA-8B-Instruct's chat template, saved in the Hugging Face format so the
same code path serves LLaDA-8B and the CPU demo.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from d1jax.model import family
from d1jax.model.hf_checkpoint import CheckpointError

# LLaDA-8B-Instruct's chat template (Llama-3 style headers, bos on the first message).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
BOS, EOS, EOT, MASK = "<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>"
SPECIAL_TOKENS = (BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", EOT, MASK)
# tokenizer_config.json classes that are Qwen2's byte-level BPE over vocab.json + merges.txt.
QWEN2_BPE_CLASSES = ("DreamTokenizer", "Qwen2Tokenizer", "Qwen2TokenizerFast")


class TokenizerError(CheckpointError):
    """A tokenizer that does not fit its checkpoint (special ids, vocabulary)."""


# The files a Hugging Face tokenizer directory holds one of (fast, BPE, sentencepiece, config).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer_config.json")


def load_tokenizer(path: str | os.PathLike):
    """A ``transformers`` tokenizer from a local directory, left padding for batching."""
    # AutoTokenizer only when needed: importing it imports torch when torch is installed
    # (about 2 s), which a tokenizer.json never needs.
    from transformers import PreTrainedTokenizerFast
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise TokenizerError(f"{path} holds no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                             "set config.model.tokenizer_path to the checkpoint's tokenizer")
    if (path / "tokenizer.json").exists():  # LLaDA's: no custom code needed (auto_map ignored)
        tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    elif _tokenizer_class(path) in QWEN2_BPE_CLASSES and (path / "vocab.json").exists():
        tok = _qwen2_class().from_pretrained(str(path), local_files_only=True)
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _tokenizer_class(path: Path) -> str | None:
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("tokenizer_class")
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{config}: invalid JSON ({e})") from None


def _qwen2_class():
    """transformers' Qwen2 BPE tokenizer: the fast class under 4.x, the one class of 5.x."""
    import transformers
    return getattr(transformers, "Qwen2TokenizerFast", None) or transformers.Qwen2Tokenizer


def train_tiny_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = 512):
    """Trains a byte-level BPE on ``texts`` and saves it (HF format) to ``out_dir``.

    Deterministic for the same texts. The mask token is the last id and EOS the one
    before it, like LLaDA's layout of special ids at the top of the vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer=trainer)
    # Specials last: ids vocab-6 .. vocab-1, with EOS and MASK at the top.
    tok.add_special_tokens(["<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>",
                            EOT, EOS, MASK])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
        mask_token=MASK, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    _save_whole(fast, Path(out_dir))
    return load_tokenizer(out_dir)


def _save_whole(tok, out_dir: Path) -> None:
    """Saves ``tok`` so that a reader of ``out_dir`` finds no tokenizer or a whole one: every
    process of a multi-process run trains the same tokenizer into the shared workdir and
    loads it, and one that read another's half-written files failed. Written into a
    temporary folder beside it, then renamed into place (or, where ``out_dir`` already holds
    files, moved in file by file, ``tokenizer.json`` last)."""
    import shutil
    import tempfile
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # a folder as mkdir makes it, not mkdtemp's owner-only one
        tok.save_pretrained(str(tmp))
        try:
            os.rename(tmp, out_dir)  # atomic; fails when out_dir holds files
        except OSError:
            out_dir.mkdir(exist_ok=True)
            names = sorted(os.listdir(tmp), key=lambda n: n == "tokenizer.json")
            for name in names:
                os.replace(tmp / name, out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def special_ids(tok, config: Any = None) -> dict[str, int | None]:
    """mask / eos / eot / pad ids of ``tok``, checked against its checkpoint's ``config``
    (a LLaDAConfig or DreamConfig read from config.json; None for a tokenizer alone).

    - mask: the tokenizer's ``mask_token`` (Dream's ``<|mask|>``); LLaDA's names none, so
      config.json's ``mask_token_id``, which must be a special token of the tokenizer
      (``<|mdm_mask|>``). Tokenizer and config naming different ids is a TokenizerError.
    - eos: the tokenizer's ``eos_token``; config.json's ``eos_token_id`` must agree.
    - pad: the tokenizer's ``pad_token`` (its eos without one). config.json's may differ:
      DiffuCoder pads with ``<|dlm_pad|>`` while its config.json says 151643 (``<|endoftext|>``),
      and its authors pad with the tokenizer's.
    - eot: the token that closes a chat turn (``<|eot_id|>``, ``<|im_end|>``), if it has one.
    """
    n = len(tok)
    cfg_mask = getattr(config, "mask_token_id", None)
    if tok.mask_token is not None:
        mask = tok.mask_token_id
        if cfg_mask is not None and cfg_mask != mask:
            raise TokenizerError(
                f"the tokenizer's mask token {tok.mask_token!r} is id {mask} but config.json has "
                f"mask_token_id={cfg_mask}: tokenizer and checkpoint do not belong together")
    elif cfg_mask is not None:
        token = tok.convert_ids_to_tokens(cfg_mask) if 0 <= cfg_mask < n else None
        if token is None or token not in tok.all_special_tokens + _added_special(tok):
            what = (f"beyond its {n} tokens" if token is None
                    else f"{token!r}, not one of its special tokens")
            raise TokenizerError(f"the tokenizer has no mask token: it names none, and "
                                 f"config.json's mask_token_id={cfg_mask} is {what}")
        mask = cfg_mask
    else:
        found = tok.convert_tokens_to_ids(MASK)  # a tokenizer alone: LLaDA's own token name
        if found is None or found == tok.unk_token_id:
            raise TokenizerError(f"the tokenizer has no mask token (no mask_token, no {MASK!r})")
        mask = found
    eos = tok.eos_token_id
    cfg_eos = getattr(config, "eos_token_id", None)
    if eos is None:
        raise TokenizerError("the tokenizer has no eos token (eos_token is unset)")
    if cfg_eos is not None and cfg_eos != eos:
        raise TokenizerError(
            f"the tokenizer's eos token {tok.eos_token!r} is id {eos} but config.json has "
            f"eos_token_id={cfg_eos}: tokenizer and checkpoint do not belong together")
    pad = tok.pad_token_id if tok.pad_token is not None else eos
    return {"mask": mask, "eos": eos, "pad": pad, "eot": _turn_end(tok)}


def _added_special(tok) -> list[str]:
    """The tokenizer's added tokens marked special (LLaDA's <|mdm_mask|>, reserved tokens)."""
    return [t.content for t in tok.added_tokens_decoder.values() if t.special]


def turn_ends() -> tuple[str, ...]:
    """Tokens that close a chat turn, every family's (``Family.turn_ends``: LLaDA's Llama-3
    headers' <|eot_id|>, Dream's / DiffuCoder's Qwen <|im_end|>)."""
    return tuple(t for fam in family.FAMILIES.values() for t in fam.turn_ends)


def _turn_end(tok) -> int | None:
    vocab = tok.get_vocab()
    return next((vocab[t] for t in turn_ends() if t in vocab), None)


def encode_prompts(tokenizer, texts: Sequence[str], length: int,
                   on_truncate: Callable[[int], None] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask [N, length], left-padded with pad, left-truncated (as
    TRL's max_prompt_length); ``on_truncate(n)`` is called when n > 0 prompts were cut."""
    pad = tokenizer.pad_token_id
    ids = np.full((len(texts), length), pad, np.int32)
    mask = np.zeros((len(texts), length), np.int32)
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    cut = sum(len(t) > length for t in encoded)
    if cut and on_truncate is not None:
        on_truncate(cut)
    for i, t in enumerate(encoded):
        t = t[-length:]
        if len(t):
            ids[i, length - len(t):] = t
            mask[i, length - len(t):] = 1
    return ids, mask


def uniform_prompt_length(tokenizer, texts: Sequence[str]) -> int:
    """The token length shared by every prompt text; an error if they differ (callers that
    train and generate without padding, like the CPU demo, rely on it)."""
    lengths = {len(t) for t in tokenizer(list(texts), add_special_tokens=False)["input_ids"]}
    if len(lengths) != 1:
        raise ValueError(f"prompts tokenize to {min(lengths)}..{max(lengths)} tokens: "
                         "expected a single length")
    return lengths.pop()
