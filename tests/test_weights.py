"""Checkpoints in the Hugging Face LLaDA layout: hand-written files load, round trips are
bitwise, sharded files load, and every bad input gets its clear error."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import d1jax
from d1jax import weights
from d1jax.weights import CheckpointError

P = "model.transformer."
# The fields of LLaDA-8B-Instruct's config.json, shrunk.
HF_CONFIG = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig"}, "bias_for_layer_norm": False,
    "block_group_size": 1, "block_type": "llama", "d_model": 32, "embedding_dropout": 0.0,
    "embedding_size": 128, "eos_token_id": 126, "flash_attention": False, "include_bias": False,
    "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell",
    "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
    "mask_token_id": 127, "max_sequence_length": 256, "mlp_hidden_size": 64, "mlp_ratio": 4,
    "model_type": "llada", "multi_query_attention": None, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2,
    "pad_token_id": 126, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 10000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 128, "weight_tying": False,
}


def torch_layout_state(rs, c):
    d, f, v, kv = c["d_model"], c["mlp_hidden_size"], c["embedding_size"], 16
    sd = {P + "wte.weight": rs.randn(v, d), P + "ln_f.weight": rs.randn(d),
          P + "ff_out.weight": rs.randn(v, d)}
    shapes = {"q_proj": (d, d), "k_proj": (kv, d), "v_proj": (kv, d), "attn_out": (d, d),
              "ff_proj": (f, d), "up_proj": (f, d), "ff_out": (d, f), "attn_norm": (d,), "ff_norm": (d,)}
    for i in range(c["n_layers"]):
        for n, s in shapes.items():
            sd[f"{P}blocks.{i}.{n}.weight"] = rs.randn(*s)
    return {k: x.astype(np.float32) for k, x in sd.items()}


@pytest.fixture
def hf_dir(tmp_path):
    sd = torch_layout_state(np.random.RandomState(0), HF_CONFIG)
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    return tmp_path, sd


def test_hand_written_checkpoint_loads_with_the_right_layout(hf_dir):
    path, sd = hf_dir
    c, params = weights.load_hf_checkpoint(path)
    assert c.n_kv_heads == 2 and c.mask_token_id == 127
    np.testing.assert_array_equal(params["wte"]["embedding"], sd[P + "wte.weight"])
    np.testing.assert_array_equal(params["ff_out"]["kernel"], sd[P + "ff_out.weight"].T)
    np.testing.assert_array_equal(params["blocks"]["q_proj"]["kernel"][1], sd[P + "blocks.1.q_proj.weight"].T)
    np.testing.assert_array_equal(params["blocks"]["ff_norm"]["weight"][0], sd[P + "blocks.0.ff_norm.weight"])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_save_load_round_trip_is_bitwise(tmp_path, tiny_model, tiny_params, tiny_config, dtype):
    params = jax.tree.map(lambda x: x.astype(dtype), tiny_params)
    weights.save_hf_checkpoint(tmp_path, tiny_config, params)
    c, back = weights.load_hf_checkpoint(tmp_path, dtype=dtype)
    assert c == tiny_config
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_sharded_files_with_index_load(tmp_path, tiny_params, tiny_config):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params, max_shard_size=20_000)
    index = json.loads((tmp_path / weights.INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    _, back = weights.load_hf_checkpoint(tmp_path)
    for a, b in zip(jax.tree.leaves(tiny_params), jax.tree.leaves(back)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_missing_things(tmp_path, hf_dir):
    with pytest.raises(CheckpointError, match="does not exist"):
        weights.load_hf_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        weights.load_hf_checkpoint(tmp_path / "empty")
    path, _ = hf_dir
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        weights.load_hf_checkpoint(path)


def test_index_pointing_at_a_missing_file(tmp_path, tiny_params, tiny_config):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params, max_shard_size=20_000)
    (tmp_path / "model-00002-of-" f"{len(list(tmp_path.glob('model-*'))):05d}.safetensors").unlink()
    with pytest.raises(CheckpointError, match="listed in the index but missing"):
        weights.load_hf_checkpoint(tmp_path)


def test_truncated_file(hf_dir):
    path, _ = hf_dir
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated safetensors file"):
        weights.load_hf_checkpoint(path)


def test_missing_unexpected_and_misshapen_keys(hf_dir):
    path, sd = hf_dir
    bad = dict(sd)
    del bad[P + "blocks.1.up_proj.weight"]
    bad[P + "blocks.9.q_proj.weight"] = np.zeros((2, 2), np.float32)
    save_file(bad, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing \['model.transformer.blocks.1.up_proj.weight'\]"
                                              r".*unexpected \['model.transformer.blocks.9.q_proj.weight'\]"):
        weights.load_hf_checkpoint(path)
    bad = dict(sd)
    bad[P + "blocks.0.k_proj.weight"] = np.zeros((32, 32), np.float32)
    save_file(bad, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"blocks.0.k_proj.weight: shape \(32, 32\).*needs \(16, 32\)"):
        weights.load_hf_checkpoint(path)


def test_unsupported_config_file(hf_dir):
    path, _ = hf_dir
    (path / "config.json").write_text(json.dumps({**HF_CONFIG, "alibi": True}))
    with pytest.raises(d1jax.model.UnsupportedConfigError, match="alibi=True"):
        weights.load_hf_checkpoint(path)


def test_failed_save_keeps_the_existing_checkpoint(tmp_path, tiny_params, tiny_config, monkeypatch):
    weights.save_hf_checkpoint(tmp_path, tiny_config, tiny_params)
    before = (tmp_path / "model.safetensors").read_bytes()
    calls = []

    def boom(file, tensors):
        calls.append(file)
        raise OSError("disk full")
    monkeypatch.setattr(weights, "_write_safetensors", boom)
    doubled = jax.tree.map(lambda x: x * 2, tiny_params)
    with pytest.raises(OSError, match="disk full"):
        weights.save_hf_checkpoint(tmp_path, tiny_config, doubled)
    assert calls and (tmp_path / "model.safetensors").read_bytes() == before
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}.tmp-*"))


def test_bf16_file_reads_as_bf16(tmp_path, hf_dir):
    path, sd = hf_dir
    save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in sd.items()}, str(path / "model.safetensors"))
    _, params = weights.load_hf_checkpoint(path, dtype=jnp.bfloat16)
    assert params["wte"]["embedding"].dtype == jnp.bfloat16
