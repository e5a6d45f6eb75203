"""Tiny replicas of the published checkpoints the configs name, written by test code.

Each replica keeps the real file set of its Hugging Face repository: ``config.json`` with
the real field names and values except sizes (widths, depth, vocabulary) and the special
ids, the tokenizer files with the real special tokens (ids placed as at the top of the real
vocabulary: the same order and gaps above a smaller byte-level BPE), the chat template,
``generation_config.json``, the remote code files by their real names, and bfloat16 weights
in sharded safetensors with ``model.safetensors.index.json``. Nothing is downloaded.

Where the facts come from (the authors' Hugging Face files, as mirrored in public GitHub
repositories):

- GSAI-ML/LLaDA-8B-Instruct: config.json, generation_config.json, tokenizer_config.json
  (269 added tokens at 126080..126348, ``<|mdm_mask|>`` at 126336, no ``mask_token`` named,
  the chat template), special_tokens_map.json, 6 weight shards.
- Dream-org/Dream-v0-Instruct-7B: config.json, generation_config.json (``alg`` "origin"),
  tokenizer_config.json (``DreamTokenizer`` over vocab.json + merges.txt, 24 added tokens at
  151643..151666, ``<|mask|>`` 151666, Qwen2.5's chat template), added_tokens.json,
  special_tokens_map.json, 4 weight shards (the last holds ``lm_head.weight`` alone).
- apple/DiffuCoder-7B-Instruct and -cpGRPO: Dream's files plus ``<|dlm_pad|>`` at 151667 as
  the tokenizer's pad, while config.json keeps ``pad_token_id`` 151643 (``<|endoftext|>``).

The Base replicas (LLaDA-8B-Base, Dream-v0-Base-7B) are their Instruct's files without the
chat template: the Base repositories' own files were not at hand, and a tokenizer without a
template is the case d1jax must name (its tasks prompt in chat turns).

The remote code files are stand-ins by the real names: d1jax's own ``configuration_*.py`` and
``modeling_*.py`` (same class names, ``model_type`` and weight names as the authors'), and
``tokenization_dream.py`` / ``generation_utils.py`` that name what the authors' hold.

``write_checkpoint`` is the one writer of the tests' other hand-made checkpoints (a config.json
and a state dict of any family, in one file or in shards with an index).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from d1jax.model import family as family_lib, hf_files

BASE_VOCAB = 320  # byte-level BPE tokens below the added ones (the real: 126080, 151643)

# --------------------------------------------------------------------------- LLaDA

# tokenizer_config.json added_tokens_decoder of LLaDA-8B-Instruct, as offsets from 126080.
_LLADA_NAMED = {0: "<|startoftext|>", 1: "<|endoftext|>", 2: "[CLS]", 3: "[gMASK]",
                256: "<|mdm_mask|>", 260: "<role>", 261: "</role>",
                262: "<|arithmetic_start|>", 263: "<|arithmetic_end|>",
                264: "<|number_start|>", 265: "<|number_end|>", 266: "<|start_header_id|>",
                267: "<|end_header_id|>", 268: "<|eot_id|>"}
LLADA_ADDED = [_LLADA_NAMED.get(i, f"<|reserved_token_{i - 4}|>") for i in range(269)]
LLADA_EXTRA = ["<role>", "</role>", "<|arithmetic_start|>", "<|arithmetic_end|>",
               "<|number_start|>", "<|number_end|>"]
LLADA_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content "
    "%}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>"
    "\n\n' }}")
# config.json of GSAI-ML/LLaDA-8B-Instruct, every field.
LLADA_8B_CONFIG = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0, "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                 "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_dropout": 0.0, "embedding_size": 126464, "eos_token_id": 126081,
    "flash_attention": False, "include_bias": False, "include_qkv_bias": False,
    "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02,
    "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
    "mask_token_id": 126336, "max_sequence_length": 4096, "mlp_hidden_size": 12288, "mlp_ratio": 4,
    "model_type": "llada", "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32,
    "n_layers": 32, "pad_token_id": 126081, "precision": "amp_bf16", "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0,
    "scale_logits": False, "torch_dtype": "bfloat16", "transformers_version": "4.46.3",
    "use_cache": False, "vocab_size": 126464, "weight_tying": False,
}
# The replicas' config.json: the same file, sizes shrunk; ids are set per replica.
LLADA_CONFIG = {**LLADA_8B_CONFIG, "d_model": 32, "embedding_size": None, "eos_token_id": None,
                "mask_token_id": None, "mlp_hidden_size": 96, "n_heads": 4, "n_kv_heads": 4,
                "n_layers": 2, "pad_token_id": None, "vocab_size": None}

# --------------------------------------------------------------------------- Dream

# added_tokens.json of Dream-v0-Instruct-7B, as offsets from 151643 (special?).
DREAM_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<|beginoftext|>", True), ("<|mask|>", True)]
DLM_PAD = ("<|dlm_pad|>", True)  # DiffuCoder's pad, 151667
DREAM_CHAT_TEMPLATE = (  # Qwen2.5's, as Dream-v0-Instruct-7B's tokenizer_config.json holds it
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == "
    "'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are "
    "a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one "
    "or more functions to assist with the user query.\\n\\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n"
    "</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>"
    "system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n"
    "{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or "
    "(message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not "
    "message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for "
    "tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' "
    "}}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or "
    "(messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content "
    "}}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or "
    "(messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")
DREAM_CONFIG = {  # config.json of Dream-v0-Instruct-7B; sizes and ids are set per replica
    "_name_or_path": None, "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                 "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": None, "eos_token_id": None, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 80, "mask_token_id": None,
    "max_position_embeddings": 131072, "max_window_layers": 2, "model_type": "Dream",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 1,
    "pad_token_id": None, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.2", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False, "vocab_size": None,
}
TOKENIZATION_DREAM = '''"""Stands in for Dream's tokenization_dream.py in d1jax's test replicas:
DreamTokenizer is Qwen2's byte-level BPE over vocab.json and merges.txt, as the authors' is."""
from transformers import Qwen2Tokenizer


class DreamTokenizer(Qwen2Tokenizer):
    pass
'''
GENERATION_UTILS = '''"""Stands in for Dream's generation_utils.py (DreamGenerationConfig and
diffusion_generate) in d1jax's test replicas."""
'''


@dataclasses.dataclass(frozen=True)
class Published:
    """One published checkpoint: its Hub name, family and the d1jax configs that name it."""

    name: str  # the Hugging Face repository
    family: str  # d1jax model family
    configs: tuple[str, ...]  # the d1jax config files naming it
    chat: bool = True  # its tokenizer carries a chat template (Instruct)
    dlm_pad: bool = False  # DiffuCoder's <|dlm_pad|> pad token

    @property
    def slug(self) -> str:
        return self.name.split("/")[1]


PUBLISHED = {p.slug: p for p in (
    Published("GSAI-ML/LLaDA-8B-Instruct", "llada",
              ("configs/grpo_*.py", "configs/sft_s1k.py", "configs/eval.py")),
    Published("GSAI-ML/LLaDA-8B-Base", "llada", ("configs/eval.py",), chat=False),
    Published("Dream-org/Dream-v0-Instruct-7B", "dream",
              ("configs/dream/grpo_*.py", "configs/dream/eval.py")),
    Published("Dream-org/Dream-v0-Base-7B", "dream", ("configs/dream/sft_s1k.py",), chat=False),
    Published("apple/DiffuCoder-7B-Instruct", "dream", ("configs/diffucoder/*.py",),
              dlm_pad=True),
    Published("apple/DiffuCoder-7B-cpGRPO", "dream", ("configs/diffucoder/*.py",),
              dlm_pad=True),
)}
# The real ids of the tokens the replicas place (the authors' tokenizer_config.json), and the
# real first added id: a replica's id minus BASE_VOCAB is the real id minus that.
REAL_IDS = {"llada": (126080, {"mask": 126336, "eos": 126081, "pad": 126081, "eot": 126348}),
            "dream": (151643, {"mask": 151666, "eos": 151643, "pad": 151643, "eot": 151645}),
            "diffucoder": (151643, {"mask": 151666, "eos": 151643, "pad": 151667, "eot": 151645})}


def added_tokens(p: Published) -> list[tuple[str, bool]]:
    """(content, special) of the added tokens, in id order from ``BASE_VOCAB``."""
    if p.family == "llada":
        return [(t, True) for t in LLADA_ADDED]
    return DREAM_ADDED + ([DLM_PAD] if p.dlm_pad else [])


def expected_ids(p: Published) -> dict[str, int]:
    """The special ids a replica's tokenizer and config.json give (as the real, shifted)."""
    at = {t: BASE_VOCAB + i for i, (t, _) in enumerate(added_tokens(p))}
    if p.family == "llada":
        return {"mask": at["<|mdm_mask|>"], "eos": at["<|endoftext|>"],
                "pad": at["<|endoftext|>"], "eot": at["<|eot_id|>"], "bos": at["<|startoftext|>"]}
    pad = at["<|dlm_pad|>"] if p.dlm_pad else at["<|endoftext|>"]
    return {"mask": at["<|mask|>"], "eos": at["<|endoftext|>"], "pad": pad,
            "eot": at["<|im_end|>"], "bos": at["<|beginoftext|>"]}


def vocab_size(p: Published) -> int:
    """config.json's vocab_size: the tokenizer's length rounded up, as the real ones are
    (126349 -> 126464, 151665 -> 152064)."""
    n = BASE_VOCAB + len(added_tokens(p))
    return -(-(n + 1) // 64) * 64


def _train_bpe(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BASE_VOCAB, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == BASE_VOCAB, tok.get_vocab_size()
    return tok


TEXTS = ["Write letters. abcd efgh ijab", "Solve the following Sudoku puzzle: 1234 0000",
         "The answer is 42.", "def f(x):\n    return x + 1\n", "<answer>12</answer>"] * 4


def _added_decoder(p: Published) -> dict[str, dict[str, Any]]:
    return {str(BASE_VOCAB + i): {"content": t, "lstrip": False, "normalized": False,
                                  "rstrip": False, "single_word": False, "special": special}
            for i, (t, special) in enumerate(added_tokens(p))}


def _token(content: str) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False}


def _write_json(path: Path, obj: Any, indent: int = 2) -> None:
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def _llada_tokenizer(p: Published, d: Path) -> None:
    from tokenizers import AddedToken
    tok = _train_bpe(TEXTS)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, _ in added_tokens(p)])
    tok.save(str(d / "tokenizer.json"))
    config = {"add_bos_token": False, "add_eos_token": False,
              "added_tokens_decoder": _added_decoder(p),
              "additional_special_tokens": LLADA_EXTRA, "bos_token": "<|startoftext|>"}
    if p.chat:
        config["chat_template"] = LLADA_CHAT_TEMPLATE
    config.update({"clean_up_tokenization_spaces": False, "cls_token": "[CLS]",
                   "eos_token": "<|endoftext|>", "fast_tokenizer": True, "gmask_token": "[gMASK]",
                   "merges_file": None, "model_input_names": ["input_ids", "attention_mask"],
                   "model_max_length": 1000000000000000019884624838656,
                   "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast",
                   "trust_remote_code": True, "vocab_file": None})
    _write_json(d / "tokenizer_config.json", config)
    _write_json(d / "special_tokens_map.json", {
        "additional_special_tokens": LLADA_EXTRA, "bos_token": _token("<|startoftext|>"),
        "cls_token": _token("[CLS]"), "eos_token": _token("<|endoftext|>"),
        "pad_token": _token("<|endoftext|>")})


def _dream_tokenizer(p: Published, d: Path) -> None:
    tok = _train_bpe(TEXTS)
    tok.model.save(str(d))  # vocab.json, merges.txt ("#version: 0.2" first, as Qwen's)
    pad = DLM_PAD[0] if p.dlm_pad else "<|endoftext|>"
    extra = ["<|beginoftext|>", "<|mask|>"] + ([DLM_PAD[0]] if p.dlm_pad else [])
    _write_json(d / "added_tokens.json", {t: BASE_VOCAB + i for i, (t, _) in
                                          sorted(enumerate(added_tokens(p)), key=lambda x: x[1])})
    _write_json(d / "special_tokens_map.json", {
        "additional_special_tokens": extra, "bos_token": _token("<|beginoftext|>"),
        "eos_token": _token("<|endoftext|>"), "mask_token": _token("<|mask|>"),
        "pad_token": _token(pad)})
    config = {"add_bos_token": False, "add_prefix_space": False,
              "added_tokens_decoder": _added_decoder(p), "additional_special_tokens": extra,
              "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
              "bos_token": "<|beginoftext|>"}
    if p.chat:
        config["chat_template"] = DREAM_CHAT_TEMPLATE
    config.update({"clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
                   "errors": "replace", "mask_token": "<|mask|>", "model_max_length": 131072,
                   "pad_token": pad, "split_special_tokens": False,
                   "tokenizer_class": "DreamTokenizer", "unk_token": None})
    _write_json(d / "tokenizer_config.json", config)
    (d / "tokenization_dream.py").write_text(TOKENIZATION_DREAM)


def hf_config(p: Published, vocab: int = 0) -> dict[str, Any]:
    """The replica's config.json (``vocab``: its vocab_size, 0: ``vocab_size(p)``)."""
    ids, v = expected_ids(p), vocab or vocab_size(p)
    if p.family == "llada":
        return {**LLADA_CONFIG, "embedding_size": v, "vocab_size": v, "eos_token_id": ids["eos"],
                "mask_token_id": ids["mask"], "pad_token_id": ids["eos"]}
    eot = ids["eos"]  # Dream's and DiffuCoder's config.json: bos = eos = pad = <|endoftext|>
    return {**DREAM_CONFIG, "_name_or_path": p.name, "bos_token_id": eot, "eos_token_id": eot,
            "pad_token_id": eot, "mask_token_id": ids["mask"], "vocab_size": v}


def generation_config(p: Published) -> dict[str, Any]:
    ids = expected_ids(p)
    if p.family == "llada":
        return {"_from_model_config": True, "bos_token_id": ids["bos"],
                "eos_token_id": ids["eos"], "transformers_version": "4.38.2"}
    return {"_from_model_config": True, "alg": "origin", "alg_temp": None,
            "bos_token_id": ids["eos"], "eos_token_id": ids["eos"], "eps": 0.001,
            "mask_token_id": None, "output_history": False, "pad_token_id": ids["eos"],
            "steps": 512, "temperature": 0.0, "top_k": None, "top_p": None,
            "transformers_version": "4.46.2"}


def _tensors(p: Published, seed: int, vocab: int = 0) -> dict[str, np.ndarray]:
    """Random weights under the real names and torch shapes, in checkpoint order."""
    rng = np.random.default_rng(seed)
    c = hf_config(p, vocab)

    def w(*shape, std=0.05):
        return rng.standard_normal(shape) * std

    out: dict[str, np.ndarray] = {}
    if p.family == "llada":
        d, f, v, h = c["d_model"], c["mlp_hidden_size"], c["vocab_size"], c["n_heads"]
        kv = c["n_kv_heads"] * d // h
        pre = "model.transformer."
        out[pre + "wte.weight"] = w(v, d, std=1.0)
        for i in range(c["n_layers"]):
            b = f"{pre}blocks.{i}."
            out.update({b + "attn_norm.weight": 1 + w(d), b + "q_proj.weight": w(d, d),
                        b + "k_proj.weight": w(kv, d), b + "v_proj.weight": w(kv, d),
                        b + "attn_out.weight": w(d, d), b + "ff_norm.weight": 1 + w(d),
                        b + "ff_proj.weight": w(f, d), b + "up_proj.weight": w(f, d),
                        b + "ff_out.weight": w(d, f)})
        out[pre + "ln_f.weight"] = 1 + w(d)
        out[pre + "ff_out.weight"] = w(v, d)
        return out
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    out["model.embed_tokens.weight"] = w(v, d, std=1.0)
    for i in range(c["num_hidden_layers"]):
        b = f"model.layers.{i}."
        out.update({b + "input_layernorm.weight": 1 + w(d),
                    b + "mlp.down_proj.weight": w(d, f), b + "mlp.gate_proj.weight": w(f, d),
                    b + "mlp.up_proj.weight": w(f, d),
                    b + "post_attention_layernorm.weight": 1 + w(d),
                    b + "self_attn.k_proj.bias": w(kv), b + "self_attn.k_proj.weight": w(kv, d),
                    b + "self_attn.o_proj.weight": w(d, d),
                    b + "self_attn.q_proj.bias": w(d), b + "self_attn.q_proj.weight": w(d, d),
                    b + "self_attn.v_proj.bias": w(kv), b + "self_attn.v_proj.weight": w(kv, d)})
    out["model.norm.weight"] = 1 + w(d)
    out["lm_head.weight"] = w(v, d)
    return out


# --------------------------------------------------------------------------- any checkpoint

def write_safetensors(d: Path, tensors: dict[str, np.ndarray],
                      shards: int | list[list[str]] = 0, total_size: int | None = None) -> None:
    """``tensors`` (Hugging Face name -> array, torch layout) into ``d`` as the Hub lays them
    out, written by the safetensors library (not by d1jax's writer, which the tests check):
    ``shards`` 0, one ``model.safetensors``; else ``model-0000i-of-0000n.safetensors`` files
    (``shards`` of them, the names split in order; or the given lists of names) and
    ``model.safetensors.index.json``, its weight_map sorted by name as the real ones are and
    its total_size the tensors' bytes unless given (the real files' bfloat16 size, say)."""
    d.mkdir(parents=True, exist_ok=True)
    if not shards:
        save_file(dict(tensors), str(d / "model.safetensors"), metadata={"format": "pt"})
        return
    keys = list(tensors)
    groups = shards if isinstance(shards, list) else [
        [keys[j] for j in part] for part in np.array_split(np.arange(len(keys)), shards)]
    weight_map = {}
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k] for k in group}, str(d / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in group})
    total = sum(tensors[k].nbytes for k in weight_map) if total_size is None else total_size
    _write_json(d / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def write_checkpoint(d: Path, config: dict[str, Any], tensors: dict[str, np.ndarray],
                     shards: int | list[list[str]] = 0, **kw: Any) -> Path:
    """A hand-made checkpoint directory ``d``: ``config`` as its config.json and ``tensors``
    as ``write_safetensors`` lays them out (``shards``, ``total_size``); returns ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / "config.json", config)
    write_safetensors(d, tensors, shards, **kw)
    return d


def _write_weights(p: Published, d: Path, seed: int, vocab: int = 0) -> None:
    """bfloat16 shards (LLaDA's 6, Dream's 4 with lm_head.weight alone in the last) and the
    index."""
    tensors = {k: a.astype(ml_dtypes.bfloat16) for k, a in _tensors(p, seed, vocab).items()}
    keys = list(tensors)
    if p.family == "llada":
        groups = [keys[i::6] for i in range(6)]
    else:
        body = keys[:-1]
        size = -(-len(body) // 3)
        groups = [body[i * size:(i + 1) * size] for i in range(3)] + [keys[-1:]]
    write_safetensors(d, tensors, groups)


def write(slug: str, d: Path, seed: int = 0, vocab: int = 0) -> Path:
    """Writes the replica of ``PUBLISHED[slug]`` into the directory ``d``; returns ``d``.
    ``vocab``: config.json's vocab_size and the embedding rows (0: the replica's own)."""
    p = PUBLISHED[slug]
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / "config.json", hf_config(p, vocab))
    _write_json(d / "generation_config.json", generation_config(p),
                indent=4 if p.family == "llada" else 2)
    code = family_lib.get(p.family).remote_code
    for name in code.files:
        shutil.copyfile(hf_files.remote_code_dir() / name, d / name)
    if p.family == "llada":
        _llada_tokenizer(p, d)
    else:
        _dream_tokenizer(p, d)
        (d / "generation_utils.py").write_text(GENERATION_UTILS)
    (d / "README.md").write_text(f"---\nlibrary_name: transformers\n---\n# {p.slug}\n")
    _write_weights(p, d, seed, vocab)
    return d


def edit_json(path: Path, **changes: Any) -> None:
    """Sets (value None: removes) top-level fields of a JSON file."""
    obj = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            obj.pop(k, None)
        else:
            obj[k] = v
    _write_json(path, obj)


# --------------------------------------------------------------------------- LLaDA2

# inclusionAI/LLaDA2.0-mini. Pinned by public files: config.json's fields (dFactory
# configs/model_configs/llada2_mini/config.json; the Hub's differs in model_type "llada2_moe"),
# <|endoftext|> at 156892 (pad_token_id; their generate's eos_id), the mask at 156895 (their
# generate's mask_id, dFactory's mask_token_id), the chat turns of dInfer's benchmarks
# ("<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>{prompt}<|role_end|>
# <role>ASSISTANT</role>"). Not pinned (their tokenizer_config.json was not at hand): the mask
# token's name (here "<|mask|>"), the ids of the role tokens (here after the mask), the other
# added tokens (reserved placeholders here), whether config.json names mask_token_id (dFactory's
# does not; d1jax needs it, so the replica carries it). No remote code: d1jax ships none.
LLADA2_REAL_FIRST = 156892
LLADA2_ADDED = ["<|endoftext|>", "<|reserved_token_0|>", "<|reserved_token_1|>", "<|mask|>",
                "<role>", "</role>", "<|role_end|>"]
LLADA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = 'detailed thinking off' %}"
    "{% endif %}{{ '<role>SYSTEM</role>' + system + '<|role_end|>' }}"
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '<role>HUMAN</role>' + message['content'] + '<|role_end|>' }}{% else %}"
    "{{ '<role>ASSISTANT</role>' + message['content'] + '<|role_end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}")


def llada2_ids() -> dict[str, int]:
    """The special ids of the LLaDA2 replica (the real ones minus 156892 plus BASE_VOCAB)."""
    at = {t: BASE_VOCAB + i for i, t in enumerate(LLADA2_ADDED)}
    return {"mask": at["<|mask|>"], "eos": at["<|endoftext|>"], "pad": at["<|endoftext|>"],
            "eot": at["<|role_end|>"]}


def llada2_config(layout: str = "hub") -> dict[str, Any]:
    """The replica's config.json: dFactory's llada2_mini fields and order, tiny sizes (the
    ``llada2-tiny`` preset's), the replica's ids."""
    ids, n = llada2_ids(), BASE_VOCAB + len(LLADA2_ADDED)
    return {
        "architectures": ["LLaDA2MoeModelLM"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                     "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
        "num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 64,
        "first_k_dense_replace": 1, "hidden_act": "silu", "max_position_embeddings": 256,
        "model_type": {"hub": "llada2_moe", "merged": "llada2_moe_veomni"}[layout],
        "moe_intermediate_size": 16, "norm_topk_prob": True, "num_experts_per_tok": 2,
        "norm_head": False, "num_attention_heads": 4, "num_experts": 8,
        "num_key_value_heads": 2, "rope_theta": 600000, "rope_scaling": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.52.3", "use_bias": False, "use_rmsnorm": True,
        "rms_norm_eps": 1e-06, "head_dim": 16, "num_shared_experts": 1, "use_cache": False,
        "use_qkv_bias": False, "embedding_dropout": 0.0, "norm_softmax": False,
        "output_dropout": 0.0, "vocab_size": -(-(n + 1) // 64) * 64, "rotary_dim": 8,
        "using_split_qkv_in_self_attention": False, "router_dtype": "fp32",
        "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5, "n_group": 4,
        "topk_group": 2, "score_function": "sigmoid", "initializer_range": 0.02,
        "max_window_layers": 28, "output_router_logits": False, "pad_token_id": ids["pad"],
        "partial_rotary_factor": 0.5, "use_sliding_window": False,
        "mask_token_id": ids["mask"], "eos_token_id": ids["eos"]}


def write_llada2(d: Path, layout: str = "hub", seed: int = 0) -> Path:
    """A tiny LLaDA2.0-mini replica in ``layout`` ("hub": per-expert tensors; "merged":
    dFactory's) in ``d``: config.json, generation_config.json, a byte-level BPE tokenizer with
    the special tokens and chat template above, bfloat16 weight shards with an index."""
    import jax
    from tokenizers import AddedToken
    from d1jax.model.llada2 import LLaDA2, read_config, save_hf_checkpoint
    from d1jax.model.predictor import init_params
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / "config.json", llada2_config(layout))
    config = read_config(d)
    params = init_params(LLaDA2(config), jax.random.key(seed))
    # A router bias of the size training gives it, so the selection depends on it.
    bias = params["moe_layers"]["gate"]["expert_bias"]
    params["moe_layers"]["gate"]["expert_bias"] = 0.1 * jax.random.normal(
        jax.random.key(seed + 1), bias.shape)
    save_hf_checkpoint(d / "weights", config, params, max_shard_size=40_000,
                       dtype=ml_dtypes.bfloat16, layout=layout)
    for f in (d / "weights").iterdir():
        if f.name.endswith(".safetensors") or f.name.endswith(".index.json"):
            f.rename(d / f.name)
    shutil.rmtree(d / "weights")
    ids = llada2_ids()
    _write_json(d / "generation_config.json", {"_from_model_config": True,
                                               "eos_token_id": ids["eos"],
                                               "pad_token_id": ids["pad"],
                                               "transformers_version": "4.52.3"})
    tok = _train_bpe(TEXTS)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLADA2_ADDED])
    tok.save(str(d / "tokenizer.json"))
    _write_json(d / "tokenizer_config.json", {
        "added_tokens_decoder": {str(BASE_VOCAB + i): {**_token(t), "special": True}
                                 for i, t in enumerate(LLADA2_ADDED)},
        "additional_special_tokens": ["<role>", "</role>", "<|role_end|>"],
        "chat_template": LLADA2_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "model_max_length": 16384,
        "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"})
    _write_json(d / "special_tokens_map.json", {
        "additional_special_tokens": ["<role>", "</role>", "<|role_end|>"],
        "eos_token": _token("<|endoftext|>"), "pad_token": _token("<|endoftext|>")})
    (d / "README.md").write_text("---\nlibrary_name: transformers\n---\n# LLaDA2.0-mini\n")
    return d


# --------------------------------------------------------------------------- LLaDA-MoE

# inclusionAI/LLaDA-MoE-7B-A1B-Instruct. Pinned by public files: the config.json field names
# (their configuration_lladamoe.py, inclusionAI/dInfer tools/ and ZHZisZZ/dllm), model_type
# "llada" (dInfer's LLaDAConfig; dllm's README has users rename it "lladamoe"), the shape
# (16 MoE layers of 64 experts, 8 a token, expert width 1024, D 2048, 16 heads, rope_theta
# 50000, 8192 positions: third-party notes of the release, not its config.json itself), the
# mask 156895 and eos 156892 (dInfer's tests/test_llada_moe.py), the tokenizer family of
# LLaDA2 (dllm sets mask "<|mask|>" and eot "<|role_end|>" for both). Not pinned (their
# tokenizer_config.json, config.json and remote code were not at hand): the chat template
# (LLaDA2's here), whether config.json names mask_token_id (the replica does: d1jax needs
# it), shared_expert_intermediate_size (null here, as 7.4B total / 1.4B active implies),
# moe_router_enable_expert_bias (true here so the replica exercises it), its auto_map.
def lladamoe_config(model_type: str = "llada") -> dict[str, Any]:
    """The replica's config.json: their field names, tiny sizes (``lladamoe-tiny``'s, no
    shared expert), LLaDA2's replica ids."""
    ids, n = llada2_ids(), BASE_VOCAB + len(LLADA2_ADDED)
    return {
        "architectures": ["LLaDAMoEModelLM"], "model_type": model_type,
        "vocab_size": -(-(n + 1) // 64) * 64, "hidden_size": 32,
        "dense_intermediate_size": 64, "expert_intermediate_size": 16,
        "shared_expert_intermediate_size": None, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
        "max_position_embeddings": 1024, "initializer_range": 0.02, "rms_norm_eps": 1e-05,
        "use_cache": False, "pad_token_id": ids["pad"], "bos_token_id": None,
        "eos_token_id": ids["eos"], "mask_token_id": ids["mask"], "tie_word_embeddings": False,
        "rope_theta": 50000, "partial_rotary_factor": 1.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
        "num_experts_per_tok": 2, "num_experts": 8, "output_router_logits": False,
        "router_aux_loss_coef": 0.01, "norm_topk_prob": False, "qk_layernorm": True,
        "moe_layer_freq": [0, 1, 1], "moe_router_enable_expert_bias": True,
        "moe_router_score_function": "softmax", "routed_scaling_factor": 1,
        "router_num_group": None, "router_topk_group": None, "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3"}


def write_lladamoe(d: Path, model_type: str = "llada", seed: int = 0) -> Path:
    """A tiny LLaDA-MoE-7B-A1B-Instruct replica in ``d`` (``model_type`` "llada" as published,
    or dllm's "lladamoe"): config.json, generation_config.json, LLaDA2's replica tokenizer
    (its special tokens and chat template), bfloat16 weight shards with an index."""
    import jax
    from d1jax.model.lladamoe import LLaDAMoE, read_config, save_hf_checkpoint
    from d1jax.model.predictor import init_params
    write_llada2(d / "llada2")  # the tokenizer family's files, taken from its replica
    d.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json"):
        shutil.copyfile(d / "llada2" / name, d / name)
    shutil.rmtree(d / "llada2")
    _write_json(d / "config.json", lladamoe_config(model_type))
    config = read_config(d)
    params = init_params(LLaDAMoE(config), jax.random.key(seed))
    # A router bias the size of the softmax probabilities (1/8 on average), so it matters.
    bias = params["moe_layers"]["gate"]["expert_bias"]
    params["moe_layers"]["gate"]["expert_bias"] = 0.05 * jax.random.normal(
        jax.random.key(seed + 1), bias.shape)
    save_hf_checkpoint(d / "weights", config, params, max_shard_size=40_000,
                       dtype=ml_dtypes.bfloat16)
    for f in (d / "weights").iterdir():
        if f.name.endswith(".safetensors") or f.name.endswith(".index.json"):
            f.rename(d / f.name)
    shutil.rmtree(d / "weights")
    (d / "README.md").write_text("---\nlibrary_name: transformers\n---\n"
                                 "# LLaDA-MoE-7B-A1B-Instruct\n")
    return d
