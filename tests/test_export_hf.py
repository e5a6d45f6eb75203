"""Hugging Face exports open out of the box: a run's export (``context.export_hf``) of a random
model and of a model loaded from an official-style directory, for LLaDA and for Dream, opened by
transformers 5.x (this environment) and 4.46.3 (a cached venv) with ``trust_remote_code=True``,
and the export of each published checkpoint's tiny replica (tests/published.py) loaded as a
run loads it (a Base one with its Instruct's tokenizer), all in one process per version: their
logits against d1jax's forward (Dream's raw, unshifted logits, also called as Dream's sampler
calls the model), their ``AutoTokenizer`` against the ``tokenizers`` library (a replica's:
against the tokenizer d1jax ran with)."""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import NamedTuple

import jax
import ml_dtypes
import numpy as np
import pytest
import tokenizers

import d1jax
from d1jax.model import family as family_lib
from d1jax.model import dream, hf_files, llada
from d1jax.model.llada import weights
from d1jax.model.dream import Dream, dream_positions
from d1jax.model.dream import (load_hf_checkpoint as load_dream_checkpoint,
                                param_shapes as dream_param_shapes, preset as dream_preset,
                                save_hf_checkpoint as save_dream_checkpoint)
from d1jax.model.tokenizer import CHAT_TEMPLATE, load_tokenizer, train_tiny_tokenizer
from d1jax.run import build, context
from tests import published

TEXTS = ["The quick brown fox jumps over 12 lazy dogs.", "Sudoku: 1 2 3 4 / 3 4 1 2",
         "<|startoftext|>Solve 7 + 8.<|eot_id|>", "Answer: 15<|mdm_mask|><|endoftext|>"]
# Left padding in the second row: the HF model must ignore padding keys as d1jax does.
IDS = [[5, 6, 7, 200, 8, 9, 10, 11], [0, 0, 0, 9, 10, 260, 3, 4]]
MASK = [[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1]]
# What a transformers 4.x save of LLaDA-8B-Instruct's tokenizer holds, besides tokenizer.json.
OFFICIAL_TOKENIZER_CONFIG = {
    "bos_token": "<|startoftext|>", "clean_up_tokenization_spaces": False,
    "eos_token": "<|endoftext|>", "mask_token": "<|mdm_mask|>",
    "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 4096,
    "tokenizer_class": "PreTrainedTokenizerFast"}
# config.json fields of LLaDA-8B-Instruct that d1jax's config does not write.
OFFICIAL_EXTRA_FIELDS = {"flash_attention": False, "init_device": "meta", "init_fn": "mitchell",
                         "init_std": 0.02, "precision": "amp_bf16", "torch_dtype": "bfloat16",
                         "transformers_version": "4.46.3", "use_cache": False}
# config.json fields of Dream-v0-Instruct-7B that d1jax's config does not write, and its auto_map.
DREAM_EXTRA_FIELDS = {"torch_dtype": "bfloat16", "transformers_version": "4.46.2",
                      "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                                   "AutoModel": "modeling_dream.DreamModel"}}
INSTRUCT = {"LLaDA-8B-Base": "LLaDA-8B-Instruct", "Dream-v0-Base-7B": "Dream-v0-Instruct-7B"}
HF4_REQUIREMENTS = ("torch==2.13.0", "transformers==4.46.3", "tokenizers<0.21", "safetensors",
                    "numpy")

# Run by each transformers version: opens every export with each of its Auto classes, writes
# logits (.npz) and tokens (.json). A "sampler_call" export is also called as Dream's
# generation_utils._sample calls it: positionally, a [B, 1, L, L] boolean mask of real query
# and key pairs, and tok_idx positions (cumsum(mask) - 1, padding at 1).
LOADER = r'''
import json, sys
import numpy as np, torch, transformers
from transformers import AutoTokenizer

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

job = json.load(open(sys.argv[1]))
result, arrays = {"version": transformers.__version__, "exports": []}, {}
ids, mask = torch.tensor(job["ids"]), torch.tensor(job["mask"])
# float32 as d1jax's reference computes (5.x would load a bfloat16 checkpoint as bfloat16)
dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype":
         torch.float32}
for i, path in enumerate(job["exports"]):
    row = {"classes": []}
    for name in job["autos"][i]:
        model = getattr(transformers, name).from_pretrained(path, trust_remote_code=True,
                                                            **dtype).eval()
        with torch.no_grad():
            arrays[f"{i}_{name}"] = model(ids, attention_mask=mask).logits.numpy()
            if job["sampler_call"][i]:
                real = mask.bool()
                tok_idx = (real.long().cumsum(-1) - 1).masked_fill(~real, 1)
                pairs = real[:, None, None, :] & real[:, None, :, None]
                arrays[f"{i}_sampler"] = model(ids, pairs, tok_idx).logits.numpy()
        row["classes"].append(type(model).__name__)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=job["trust_tokenizer"][i])
    row.update(tokens=[tok(t)["input_ids"] for t in job["texts"]], mask=tok.mask_token,
               chat_template=tok.chat_template)
    result["exports"].append(row)
np.savez(job["arrays"], **arrays)
json.dump(result, open(job["result"], "w"))
'''


def random_params(shapes, seed):
    """numpy params of ``shapes`` (path -> shape) with logits of order 1-10 (init's std 0.02
    would leave them near 0)."""
    rs, params = np.random.RandomState(seed), {}
    for path, shape in sorted(shapes.items()):
        scale, offset = (0.1, 1.0) if path[-1] == "weight" else (0.3, 0.0)  # RMSNorm scales
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = (offset + scale * rs.randn(*shape)).astype(np.float32)
    return params


def export_run(workdir, tok, model, config, params, source_dir):
    """The export a run ends with, through the run's own function."""
    setup = build.Setup(mesh=None, rules=(), tokenizer=tok, model=model,
                        model_config=config, params=params, ids={})
    state = types.SimpleNamespace(policy_params=lambda: params)
    return context.export_hf(Path(workdir), setup, state, source_dir=source_dir)


def official_source(path, config, params, tok_dir):
    """An official-style LLaDA directory: its config.json fields, remote code (stand-ins),
    generation config, and a tokenizer.json with a transformers 4.x tokenizer_config.json."""
    weights.save_hf_checkpoint(path, config, params)
    (path / "config.json").write_text(json.dumps({**config.to_hf_dict(), **OFFICIAL_EXTRA_FIELDS}))
    for name in llada.REMOTE_CODE.files:
        (path / name).write_text("# LLaDA's official code stands here\n")
    official_companions(path, config.eos_token_id, tok_dir, OFFICIAL_TOKENIZER_CONFIG)
    return path


def official_companions(path, eos_token_id, tok_dir, tokenizer_config):
    """A generation config, and a tokenizer.json with a transformers 4.x tokenizer_config.json."""
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_id}))
    shutil.copy(tok_dir / "tokenizer.json", path / "tokenizer.json")
    chat_template = (tok_dir / "chat_template.jinja").read_text()
    (path / "tokenizer_config.json").write_text(
        json.dumps({**tokenizer_config, "chat_template": chat_template}, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {k: OFFICIAL_TOKENIZER_CONFIG[k] for k in ("bos_token", "eos_token", "mask_token")}))


def official_dream_source(path, config, params, tok_dir):
    """An official-style Dream directory: its config.json fields and auto_map, remote code of
    its own (d1jax's, marked, standing in for Dream's; its modeling file imports
    ``generation_utils`` as Dream's does), a tokenizer whose config names a tokenizer module."""
    save_dream_checkpoint(path, config, params)
    (path / "README.md").unlink()
    (path / "config.json").write_text(json.dumps({**config.to_hf_dict(), **DREAM_EXTRA_FIELDS}))
    for name in dream.REMOTE_CODE.files:
        (path / name).write_text((hf_files.remote_code_dir() / name).read_text()
                                 + "# the source model's own copy\n")
    with open(path / "modeling_dream.py", "a") as f:
        f.write("from .generation_utils import SAMPLER  # noqa: E402,F401\n")
    (path / "generation_utils.py").write_text('SAMPLER = "the source\'s diffusion_generate"\n')
    (path / "tokenization_dream.py").write_text("class DreamTokenizer:  # stands in for Dream's\n"
                                                "    pass\n")
    official_companions(path, config.eos_token_id, tok_dir, {
        **OFFICIAL_TOKENIZER_CONFIG, "auto_map": {"AutoTokenizer": [
            "tokenization_dream.DreamTokenizer", None]}})
    return path


class Export(NamedTuple):
    path: Path  # the export directory
    logits: np.ndarray  # d1jax's forward on IDS, MASK [2, 8, V] (Dream: raw_logits)
    tokenizer_json: Path  # the tokenizer the run used
    tokens: list[list[int]] | None  # TEXTS as it splits them
    source: Path | None  # the directory the run loaded its model from
    autos: tuple[str, ...]  # the Auto classes that open it
    model_class: str  # the class they give
    sampler_call: bool  # also called as Dream's sampler calls the model
    mask_token: str = "<|mdm_mask|>"  # the AutoTokenizer's mask_token
    chat_template: str | None = CHAT_TEMPLATE  # and chat template
    trust_tokenizer: bool = False  # its tokenizer is remote code (Dream's DreamTokenizer)


def reference_tokens(tok) -> list[list[int]] | None:
    """TEXTS through the ``tokenizers`` library from the run's tokenizer.json (None: it has
    none, as Dream's vocab.json and merges.txt)."""
    if not (Path(tok.name_or_path) / "tokenizer.json").is_file():
        return None
    reference = tokenizers.Tokenizer.from_file(str(Path(tok.name_or_path) / "tokenizer.json"))
    return [reference.encode(t).ids for t in TEXTS]


def export_and_reference(workdir, tok, config, params, source) -> Export:
    path = export_run(workdir, tok, d1jax.LLaDA(config), config, params,
                      None if source is None else str(source))
    logits = jax.jit(d1jax.LLaDA(config).apply)({"params": params}, np.array(IDS), np.array(MASK))
    return Export(path, np.asarray(logits), Path(tok.name_or_path) / "tokenizer.json",
                  reference_tokens(tok), source,
                  ("AutoModel", "AutoModelForCausalLM"), "LLaDAModelLM", False)


def dream_export_and_reference(workdir, tok, config, params, source) -> Export:
    """Dream's export and its raw (unshifted) logits, RoPE positions counted from each row's
    first real token: what Dream's sampler passes with a left-padded batch."""
    path = export_run(workdir, tok, Dream(config), config, params,
                      None if source is None else str(source))
    mask = np.array(MASK)
    raw = jax.jit(lambda p: Dream(config).apply({"params": p}, np.array(IDS), mask,
                                                positions=dream_positions(mask),
                                                method=Dream.raw_logits))(params)
    return Export(path, np.asarray(raw), Path(tok.name_or_path) / "tokenizer.json",
                  reference_tokens(tok), source,
                  ("AutoModel",), "DreamModel", True)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Export]:
    root = tmp_path_factory.mktemp("export_hf")
    # Random init, as a run makes it: a tokenizer trained into the workdir by transformers 5,
    # here with a tied, scaled head and one kv head (the source model covers the other head).
    tok_dir = root / "random" / "tokenizer"
    tok = train_tiny_tokenizer(TEXTS * 4, tok_dir, vocab_size=300)
    vocab = -(-len(tok) // 64) * 64
    ids = {"mask_token_id": tok.mask_token_id, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.eos_token_id}
    tied = d1jax.preset("test-tiny", vocab_size=vocab, embedding_size=vocab, n_kv_heads=1,
                        weight_tying=True, scale_logits=True, **ids)
    out = {"random": export_and_reference(root / "random", tok, tied,
                                          random_params(weights.param_shapes(tied), 1), None)}
    # From an official-style directory, as a run with model.path: weights and tokenizer from it.
    untied = d1jax.preset("test-tiny", vocab_size=vocab, embedding_size=vocab, **ids)
    source = official_source(root / "hub", untied,
                             random_params(weights.param_shapes(untied), 2), tok_dir)
    config, params = weights.load_hf_checkpoint(source)
    params = jax.tree.map(np.asarray, params)  # host arrays: no per-layer device slicing to compile
    out["source"] = export_and_reference(root / "run", load_tokenizer(source), config, params,
                                         source)
    # Dream the same two ways: tied with GQA 4:2 at random, untied from its own-code directory.
    dream_ids = {"mask_token_id": tok.mask_token_id, "eos_token_id": tok.eos_token_id,
                 "bos_token_id": tok.eos_token_id, "pad_token_id": tok.eos_token_id}
    tied = dream_preset("dream-test-tiny", vocab_size=vocab, tie_word_embeddings=True,
                        **dream_ids)
    out["dream-random"] = dream_export_and_reference(
        root / "dream-random", tok, tied, random_params(dream_param_shapes(tied), 3), None)
    untied = dream_preset("dream-test-tiny", vocab_size=vocab, **dream_ids)
    source = official_dream_source(root / "dream-hub", untied,
                                   random_params(dream_param_shapes(untied), 4), tok_dir)
    config, params = load_dream_checkpoint(source)
    out["dream-source"] = dream_export_and_reference(
        root / "dream-run", load_tokenizer(source), config, jax.tree.map(np.asarray, params),
        source)
    out.update(replica_exports(root / "published"))
    return out


def replica_exports(root: Path) -> dict[str, Export]:
    """Each published checkpoint's replica loaded and exported as a run does it (a Base one
    with its Instruct's tokenizer, ``config.model.tokenizer_path``): bfloat16 weights, the
    source's remote code (Dream's) and tokenizer files (Dream's: a DreamTokenizer module)."""
    out = {}
    for i, slug in enumerate(published.PUBLISHED):
        published.write(slug, root / slug, seed=i)
    for slug, p in published.PUBLISHED.items():
        source = root / slug
        tok = load_tokenizer(source if p.chat else root / INSTRUCT[slug])
        config, params = family_lib.get(p.family).load(source)
        # bfloat16, as the 7B configs keep them: the export stores them so
        params = jax.tree.map(lambda a: np.asarray(a).astype(ml_dtypes.bfloat16), params)
        run = (export_and_reference if p.family == "llada" else dream_export_and_reference)(
            root / f"{slug}-run", tok, config, params, source)
        named = json.loads((Path(tok.name_or_path) / "tokenizer_config.json").read_text())
        out[slug] = run._replace(  # LLaDA's tokenizer names no mask token
            tokens=[tok(t)["input_ids"] for t in TEXTS], mask_token=named.get("mask_token"),
            chat_template=named["chat_template"], trust_tokenizer=p.family == "dream")
    return out


def test_exports_hold_d1jax_remote_code_and_the_source_tokenizer_unchanged(exports):
    for export in (exports["random"], exports["source"]):
        config = json.loads((export.path / "config.json").read_text())
        assert config["auto_map"] == dict(llada.REMOTE_CODE.auto_map)
        for code in llada.REMOTE_CODE.files:
            assert (export.path / code).read_bytes() == (
                hf_files.remote_code_dir() / code).read_bytes()
        assert "d1jax's own `configuration_llada.py`" in (export.path / "README.md").read_text()
    export = exports["source"]
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json"):
        assert (export.path / f).read_bytes() == (export.source / f).read_bytes(), f
    assert "official code stands" not in (export.path / "modeling_llada.py").read_text()
    export = exports["random"]  # transformers 5 wrote its tokenizer_config: rewritten for 4.x
    assert (export.path / "tokenizer.json").read_bytes() == export.tokenizer_json.read_bytes()
    cfg = json.loads((export.path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["chat_template"]


def test_dream_exports_hold_d1jax_code_without_a_source_and_the_sources_own_with_one(exports):
    export = exports["dream-random"]
    assert json.loads((export.path / "config.json").read_text())["auto_map"] == dict(
        dream.REMOTE_CODE.auto_map)
    for code in dream.REMOTE_CODE.files:
        assert (export.path / code).read_bytes() == (
            hf_files.remote_code_dir() / code).read_bytes()
    assert "d1jax's own `configuration_dream.py`" in (export.path / "README.md").read_text()
    cfg = json.loads((export.path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["chat_template"]
    export = exports["dream-source"]  # its code, the module it imports, its tokenizer's module
    assert json.loads((export.path / "config.json").read_text())["auto_map"] == (
        DREAM_EXTRA_FIELDS["auto_map"])
    for f in (*dream.REMOTE_CODE.files, "generation_utils.py", "tokenization_dream.py",
              "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json"):
        assert (export.path / f).read_bytes() == (export.source / f).read_bytes(), f
    assert "the source model's own" in (export.path / "README.md").read_text()


def check_opened(python, exports, tmp_path):
    """Runs LOADER under ``python`` on every export; compares with d1jax and ``tokenizers``."""
    names = sorted(exports)
    job = {"exports": [str(exports[n].path) for n in names], "ids": IDS, "mask": MASK,
           "autos": [exports[n].autos for n in names],
           "sampler_call": [exports[n].sampler_call for n in names],
           "trust_tokenizer": [exports[n].trust_tokenizer for n in names],
           "texts": TEXTS, "arrays": str(tmp_path / "logits.npz"),
           "result": str(tmp_path / "result.json")}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "loader.py").write_text(LOADER)
    # Its own HF_HOME: remote code is imported from a fresh module cache, nothing is downloaded.
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([str(python), str(tmp_path / "loader.py"), str(tmp_path / "job.json")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    arrays = np.load(tmp_path / "logits.npz")
    for i, name in enumerate(names):
        row, export = result["exports"][i], exports[name]
        assert row["classes"] == [export.model_class] * len(export.autos), (name,
                                                                           result["version"])
        for auto in export.autos:
            np.testing.assert_allclose(arrays[f"{i}_{auto}"], export.logits, rtol=1e-5,
                                       atol=1e-5,
                                       err_msg=f"{name} {auto} {result['version']}")
        if export.sampler_call:  # padding rows attend to nothing there: only real rows compare
            real = np.array(MASK, bool)
            np.testing.assert_allclose(arrays[f"{i}_sampler"][real], export.logits[real],
                                       rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} sampler call {result['version']}")
        assert row["tokens"] == export.tokens, name
        assert row["mask"] == export.mask_token, name
        assert row["chat_template"] == export.chat_template, name
    return result["version"]


def test_transformers_5_opens_every_export(exports, tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed; `pip install -e .[test]` installs it")
    assert check_opened(sys.executable, exports, tmp_path).startswith("5.")


@pytest.fixture(scope="session")
def hf4_python():
    """Python of a venv with transformers 4.46.3 (it needs tokenizers<0.21, so it cannot share
    this environment), built once under ~/.cache/d1jax, keyed by Python and the pins."""
    key = hashlib.sha256(repr((sys.version_info[:2], HF4_REQUIREMENTS)).encode()).hexdigest()[:12]
    venv = Path.home() / ".cache" / "d1jax" / f"hf446-venv-{key}"
    python, done = venv / "bin" / "python", venv / "d1jax-complete"
    if not done.exists():
        shutil.rmtree(venv, ignore_errors=True)
        r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                           text=True)
        if r.returncode == 0:
            r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-input",
                                "--disable-pip-version-check", *HF4_REQUIREMENTS],
                               capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"cannot build a venv with {' '.join(HF4_REQUIREMENTS)} (no network?): "
                        f"{(r.stderr or r.stdout)[-800:]}")
        done.write_text(" ".join(HF4_REQUIREMENTS) + "\n")
    return python


def test_transformers_4_46_opens_every_export(exports, hf4_python, tmp_path):
    assert check_opened(hf4_python, exports, tmp_path) == "4.46.3"
