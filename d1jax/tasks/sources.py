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

Rows remember where they came from (``Rows.where``: file and line for text files, dataset
and row index otherwise), so ``check_rows`` can name the exact record a task rejects.
"""

from __future__ import annotations

import csv
import json
import os
import urllib.request
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

D1_RAW_URL = "https://raw.githubusercontent.com/dllm-reasoning/d1/main/dataset/"
_FILE_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")


T = TypeVar("T")


class DataUnavailableError(RuntimeError):
    """A public dataset could not be fetched (offline?) and no local copy was given."""


class BadRecordError(ValueError):
    """A data record is malformed; the message names the file (or dataset) and the line
    (or row index) of the record, what is wrong and the value seen, in one line."""


class Rows(list):
    """A list of row dicts that remembers where each row came from.

    ``origin`` names the file or dataset; ``lines`` holds each row's line number in a text
    file (CSV: the header is line 1), or is None where only the row index is known.
    """

    def __init__(self, rows, origin: str, lines: list[int] | None = None):
        super().__init__(rows)
        self.origin, self.lines = origin, lines

    def where(self, i: int) -> str:
        if self.lines is not None:
            return f"{self.origin} line {self.lines[i]}"
        return f"{self.origin} row index {i}"


def where(rows: list, i: int) -> str:
    """Where row ``i`` came from ('train.csv line 7'); plain lists only know the index."""
    return rows.where(i) if isinstance(rows, Rows) else f"row index {i}"


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters: error messages stay one line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_rows(task: str, rows: list, normalize: Callable[[dict], T]) -> list[T]:
    """``normalize`` every row; the ValueError (or TypeError) it raises for a malformed row
    becomes a BadRecordError prefixed with the task and where the row came from."""
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(normalize(row))
        except (ValueError, TypeError) as e:
            raise BadRecordError(f"{task} data {where(rows, i)}: {e}") from e
    return out


def load_rows(source: str | os.PathLike | None, *, split: str, default_hub: str | None = None,
              hub_config: str | None = None, cache_dir: str | None = None) -> Rows:
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
        rows = read_file(download(text))
        rows.origin = text  # name the URL the user gave, not the cache path
        return rows
    path = Path(source).expanduser()
    if path.is_file():
        return read_file(path)
    if path.is_dir():
        return _from_dir(path, split, cache_dir)
    if text.endswith(_FILE_SUFFIXES) or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise FileNotFoundError(f"data source {text!r}: no such file or directory "
                                f"(and not a Hub id of the form owner/name)")
    return _from_hub(text, hub_config, split, cache_dir)


def read_file(path: str | os.PathLike) -> Rows:
    """Rows of one local ``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv`` file.

    A line that is not JSON, or a JSON value that is not an object, is a BadRecordError
    naming the file and line."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".parquet":
        import pyarrow.parquet as pq
        return Rows(pq.read_table(path).to_pylist(), str(path))
    raise BadRecordError(f"{path}: unsupported data file type {suffix!r} "
                         f"(use one of {', '.join(_FILE_SUFFIXES)})")


def _read_csv(path: Path) -> Rows:
    rows, lines = [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        for row in reader:
            # line_num is the line the row ends on; the header is line 1.
            _check_csv_cells(row, reader.fieldnames, f"{path} line {reader.line_num}")
            rows.append(dict(row))
            lines.append(reader.line_num)
    return Rows(rows, str(path), lines)


def _check_csv_cells(row: dict, header: list[str], at: str) -> None:
    """DictReader pads a short row with None and files a long row's extra cells under
    None: both mean the line does not match the header."""
    missing = [k for k in header if row.get(k) is None]
    cells = len(header) - len(missing) + len(row.get(None) or ())
    if missing or None in row:
        lack = f"; no value for {', '.join(map(repr, missing))}" if missing else ""
        raise BadRecordError(f"{at}: {cells} cell(s) but the header has {len(header)} "
                             f"columns ({', '.join(header)}){lack}")


def _read_jsonl(path: Path) -> Rows:
    rows, lines = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip())  # so colno counts within the line
            except json.JSONDecodeError as e:
                raise BadRecordError(f"{path} line {n}: not valid JSON ({e.msg}, column "
                                     f"{e.colno}): {show(line.strip())}") from None
            _require_object(row, f"{path} line {n}")
            rows.append(row)
            lines.append(n)
    return Rows(rows, str(path), lines)


def _read_json(path: Path) -> Rows:
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise BadRecordError(f"{path} line {e.lineno}: not valid JSON ({e.msg}, column "
                                 f"{e.colno})") from None
    if not isinstance(data, list):
        raise BadRecordError(f"{path}: expected a JSON list of row objects, got "
                             f"{type(data).__name__}")
    for i, row in enumerate(data):
        _require_object(row, f"{path} row index {i}")
    return Rows(data, str(path))


def _require_object(row: Any, where: str) -> None:
    if not isinstance(row, dict):
        raise BadRecordError(f"{where}: expected a JSON object (one row), got "
                             f"{type(row).__name__} {show(row)}")


def _from_dir(path: Path, split: str, cache_dir: str | None) -> Rows:
    import datasets
    if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
        data = datasets.load_from_disk(str(path))
    else:
        data = datasets.load_dataset(str(path), cache_dir=cache_dir)
    if isinstance(data, datasets.Dataset):
        return Rows(data.to_list(), str(path))
    if split not in data:
        if len(data) == 1:
            only = next(iter(data))
            return Rows(data[only].to_list(), f"{path} split {only}")
        raise ValueError(f"{path}: no split {split!r}; it has {sorted(data)}")
    return Rows(data[split].to_list(), f"{path} split {split}")


def _from_hub(name: str, config: str | None, split: str, cache_dir: str | None) -> Rows:
    import datasets
    try:
        data = datasets.load_dataset(name, config, split=split, cache_dir=cache_dir)
    except Exception as e:  # the Hub raises many types when offline
        raise DataUnavailableError(
            f"could not load {name!r} (config {config!r}, split {split!r}) from the Hugging "
            f"Face Hub: {type(e).__name__}: {e}. Offline? Fetch it once with internet access, "
            f"or pass source=<local file or directory in the Hugging Face schema>.") from e
    return Rows(data.to_list(), f"{name} split {split}")


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
    A source with fewer rows than ``size`` (a user's own test file; d1's code would stop) is
    scored whole, in the order d1's draw of all of them gives.
    """
    if size is None or size < 0:
        return list(rows)
    size = min(size, len(rows))
    idx = np.random.RandomState(seed).choice(len(rows), size, replace=False)
    return [rows[i] for i in idx]


def d1_train_holdout(rows: list, holdout: int = 500, seed: int = 42) -> list:
    """The rows d1 trains on when it keeps ``holdout`` rows back (Countdown, Sudoku).

    d1 shuffles with ``Dataset.shuffle(seed=42)`` (NumPy ``default_rng(42).permutation``)
    and drops the last 500 of that order; the kept rows come back in that order.
    """
    perm = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in perm[:max(len(rows) - holdout, 0)]]
