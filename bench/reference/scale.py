"""The PyTorch reference at LLaDA-8B's size: d1's GSM8K GRPO cycle and Fast-dLLM's generation.

    bench/reference/setup.sh REF_DIR                                 # once: sources + venv
    REF_DIR/venv/bin/python bench/reference/scale.py --ref-dir REF_DIR --device cuda \
        --numerics NUMERICS_DIR --out ref_scale.json                 # one GPU
    REF_DIR/venv/bin/python bench/reference/scale.py --ref-dir REF_DIR --tiny   # CPU check

Beside ``bench/scale.py`` (d1jax's side, same machine, same sitting). Runs in the
reference's venv (torch, transformers 4.46.3, peft), never in d1jax's environment; each
source file is checked against its pinned commit first (``run.verified_sources``).

- The model: LLaDA's Hugging Face code (``modeling_llada.py``) at LLaDA-8B-Instruct's
  config.json sizes, bf16 (``--tiny``: bench-tiny's), every weight filled by the counter
  hash d1jax's side computes bit for bit (``hashed``; norms 1), so both hold the same bf16
  weights.
- ``numerics`` (with --numerics DIR, where ``bench/scale.py --numerics`` saved d1jax's
  logits): the bf16 forward and the float32 forward (the same weights upcast, no TF32) of
  the same input; each side's bf16 error against its own float32, and the two float32
  forwards against each other.
- ``cycle``: d1's LoRA setup (PEFT, r 128, alpha 64, dropout 0.05, its target list: on
  LLaDA's module names q/k/v/up_proj), LLaDA's ``generate()`` of G = 6 completions of gen
  256 in blocks of 32 with 128 steps at temperature 0 from 200-token prompts, d1's
  ``_get_per_token_logps`` for the old (adapters on) and reference (``disable_adapter()``)
  log-probs of all mu = 12 seeds, then 12 updates: d1's ``compute_loss``, backward,
  clipping at 0.2, AdamW (d1's settings) on the adapters. The base stays bf16: d1 loads
  it in 4-bit NF4 (bitsandbytes, not on this machine), which costs more time, not less.
- ``pair`` (with --pair DIR, where ``bench/scale.py --pair`` saved its inputs): d1's first
  update's loss and adapter gradient norm on d1jax's batch, hashed adapters and prompt mask
  (``pair``), beside d1jax's.
- ``fast_dllm``: Fast-dLLM's own ``generate_with_dual_cache`` (its modeling code, threshold
  0.9) on one prompt (its loop is written for batch 1), gen 256, block 32.

Prints one JSON object (also written to --out after every section).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as ref  # noqa: E402  (bench/reference/run.py: sources, d1's methods)

LLADA_8B = {**ref.BENCH_TINY, "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32,
            "mlp_hidden_size": 12288, "vocab_size": 126464, "embedding_size": 126464,
            "mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081,
            "max_sequence_length": 4096}
WORKLOAD = dict(rows=6, prompt=200, gen_length=256, block_length=32, steps=128, mu=12)
TINY = dict(rows=2, prompt=16, gen_length=32, block_length=16, steps=16, mu=2)
LORA = dict(r=128, lora_alpha=64, lora_dropout=0.05,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj",
                            "gate_proj"])  # diffu_grpo_train.py
HASH_STD = 0.02
NUMERICS_IDS = dict(batch=1, length=128, seed=3)  # bench/scale.py's


def hashed(shape, seed: int, device, scale: float = HASH_STD * 12 ** 0.5):
    """bench/scale.py's ``hashed`` in torch: uint32 arithmetic done in int64 and masked."""
    import torch
    m = 0xFFFFFFFF
    n = 1
    for s in shape:
        n *= s
    h = (torch.arange(n, dtype=torch.int64, device=device) * 2654435761 + seed * 97531) & m
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & m
    h = h ^ (h >> 16)
    u = (h >> 8).to(torch.float32) / float(2 ** 24) - 0.5
    return (u * torch.tensor(scale, dtype=torch.float32)).reshape(shape)


def fill_hashed(model, prefix: str = "") -> None:
    """Every weight of a LLaDA model (HF names, ``prefix`` stripped) from ``hashed``."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = name[len(prefix):] if prefix and name.startswith(prefix) else name
            if key.endswith("norm.weight") or key.endswith("ln_f.weight"):
                p.fill_(1.0)
            else:
                p.copy_(hashed(tuple(p.shape), zlib.crc32(key.encode()), p.device).to(p.dtype))


def hf_model(config: dict, ref_dir: str, out_dir: str, device, dtype):
    """LLaDA's HF model (its remote code) of ``config``, weights uninitialised until hashed."""
    import torch
    from transformers import AutoConfig, AutoModel
    from transformers.modeling_utils import no_init_weights
    ckpt = os.path.join(out_dir, "llada_hf_config")
    os.makedirs(ckpt, exist_ok=True)
    for name in ("modeling_llada.py", "configuration_llada.py"):
        with open(os.path.join(ref_dir, "llada_hf", name)) as f, \
                open(os.path.join(ckpt, name), "w") as g:
            g.write(f.read())
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    cfg = AutoConfig.from_pretrained(ckpt, trust_remote_code=True)
    with no_init_weights():
        model = AutoModel.from_config(cfg, trust_remote_code=True, torch_dtype=dtype)
    model = model.to(device)
    fill_hashed(model)
    return model.eval()


def fast_dllm_model(config: dict, ref_dir: str, device, dtype):
    """Fast-dLLM's LLaDA model class (its modeling code, with the dual cache)."""
    import torch
    from transformers.modeling_utils import no_init_weights
    sys.path.insert(0, os.path.join(ref_dir, "fastdllm", "llada"))
    from model.configuration_llada import LLaDAConfig  # Fast-dLLM's package
    from model.modeling_llada import LLaDAModelLM
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            model = LLaDAModelLM(LLaDAConfig(**config))
    finally:
        torch.set_default_dtype(previous)
    model = model.to(device)
    fill_hashed(model)
    return model.eval()


def load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Out:
    def __init__(self, path: str | None, head: dict):
        self.path, self.data = path, head

    def put(self, key, value):
        self.data[key] = value
        print(f"[reference-scale] {key}: {json.dumps(value)[:400]}", file=sys.stderr, flush=True)
        if self.path:
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.data, f, indent=1)
            os.replace(self.path + ".tmp", self.path)


def numerics(model, config: dict, device, ndir: str) -> dict:
    """bf16 and float32 logits of the shared input; against d1jax's saved ones."""
    import numpy as np
    import torch
    n = NUMERICS_IDS
    ids = np.random.RandomState(n["seed"]).randint(0, config["vocab_size"] - 2,
                                                   (n["batch"], n["length"]))
    x = torch.as_tensor(ids, device=device)
    with torch.no_grad():
        lb = model(x).logits.float().cpu().numpy()
        model.float()
        lf = model(x).logits.float().cpu().numpy()
        model.to(torch.bfloat16)
    out = {"torch_bf16_vs_torch_f32": _err(lb, lf)}
    for name in ("d1jax_bf16", "d1jax_f32"):
        path = os.path.join(ndir, name + ".npy")
        if os.path.isfile(path):
            out[f"{name}_vs_torch_f32"] = _err(np.load(path), lf)
    return out


def _err(a, b) -> dict:
    import numpy as np
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).mean())}


def cycle(model, ref_dir: str, config: dict, w: dict, device, rounds: int, sync) -> dict:
    """d1's cycle with PEFT LoRA on the bf16 base; ``rounds`` timed after one warm-up."""
    import torch
    from peft import LoraConfig, get_peft_model
    generate = ref.load_generate(ref_dir)
    trainer = ref.d1_trainer(ref_dir, w["mu"])
    trainer.args.mask_id = config["mask_token_id"]
    lora = dict(LORA, r=8, lora_alpha=16) if w is TINY else LORA
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=ref.D1["lr"], betas=ref.D1["betas"],
                            weight_decay=ref.D1["weight_decay"])
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, config["eos_token_id"] - 1, (w["rows"], w["prompt"]),
                           generator=g).to(device)
    seeds = [ref.D1["mask_seed"]] * w["mu"]

    def clock():
        sync()
        return time.perf_counter()

    rows = []
    for r in range(rounds + 1):
        t = {}
        t0 = clock()
        model.eval()
        with torch.no_grad():
            seq = generate(model, prompt, steps=w["steps"], gen_length=w["gen_length"],
                           block_length=w["block_length"], temperature=0.0,
                           cfg_scale=0.0, remasking="low_confidence",
                           mask_id=config["mask_token_id"])
        t["generate_s"] = clock() - t0
        t0 = clock()
        x = seq.unsqueeze(0).expand(w["mu"], -1, -1)
        with torch.no_grad():
            old = trainer._get_per_token_logps(model, x, w["gen_length"], seeds)
            with model.disable_adapter():
                reflp = trainer._get_per_token_logps(model, x, w["gen_length"], seeds)
        t["rollout_logps_s"] = clock() - t0
        comp = seq[:, w["prompt"]:]
        inputs = {"prompt_ids": seq[:, :w["prompt"]],
                  "prompt_mask": torch.ones_like(seq[:, :w["prompt"]]),
                  "completion_ids": comp,
                  "completion_mask": ref.completion_mask(comp, config["eos_token_id"]),
                  "old_per_token_logps": old, "ref_per_token_logps": reflp,
                  "advantages": torch.randn(w["rows"], generator=g).to(device),
                  "mask_seeds": seeds}
        t0 = clock()
        model.train()
        losses = []
        for it in range(w["mu"]):
            trainer._step = it
            opt.zero_grad(set_to_none=True)
            loss = trainer.compute_loss(model, inputs)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], ref.D1["max_grad_norm"])
            opt.step()
            losses.append((float(loss.detach()), float(norm)))
        t["updates_s"] = clock() - t0
        t["total_s"] = sum(t.values())
        t["first_update_loss_grad_norm"] = losses[0]
        if r:
            rows.append({k: (round(v, 4) if isinstance(v, float) else v) for k, v in t.items()})
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    return {"rounds": rows, "median_s": {k: round(statistics.median(c[k] for c in rows), 4)
                                         for k in ("generate_s", "rollout_logps_s",
                                                   "updates_s", "total_s")},
            "peak_gib": peak and round(peak, 3),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def pair(model, ref_dir: str, config: dict, w: dict, device, pdir: str) -> dict:
    """d1's first update (``compute_loss``, backward, the adapters' gradient norm before
    clipping) on ``bench/scale.py --pair``'s inputs: the same hashed adapters (dropout 0),
    batch and prompt mask (handed to d1's ``forward_process`` in place of its draw)."""
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    z = np.load(os.path.join(pdir, "pair.npz"))
    trainer = ref.d1_trainer(ref_dir, w["mu"])
    trainer.args.mask_id = config["mask_token_id"]
    seed = int(z["mask_seed"])
    masked = torch.as_tensor(z["prompt_masked"], device=device)

    def forward_process(batch, prompt_index, mask_id, seed=None, _own=seed):
        if seed != _own:
            raise ValueError(f"mask seed {seed}: the pair holds {_own}'s mask only")
        b, l = batch.shape
        is_mask = torch.zeros((b, l), dtype=torch.bool, device=batch.device)
        is_mask[:, :masked.shape[1]] = masked
        is_mask |= ~prompt_index
        return torch.where(is_mask, mask_id, batch), None  # p_mask: unread by the estimator
    trainer.forward_process = forward_process
    lora = dict(LORA, r=8, lora_alpha=16) if w is TINY else dict(LORA)
    lora["lora_dropout"] = 0.0
    pm = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                key = name.removeprefix("base_model.model.").removesuffix(".default.weight")
                p.copy_(hashed(tuple(p.shape), zlib.crc32(key.encode()), p.device).to(p.dtype))
    t = {k: torch.as_tensor(z[k], device=device) for k in
         ("prompt_ids", "completion_ids", "completion_mask", "advantages")}
    t["prompt_ids"], t["completion_ids"] = t["prompt_ids"].long(), t["completion_ids"].long()
    x = torch.cat([t["prompt_ids"], t["completion_ids"]], 1).unsqueeze(0)
    gen = t["completion_ids"].shape[1]
    pm.eval()
    with torch.no_grad():
        old = trainer._get_per_token_logps(pm, x, gen, [seed])
        with pm.disable_adapter():
            reflp = trainer._get_per_token_logps(pm, x, gen, [seed])
    inputs = {"prompt_ids": t["prompt_ids"], "prompt_mask": torch.ones_like(t["prompt_ids"]),
              "completion_ids": t["completion_ids"], "completion_mask": t["completion_mask"],
              "old_per_token_logps": old, "ref_per_token_logps": reflp,
              "advantages": t["advantages"], "mask_seeds": [seed]}
    pm.train()
    trainer._step = 0
    loss = trainer.compute_loss(pm, inputs)
    loss.backward()
    params = [p for p in pm.parameters() if p.requires_grad]
    norm = float(torch.nn.utils.clip_grad_norm_(params, ref.D1["max_grad_norm"]))
    cm = z["completion_mask"].astype(bool)
    d = np.abs(reflp[0].float().cpu().numpy() - z["ref_logps"])[cm]
    out = {"mask_seed": seed, "trainable_params": sum(p.numel() for p in params),
           "reference": {"loss": float(loss.detach()), "grad_norm": norm},
           "d1jax": {"loss": float(z["loss"]), "grad_norm": float(z["grad_norm"])},
           "ref_logps_abs_diff": {"max": float(d.max()), "mean": float(d.mean())},
           "ref_logps_mean": float(reflp[0].float().cpu().numpy()[cm].mean())}
    out["rel_diff"] = {k: abs(out["d1jax"][k] - out["reference"][k])
                       / max(abs(out["reference"][k]), 1e-12) for k in ("loss", "grad_norm")}
    pm.zero_grad(set_to_none=True)
    pm.unload()
    return out


def fast_dllm(model, ref_dir: str, config: dict, w: dict, device, rounds: int, sync) -> dict:
    import torch
    fd = load_module(os.path.join(ref_dir, "fastdllm", "llada", "generate.py"),
                     "fastdllm_generate")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, config["eos_token_id"] - 1, (1, w["prompt"]), generator=g).to(device)
    times, nfes = [], []
    for r in range(rounds + 1):
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            _, nfe = fd.generate_with_dual_cache(
                model, prompt, steps=w["steps"], gen_length=w["gen_length"],
                block_length=w["block_length"], temperature=0.0, remasking="low_confidence",
                mask_id=config["mask_token_id"], threshold=0.9)
        sync()
        if r:
            times.append(time.perf_counter() - t0)
            nfes.append(int(nfe))
    med = statistics.median(times)
    return {"batch": 1, "threshold": 0.9, "times_s": [round(t, 4) for t in times],
            "median_s": round(med, 4), "forwards": nfes,
            "tokens_per_s": round(w["gen_length"] / med, 1)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref-dir", required=True, help="what setup.sh built")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tiny", action="store_true", help="bench-tiny sizes (a CPU check)")
    p.add_argument("--rounds", type=int, default=1, help="timed cycles after a warm-up")
    p.add_argument("--sections", default="numerics,cycle,fast_dllm")
    p.add_argument("--numerics", metavar="DIR", help="where bench/scale.py saved its logits")
    p.add_argument("--pair", metavar="DIR", help="where bench/scale.py --pair saved its inputs "
                   "(the pair section runs when given)")
    p.add_argument("--out", help="JSON, rewritten after every section")
    a = p.parse_args(argv)
    out_dir = os.path.join(a.ref_dir, "out")
    os.makedirs(out_dir, exist_ok=True)
    os.environ.setdefault("HF_MODULES_CACHE", os.path.join(out_dir, ".hf_modules"))
    sources = ref.verified_sources(a.ref_dir)
    import torch
    device = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    config, w = (ref.BENCH_TINY, TINY) if a.tiny else (LLADA_8B, WORKLOAD)
    sections = a.sections.split(",")
    res = Out(a.out, {"model": "bench-tiny" if a.tiny else "llada-8b", "workload": w,
                      "lora": LORA, "env": ref.environment(a.device), "sources": sources})
    t0 = time.perf_counter()
    model = hf_model(config, a.ref_dir, out_dir, device, torch.bfloat16)
    res.put("init_s", round(time.perf_counter() - t0, 2))
    if "numerics" in sections and a.numerics:
        res.put("numerics", numerics(model, config, device, a.numerics))
    if a.pair:
        res.put("pair", pair(model, a.ref_dir, config, w, device, a.pair))
    if "cycle" in sections:
        res.put("cycle", cycle(model, a.ref_dir, config, w, device, a.rounds, sync))
    if "fast_dllm" in sections:
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        model = fast_dllm_model(config, a.ref_dir, device, torch.bfloat16)
        res.put("fast_dllm", fast_dllm(model, a.ref_dir, config, w, device, a.rounds, sync))
    print(json.dumps(res.data, indent=1))
    return res.data


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
