"""LLaDA2 against inclusionAI's own ``modeling_llada2_moe.py`` in torch on CPU, and a d1jax
export opened with it by transformers (``trust_remote_code``).

Their code is vendored unchanged in ``d1jax/model/hf_remote/llada2/`` (inclusionAI/dFactory
``models/llada2_moe/``; ``SOURCE.md`` there) and shipped beside every export made without a
source directory; nothing is downloaded. ``$D1JAX_LLADA2_MODELING`` may name another folder
holding their two files (e.g. a newer dFactory clone's ``models/llada2_moe``) for the
in-process comparison:

    D1JAX_LLADA2_MODELING=dFactory/models/llada2_moe python -m pytest -q tests/test_llada2_torch.py

Their file imports VeOmni (its fused MoE kernel, parallel state, logging, liger check) and was
written against transformers 4.52; under transformers 5.x it needs stand-ins for exactly
these, installed before it is imported (``STAND_INS``, run in-process and in the subprocess
that opens the export):

- ``veomni.*``: ``is_liger_kernel_available`` -> False (their plain SiLU / RMSNorm / RoPE),
  ``logging`` -> transformers' logging; ``fused_moe_forward`` is never reached, because the
  Hub layout's ``model_type`` "llada2_moe" builds the per-expert ``nn.ModuleList`` and
  ``moe_infer`` (eval mode) the Hub releases run (the merged layout's "llada2_moe_veomni" would
  call VeOmni's kernel: not run here).
- ``transformers.utils.import_utils.is_torch_fx_available`` (gone in 5.x) -> False.
- RoPE type "default" (gone from 5.x's ``ROPE_INIT_FUNCTIONS``) -> 4.x's default: inverse
  frequencies over ``int(head_dim * partial_rotary_factor)`` features, base ``rope_theta``.

Their eager attention is used with the block-causal mask as a [B, 1, L, L] 0/1 tensor (their
``_prepare_4d_causal_attention_mask`` turns it into the additive mask) and positions 0..L-1.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.model import hf_files
from d1jax.model.llada2 import LLaDA2, REMOTE_CODE
from d1jax.model.llada2.weights import SOURCE, load_hf_checkpoint, save_hf_checkpoint
from tests.test_llada2 import IDS, TINY_JSON, hub_state, write_dir

pytest.importorskip("torch")
pytest.importorskip("transformers")

VENDORED = hf_files.remote_code_dir() / "llada2"
THEIRS = Path(os.environ.get("D1JAX_LLADA2_MODELING") or VENDORED)
BLOCK = 4

# Python run before their file is imported (module docstring); exec'd here and in the opener.
STAND_INS = r'''
import importlib.machinery, sys, types
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import import_utils, logging

def default_rope(config, device=None, *_, **__):
    dim = int(config.head_dim * config.partial_rotary_factor)
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64)
                                       .float().to(device) / dim))
    return inv, 1.0

ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)
if not hasattr(import_utils, "is_torch_fx_available"):
    import_utils.is_torch_fx_available = lambda: False

def unreachable(*a, **k):
    raise AssertionError("VeOmni's fused MoE path must not run here")

for name, attrs in [
        ("veomni", {}), ("veomni.ops", dict(causallm_loss_function=unreachable,
                                            fused_moe_forward=unreachable)),
        ("veomni.distributed", {}),
        ("veomni.distributed.parallel_state", dict(get_parallel_state=unreachable)),
        ("veomni.utils", dict(logging=logging)),
        ("veomni.utils.import_utils", dict(is_liger_kernel_available=lambda: False))]:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    sys.modules[name] = module
'''

# Opens an export with AutoModelForCausalLM (trust_remote_code) and saves its logits under
# the block-causal mask; argv: export, output prefix, block.
OPENER = STAND_INS + r'''
import json
import numpy as np
import transformers

path, out, block = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = torch.tensor(np.load(out + ".ids.npy"), dtype=torch.long)
model = transformers.AutoModelForCausalLM.from_pretrained(
    path, trust_remote_code=True, dtype=torch.float32, attn_implementation="eager").eval()
rotary = model.model.rotary_emb  # 5.x builds on the meta device: refill the buffer it skips
with torch.no_grad():
    rotary.inv_freq.copy_(rotary.rope_init_fn(rotary.config, None)[0])
length = ids.shape[1]
blocks = -(-length // block)
keep = (torch.tril(torch.ones(blocks, blocks)).repeat_interleave(block, 0)
        .repeat_interleave(block, 1)[:length, :length][None, None])
with torch.no_grad():
    logits = model(ids, attention_mask=keep, position_ids=torch.arange(length)[None]).logits
np.save(out + ".logits.npy", logits.float().numpy())
json.dump({"class": type(model).__name__, "model_type": model.config.model_type,
           "module": type(model).__module__}, open(out + ".json", "w"))
'''


def _their_package():
    """Their two files imported as a package (the modeling file imports ``.configuration_``)."""
    exec(STAND_INS, {})
    name = "llada2_published"
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(THEIRS)]
    sys.modules[name] = pkg
    conf = importlib.import_module(f"{name}.configuration_llada2_moe")
    model = importlib.import_module(f"{name}.modeling_llada2_moe")
    return conf, model


def _ours(path: Path) -> np.ndarray:
    config, params = load_hf_checkpoint(path)
    ours = LLaDA2(dataclasses.replace(config, block_size=BLOCK))
    return np.asarray(ours.apply({"params": params}, jnp.asarray(IDS)))[0]


def test_logits_match_their_modeling_file(tmp_path):
    import torch
    conf, modeling = _their_package()
    cfg = {k: v for k, v in TINY_JSON.items() if k not in ("auto_map", "architectures")}
    config = conf.LLaDA2MoeConfig(**cfg)
    config.model_type = "llada2_moe"  # the Hub's per-expert experts (module docstring)
    config._attn_implementation = "eager"
    sd = hub_state(TINY_JSON)
    theirs = modeling.LLaDA2MoeModelLM(config).float().eval()
    missing, unexpected = theirs.load_state_dict({k: torch.from_numpy(a) for k, a in sd.items()},
                                                 strict=False)
    assert not unexpected and all(k.endswith("inv_freq") for k in missing), (missing, unexpected)
    L = IDS.shape[1]
    blocks = -(-L // BLOCK)
    keep = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(BLOCK, 0)\
        .repeat_interleave(BLOCK, 1)[:L, :L][None, None]
    with torch.no_grad():
        want = theirs(torch.from_numpy(IDS), attention_mask=keep,
                      position_ids=torch.arange(L)[None]).logits[0].numpy()
    write_dir(tmp_path / "hub", TINY_JSON, sd)
    np.testing.assert_allclose(_ours(tmp_path / "hub"), want, rtol=2e-4, atol=2e-4)


def test_an_export_opens_with_the_published_code_and_gives_d1jax_logits(tmp_path):
    """A random d1jax model exported without a source directory carries the vendored files
    unchanged (with their license header and the commit), and transformers' AutoModelForCausalLM
    opens it with them: logits equal d1jax's."""
    write_dir(tmp_path / "hub", TINY_JSON, hub_state(TINY_JSON, seed=1))
    config, params = load_hf_checkpoint(tmp_path / "hub")
    export = tmp_path / "export"
    save_hf_checkpoint(export, config, params)  # no source_dir: a random init's export
    for name in REMOTE_CODE.files:
        assert (export / name).read_bytes() == (VENDORED / name).read_bytes()
    assert "Licensed under the Apache License, Version 2.0" in (
        VENDORED / "modeling_llada2_moe.py").read_text()
    assert SOURCE[1] in (VENDORED / "SOURCE.md").read_text()
    saved = json.loads((export / "config.json").read_text())
    assert saved["auto_map"] == dict(REMOTE_CODE.auto_map) and saved["model_type"] == "llada2_moe"
    readme = (export / "README.md").read_text()
    assert SOURCE[1][:12] in readme and "unchanged" in readme
    out = str(tmp_path / "run")
    np.save(out + ".ids.npy", IDS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    run = subprocess.run([sys.executable, "-c", OPENER, str(export), out, str(BLOCK)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    info = json.loads(Path(out + ".json").read_text())
    assert (info["class"], info["model_type"]) == ("LLaDA2MoeModelLM", "llada2_moe")
    assert info["module"].endswith("modeling_llada2_moe")  # the export's file, not ours
    got = np.load(out + ".logits.npy")[0]
    np.testing.assert_allclose(got, _ours(export), rtol=2e-4, atol=2e-4)
