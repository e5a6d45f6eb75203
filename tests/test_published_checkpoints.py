"""The published checkpoints the configs name, loaded as users download them.

Tiny replicas (tests/published.py) keep each checkpoint's file set, field names, special
tokens and bfloat16 weights. Each replica's special ids are checked against the real ones
and transformers' own loader; each one samples through d1jax's evaluation (in process, or
``python -m d1jax.eval`` for Dream-v0-Instruct-7B, the command issue 41 reports) and goes
through the commands as a user runs them: ``python -m d1jax.main`` SFT one step -> export ->
GRPO one step from that export (its rollouts sample it) -> export -> both exports reloaded (each
command a process of its own, forked from one that imported the command's modules once).
tests/test_export_hf.py opens each replica's export in transformers 4.46.3 and 5.x. A
checkpoint that does not fit is one ``error:`` line before anything is written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d1jax import config as config_lib
from d1jax.config import ConfigError
from d1jax.eval import evaluate
from d1jax.metrics import read_jsonl
from d1jax.model import family as family_lib
from d1jax.model.preflight import check_checkpoint
from d1jax.model.tokenizer import TokenizerError, load_tokenizer, special_ids
from d1jax.model.hf_checkpoint import open_checkpoint as _open_checkpoint
from tests import learnable, published
from tests.commands import Commands
from tests.published import BASE_VOCAB, PUBLISHED, REAL_IDS

ROOT = Path(__file__).resolve().parents[1]
MASK_TOKENS = {"llada": "<|mdm_mask|>", "dream": "<|mask|>"}
INSTRUCT = {"LLaDA-8B-Base": "LLaDA-8B-Instruct", "Dream-v0-Base-7B": "Dream-v0-Instruct-7B"}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    return {slug: published.write(slug, root / slug, seed=i)
            for i, slug in enumerate(PUBLISHED)}


def _real(p) -> tuple[int, dict[str, int]]:
    return REAL_IDS["diffucoder" if p.dlm_pad else p.family]


# --------------------------------------------------------------------------- the files

def test_replicas_hold_the_published_file_set(replicas):
    """config.json and the tokenizer name the tokens the authors' do, at the ids the real
    vocabulary gives them (shifted by its size); weights are bfloat16 shards with an index."""
    for slug, d in replicas.items():
        p = PUBLISHED[slug]
        names = {f.name for f in d.iterdir()}
        code = {"llada": {"configuration_llada.py", "modeling_llada.py", "tokenizer.json"},
                "dream": {"configuration_dream.py", "modeling_dream.py", "generation_utils.py",
                          "tokenization_dream.py", "vocab.json", "merges.txt",
                          "added_tokens.json"}}[p.family]
        assert {"config.json", "generation_config.json", "tokenizer_config.json",
                "special_tokens_map.json", "model.safetensors.index.json", *code} <= names, slug
        shards = sorted(n for n in names if n.endswith(".safetensors"))
        assert len(shards) == {"llada": 6, "dream": 4}[p.family], shards
        where = _open_checkpoint(d)
        assert {where[k].header[k]["dtype"] for k in where} == {"BF16"}
        cfg = json.loads((d / "config.json").read_text())
        base, real = _real(p)
        for key in ("mask", "eos"):
            assert cfg[f"{key}_token_id"] - BASE_VOCAB == real[key] - base, (slug, key)
        tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
        assert ("chat_template" in tok_cfg) == p.chat


@pytest.mark.parametrize("slug", list(PUBLISHED))
def test_special_ids_are_each_checkpoints_own(replicas, slug):
    """mask / eos / pad / eot from the checkpoint's tokenizer and config.json: LLaDA's mask
    is config.json's id of <|mdm_mask|> (its tokenizer names no mask token), Dream's and
    DiffuCoder's the tokenizer's <|mask|>; DiffuCoder pads with <|dlm_pad|> although its
    config.json says <|endoftext|>. transformers' own loader agrees on every id."""
    p, d = PUBLISHED[slug], replicas[slug]
    tok = load_tokenizer(d)
    cfg = family_lib.get(p.family).read_config(d)
    ids = special_ids(tok, cfg)
    base, real = _real(p)
    assert {k: v - BASE_VOCAB for k, v in ids.items()} == {k: v - base for k, v in real.items()}
    assert tok.convert_ids_to_tokens(ids["mask"]) == MASK_TOKENS[p.family]
    instruct = None if p.chat else replicas[INSTRUCT[slug]]  # Base: no chat template
    assert check_checkpoint(d, p.family, instruct) == ids
    if p.dlm_pad:
        assert tok.convert_ids_to_tokens(ids["pad"]) == "<|dlm_pad|>"
        assert cfg.pad_token_id == ids["eos"] != ids["pad"]
    from transformers import AutoTokenizer  # the authors' way in: their tokenizer class
    theirs = AutoTokenizer.from_pretrained(str(d), trust_remote_code=True)
    assert (theirs.eos_token_id, theirs.pad_token_id) == (ids["eos"], ids["pad"])
    assert theirs.convert_tokens_to_ids(MASK_TOKENS[p.family]) == ids["mask"]
    text = "Write letters. abcd"
    assert tok(text)["input_ids"] == theirs(text)["input_ids"]
    if p.chat:
        chat = [{"role": "user", "content": text}]
        assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
            theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


# --------------------------------------------------------------------------- sampling

def _eval_config(p, path: Path, **changes):
    c = config_lib.eval_config("sudoku,tiny", checkpoint=p.family)
    c.unlock()
    values = {"task.name": learnable.NAME, "model.path": str(path), "eval.num_examples": 8,
              **changes}
    for key, value in values.items():
        *groups, name = key.split(".")
        node = c
        for g in groups:
            node = node[g]
        setattr(node, name, value)
    return c


def _completions(wd: Path) -> list[str]:
    (file,) = wd.glob("*_generations.json")
    return [r["generation"] for r in json.loads(file.read_text())["generations"]]


# `python -c EVAL_MAIN <flags>`: d1jax.eval with tests/learnable.py's task registered (its
# prompts are generated: nothing to download).
EVAL_MAIN = ("import runpy, sys; import tests.learnable; sys.argv[0] = 'd1jax.eval'; "
             "runpy.run_module('d1jax.eval', run_name='__main__', alter_sys=True)")
EVAL_FLAGS = (f"--config.task.name={learnable.NAME}", "--config.eval.num_examples=8")


@pytest.mark.parametrize("slug", [s for s in PUBLISHED if s not in (
    "LLaDA-8B-Instruct", "DiffuCoder-7B-Instruct", "Dream-v0-Instruct-7B")])
def test_replica_loads_and_samples(replicas, slug, tmp_path):
    """d1jax's evaluation (d1jax.eval's run, after its input checks) on the replica: every
    completion position is filled, so the sampler masked with the checkpoint's mask id. A
    Base tokenizer without a chat template is named, and its Instruct's tokenizer serves."""
    p = PUBLISHED[slug]
    c = _eval_config(p, replicas[slug])
    if not p.chat:
        with pytest.raises(ConfigError, match="its tokenizer has no chat template, and d1jax's "
                                              "tasks prompt in chat turns: set config.model."
                                              "tokenizer_path to the Instruct model's directory"):
            config_lib.check_inputs(c)
        c = _eval_config(p, replicas[slug], **{"model.tokenizer_path":
                                                str(replicas[INSTRUCT[slug]])})
    config_lib.check_inputs(c)
    evaluate.run(c, str(tmp_path))
    assert not (tmp_path / "d1jax.lock").exists()  # the run released its workdir
    texts = _completions(tmp_path)
    assert len(texts) == 8 and all(texts)
    assert not any(MASK_TOKENS[p.family] in t for t in texts), texts[:2]


def _cli(*args, module="d1jax.main", main=None) -> subprocess.CompletedProcess:
    argv = ["-c", main, *args] if main else ["-m", module, *args]
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture
def commands(tmp_path):
    """The chains' 12 ``python -m d1jax.main`` runs, forked from one process that imported
    what the command imports (tests/commands.py); ``_cli``'s commands start for real."""
    c = Commands(tmp_path / "logs")
    yield lambda *args: c.run("d1jax.main", *args)
    c.close()


def test_dream_v0_instruct_samples_through_the_eval_command(replicas, tmp_path):
    """The command issue 41 reports: Dream-v0-Instruct-7B (mask <|mask|>) through
    ``python -m d1jax.eval --config=configs/dream/eval.py``."""
    r = _cli("--config=configs/dream/eval.py:sudoku,tiny",
             f"--config.model.path={replicas['Dream-v0-Instruct-7B']}", *EVAL_FLAGS,
             f"--workdir={tmp_path}", main=EVAL_MAIN)
    assert r.returncode == 0, r.stderr[-3000:]
    texts = _completions(tmp_path)
    assert len(texts) == 8 and not any("<|mask|>" in t for t in texts)


# --------------------------------------------------------------------------- the commands

LLADA_CHAIN = ("configs/sft_s1k.py:tiny", "configs/grpo_sudoku.py:tiny", ())
# bfloat16 params and compute, as users run the 7B configs
BF16 = ("--config.model.dtype=bfloat16", "--config.model.param_dtype=bfloat16")
DREAM_CHAIN = ("configs/dream/sft_s1k.py:tiny", "configs/dream/grpo_sudoku.py:tiny", BF16)
DIFFUCODER_CHAIN = ("configs/dream/sft_s1k.py:tiny",
                    "configs/diffucoder/coupled_grpo_sudoku.py:tiny", BF16)
CHAINS = {  # replica: (SFT config, GRPO config, dtype flags)
    "LLaDA-8B-Instruct": LLADA_CHAIN, "LLaDA-8B-Base": LLADA_CHAIN,
    "Dream-v0-Instruct-7B": DREAM_CHAIN, "Dream-v0-Base-7B": DREAM_CHAIN,
    "DiffuCoder-7B-Instruct": DIFFUCODER_CHAIN, "DiffuCoder-7B-cpGRPO": DIFFUCODER_CHAIN,
}
# The chains of one family run back to back in one test (one xdist worker): their replicas'
# shapes are the same, so the second one's programs come from the compilation cache.
FAMILIES = {"llada": ("LLaDA-8B-Instruct", "LLaDA-8B-Base"),
            "dream": ("Dream-v0-Instruct-7B", "Dream-v0-Base-7B"),
            "diffucoder": ("DiffuCoder-7B-Instruct", "DiffuCoder-7B-cpGRPO")}
# One step, no warmup (HF's warmup gives step 1 a learning rate of 0), on tests/learnable.py's
# generated task (nothing to download).
ONE_STEP = ("--config.train.num_steps=1", "--config.optim.warmup_ratio=0",
            f"--config.task.name={learnable.NAME}")
GRPO_FLAGS = (*ONE_STEP, "--config.max_prompt_length=64",
              "--config.grpo.num_iterations=1", "--config.grpo.prompts_per_step=4",
              "--config.grpo.num_generations=2")
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def _weights(d: Path) -> dict[str, np.ndarray]:
    where = _open_checkpoint(d)
    return {k: np.asarray(f.array(k), np.float32) for k, f in where.items()}


def test_every_replica_has_a_chain():
    assert set(CHAINS) == set(PUBLISHED) == {s for pair in FAMILIES.values() for s in pair}
    for pair in FAMILIES.values():  # the same shapes, so the same compiled programs
        a, b = (published.hf_config(PUBLISHED[s]) for s in pair)
        assert {k: v for k, v in a.items() if k != "_name_or_path"} == {
            k: v for k, v in b.items() if k != "_name_or_path"}, pair


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sft_then_grpo_through_the_commands(replicas, family, tmp_path, commands):
    """For each replica of the family: ``python -m d1jax.main`` SFT one step on it, exported;
    GRPO one step loading that export and sampling its rollouts from it, exported. A Base
    replica is trained with its Instruct's tokenizer (``--config.model.tokenizer_path``), as a
    user must (it has no chat template); its exports ship that tokenizer, so GRPO from the SFT
    export needs no flag. Each export keeps the checkpoint's generation config and the
    tokenizer files byte for byte and its special ids in config.json, loads, and holds weights
    the step changed."""
    for slug in FAMILIES[family]:
        _chain(replicas, slug, tmp_path / slug, commands)


def _chain(replicas, slug: str, tmp_path: Path, cli) -> None:
    p, src = PUBLISHED[slug], replicas[slug]
    tok_src = src if p.chat else replicas[INSTRUCT[slug]]
    tok_flag = () if p.chat else (f"--config.model.tokenizer_path={tok_src}",)
    sft_cfg, grpo_cfg, dtypes = CHAINS[slug]
    sft_wd, grpo_wd = tmp_path / "sft", tmp_path / "grpo"
    r = cli(f"--config={sft_cfg}", f"--config.model.path={src}", *tok_flag, *ONE_STEP, *dtypes,
            "--config.sft.max_length=96", f"--workdir={sft_wd}")
    assert r.returncode == 0, (slug, r.stderr[-3000:])
    r = cli(f"--config={grpo_cfg}", f"--config.model.path={sft_wd / 'hf'}", *GRPO_FLAGS,
            *dtypes, f"--workdir={grpo_wd}")
    assert r.returncode == 0, (slug, r.stderr[-3000:])
    (row,) = read_jsonl(grpo_wd / "metrics.jsonl")
    assert row["step"] == 1 and np.isfinite(row["loss"]) and 0 <= row["reward"] <= 1, slug

    want = json.loads((src / "config.json").read_text())
    ids = check_checkpoint(src, p.family, None if p.chat else tok_src)
    before = _weights(src)
    for hf in (sft_wd / "hf", grpo_wd / "hf"):
        assert (hf / "generation_config.json").read_bytes() == (
            src / "generation_config.json").read_bytes(), hf
        for name in TOKENIZER_FILES:
            assert (hf / name).read_bytes() == (tok_src / name).read_bytes(), (hf, name)
        got = json.loads((hf / "config.json").read_text())
        for key in ("model_type", "mask_token_id", "eos_token_id", "pad_token_id", "vocab_size"):
            assert got[key] == want[key], (hf, key)
        assert check_checkpoint(hf, p.family) == ids, hf
        cfg, params = family_lib.get(p.family).load(hf)
        assert cfg.mask_token_id == want["mask_token_id"] and params
        if dtypes:  # stored as published
            where = _open_checkpoint(hf)
            assert {where[k].header[k]["dtype"] for k in where} == {"BF16"}, hf
        after = _weights(hf)
        assert after.keys() == before.keys()
        assert any(not np.array_equal(after[k], before[k]) for k in before), \
            f"{hf}: the exported weights are the ones loaded"
        before = after


# --------------------------------------------------------------------------- bad inputs

def _bad(replicas, tmp_path, slug="Dream-v0-Instruct-7B") -> Path:
    d = tmp_path / "bad"
    shutil.copytree(replicas[slug], d)
    return d


def _no_mask(d: Path) -> None:
    """The tokenizer without <|mask|>: not named, not an added token."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        obj = json.loads((d / name).read_text())
        obj.pop("mask_token")
        obj["additional_special_tokens"].remove("<|mask|>")
        obj.get("added_tokens_decoder", {}).pop(str(BASE_VOCAB + 23), None)
        published._write_json(d / name, obj)
    added = json.loads((d / "added_tokens.json").read_text())
    added.pop("<|mask|>")
    published._write_json(d / "added_tokens.json", added)


CASES = {
    "another_family": ("configs/grpo_sudoku.py:tiny", None,
                       "it holds a Dream checkpoint but config.model.family='llada': set "
                       "--config.model.family=dream"),
    "no_mask_token": ("configs/dream/grpo_sudoku.py:tiny", _no_mask,
                      "the tokenizer has no mask token: it names none, and config.json's "
                      "mask_token_id=343 is beyond its 343 tokens"),
    "mask_ids_disagree": ("configs/dream/grpo_sudoku.py:tiny",
                          lambda d: published.edit_json(d / "config.json", mask_token_id=342),
                          "the tokenizer's mask token '<|mask|>' is id 343 but config.json has "
                          "mask_token_id=342: tokenizer and checkpoint do not belong together"),
    "no_config_mask": ("configs/dream/grpo_sudoku.py:tiny",
                       lambda d: published.edit_json(d / "config.json", mask_token_id=None),
                       "its config.json names no mask_token_id (the tokenizer's mask token: "
                       "'<|mask|>'): add the id the model was trained with"),
    "unknown_alg": ("configs/dream/eval.py:sudoku,tiny",
                    lambda d: published.edit_json(d / "generation_config.json",
                                                  alg="confidence_threshold"),
                    "{d}/generation_config.json: alg='confidence_threshold' is not an "
                    "algorithm d1jax's sampler runs "
                    "(origin, maskgit_plus, topk_margin, entropy)"),
    "small_vocabulary": ("configs/dream/sft_s1k.py:tiny", "vocab",
                         "its config.json vocab_size=320 is smaller than the tokenizer's 344 "
                         "tokens (ids 320..343 have no embedding row): not this tokenizer's "
                         "model"),
    "small_embedding": ("configs/dream/sft_s1k.py:tiny", "rows",
                        "its embedding rows=320 is smaller than the tokenizer's 344 tokens (ids "
                        "320..343 have no embedding row): not this tokenizer's model"),
}


def _make_bad(replicas, tmp_path, case) -> tuple[str, Path, str]:
    config, change, message = CASES[case]
    if change in ("vocab", "rows"):  # weights of a 320-token vocabulary
        d = published.write("Dream-v0-Instruct-7B", tmp_path / "bad", vocab=320)
        if change == "rows":  # config.json says the tokenizer's size all the same
            published.edit_json(d / "config.json", vocab_size=384)
    else:
        d = _bad(replicas, tmp_path)
        if change is not None:
            change(d)
    return config, d, f"config.model.path={str(d)!r}: " + message.format(d=d)


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_that_does_not_fit_is_refused_before_any_work(replicas, tmp_path, case):
    """d1jax.config.check_inputs, which the commands run after parsing their flags: one
    line naming the problem and the values."""
    from tests.config_files import load_config
    config, d, message = _make_bad(replicas, tmp_path, case)
    c = load_config(config)
    c.model.path = str(d)
    with pytest.raises(ConfigError) as e:
        config_lib.check_inputs(c)
    assert str(e.value) == message


@pytest.mark.parametrize("case,module", [("no_mask_token", "d1jax.main"),
                                         ("unknown_alg", "d1jax.eval")])
def test_the_commands_refuse_it_in_one_line_writing_nothing(replicas, tmp_path, case, module):
    config, d, message = _make_bad(replicas, tmp_path, case)
    wd = tmp_path / "wd"
    r = _cli(f"--config={config}", f"--config.model.path={d}", f"--workdir={wd}", module=module)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"error: {message}"], r.stderr[-2000:]
    assert not wd.exists()


def test_special_ids_refuse_a_disagreeing_eos(replicas):
    """eos: the tokenizer's and config.json's must be the same token."""
    p = PUBLISHED["LLaDA-8B-Instruct"]
    tok = load_tokenizer(replicas["LLaDA-8B-Instruct"])
    cfg = family_lib.get("llada").read_config(replicas["LLaDA-8B-Instruct"])
    import dataclasses
    eos = published.expected_ids(p)["eos"]
    with pytest.raises(TokenizerError, match=rf"^the tokenizer's eos token '<\|endoftext\|>' is "
                                             rf"id {eos} but config.json has eos_token_id=7:"):
        special_ids(tok, dataclasses.replace(cfg, eos_token_id=7))
