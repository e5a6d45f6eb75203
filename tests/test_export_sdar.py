"""An SDAR/TraDo export opens with the family's published Hugging Face code.

d1jax ships Gen-Verse/dLLM-RL's ``models/sdar/configuration_sdar.py`` and ``modeling_sdar.py``
(vendored unchanged in ``d1jax/model/hf_remote/sdar/``) beside an export of a random init. The
configuration opens under this environment's transformers 5.x as it is. The modeling file
does not import under 5.x: it imports ``transformers.utils.LossKwargs`` (gone in 5.x) and
flash_attn's triton ``rms_norm_fn`` (its RMSNorm; no flash_attn on CPU), and builds its RoPE
with ``ROPE_INIT_FUNCTIONS["default"]`` (gone in 5.x); and 5.x, which builds a model on the
meta device, leaves its rotary embedding's non-persistent ``inv_freq`` buffer uninitialised. A
subprocess stands in for exactly those four (an empty ``LossKwargs``, RMSNorm in float32, the
"default" frequencies 1 / theta^(2i/H), ``inv_freq`` refilled by their own ``rope_init_fn``
after loading), opens the export with ``AutoModelForCausalLM.from_pretrained(...,
trust_remote_code=True)``, and runs their forward under the block-causal mask as JetAstra/SDAR's
``generate.py`` builds it (``tril(ones(blocks, blocks))`` repeated ``block_size`` times along
both axes, positions 0..L-1); its logits must equal d1jax's.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from d1jax.model import hf_files, sdar
from d1jax.model.sdar import weights as sdar_weights

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = sdar.preset("sdar-tiny")
BS = CONFIG.block_size
IDS = np.array([[5, 17, 3, 99, 42, 8, 127, 127, 127, 127, 1, 2],
                [60, 61, 62, 63, 7, 7, 7, 7, 127, 9, 127, 10]], np.int32)  # 3 blocks of 4

# Run in a subprocess: the stand-ins patch transformers and sys.modules.
OPENER = r'''
import importlib.machinery, json, sys, types, typing
import numpy as np, torch

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

def rms_norm_fn(x, weight, bias=None, eps=1e-6, **kwargs):  # flash_attn's, as plain RMSNorm
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)

for name in ("flash_attn", "flash_attn.ops", "flash_attn.ops.triton",
             "flash_attn.ops.triton.layer_norm"):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = module
sys.modules["flash_attn.ops.triton.layer_norm"].rms_norm_fn = rms_norm_fn

import transformers, transformers.utils
from transformers import modeling_rope_utils

class LossKwargs(typing.TypedDict, total=False):
    pass

transformers.utils.LossKwargs = LossKwargs

def default_rope(config, device=None, *args, **kwargs):
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return inv_freq.to(device), 1.0

modeling_rope_utils.ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)

path, out, block = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = torch.tensor(np.load(out + ".ids.npy"), dtype=torch.long)
model = transformers.AutoModelForCausalLM.from_pretrained(
    path, trust_remote_code=True, dtype=torch.float32).eval()
# 5.x builds the model on the meta device and restores only the buffers its _init_weights
# knows: their rotary embedding's non-persistent inv_freq is left uninitialised memory.
rotary = model.model.rotary_emb
with torch.no_grad():
    rotary.inv_freq.copy_(rotary.rope_init_fn(rotary.config, None)[0])
length = ids.shape[1]
blocks = length // block
block_mask = torch.tril(torch.ones(blocks, blocks))
mask = (block_mask.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)
        .unsqueeze(0).unsqueeze(0).expand(ids.shape[0], 1, length, length))
position_ids = torch.arange(length).unsqueeze(0).expand(ids.shape[0], length)
with torch.no_grad():
    logits = model(ids, attention_mask=mask, position_ids=position_ids).logits
np.save(out + ".logits.npy", logits.float().numpy())
json.dump({"class": type(model).__name__, "transformers": transformers.__version__},
          open(out + ".json", "w"))
'''


def random_params(config, seed=0):
    """d1jax params of ``config`` with logits of order 1-10 (RMSNorm scales near 1)."""
    shapes = nn.meta.unbox(jax.eval_shape(lambda: sdar.SDAR(config).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]))
    rs = np.random.RandomState(seed)

    def draw(path, leaf):
        if path[-1].key == "weight":  # RMSNorm scales
            return (1.0 + 0.1 * rs.randn(*leaf.shape)).astype(np.float32)
        return (0.3 * rs.randn(*leaf.shape)).astype(np.float32)
    return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    params = random_params(CONFIG)
    path = tmp_path_factory.mktemp("sdar") / "export"
    sdar.save_hf_checkpoint(path, CONFIG, params)
    return path, params


def test_a_random_init_export_ships_the_published_code(export):
    path, _ = export
    for name in sdar.REMOTE_CODE.files:
        vendored = hf_files.remote_code_dir() / "sdar" / name
        assert (path / name).read_bytes() == vendored.read_bytes()
        assert "Licensed under the Apache License, Version 2.0" in vendored.read_text()
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["auto_map"] == dict(sdar.REMOTE_CODE.auto_map)
    assert cfg["architectures"] == ["SDARForCausalLM"] and cfg["model_type"] == "sdar"
    repo, commit, folder = sdar_weights.SOURCE
    source_note = (hf_files.remote_code_dir() / "sdar" / "SOURCE.md").read_text()
    assert repo in source_note and commit in source_note and folder.rstrip("/") in source_note
    readme = (path / "README.md").read_text()
    assert commit[:12] in readme and "unchanged" in readme and "d1jax's own" not in readme


def test_the_published_config_opens_the_export_under_transformers_5(export):
    path, _ = export
    cfg = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=True)
    assert type(cfg).__name__ == "SDARConfig" and cfg.model_type == "sdar"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim, cfg.block_size,
            cfg.num_key_value_heads, cfg.tie_word_embeddings) == (
        CONFIG.hidden_size, CONFIG.num_hidden_layers, CONFIG.head_dim, CONFIG.block_size,
        CONFIG.num_key_value_heads, CONFIG.tie_word_embeddings)


def test_the_published_model_code_gives_d1jax_logits_under_the_block_causal_mask(
        export, tmp_path):
    path, params = export
    out = str(tmp_path / "run")
    np.save(out + ".ids.npy", IDS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    run = subprocess.run([sys.executable, "-c", OPENER, str(path), out, str(BS)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    info = json.loads(open(out + ".json").read())
    assert info["class"] == "SDARForCausalLM"
    theirs = np.load(out + ".logits.npy")
    ours = np.asarray(sdar.SDAR(CONFIG).apply({"params": params}, jnp.asarray(IDS),
                                             jnp.ones(IDS.shape, jnp.int32)))
    assert ours.shape == theirs.shape == (*IDS.shape, CONFIG.vocab_size)
    assert np.abs(ours).max() > 1.0  # logits of order 1-10, not near 0
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)
    # the block-causal mask matters: a later block's tokens do not reach an earlier block
    changed = IDS.copy()
    changed[:, -BS:] = 3
    ours2 = np.asarray(sdar.SDAR(CONFIG).apply({"params": params}, jnp.asarray(changed),
                                              jnp.ones(IDS.shape, jnp.int32)))
    np.testing.assert_allclose(ours2[:, :-BS], ours[:, :-BS], atol=1e-5)
