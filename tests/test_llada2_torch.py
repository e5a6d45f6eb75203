"""LLaDA2 logits against inclusionAI's own ``modeling_llada2_moe.py`` in torch on CPU.

Their code is not vendored in d1jax (issue 58). The test runs when ``$D1JAX_LLADA2_MODELING``
names a folder holding their ``modeling_llada2_moe.py`` and ``configuration_llada2_moe.py``
(inclusionAI/dFactory ``models/llada2_moe/``, read as published); it is skipped otherwise, and
nothing is downloaded. For example, from a clone of dFactory:

    D1JAX_LLADA2_MODELING=dFactory/models/llada2_moe python -m pytest -q tests/test_llada2_torch.py

dFactory's file imports VeOmni (its fused MoE kernel, parallel state, logging, liger check) and
was written against transformers 4.52; under transformers 5.x it needs stand-ins for exactly
these, installed here before it is imported:

- ``veomni.*``: ``is_liger_kernel_available`` -> False (their plain SiLU / RMSNorm / RoPE),
  ``logging`` -> transformers' logging; ``fused_moe_forward`` is never reached, because the
  config's ``model_type`` is set to the Hub's "llada2_moe", which builds the per-expert
  ``nn.ModuleList`` and ``moe_infer`` (eval mode) the Hub releases run.
- ``transformers.utils.import_utils.is_torch_fx_available`` (gone in 5.x) -> False.
- RoPE type "default" (gone from 5.x's ``ROPE_INIT_FUNCTIONS``) -> 4.x's default: inverse
  frequencies over ``int(head_dim * partial_rotary_factor)`` features, base ``rope_theta``.

Their eager attention is used with the block-causal mask as a [1, 1, L, L] 0/1 tensor (their
``_prepare_4d_causal_attention_mask`` turns it into the additive mask) and positions 0..L-1.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import types
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.model.llada2 import LLaDA2
from d1jax.model.llada2.weights import load_hf_checkpoint
from tests.test_llada2 import IDS, TINY_JSON, hub_state, write_dir

SOURCE = os.environ.get("D1JAX_LLADA2_MODELING")
pytestmark = pytest.mark.skipif(
    not SOURCE or not (Path(SOURCE) / "modeling_llada2_moe.py").is_file(),
    reason="set D1JAX_LLADA2_MODELING to a folder with their modeling_llada2_moe.py")


def _stand_ins() -> None:
    """The modules and registry entries their file needs that transformers 5.x / a CPU box
    lack (module docstring)."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.utils import import_utils, logging

    def default_rope(config, device=None, *_):
        dim = int(config.head_dim * config.partial_rotary_factor)
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64)
                                           .float().to(device) / dim))
        return inv, 1.0
    ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)
    if not hasattr(import_utils, "is_torch_fx_available"):
        import_utils.is_torch_fx_available = lambda: False

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m
    def unreachable(*a, **k):
        raise AssertionError("VeOmni's fused MoE path must not run here")
    module("veomni")
    module("veomni.ops", causallm_loss_function=unreachable, fused_moe_forward=unreachable)
    module("veomni.distributed")
    module("veomni.distributed.parallel_state", get_parallel_state=unreachable)
    module("veomni.utils", logging=logging)
    module("veomni.utils.import_utils", is_liger_kernel_available=lambda: False)


def _their_package():
    """Their two files imported as a package (the modeling file imports ``.configuration_``)."""
    _stand_ins()
    name = "llada2_published"
    spec = importlib.util.spec_from_file_location(
        name, Path(SOURCE) / "__init__.py" if (Path(SOURCE) / "__init__.py").is_file() else None,
        submodule_search_locations=[SOURCE])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    conf = importlib.import_module(f"{name}.configuration_llada2_moe")
    model = importlib.import_module(f"{name}.modeling_llada2_moe")
    return conf, model


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
    block = 4
    L = IDS.shape[1]
    blocks = -(-L // block)
    keep = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(block, 0)\
        .repeat_interleave(block, 1)[:L, :L][None, None]
    with torch.no_grad():
        want = theirs(torch.from_numpy(IDS), attention_mask=keep,
                      position_ids=torch.arange(L)[None]).logits[0].numpy()
    write_dir(tmp_path / "hub", TINY_JSON, sd)
    ours_config, params = load_hf_checkpoint(tmp_path / "hub")
    ours = LLaDA2(dataclasses.replace(ours_config, block_size=block))
    got = np.asarray(ours.apply({"params": params}, jnp.asarray(IDS)))[0]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
