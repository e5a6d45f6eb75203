"""SFT sequences as d1 builds them (SFT/sft_trainer.py preprocess_dataset).

The conversation (user prompt + assistant trajectory) goes through the chat template and
is right-padded with the pad token (EOS for LLaDA) to ``max_length``; the padding belongs
to the completion and is trained on, so the model learns to emit EOS after its answer.
The prompt span, which the SFT loss never masks, is the templated user turn plus "\\n"
(d1's choice: the assistant header tokens fall in the completion span).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from d1jax.model.tokenizer import EOT
from d1jax.tasks import registry


def encode_sft(tokenizer, examples: Sequence[dict], max_length: int,
               split: bool = False) -> dict[str, np.ndarray]:
    """Token ids [N, max_length] and prompt lengths [N] for examples with
    ``prompt`` (chat messages) and ``completion`` (assistant text).

    ``split``: tokenize the generation prompt and the completion (+ end of turn) apart and
    concatenate, so training sees exactly the tokens generation will (a byte-level BPE
    may merge across the boundary of a templated whole, e.g. "\n\n" + "<"); False is
    d1's tokenization of the whole templated conversation.
    """
    pad = tokenizer.pad_token_id
    ids = np.full((len(examples), max_length), pad, np.int32)
    prompt_len = np.zeros((len(examples),), np.int32)
    for i, ex in enumerate(examples):
        if split:
            prompt = tokenizer.apply_chat_template(list(ex["prompt"]), tokenize=False,
                                                   add_generation_prompt=True)
            p_toks = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            c_toks = tokenizer(ex["completion"] + EOT, add_special_tokens=False)["input_ids"]
            toks, n_prompt = (p_toks + c_toks)[:max_length], len(p_toks)
        else:
            messages = list(ex["prompt"]) + [{"role": "assistant", "content": ex["completion"]}]
            full = tokenizer.apply_chat_template(messages, tokenize=False)
            prompt = tokenizer.apply_chat_template(list(ex["prompt"]), tokenize=False) + "\n"
            toks = tokenizer(full, add_special_tokens=False)["input_ids"][:max_length]
            n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        ids[i, :len(toks)] = toks
        prompt_len[i] = min(n_prompt, max_length)
    return {"input_ids": ids, "prompt_len": prompt_len}


def trajectory_examples(task, examples) -> list[dict]:
    """SFT pairs (the task's GRPO prompt, its entry's solution trajectory: d1's
    reasoning/answer layout, a code task's solution) for a task with known solutions."""
    entry = registry.find(task.name)  # a Task built by hand: the default layout
    trajectory = entry.trajectory if entry else registry.reasoning_answer
    return [{"prompt": task.build_messages(ex), "completion": trajectory(ex)} for ex in examples]
