"""Every run config in configs/ and the spec it translates to, as plain JSON: the record
``tests/test_spec_snapshot.py`` compares today's code against.

    python tests/spec_snapshot.py    # rewrite tests/spec_snapshot.json.gz from this checkout
    zcat tests/spec_snapshot.json.gz | less  # read it (one entry a line)

The snapshot was written from the code before the config groups were declared once
(d1jax/config/knobs.py, issue 40): rewrite it only for a change that means to alter a config
or its spec, and say so in the commit. Each entry is one config file with one argument
(variant), optionally with overrides: the ConfigDict (every field's type and value, in
order) and every field of the spec it translates to, flattened to "path: value" (the
spec's shape may change; every path recorded must still read the same value), or the error
either raised.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SNAPSHOT = ROOT / "tests" / "spec_snapshot.json.gz"

# Config arguments tried on every file (the builders refuse the ones a file has not);
# evaluation configs take a task instead.
VARIANTS = (None, "tiny", "authors", "authors,tiny", "generated", "tiny,generated", "full",
            "bogus")
EVAL_TASKS = ("gsm8k", "math500", "sudoku", "countdown", "humaneval", "mbpp")
EVAL_VARIANTS = (None, "bogus", "sudoku-huge") + tuple(
    f"{t}{v}" for t in EVAL_TASKS for v in ("", ",tiny"))
# Overrides reaching translation paths no config file takes by default, on one file each.
OVERRIDES = {
    "grpo_sudoku.py:tiny+fast": {"sampler.kv_cache": "dual", "sampler.threshold": 0.9,
                                 "sampler.parallel_rule": "fast_dllm", "sampler.cache_refresh": 4,
                                 "sampler.recompute": "masked", "sampler.first_position": True},
    "grpo_sudoku.py:tiny+full_ft": {"lora.enabled": False, "optim.master_weights": "none",
                                    "grpo.token_mean": "step", "model.unroll_layers": True,
                                    "model.layers_per_loop": 2, "grpo.num_epochs": 3},
    "grpo_sudoku.py:tiny+quant": {"model.base_quant": "nf4", "lora.targets": ("q_proj",),
                                  "train.accept_changes": "seed, optim.learning_rate",
                                  "task.source": "", "mesh.rules": (("embed", None),)},
    "sft_s1k.py:tiny+split": {"sft.tokenize": "split", "sft.num_epochs": 2,
                              "model.dtype": "bfloat16", "model.param_dtype": "float16"},
    "eval.py:sudoku,tiny+cache": {"sampler.kv_cache": "prefix", "sampler.temperature": 0.5,
                                  "eval.gen_lengths": (32, 64)},
    # bad values: the error each gives
    "grpo_sudoku.py:tiny+bad_token_mean": {"grpo.token_mean": "batch"},
    "grpo_sudoku.py:tiny+bad_advantage": {"grpo.advantage": "rloo"},
    "grpo_sudoku.py:tiny+bad_schedule": {"optim.lr_schedule": "cosine"},
    "grpo_sudoku.py:tiny+bad_master": {"optim.master_weights": "bfloat16"},
    "grpo_sudoku.py:tiny+bad_dtype": {"model.dtype": "float8"},
    "grpo_sudoku.py:tiny+bad_quant": {"model.base_quant": "int4"},
    "grpo_sudoku.py:tiny+bad_lr": {"optim.learning_rate": 0.0},
    "grpo_sudoku.py:tiny+bad_incompatible": {"train.if_incompatible": "ignore"},
    "grpo_sudoku.py:tiny+bad_accept": {"train.accept_changes": "sampler.steps"},
    "grpo_sudoku.py:tiny+bad_remasking": {"sampler.remasking": "top"},
    "grpo_sudoku.py:tiny+bad_block": {"sampler.block_length": 5},
    "grpo_sudoku.py:tiny+bad_loop": {"model.layers_per_loop": 0},
    "grpo_sudoku.py:tiny+bad_family": {"model.family": "gpt"},
    "grpo_sudoku.py:tiny+bad_preset": {"model.random_init": "huge"},
    "grpo_sudoku.py:tiny+bad_target": {"lora.targets": ("o_proj",)},
    "spg_sudoku.py:tiny+bad_num_t": {"grpo.spg.num_t": 9},
    "sft_s1k.py:tiny+bad_tokenize": {"sft.tokenize": "chat"},
    "grpo_sudoku.py:tiny+bad_stage": {"stage": "pretrain"},
}


def config_files() -> list[Path]:
    return sorted(p for p in (ROOT / "configs").rglob("*.py"))


def load(path: Path):
    from tests.config_files import load_module
    return load_module(path)


def _value(v):
    """A config or spec value as JSON keeps it, its type written where JSON would lose it."""
    import numpy as np
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"class": type(v).__name__}
    if isinstance(v, (tuple, list)):
        return {type(v).__name__: [_value(x) for x in v]}
    if isinstance(v, float):
        return {"float": repr(v)}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    try:
        return {"dtype": np.dtype(v).name}
    except TypeError:
        return {"repr": repr(v)}


def config_record(c) -> list:
    """[key, type, value] of every field of a ConfigDict, in order; groups nested."""
    import ml_collections as mlc
    out = []
    for key in c.keys():
        ref = c._fields[key]
        if isinstance(ref, mlc.FieldReference):
            out.append([key, f"FieldReference[{ref.get_type().__name__}]", _value(ref.get())])
            continue
        value = c[key]
        if isinstance(value, mlc.ConfigDict):
            out.append([key, "ConfigDict", config_record(value)])
        else:
            out.append([key, type(value).__name__, _value(value)])
    return out


def flatten(obj, prefix: str = "") -> dict:
    """Every dataclass field under ``obj`` (a spec), "a.b[0].c" -> value."""
    out = {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out[prefix or "."] = _value(obj)
        for f in dataclasses.fields(obj):
            out.update(flatten(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name))
    elif isinstance(obj, tuple) and any(dataclasses.is_dataclass(x) for x in obj):
        out[prefix] = {"tuple_of": len(obj)}
        for i, x in enumerate(obj):
            out.update(flatten(x, f"{prefix}[{i}]"))
    elif prefix.endswith("config_json"):
        out[prefix] = {"sha256": hashlib.sha256(obj.encode()).hexdigest()}
    else:
        out[prefix] = _value(obj)
    return out


def read_path(obj, path: str):
    """The value at a ``flatten`` path (attributes, properties included, and [i])."""
    if path == ".":
        return obj
    for part in path.split("."):
        name, _, index = part.partition("[")
        obj = getattr(obj, name)
        if index:
            obj = obj[int(index.rstrip("]"))]
    return obj


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"}


def entries() -> dict[str, tuple]:
    """name -> (file, arg, overrides) of every entry."""
    out = {}
    for path in config_files():
        rel = path.relative_to(ROOT / "configs").as_posix()
        if rel == "forward_demo.py":
            out[rel] = (path, (), {})
            continue
        variants = EVAL_VARIANTS if path.stem == "eval" else VARIANTS
        if rel == "demo_sudoku.py":
            variants = (None, "ci", "compare", "seeds", "bogus")
        for arg in variants:
            out[f"{rel}:{arg}"] = (path, (arg,), {})
    for name, overrides in OVERRIDES.items():
        rel, rest = name.split(":")
        out[name] = (ROOT / "configs" / rel, (rest.split("+")[0],), overrides)
    return out


def clear_model_paths() -> None:
    """The checkpoint environment variables give model.path a default: none set."""
    from d1jax.config import defaults
    for _, env, _ in defaults.checkpoints().values():
        os.environ.pop(env, None)


def record(path: Path, args: tuple, overrides: dict):
    """(config record or error, the config (or None)) of one entry."""
    try:
        c = load(path).get_config(*args)
        if overrides:
            with c.unlocked():
                for key, value in overrides.items():
                    *groups, last = key.split(".")
                    node = c
                    for g in groups:
                        node = node[g]
                    node[last] = value
    except Exception as e:  # noqa: BLE001 - a refused variant is recorded, message and all
        return _error(e), None
    return config_record(c), c


def spec_record(c):
    """The flattened spec of a run config (``weights=False``: no checkpoint on disk), or the
    error its translation raised; None for a config d1jax.main does not run."""
    from d1jax.run import spec as spec_lib
    if c.get("stage") not in spec_lib.STAGES and c.get("stage") != "pretrain":
        return None
    try:
        return flatten(spec_lib.from_config(c, weights=False))
    except Exception as e:  # noqa: BLE001
        return _error(e)


def snapshot() -> dict:
    clear_model_paths()
    out = {}
    for name, (path, args, overrides) in entries().items():
        config, c = record(path, args, overrides)
        out[name] = {"config": config, "spec": spec_record(c) if c is not None else None}
    return out


def read() -> dict:
    with gzip.open(SNAPSHOT, "rt") as f:
        return json.load(f)


def write(data: dict) -> None:
    """One entry a line (``zcat`` reads it); gzip without a timestamp, so equal data give
    equal bytes."""
    text = "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                              for k, v in data.items()) + "\n}\n"
    with open(SNAPSHOT, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(text.encode())


if __name__ == "__main__":
    data = snapshot()
    write(data)
    assert read() == data
    print(f"{len(data)} entries, {SNAPSHOT.stat().st_size} bytes -> {SNAPSHOT}")
