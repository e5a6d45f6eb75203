"""Checkpoints in the Hugging Face LLaDA layout: hand-written files load, round trips are
bitwise, sharded files load, and every bad input gets its clear error."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

import d1jax
from d1jax.model import hf_checkpoint
from d1jax.model import llada
from d1jax.model.llada import weights
from d1jax.model import UnsupportedConfigError
from d1jax.model.hf_checkpoint import CheckpointError
from tests import published
from tests.published import LLADA_8B_CONFIG  # config.json of LLaDA-8B-Instruct

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

HF = "model.transformer."

# The same file shrunk to a tiny GQA model (4 query heads, 2 kv heads of width 8).
TINY_CONFIG = {**LLADA_8B_CONFIG, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2,
               "mlp_hidden_size": 64, "vocab_size": 128, "embedding_size": 128,
               "mask_token_id": 127, "eos_token_id": 126, "pad_token_id": 126,
               "max_sequence_length": 256}


def torch_layout_state(cfg, seed=0):
    """A random HF state dict: torch Linear weights [out, in], norms [d_model]."""
    d, f, v = cfg["d_model"], cfg["mlp_hidden_size"], cfg["embedding_size"]
    kv = cfg["n_kv_heads"] * d // cfg["n_heads"]
    rs = np.random.RandomState(seed)
    shapes = {HF + "wte.weight": (v, d), HF + "ln_f.weight": (d,), HF + "ff_out.weight": (v, d)}
    for i in range(cfg["n_layers"]):
        shapes.update({f"{HF}blocks.{i}.{name}.weight": shape for name, shape in [
            ("attn_norm", (d,)), ("q_proj", (d, d)), ("k_proj", (kv, d)), ("v_proj", (kv, d)),
            ("attn_out", (d, d)), ("ff_norm", (d,)), ("ff_proj", (f, d)), ("up_proj", (f, d)),
            ("ff_out", (d, f))]})
    return {k: rs.randn(*s).astype(np.float32) for k, s in shapes.items()}


def write_checkpoint(path, sd):
    return published.write_checkpoint(path, TINY_CONFIG, sd)


@pytest.fixture
def hf_state():
    return torch_layout_state(TINY_CONFIG)


@pytest.fixture
def hf_dir(tmp_path, hf_state):
    return write_checkpoint(tmp_path / "ckpt", hf_state)


def our_value(params, key):
    """The value our params hold for one HF key, back in torch layout ([out, in])."""
    name = key[len(HF):].removesuffix(".weight").split(".")
    if name[0] == "blocks":  # stacked on a leading layers axis; kernels are [in, out]
        leaf, layer = params["blocks"][name[2]], int(name[1])
        return np.asarray(leaf["kernel"][layer]).T if "kernel" in leaf else np.asarray(leaf["weight"][layer])
    if name[0] == "ff_out":
        return np.asarray(params["ff_out"]["kernel"]).T
    return np.asarray(params[name[0]]["embedding" if name[0] == "wte" else "weight"])


def assert_bitwise_equal(a_tree, b_tree):
    for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def split_into_files(path, sd, n_files):
    """Rewrites a checkpoint as n_files safetensors files plus model.safetensors.index.json."""
    (path / weights.SINGLE_FILE).unlink(missing_ok=True)
    published.write_safetensors(path, sd, shards=n_files)


# --------------------------------------------------------------------------- loading

def test_llada_8b_config_json_gives_the_8b_preset():
    assert d1jax.LLaDAConfig.from_hf_dict(LLADA_8B_CONFIG) == d1jax.preset("llada-8b")


def test_hand_written_hf_checkpoint_loads_every_tensor_in_place(hf_dir, hf_state):
    c, params = weights.load_hf_checkpoint(hf_dir)
    assert c == d1jax.preset("test-tiny", rope_theta=500000.0)
    assert set(weights.key_map(c)) == set(hf_state)
    for key, want in hf_state.items():
        np.testing.assert_array_equal(our_value(params, key), want, err_msg=key)
    # Stacked on a leading layers axis, [in, out] kernels.
    assert params["blocks"]["k_proj"]["kernel"].shape == (2, 32, 16)
    assert params["ff_out"]["kernel"].shape == (32, 128)


def test_sharded_checkpoint_with_index_loads(hf_dir, hf_state):
    split_into_files(hf_dir, hf_state, n_files=3)
    _, params = weights.load_hf_checkpoint(hf_dir)
    for key, want in hf_state.items():
        np.testing.assert_array_equal(our_value(params, key), want, err_msg=key)


def test_bfloat16_checkpoint_loads_in_either_dtype(hf_dir, hf_state):
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in hf_state.items()}
    published.write_safetensors(hf_dir, bf16)
    _, as_bf16 = weights.load_hf_checkpoint(hf_dir, dtype=jnp.bfloat16)
    _, as_f32 = weights.load_hf_checkpoint(hf_dir)
    key = HF + "blocks.1.up_proj.weight"
    assert as_bf16["blocks"]["up_proj"]["kernel"].dtype == jnp.bfloat16
    assert our_value(as_bf16, key).tobytes() == bf16[key].tobytes()
    np.testing.assert_array_equal(our_value(as_f32, key), bf16[key].astype(np.float32))


# --------------------------------------------------------------------------- saving

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_save_then_load_is_bitwise_identical(tmp_path, tiny_config, tiny_params, dtype):
    params = jax.tree.map(lambda x: x.astype(dtype), tiny_params)
    weights.save_hf_checkpoint(tmp_path, tiny_config, params)
    raw = (tmp_path / weights.SINGLE_FILE).read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert header[HF + "blocks.0.q_proj.weight"]["dtype"] == ("BF16" if dtype == jnp.bfloat16 else "F32")
    c, back = weights.load_hf_checkpoint(tmp_path, dtype=dtype)
    assert c == tiny_config
    assert_bitwise_equal(params, back)


def test_save_writes_the_hf_layout(tmp_path, tiny_config, tiny_params):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params)
    sd = load_file(str(tmp_path / weights.SINGLE_FILE))
    assert set(sd) == set(torch_layout_state(TINY_CONFIG))
    assert sd[HF + "blocks.1.k_proj.weight"].shape == (16, 32)  # torch [out, in]
    np.testing.assert_array_equal(sd[HF + "blocks.1.k_proj.weight"],
                                  np.asarray(tiny_params["blocks"]["k_proj"]["kernel"][1]).T)
    saved_cfg = json.loads((tmp_path / "config.json").read_text())
    assert d1jax.LLaDAConfig.from_hf_dict(saved_cfg) == tiny_config


def test_save_gathers_stacked_params_one_layer_at_a_time(tmp_path, tiny_config, tiny_params,
                                                         monkeypatch):
    gathered = []
    real = weights.shd.gather_all
    monkeypatch.setattr(weights.shd, "gather_all", lambda x: gathered.append(x.shape) or real(x))
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params)
    assert len(gathered) == len(weights.key_map(tiny_config))  # one gather per HF tensor
    assert max(len(shape) for shape in gathered) == 2  # never a whole [layers, ...] stack


def test_save_in_several_files_writes_an_index_and_loads_back(tmp_path, tiny_config, tiny_params):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params, max_shard_size=20_000)
    index = json.loads((tmp_path / weights.INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert index["metadata"]["total_size"] == 4 * tiny_config.num_params()
    _, back = weights.load_hf_checkpoint(tmp_path)
    assert_bitwise_equal(tiny_params, back)


def test_save_over_a_sharded_checkpoint_removes_its_stale_files(tmp_path, tiny_config, tiny_params):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params, max_shard_size=20_000)
    (tmp_path / "tokenizer.json").write_text("{}")
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "config.json", "configuration_llada.py", weights.SINGLE_FILE,
        "modeling_llada.py", "tokenizer.json"]


def test_failed_save_leaves_the_existing_checkpoint_intact(tmp_path, tiny_config, tiny_params,
                                                           monkeypatch):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params, max_shard_size=20_000)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_writer, written = hf_checkpoint.write_safetensors, []

    def writer_failing_on_the_second_file(file, tensors):
        if written:
            file.write_bytes(b"partial")
            raise OSError("disk full")
        written.append(file)
        real_writer(file, tensors)
    monkeypatch.setattr(hf_checkpoint, "write_safetensors", writer_failing_on_the_second_file)
    doubled = jax.tree.map(lambda x: x * 2, tiny_params)
    with pytest.raises(OSError, match="disk full"):
        weights.save_hf_checkpoint(tmp_path, tiny_config, doubled, max_shard_size=20_000)
    assert written  # it failed midway, after one file was complete
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}.tmp-*"))  # no temporary left
    monkeypatch.undo()
    assert_bitwise_equal(tiny_params, weights.load_hf_checkpoint(tmp_path)[1])


# --------------------------------------------------------------------------- bad inputs

def test_missing_directory_is_reported(tmp_path):
    with pytest.raises(CheckpointError, match=f"checkpoint directory {tmp_path / 'nope'} does not exist"):
        weights.load_hf_checkpoint(tmp_path / "nope")


def test_missing_config_json_is_reported(hf_dir):
    (hf_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        weights.load_hf_checkpoint(hf_dir)


def test_invalid_config_json_is_reported(hf_dir):
    (hf_dir / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: invalid JSON"):
        weights.load_hf_checkpoint(hf_dir)


def test_missing_weight_files_are_reported(hf_dir):
    (hf_dir / weights.SINGLE_FILE).unlink()
    with pytest.raises(CheckpointError,
                       match="has neither model.safetensors nor model.safetensors.index.json"):
        weights.load_hf_checkpoint(hf_dir)


def test_index_pointing_at_a_missing_file_is_reported(hf_dir, hf_state):
    split_into_files(hf_dir, hf_state, n_files=2)
    (hf_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError,
                       match="model-00002-of-00002.safetensors is listed in the index but missing"):
        weights.load_hf_checkpoint(hf_dir)


def test_index_naming_the_wrong_file_for_a_key_is_reported(hf_dir, hf_state):
    split_into_files(hf_dir, hf_state, n_files=2)
    index = json.loads((hf_dir / weights.INDEX_FILE).read_text())
    index["weight_map"][HF + "wte.weight"] = "model-00002-of-00002.safetensors"
    (hf_dir / weights.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="index says model.transformer.wte.weight is in "
                                              "model-00002-of-00002.safetensors, but that file lacks it"):
        weights.load_hf_checkpoint(hf_dir)


def test_corrupt_index_is_reported(hf_dir):
    (hf_dir / weights.INDEX_FILE).write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match="not a valid safetensors index"):
        weights.load_hf_checkpoint(hf_dir)


@pytest.mark.parametrize("keep", ["first 4 bytes", "first 200 bytes", "all but 100 bytes"])
def test_truncated_safetensors_file_is_reported(hf_dir, keep):
    f = hf_dir / weights.SINGLE_FILE
    raw = f.read_bytes()
    f.write_bytes({"first 4 bytes": raw[:4], "first 200 bytes": raw[:200],
                   "all but 100 bytes": raw[:-100]}[keep])
    with pytest.raises(CheckpointError, match="model.safetensors: truncated safetensors file"):
        weights.load_hf_checkpoint(hf_dir)


def test_missing_keys_are_reported(hf_dir, hf_state):
    del hf_state[HF + "blocks.1.up_proj.weight"]
    write_checkpoint(hf_dir, hf_state)
    with pytest.raises(CheckpointError, match=r"missing \['model.transformer.blocks.1.up_proj.weight'\]"
                                              r" \(1\), unexpected \[\] \(0\)"):
        weights.load_hf_checkpoint(hf_dir)


def test_unexpected_keys_are_reported(hf_dir, hf_state):
    hf_state[HF + "blocks.0.q_proj.bias"] = np.zeros(32, np.float32)
    hf_state[HF + "blocks.2.q_proj.weight"] = np.zeros((32, 32), np.float32)
    write_checkpoint(hf_dir, hf_state)
    with pytest.raises(CheckpointError, match=r"missing \[\] \(0\), unexpected \['model.transformer"
                                              r".blocks.0.q_proj.bias', 'model.transformer.blocks.2"
                                              r".q_proj.weight'\] \(2\)"):
        weights.load_hf_checkpoint(hf_dir)


def test_shape_mismatch_is_reported(hf_dir, hf_state):
    hf_state[HF + "blocks.0.k_proj.weight"] = np.zeros((32, 32), np.float32)  # MHA-sized k
    write_checkpoint(hf_dir, hf_state)
    with pytest.raises(CheckpointError, match=r"model.transformer.blocks.0.k_proj.weight: shape "
                                              r"\(32, 32\) in the checkpoint, config needs \(16, 32\)"):
        weights.load_hf_checkpoint(hf_dir)


@pytest.mark.parametrize("field,value,message", [
    ("alibi", True, "config.json has alibi=True; d1jax supports only alibi=False"),
    ("layer_norm_type", "default", "layer_norm_type='default'; d1jax supports only layer_norm_type='rms'"),
    ("attention_layer_norm", True, "attention_layer_norm=True; d1jax supports only"),
    ("include_bias", True, "include_bias=True is not supported"),
    ("include_qkv_bias", True, "include_qkv_bias=True; d1jax supports only"),
    ("attention_dropout", 0.1, "attention_dropout=0.1; d1jax supports only attention_dropout=0.0"),
    ("residual_dropout", 0.1, "residual_dropout=0.1; d1jax supports only"),
    ("embedding_dropout", 0.1, "embedding_dropout=0.1; d1jax supports only"),
    ("block_type", "sequential", "block_type='sequential'; d1jax supports only block_type='llama'"),
    ("rope", False, "rope=False; d1jax supports only rope=True"),
    ("activation_type", "gelu", "activation_type='gelu'"),
])
def test_unsupported_config_is_refused(hf_dir, field, value, message):
    (hf_dir / "config.json").write_text(json.dumps({**TINY_CONFIG, field: value}))
    with pytest.raises(UnsupportedConfigError, match=message):
        weights.load_hf_checkpoint(hf_dir)


# --------------------------------------------------------------------------- self-contained export

# Stand-ins for a Hub LLaDA directory's own remote code (an export ships d1jax's instead).
CONFIGURATION_PY = '''from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(self, d_model=8, n_layers=1, **kwargs):
        self.d_model = d_model
        self.n_layers = n_layers
        super().__init__(**kwargs)
'''
MODELING_PY = "from .configuration_llada import LLaDAConfig  # the real file defines the model\n"


@pytest.fixture
def hub_dir(tmp_path, hf_state):
    """An HF-layout model directory with remote code, generation config and tokenizer files."""
    path = write_checkpoint(tmp_path / "hub", hf_state)
    (path / "configuration_llada.py").write_text(CONFIGURATION_PY)
    (path / "modeling_llada.py").write_text(MODELING_PY)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 126}))
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))
    (path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return path


def exported_auto_map_files(export):
    auto_map = json.loads((export / "config.json").read_text()).get("auto_map", {})
    return {ref.split(".")[0] + ".py" for ref in auto_map.values()}


def test_export_from_a_hub_directory_carries_d1jax_remote_code_and_its_companions(
        tmp_path, hub_dir, tiny_config, tiny_params):
    from d1jax.model import hf_files
    export = tmp_path / "export"
    weights.save_hf_checkpoint(export, tiny_config, tiny_params, source_dir=hub_dir)
    assert {f.name for f in export.iterdir()} == {
        "config.json", "model.safetensors", "README.md", "configuration_llada.py",
        "modeling_llada.py", "generation_config.json", "tokenizer_config.json",
        "special_tokens_map.json"}
    assert exported_auto_map_files(export) == {"configuration_llada.py", "modeling_llada.py"}
    for name in ("configuration_llada.py", "modeling_llada.py"):  # d1jax's, not the source's
        assert (export / name).read_bytes() == (hf_files.remote_code_dir() / name).read_bytes()
    for name in ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (export / name).read_bytes() == (hub_dir / name).read_bytes()
    readme = (export / "README.md").read_text()
    assert "d1jax's own `configuration_llada.py`" in readme and "were not copied" in readme


def test_export_opens_with_transformers_autoconfig_from_the_export_alone(
        tmp_path, hub_dir, tiny_config, tiny_params):
    import shutil

    import transformers
    export = tmp_path / "export"
    weights.save_hf_checkpoint(export, tiny_config, tiny_params, source_dir=hub_dir)
    shutil.rmtree(hub_dir)  # nothing may be read from the source any more
    cfg = transformers.AutoConfig.from_pretrained(str(export), trust_remote_code=True)
    assert type(cfg).__name__ == "LLaDAConfig" and cfg.model_type == "llada"
    assert (cfg.d_model, cfg.n_layers) == (tiny_config.d_model, tiny_config.n_layers)


def test_export_keeps_only_auto_map_entries_whose_module_it_holds(
        tmp_path, hub_dir, tiny_config, tiny_params):
    from d1jax.model import hf_files
    cfg = {**TINY_CONFIG, "auto_map": {**TINY_CONFIG["auto_map"],
                                       "AutoModelForMaskedLM": "masked_llada.Model",
                                       "AutoTokenizer": ["tokenization_llada.Tok", None]}}
    (hub_dir / "config.json").write_text(json.dumps(cfg))
    (hub_dir / "tokenization_llada.py").write_text("class Tok: pass\n")  # masked_llada.py absent
    export = tmp_path / "export"
    weights.save_hf_checkpoint(export, tiny_config, tiny_params, source_dir=hub_dir)
    auto_map = json.loads((export / "config.json").read_text())["auto_map"]
    assert auto_map == {**llada.REMOTE_CODE.auto_map, "AutoTokenizer": ["tokenization_llada.Tok", None]}
    assert (export / "tokenization_llada.py").is_file()


def test_export_without_a_source_still_carries_the_remote_code_it_names(
        tmp_path, tiny_config, tiny_params):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params)
    assert exported_auto_map_files(tmp_path) == {"configuration_llada.py", "modeling_llada.py"}
    assert {f.name for f in tmp_path.glob("*.py")} == {"configuration_llada.py",
                                                       "modeling_llada.py"}
    assert "d1jax's own `configuration_llada.py`" in (tmp_path / "README.md").read_text()


def lora_params(tiny_config, lora):
    """LoRA params with nonzero lora_b, as after training."""
    params = d1jax.init_params(d1jax.LLaDA(tiny_config, lora=lora), jax.random.key(1))
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (jnp.full_like(x, 0.01) if path[-1].key == "lora_b" else x), params)


def test_export_refuses_unmerged_lora_params(tmp_path, tiny_config):
    params = lora_params(tiny_config, d1jax.LoraConfig(rank=2, alpha=4.0, dropout=0.0))
    with pytest.raises(ValueError, match=r"unmerged LoRA.*lora\.merge\(params, lora_config\)"):
        weights.save_hf_checkpoint(tmp_path / "export", tiny_config, params)
    assert not (tmp_path / "export").exists()


def test_export_merges_lora_when_given_its_config(tmp_path, tiny_config):
    lora = d1jax.LoraConfig(rank=2, alpha=4.0, dropout=0.0)
    params = lora_params(tiny_config, lora)
    weights.save_hf_checkpoint(tmp_path, tiny_config, params, lora=lora)
    q = params["blocks"]["q_proj"]
    a, b, kernel = (np.asarray(q[k][1], np.float64) for k in ("lora_a", "lora_b", "kernel"))
    want = kernel + (4.0 / 2) * a @ b  # W + (alpha / r) A B, layer 1, [in, out]
    got = load_file(str(tmp_path / weights.SINGLE_FILE))[HF + "blocks.1.q_proj.weight"].T
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_auto_map_modules_reads_every_value_form():
    from d1jax.model import hf_files
    auto_map = {"AutoConfig": "configuration_llada.LLaDAConfig",
                "AutoTokenizer": ["tokenization_llada.Slow", None],  # [slow, fast] pair
                "AutoModel": "org/other-repo--modeling_other.Model"}  # code in another Hub repo
    assert hf_files.auto_map_modules(auto_map) == {"configuration_llada.py",
                                                   "tokenization_llada.py"}
