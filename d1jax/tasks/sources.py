"""Where task data comes from: local files, the Hugging Face Hub, or d1's repository.

A ``source`` is one of
  * None: the task's public default (a Hub dataset, or a file of d1's repository);
  * a local file: ``.parquet``, ``.jsonl``, ``.json`` (a list of rows) or ``.csv``;
  * a local directory: ``datasets.save_to_disk`` output, or files ``datasets`` reads as a
    folder (e.g. ``train.jsonl`` + ``test.jsonl``, ``data/train-*.parquet``);
  * an ``http(s)://`` URL of one such file (downloaded once into the cache);
  * a Hub dataset id such as ``openai/gsm8k``.

Files of d1's repository (its Sudoku and Countdown test sets) are looked up first in
``$D1JAX_DATA_DIR``, then in the cache (``$D1JAX_CACHE``, default ``~/.cache/d1jax``), and
downloaded only when absent. CSV cells stay strings (Sudoku puzzles start with zeros).
"""

from __future__ import annotations

import csv
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

D1_RAW_URL = "https://raw.githubusercontent.com/dllm-reasoning/d1/main/dataset/"
_FILE_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")


class DataUnavailableError(RuntimeError):
    """A public dataset could not be fetched (offline?) and no local copy was given."""


def load_rows(source: str | os.PathLike | None, *, split: str, default_hub: str | None = None,
              hub_config: str | None = None, cache_dir: str | None = None) -> list[dict[str, Any]]:
    """Rows (plain dicts) of ``split`` from ``source``; see the module docstring.

    ``default_hub`` names the Hub dataset used when ``source`` is None. For a single local
    file ``split`` is ignored (the file is the split).
    """
    if source is None:
        if default_hub is None:
            raise ValueError("no source given and this dataset has no public default")
        return _from_hub(default_hub, hub_config, split, cache_dir)
    text = str(source)
    if text.startswith(("http://", "https://")):
        return read_file(download(text))
    path = Path(source).expanduser()
    if path.is_file():
        return read_file(path)
    if path.is_dir():
        return _from_dir(path, split, cache_dir)
    if text.endswith(_FILE_SUFFIXES) or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise FileNotFoundError(f"data source {text!r}: no such file or directory "
                                f"(and not a Hub id of the form owner/name)")
    return _from_hub(text, hub_config, split, cache_dir)


def read_file(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of one local ``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv`` file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return [dict(row) for row in csv.DictReader(f)]
    if suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if suffix == ".json":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not (isinstance(data, list) and all(isinstance(r, dict) for r in data)):
            raise ValueError(f"{path}: expected a JSON list of row objects")
        return data
    if suffix == ".parquet":
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: unsupported data file type {suffix!r} "
                     f"(use one of {', '.join(_FILE_SUFFIXES)})")


def _from_dir(path: Path, split: str, cache_dir: str | None) -> list[dict[str, Any]]:
    import datasets
    if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
        data = datasets.load_from_disk(str(path))
    else:
        data = datasets.load_dataset(str(path), cache_dir=cache_dir)
    if isinstance(data, datasets.Dataset):
        return data.to_list()
    if split not in data:
        if len(data) == 1:
            return next(iter(data.values())).to_list()
        raise ValueError(f"{path}: no split {split!r}; it has {sorted(data)}")
    return data[split].to_list()


def _from_hub(name: str, config: str | None, split: str, cache_dir: str | None) -> list[dict]:
    import datasets
    try:
        data = datasets.load_dataset(name, config, split=split, cache_dir=cache_dir)
    except Exception as e:  # the Hub raises many types when offline
        raise DataUnavailableError(
            f"could not load {name!r} (config {config!r}, split {split!r}) from the Hugging "
            f"Face Hub: {type(e).__name__}: {e}. Offline? Fetch it once with internet access, "
            f"or pass source=<local file or directory in the Hugging Face schema>.") from e
    return data.to_list()


def cache_root() -> Path:
    return Path(os.environ.get("D1JAX_CACHE", Path.home() / ".cache" / "d1jax"))


def download(url: str, timeout_s: float = 60.0) -> Path:
    """Local copy of ``url`` in the cache, downloaded on first use."""
    dest = cache_root() / url.split("://", 1)[1].replace("/", "_")
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read()
    except OSError as e:
        raise DataUnavailableError(
            f"could not download {url}: {e}. Offline? Download the file by hand and pass "
            f"source=<its path>, or put it in $D1JAX_DATA_DIR.") from e
    tmp = dest.with_suffix(dest.suffix + ".part")
    tmp.write_bytes(body)
    tmp.replace(dest)
    return dest


def d1_file(name: str) -> Path:
    """A data file of d1's repository (``dataset/NAME``): ``$D1JAX_DATA_DIR/NAME`` if there,
    else the cached download of the public copy."""
    local = os.environ.get("D1JAX_DATA_DIR")
    if local and (Path(local) / name).is_file():
        return Path(local) / name
    return download(D1_RAW_URL + name)


def d1_eval_subset(rows: list, size: int | None, seed: int = 42) -> list:
    """The ``size`` rows d1's evaluation picks, in its order.

    d1 (eval/eval.py) seeds NumPy's global generator with 42 and draws
    ``np.random.choice(len(rows), size, replace=False)``; size None or -1 keeps all rows.
    """
    if size is None or size < 0:
        return list(rows)
    if size > len(rows):
        raise ValueError(f"subsample {size} is larger than the {len(rows)} rows")
    idx = np.random.RandomState(seed).choice(len(rows), size, replace=False)
    return [rows[i] for i in idx]


def d1_train_holdout(rows: list, holdout: int = 500, seed: int = 42) -> list:
    """The rows d1 trains on when it keeps ``holdout`` rows back (Countdown, Sudoku).

    d1 shuffles with ``Dataset.shuffle(seed=42)`` (NumPy ``default_rng(42).permutation``)
    and drops the last 500 of that order; the kept rows come back in that order.
    """
    perm = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in perm[:max(len(rows) - holdout, 0)]]
