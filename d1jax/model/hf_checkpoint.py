"""Hugging Face checkpoint directories of any family: config.json + safetensors, in and out.

Loading streams tensor by tensor: every safetensors file is memory-mapped and each
device shard of each parameter is read from the map by ``jax.make_array_from_callback``,
so a host only materialises the shards its own devices hold (an 8B checkpoint is never
held whole, let alone twice). Saving writes the same layout (``model.safetensors`` or
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``), atomically.

A family gives its names as a key map (``KeyMap``: HF key -> (param path, layer index or
None, transposed?), in checkpoint order; torch Linear weights are [out, in], our kernels
[in, out]); ``load_hf_checkpoint`` and ``save_hf_checkpoint`` do the rest
(``d1jax.model.llada.weights``, ``d1jax.model.dream.weights``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from d1jax import sharding as shd
from d1jax.model import hf_files, lora as lora_lib

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_DTYPES = {
    "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F64": np.dtype(np.float64),
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint directory or file that cannot be loaded as the family's checkpoint."""


class UnsupportedConfigError(ValueError):
    """A config.json value (or config field) that this port does not implement."""


class HFShapeNames:
    """Mixin of a config with Hugging Face's field names (``hidden_size``,
    ``num_hidden_layers``, ...): the shape names every family's config answers (the sampler
    and the planner's FLOP counts read these)."""

    @property
    def max_sequence_length(self) -> int:
        """Longest sequence the sampler accepts (the interface's name)."""
        return self.max_position_embeddings

    @property
    def width(self) -> int:
        return self.hidden_size

    @property
    def depth(self) -> int:
        return self.num_hidden_layers

    @property
    def query_heads(self) -> int:
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def output_vocab(self) -> int:
        """Columns of the output head (the logits' last axis)."""
        return self.vocab_size


# HF key -> (param path, layer index or None, transposed?), in checkpoint order.
KeyMap = dict[str, tuple[tuple[str, ...], int | None, bool]]


def param_shapes(model: Any) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Shapes of a module's (layer-stacked) params, by path; nothing is computed."""
    flat = jax.tree_util.tree_flatten_with_path(shd.abstract_params(model))[0]
    return {tuple(k.key for k in path): tuple(leaf.shape) for path, leaf in flat}


# --------------------------------------------------------------------------- reading

class SafetensorsFile:
    """A memory-mapped safetensors file: header checked, tensors as numpy views."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            n = int.from_bytes(raw, "little")
            if n > size - 8:
                raise CheckpointError(f"{path}: truncated safetensors file (header of {n} bytes "
                                      f"but file has {size} bytes)")
            try:
                header = json.loads(f.read(n))
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from None
        header.pop("__metadata__", None)
        self.start = 8 + n
        end = max((v["data_offsets"][1] for v in header.values()), default=0)
        if self.start + end > size:
            raise CheckpointError(f"{path}: truncated safetensors file: tensors need "
                                  f"{self.start + end} bytes, file has {size}")
        self.header = header
        self._mm = np.memmap(path, dtype=np.uint8, mode="r") if size else None

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.header[key]["shape"])

    def array(self, key: str) -> np.ndarray:
        meta = self.header[key]
        if meta["dtype"] not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {key} has unsupported dtype {meta['dtype']}")
        a, b = meta["data_offsets"]
        buf = self._mm[self.start + a:self.start + b]
        return buf.view(_DTYPES[meta["dtype"]]).reshape(meta["shape"])


def open_checkpoint(path: str | os.PathLike) -> dict[str, SafetensorsFile]:
    """HF key -> the file holding it (every file's header checked, the index against them)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    index = path / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
        names = sorted(set(weight_map.values()))
    elif (path / SINGLE_FILE).exists():
        weight_map, names = None, [SINGLE_FILE]
    else:
        raise CheckpointError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    files = {}
    for name in names:
        if not (path / name).exists():
            raise CheckpointError(f"{path / name} is listed in the index but missing")
        files[name] = SafetensorsFile(path / name)
    where = {}
    for name, f in files.items():
        for key in f.header:
            where[key] = f
    if weight_map is not None:
        for key, name in weight_map.items():
            if key not in files[name].header:
                raise CheckpointError(f"index says {key} is in {name}, but that file lacks it")
    return where


def read_config(path: str | os.PathLike, from_hf_dict: Callable[[dict], Any], *,
                wrap_unsupported: bool = False) -> Any:
    """The config ``from_hf_dict`` builds from a checkpoint directory's config.json;
    CheckpointError when it is missing or not JSON (``wrap_unsupported``: also for an
    UnsupportedConfigError, named after the file)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        if not path.is_dir():
            raise CheckpointError(f"checkpoint directory {path} does not exist")
        raise CheckpointError(f"{cfg_file} is missing")
    try:
        return from_hf_dict(json.loads(cfg_file.read_text()))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file}: invalid JSON ({e})") from None
    except UnsupportedConfigError as e:
        if not wrap_unsupported:
            raise
        raise CheckpointError(f"{cfg_file}: {e}") from None


def check_keys(expected: Mapping[str, tuple], shapes: Mapping[tuple, tuple],
               where: Mapping[str, Any], ignorable: set[str] = frozenset(),
               what: str = "checkpoint") -> None:
    """CheckpointError unless ``where`` (HF key -> its file) holds exactly the ``expected``
    keys (HF key -> (param path, layer or None, transposed); ``ignorable`` may be present too)
    with the shapes ``shapes`` (param path -> shape, layer-stacked) gives them."""
    missing = sorted(set(expected) - set(where))
    unexpected = sorted(set(where) - set(expected) - set(ignorable))
    if missing or unexpected:
        raise CheckpointError(
            f"{what} keys do not match the config: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''} ({len(missing)}), unexpected "
            f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''} ({len(unexpected)})")
    for key, (ppath, layer, transposed) in expected.items():
        want = shapes[ppath][1:] if layer is not None else shapes[ppath]
        want = tuple(want[::-1] if transposed else want)
        got = where[key].shape(key)
        if got != want:
            raise CheckpointError(f"{key}: shape {got} in the checkpoint, config needs {want}")


def load_hf_checkpoint(path: str | os.PathLike, key_map: KeyMap, model: Any,
                       mesh: Mesh | None = None, dtype: Any = jnp.float32,
                       rules=shd.DEFAULT_RULES, ignorable: set[str] = frozenset(),
                       what: str = "checkpoint") -> dict[str, Any]:
    """The params of ``model`` from the checkpoint directory
    ``path`` (model.safetensors, or sharded files + index) by ``key_map``: the plain pytree
    ``model.apply`` takes under ``{"params": ...}``, each param placed with the sharding the
    rules give it over ``mesh`` (else on the first local device). ``ignorable``: HF keys that
    may be present and are not read (a tied head's copy)."""
    return stream_params(open_checkpoint(path), key_map, param_shapes(model), model, mesh,
                         dtype, rules, ignorable, what)


def stream_params(where: Mapping[str, Any], expected: Mapping[str, tuple],
                  shapes: Mapping[tuple, tuple], model, mesh: Mesh | None, dtype: Any,
                  rules=shd.DEFAULT_RULES, ignorable: set[str] = frozenset(),
                  what: str = "checkpoint") -> dict[str, Any]:
    """The plain param tree of ``model`` from an opened checkpoint (``check_keys`` first):
    each param placed with the sharding the rules give it over ``mesh`` (else on the first
    local device), each device reading only its own shard from the memory maps."""
    check_keys(expected, shapes, where, ignorable, what)
    shardings = shd.param_shardings(model, mesh, rules) if mesh is not None else None
    by_param: dict[tuple[str, ...], dict[int | None, str]] = {}
    for key, (ppath, layer, _) in expected.items():
        by_param.setdefault(ppath, {})[layer] = key
    transposed = {p: t for p, _, t in expected.values()}
    params: dict[str, Any] = {}
    for ppath, keys in by_param.items():
        sharding = (get_path(shardings, ppath) if shardings is not None
                    else SingleDeviceSharding(jax.local_devices()[0]))

        def read(index, ppath=ppath, keys=keys):
            return _read_slice(where, keys, index, transposed[ppath], dtype)

        set_path(params, ppath, jax.make_array_from_callback(shapes[ppath], sharding, read))
    return params


def _read_slice(where, keys: Mapping[int | None, str], index: tuple[slice, ...],
                transposed: bool, dtype) -> np.ndarray:
    """One device shard of a param, read from the memory maps."""
    def one(key, idx):
        a = where[key].array(key)
        a = a.T if transposed else a
        return np.asarray(a[idx]).astype(dtype)
    if None in keys:  # unstacked param
        return one(keys[None], index)
    layers = range(len(keys))[index[0]]
    return np.stack([one(keys[i], index[1:]) for i in layers])


def get_path(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def set_path(tree, path, value):
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


# --------------------------------------------------------------------------- writing

def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    s = size.strip().upper()
    for unit, mult in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
        if s.endswith(unit):
            return int(float(s[:-len(unit)]) * mult)
    return int(s)


def write_safetensors(file: Path, tensors: list[tuple[str, np.ndarray]]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, a in tensors:
        if a.dtype not in _DTYPE_NAMES:
            raise ValueError(f"cannot write {key} with dtype {a.dtype}")
        header[key] = {"dtype": _DTYPE_NAMES[a.dtype], "shape": list(a.shape),
                       "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(file, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a).tobytes())


def save_hf_checkpoint(path: str | os.PathLike, config: Any, params: Mapping[str, Any],
                       key_map: KeyMap, remote_code: Any, max_shard_size: int | str = "5GB",
                       dtype: Any = None, *, source_dir: str | os.PathLike | None = None,
                       tokenizer: Any = None, lora: Any = None) -> None:
    """Writes params by ``key_map`` and ``config.to_hf_dict()`` as a Hugging Face checkpoint
    with the family's remote code (``remote_code``, an ``hf_files.RemoteCode``).

    Tensors are gathered to the host one at a time; files are written into a temporary
    directory next to ``path`` and moved into place only when complete, so an existing
    checkpoint at ``path`` survives a failed save. Only process 0 writes.

    Args:
      source_dir: the Hugging Face directory the model was loaded from, or None: its
        generation config, remote code and tokenizer files are copied as
        ``hf_files.copy_companions`` says, and the export's README.md names the code it holds.
      tokenizer: the ``transformers`` tokenizer to ship (``hf_files.ship_tokenizer``).
      lora: the model's LoRA config; adapters in ``params`` are merged into the kernels.
        Params holding adapters without it are refused (the export would be the base model).
    """
    params = _merged(params, lora)
    entries = [(k, (get_path(params, p), layer, t)) for k, (p, layer, t) in key_map.items()]

    def finish(tmp: Path) -> None:
        hf_config = config.to_hf_dict()
        hf_config["auto_map"] = hf_files.copy_companions(source_dir, tmp, tokenizer,
                                                         remote_code)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))

    write_checkpoint(Path(path), entries, max_shard_size, dtype, finish)


def write_checkpoint(path: Path, entries: list, max_shard_size: int | str, dtype: Any,
                     finish: Callable[[Path], None]) -> None:
    """Writes ``entries`` ((HF key, (array, layer or None, transposed)) in file order) as
    safetensors shards of at most ``max_shard_size`` into a temporary directory beside
    ``path``, lets ``finish(tmp)`` add config and companion files, then moves it into place:
    an existing checkpoint survives a failed save. Tensors are gathered to the host one at a
    time; every process takes part in the gathers, only process 0 writes."""
    limit = _parse_size(max_shard_size)

    def nbytes(entry):
        arr, layer, _ = entry
        item = np.dtype(dtype or arr.dtype).itemsize
        return int(np.prod(arr.shape[1:] if layer is not None else arr.shape)) * item
    shards: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for key, entry in entries:
        if shards[-1] and size + nbytes(entry) > limit:
            shards.append([])
            size = 0
        shards[-1].append((key, entry))
        size += nbytes(entry)

    def materialise(entry):
        # Keys come layer by layer, so a stacked param is sliced on device and only that
        # layer gathered (gathering the whole stack per key would copy it n_layers times).
        arr, layer, transposed = entry
        a = shd.gather_all(arr[layer] if layer is not None else arr)
        a = a.T if transposed else a
        return np.ascontiguousarray(a.astype(dtype) if dtype is not None else a)

    if jax.process_index() != 0:
        for _, entry in entries:  # take part in collective gathers
            materialise(entry)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        _write_shards(tmp, shards, materialise)
        finish(tmp)
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _merged(params: Mapping[str, Any], lora: Any) -> Mapping[str, Any]:
    """Params with LoRA adapters folded into their kernels; adapters without a config refused."""
    if lora is not None:
        return lora_lib.merge(dict(params), lora)
    adapters = jax.tree_util.tree_flatten_with_path(lora_lib.split(dict(params))[1])[0]
    if adapters:
        first = "/".join(k.key for k in adapters[0][0])
        raise ValueError(
            f"save_hf_checkpoint: params hold {len(adapters)} unmerged LoRA leaves (e.g. {first}); "
            f"the export would silently be the base model. Merge them first with "
            f"d1jax.model.lora.merge(params, lora_config), or pass lora=lora_config")
    return params


def _replace_dir(tmp: Path, path: Path) -> None:
    """Moves the weight files of ``tmp`` into ``path``, keeping other files (tokenizer...)."""
    path.mkdir(parents=True, exist_ok=True)
    stale = [f for f in list(path.glob("model*.safetensors")) + [path / INDEX_FILE]
             if f.exists() and not (tmp / f.name).exists()]
    for f in tmp.iterdir():
        os.replace(f, path / f.name)
    for f in stale:
        f.unlink()
    tmp.rmdir()


def _write_shards(tmp: Path, shards, materialise) -> None:
    """Writes ``shards`` (lists of (HF key, entry)) as one safetensors file or several with
    an index, each tensor ``materialise(entry)`` (gathered to host one at a time)."""
    names = ([SINGLE_FILE] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map, total = {}, 0
    for name, shard in zip(names, shards):
        tensors = [(k, materialise(e)) for k, e in shard]
        write_safetensors(tmp / name, tensors)
        for k, a in tensors:
            weight_map[k] = name
            total += a.nbytes
    if len(shards) > 1:
        (tmp / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
