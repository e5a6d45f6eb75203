"""The PyTorch reference on bench-tiny: LLaDA's sampler and d1's diffu-GRPO code, unmodified.

    bench/reference/setup.sh REF_DIR                       # once: sources + venv
    REF_DIR/venv/bin/python bench/reference/run.py --ref-dir REF_DIR > ref.json
    REF_DIR/venv/bin/python bench/reference/run.py --ref-dir REF_DIR --sections cycle

Runs in the venv that ``setup.sh`` builds (torch CPU, transformers 4.46.3), never in
d1jax's environment. What runs, each file checked against the blob of its pinned commit
(``REF_DIR/sources.json``) before anything is timed:

- the model: the Hugging Face LLaDA code (``modeling_llada.py``, ``configuration_llada.py``)
  at bench-tiny's sizes, its own initialisation (``init_params``) under torch seed 0, float32;
- ``sampler``: ``generate()`` from LLaDA's ``generate.py`` on 8 prompts of 64 random tokens
  (torch seed 0), gen 128, block 32, 64 steps, temperature 0, low-confidence remasking;
- ``estimator``: d1's ``_get_per_token_logps`` (with its ``forward_process`` and
  ``get_logits``) on the generated [mu, 8, 192] for each of --mus;
- ``update``: d1's ``compute_loss``, backward, gradient clipping at d1's max_grad_norm 0.2
  (the Hugging Face Trainer's step) and ``torch.optim.AdamW`` with d1's settings, mu = 1;
- ``cycle``: one diffu-GRPO iteration as d1's trainer runs it at mu = 4 with full
  fine-tuning: one ``generate()`` of the 8 completions, the old log-probs (policy) and the
  reference log-probs (a frozen copy of the initial model) for all 4 mask seeds, then 4
  updates, each with its iteration's seed and rows (d1 sets ``self._step``).

d1's methods are cut out of ``DiffuGRPOTrainer`` by their syntax tree and executed with
the names their module imports (``set_seed`` is accelerate's; trl's ``profiling_decorator``,
which only logs timings, is the identity) on a stand-in ``self`` holding the attributes
they read (d1's defaults: p_mask_prompt 0.15, beta 0.04, epsilon 0.5, cfg_scale 0, fixed
mask seeds 42). Reward scoring, logging and checkpoints are not timed.

``--device cuda`` runs it all on the GPU (float32, torch's defaults: no TF32 matmuls), each
timed interval closed by ``torch.cuda.synchronize()``.

Prints one JSON object (also written to OUT_DIR/reference.json). OUT_DIR also gets the
weights as a Hugging Face checkpoint (``bench_tiny_hf/``) and ``ref_generate.npz`` (the
prompts and generated ids), so d1jax can run on the same weights and compare tokens.
"""

from __future__ import annotations

import argparse
import ast
import collections
import copy
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
import types

SECTIONS = ("sampler", "estimator", "update", "cycle")
# bench-tiny (d1jax.preset("bench-tiny")): the HF config's fields.
BENCH_TINY = dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden_size=768,
                  vocab_size=8192, embedding_size=8192, mask_token_id=8191,
                  eos_token_id=8190, pad_token_id=8190, max_sequence_length=1024,
                  rope_theta=500000.0, rms_norm_eps=1e-5, block_type="llama",
                  activation_type="silu", layer_norm_type="rms", rope=True,
                  rope_full_precision=True, weight_tying=False, include_bias=False,
                  include_qkv_bias=False, bias_for_layer_norm=False, alibi=False,
                  attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0,
                  flash_attention=False, use_cache=False,
                  model_type="llada", architectures=["LLaDAModelLM"],
                  auto_map={"AutoConfig": "configuration_llada.LLaDAConfig",
                            "AutoModel": "modeling_llada.LLaDAModelLM"})
WORKLOAD = dict(batch=8, prompt_len=64, prompt_vocab=8000, gen_length=128, block_length=32,
                steps=64, temperature=0.0, remasking="low_confidence", seed=0)
# d1's diffu-GRPO defaults (diffu_grpo_config.py, slurm_scripts/train.yaml).
D1 = dict(p_mask_prompt=0.15, beta=0.04, epsilon=0.5, cfg_scale=0.0, mask_seed=42,
          lr=3e-6, betas=(0.9, 0.99), weight_decay=0.1, max_grad_norm=0.2)
D1_METHODS = ("forward_process", "get_logits", "_get_per_token_logps", "compute_loss")


def git_blob(path: str) -> str:
    """The git blob id of a file's bytes (what ``git rev-parse COMMIT:PATH`` prints)."""
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def verified_sources(ref_dir: str) -> list[dict]:
    """sources.json's entries, after checking that every file is its pinned commit's."""
    listing = os.path.join(ref_dir, "sources.json")
    if not os.path.isfile(listing):
        sys.exit(f"no {listing}: build the reference with bench/reference/setup.sh {ref_dir}")
    with open(listing) as f:
        sources = json.load(f)
    for s in sources:
        got = git_blob(os.path.join(ref_dir, s["file"]))
        if got != s["blob"]:
            sys.exit(f"{s['file']} in {ref_dir} differs from {s['path']} at {s['commit']} "
                     f"(blob {got}, pinned {s['blob']}): rerun bench/reference/setup.sh")
    return sources


def load_generate(ref_dir: str):
    spec = importlib.util.spec_from_file_location(
        "llada_generate", os.path.join(ref_dir, "llada", "generate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate


def d1_trainer(ref_dir: str, mu: int):
    """A stand-in trainer whose methods are d1's own source, compiled from its file."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from accelerate.utils import set_seed
    from torch import nn

    path = os.path.join(ref_dir, "d1", "diffu-grpo", "diffu_grpo_trainer.py")
    with open(path) as f:
        source = f.read()
    cls = next(n for n in ast.parse(source).body
               if isinstance(n, ast.ClassDef) and n.name == "DiffuGRPOTrainer")
    lines = source.splitlines(keepends=True)
    names = {"torch": torch, "F": F, "np": np, "nn": nn, "set_seed": set_seed,
             "profiling_decorator": lambda fn: fn}
    methods = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in D1_METHODS:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            text = textwrap.dedent("".join(lines[first - 1:node.end_lineno]))
            exec(compile(text, f"{path}:{first}", "exec"), names)
            methods[node.name] = names[node.name]
    if set(methods) != set(D1_METHODS):
        sys.exit(f"{path} lacks {sorted(set(D1_METHODS) - set(methods))}")
    trainer = type("D1Trainer", (), methods)()
    trainer.args = types.SimpleNamespace(
        p_mask_prompt=D1["p_mask_prompt"], mask_id=BENCH_TINY["mask_token_id"],
        cfg_scale=D1["cfg_scale"], num_iterations=mu, fp16=False)
    trainer.num_iterations, trainer.beta, trainer.epsilon = mu, D1["beta"], D1["epsilon"]
    trainer._step = 0
    trainer.control = types.SimpleNamespace(should_evaluate=False)
    trainer._metrics = {"train": collections.defaultdict(list),
                        "eval": collections.defaultdict(list)}
    trainer.accelerator = types.SimpleNamespace(gather_for_metrics=lambda x: x)
    return trainer


def bench_tiny_model(ref_dir: str, out_dir: str):
    """LLaDA's HF model at bench-tiny's sizes, its own init under torch seed 0; also saved
    with its code to OUT_DIR/bench_tiny_hf."""
    import torch
    from transformers import AutoConfig, AutoModel

    ckpt = os.path.join(out_dir, "bench_tiny_hf")
    os.makedirs(ckpt, exist_ok=True)
    for name in ("modeling_llada.py", "configuration_llada.py"):
        shutil.copyfile(os.path.join(ref_dir, "llada_hf", name), os.path.join(ckpt, name))
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(BENCH_TINY, f, indent=1)
    config = AutoConfig.from_pretrained(ckpt, trust_remote_code=True)
    torch.manual_seed(WORKLOAD["seed"])
    model = AutoModel.from_config(config, trust_remote_code=True, init_params=True,
                                  torch_dtype=torch.float32).float().eval()
    model.save_pretrained(ckpt, safe_serialization=True)
    return model, ckpt


def timed(fn, runs: int, sync=lambda: None) -> list[float]:
    out = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(round(time.perf_counter() - t0, 4))
    return out


def completion_mask(completion_ids, eos_id: int):
    """d1's mask: every token up to and including the first EOS (its trainer's arithmetic)."""
    import torch
    is_eos = completion_ids == eos_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), is_eos.size(1))
    return (torch.arange(is_eos.size(1), device=is_eos.device)[None] <= first[:, None]).int()


class Reference:
    """The model, LLaDA's sampler and d1's methods on the fixed bench-tiny inputs."""

    def __init__(self, ref_dir: str, out_dir: str, device: str = "cpu"):
        import torch
        self.torch, self.device = torch, torch.device(device)
        self.generate_fn = load_generate(ref_dir)
        self.ref_dir = ref_dir
        self.model, self.ckpt = bench_tiny_model(ref_dir, out_dir)
        self.model.to(self.device)
        w = WORKLOAD
        g = torch.Generator().manual_seed(w["seed"])
        self.prompt = torch.randint(0, w["prompt_vocab"], (w["batch"], w["prompt_len"]),
                                    generator=g).to(self.device)

    def sync(self):
        """Waits for the device's queued work (timing on a GPU)."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def generate(self):
        w = WORKLOAD
        return self.generate_fn(self.model, self.prompt, steps=w["steps"],
                                gen_length=w["gen_length"], block_length=w["block_length"],
                                temperature=w["temperature"], cfg_scale=D1["cfg_scale"],
                                remasking=w["remasking"], mask_id=BENCH_TINY["mask_token_id"])

    def logps(self, trainer, model, seq, mu: int):
        """d1's old/ref pass: per-token log-probs [mu, B, C] of seq's completions."""
        with self.torch.no_grad():
            return trainer._get_per_token_logps(model, seq.unsqueeze(0).expand(mu, -1, -1),
                                                WORKLOAD["gen_length"],
                                                [D1["mask_seed"]] * mu)

    def rollout_inputs(self, seq, mu: int, old, ref) -> dict:
        """The dict d1's ``_generate_and_score_completions`` hands to ``compute_loss``."""
        torch, p = self.torch, WORKLOAD["prompt_len"]
        comp = seq[:, p:]
        adv = torch.randn(seq.size(0), generator=torch.Generator().manual_seed(0)).to(seq.device)
        return {"prompt_ids": seq[:, :p], "prompt_mask": torch.ones_like(seq[:, :p]),
                "completion_ids": comp,
                "completion_mask": completion_mask(comp, BENCH_TINY["eos_token_id"]),
                "old_per_token_logps": old if old is not None else [],
                "ref_per_token_logps": ref, "advantages": adv,
                "mask_seeds": [D1["mask_seed"]] * mu}

    def optimizer(self):
        return self.torch.optim.AdamW(self.model.parameters(), lr=D1["lr"], betas=D1["betas"],
                                      weight_decay=D1["weight_decay"])

    def update(self, trainer, opt, inputs, step: int) -> float:
        """One Trainer step: d1's loss, backward, clipping, AdamW."""
        trainer._step = step
        opt.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(self.model, inputs)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), D1["max_grad_norm"])
        opt.step()
        return float(loss.detach())


def generate_once(r: Reference, out_dir: str):
    """The ids [8, 192] the estimator and update run on, which d1jax's exact sampler must
    reproduce (saved with the prompts)."""
    import numpy as np
    w = WORKLOAD
    out = r.generate()
    assert not (out == BENCH_TINY["mask_token_id"]).any(), "masks left after generate()"
    np.savez(os.path.join(out_dir, "ref_generate.npz"), prompt=r.prompt.cpu().numpy(),
             output=out.cpu().numpy(), mask_id=BENCH_TINY["mask_token_id"], steps=w["steps"],
             gen_length=w["gen_length"], block_length=w["block_length"])
    return out


def measure_sampler(r: Reference, runs: int) -> dict:
    w = WORKLOAD
    times = timed(r.generate, runs, r.sync)
    med = statistics.median(times)
    keys = ("batch", "prompt_len", "gen_length", "block_length", "steps", "temperature",
            "remasking")
    return {**{k: w[k] for k in keys}, "times_s": times, "median_s": round(med, 4),
            "generated_tokens_per_s": round(w["batch"] * w["gen_length"] / med, 2)}


def measure_estimator(r: Reference, seq, mus: list[int], runs: int) -> dict:
    res = {"p_mask_prompt": D1["p_mask_prompt"], "input": "the generated ids [mu, 8, 192]"}
    for mu in mus:
        trainer = d1_trainer(r.ref_dir, mu)
        r.logps(trainer, r.model, seq, mu)  # warm-up
        times = timed(lambda: r.logps(trainer, r.model, seq, mu), runs, r.sync)
        res[f"mu{mu}"] = {"times_s": times, "median_s": round(statistics.median(times), 4)}
    return res


def measure_update(r: Reference, seq, runs: int) -> dict:
    """mu = 1 (d1 then uses the detached policy log-probs as the old ones)."""
    trainer = d1_trainer(r.ref_dir, 1)
    inputs = r.rollout_inputs(seq, 1, None, r.logps(trainer, r.model, seq, 1))
    state = copy.deepcopy(r.model.state_dict())
    r.model.train()
    opt = r.optimizer()
    r.update(trainer, opt, inputs, 0)  # warm-up (AdamW allocates its moments)
    times = timed(lambda: r.update(trainer, opt, inputs, 0), runs, r.sync)
    r.model.load_state_dict(state)
    r.model.eval()
    return {"mu": 1, "max_grad_norm": D1["max_grad_norm"], "times_s": times,
            "median_s": round(statistics.median(times), 4)}


def one_cycle(r: Reference, trainer, ref_model, opt, mu: int) -> dict:
    t = {}

    def clock() -> float:
        r.sync()
        return time.perf_counter()

    t0 = clock()
    seq = r.generate()
    t["generate_s"] = clock() - t0
    t0 = clock()
    old = r.logps(trainer, r.model, seq, mu)
    t["old_logps_s"] = clock() - t0
    t0 = clock()
    ref = r.logps(trainer, ref_model, seq, mu)
    t["ref_logps_s"] = clock() - t0
    inputs = r.rollout_inputs(seq, mu, old, ref)
    t0 = clock()
    r.model.train()
    for it in range(mu):
        r.update(trainer, opt, inputs, it)
    r.model.eval()
    t["updates_s"] = clock() - t0
    t["total_s"] = sum(t.values())
    return {k: round(v, 4) for k, v in t.items()}


def warmup_ids(r: Reference):
    """Prompts followed by random completion tokens [8, 192]: warm-up input."""
    torch, w = r.torch, WORKLOAD
    g = torch.Generator().manual_seed(1)
    comp = torch.randint(0, w["prompt_vocab"], (w["batch"], w["gen_length"]), generator=g)
    return torch.cat([r.prompt, comp.to(r.device)], 1)


def measure_cycle(r: Reference, mu: int, runs: int) -> dict:
    """``runs`` timed cycles after an untimed warm-up (one pass and one update: AdamW
    allocates its moments); the model keeps training throughout (the costs do not depend
    on the weights), the reference stays at the initial weights."""
    trainer = d1_trainer(r.ref_dir, mu)
    ref_model = copy.deepcopy(r.model).eval().requires_grad_(False)
    state = copy.deepcopy(r.model.state_dict())
    opt = r.optimizer()
    seq = warmup_ids(r)
    logps = r.logps(trainer, ref_model, seq, mu)
    r.model.train()
    r.update(trainer, opt, r.rollout_inputs(seq, mu, logps, logps), 0)
    r.model.eval()
    cycles = [one_cycle(r, trainer, ref_model, opt, mu) for _ in range(runs)]
    r.model.load_state_dict(state)
    return {"mu": mu, "updates": mu, "completions": WORKLOAD["batch"],
            "max_grad_norm": D1["max_grad_norm"], "cycles": cycles,
            "median_s": {k: round(statistics.median(c[k] for c in cycles), 4)
                         for k in cycles[0]}}


def environment(device: str) -> dict:
    import accelerate
    import numpy
    import torch
    import transformers
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else None
    return {"device": gpu or "cpu", "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "accelerate": accelerate.__version__,
            "numpy": numpy.__version__, "torch_threads": torch.get_num_threads(),
            "cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref-dir", default=os.path.join(tempfile.gettempdir(), "d1jax-ref"),
                   help="what setup.sh built (default: its default, $TMPDIR/d1jax-ref)")
    p.add_argument("--out-dir", help="checkpoint, ids and JSON (default: REF_DIR/out)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--mus", default="1,2,3,4", help="estimator: mask seeds per pass")
    p.add_argument("--gen-runs", type=int, default=3, help="timed generate() calls")
    p.add_argument("--est-runs", type=int, default=5, help="timed estimator calls per mu")
    p.add_argument("--update-runs", type=int, default=5, help="timed updates")
    p.add_argument("--cycle-runs", type=int, default=2, help="timed cycles")
    p.add_argument("--cycle-mu", type=int, default=4, help="mu (updates) of a cycle")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    a = p.parse_args(argv)
    sections = [s for s in a.sections.split(",") if s]
    if set(sections) - set(SECTIONS):
        p.error(f"--sections {a.sections!r}: choose from {','.join(SECTIONS)}")
    out_dir = a.out_dir or os.path.join(a.ref_dir, "out")
    os.makedirs(out_dir, exist_ok=True)
    # trust_remote_code copies the model code into a module cache: keep it in out_dir.
    os.environ.setdefault("HF_MODULES_CACHE", os.path.join(out_dir, ".hf_modules"))
    sources = verified_sources(a.ref_dir)
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)

    r = Reference(a.ref_dir, out_dir, a.device)
    res = {"config": "bench-tiny", "workload": WORKLOAD, "d1": {**D1, "betas": list(D1["betas"])},
           "checkpoint": {"dir": r.ckpt,
                          "n_params": sum(x.numel() for x in r.model.parameters())}}
    if {"sampler", "estimator", "update"} & set(sections):
        seq = generate_once(r, out_dir)  # also the sampler's warm-up
    if "sampler" in sections:
        res["sampler"] = measure_sampler(r, a.gen_runs)
    if "estimator" in sections:
        res["estimator"] = measure_estimator(r, seq, [int(m) for m in a.mus.split(",")],
                                             a.est_runs)
    if "update" in sections:
        res["grpo_update"] = measure_update(r, seq, a.update_runs)
    if "cycle" in sections:
        res["cycle"] = measure_cycle(r, a.cycle_mu, a.cycle_runs)
    res.update(env=environment(a.device), sources=sources)
    text = json.dumps(res, indent=1)
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        f.write(text + "\n")
    print(text)
    return res


if __name__ == "__main__":
    main()
