"""Tokenizers: load a Hugging Face tokenizer directory, or train a tiny one for CPU runs.

The tiny tokenizer is a byte-level BPE (digits split individually) with LLaDA's special
tokens and LLaDA-8B-Instruct's chat template, saved in the Hugging Face format so the
same code path serves LLaDA-8B and the CPU demo.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

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


def load_tokenizer(path: str | os.PathLike):
    """A ``transformers`` tokenizer from a local directory, left padding for batching."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    if (path / "tokenizer.json").exists():  # LLaDA's: no custom code needed (auto_map ignored)
        tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


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
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return load_tokenizer(out_dir)


def special_ids(tok) -> dict[str, int]:
    """mask / eos / eot / pad ids of a LLaDA-style tokenizer."""
    ids = {"eos": tok.eos_token_id, "pad": tok.pad_token_id}
    for name, t in (("mask", MASK), ("eot", EOT)):
        i = tok.convert_tokens_to_ids(t)
        ids[name] = i if i != tok.unk_token_id else None
    if ids["mask"] is None:
        raise ValueError(f"tokenizer has no mask token {MASK!r}; is it a LLaDA tokenizer?")
    return ids
