"""docs/benchmarks.md's tables at the released sizes, from the JSON a GPU run left.

    python bench/scale_table.py docs/scale/h100_llada8b.json

The JSON (docs/scale/) holds ``bench/scale.py``'s output (``d1jax``), and where the
reference ran beside it ``bench/reference/scale.py``'s (``reference``) and the numerics of
both, with the device, jax version and commit of the run. Ratios: the reference's seconds
over d1jax's (> 1: d1jax is faster), from the same sitting.
"""

from __future__ import annotations

import json
import sys

CYCLE_PARTS = (("generate_s", "generate ({rows} completions)"),
               ("rollout_logps_s", "old + reference log-probs, mu = {mu}"),
               ("updates_s", "{mu} updates"),
               ("total_s", "**cycle**"))


def _s(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:.1f}"


def cycle_table(run: dict) -> list[str]:
    """Reference vs d1jax per cycle part, exact and fast() rollouts."""
    ours, ref = run["d1jax"], run.get("reference", {}).get("cycle")
    w = ours["workload"]
    cyc = {name: c["rounds"][0] if len(c["rounds"]) == 1 else _median_round(c["rounds"])
           for name, c in ours["cycles"].items()}
    head = "| part | PyTorch reference, s | d1jax exact, s | ratio | d1jax fast(), s | ratio |"
    lines = [head, "|---|---|---|---|---|---|"]
    for key, label in CYCLE_PARTS:
        r = ref["median_s"][key] if ref else None
        cells = [label.format(rows=w["rows"], mu=w["mu"]), _s(r) if r else "n/a"]
        for name in ("exact", "fast"):
            v = cyc.get(name, {}).get(key)
            cells += [_s(v) if v else "n/a",
                      f"{r / v:.2f}x" if (r and v) else "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _median_round(rounds: list[dict]) -> dict:
    import statistics
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]
            if isinstance(rounds[0][k], (int, float))}


def program_table(run: dict) -> list[str]:
    """d1jax's programs: seconds, model FLOPs, MFU, compile cold/warm, XLA temp memory."""
    lines = ["| program | median s | model TFLOP | MFU (bf16 peak) | compile cold, s | "
             "warm cache, s | XLA temp GiB |", "|---|---|---|---|---|---|---|"]
    ours = run["d1jax"]
    for name, p in ours.get("programs", {}).items():
        lines.append(f"| {name} | {_s(p['median_s'])} | {p['tflops_model']:.0f} | "
                     f"{100 * p['mfu']:.1f}% | {p['compile_cold_s']} | {p['compile_warm_s']} | "
                     f"{p['memory'].get('temp_gib', 'n/a')} |")
    if not ours.get("programs"):  # a run cut short: the compile times it reached
        for key, v in ours.items():
            if key.startswith("compile_cold_s."):
                lines.append(f"| {key.split('.', 1)[1]} | n/a | n/a | n/a | {v} | n/a | n/a |")
    return lines


def fast_dllm_line(run: dict) -> str | None:
    ours = run["d1jax"].get("programs", {}).get("generate_fast_dllm")
    ref = run.get("reference", {}).get("fast_dllm")
    if not (ours and ref):
        return None
    return (f"Fast-dLLM's settings (dual cache, threshold 0.9, one prompt, gen "
            f"{run['d1jax']['workload']['gen_length']}): Fast-dLLM's own code "
            f"{ref['tokens_per_s']} tokens/s ({ref['forwards'][0]} forwards), d1jax "
            f"{ours['tokens_per_s']} tokens/s ({ours['forwards'][0]} forwards): "
            f"{ours['tokens_per_s'] / ref['tokens_per_s']:.2f}x.")


def numerics_lines(run: dict) -> list[str]:
    ref = run.get("reference", {}).get("numerics")
    ours = run.get("d1jax_numerics", {}).get("bf16_vs_f32")
    if not (ref and ours):
        return []
    t = ref["torch_bf16_vs_torch_f32"]
    x = ref["d1jax_f32_vs_torch_f32"]
    return ["| logits on the same weights | max abs error | mean abs error | argmax agrees |",
            "|---|---|---|---|",
            f"| d1jax bf16 vs d1jax float32 | {ours['max_abs']:.3g} | {ours['mean_abs']:.3g} | "
            f"{100 * ours['argmax_agree']:.1f}% |",
            f"| modeling_llada.py bf16 vs its float32 | {t['max_abs']:.3g} | {t['mean_abs']:.3g} | "
            f"{100 * t['argmax_agree']:.1f}% |",
            f"| d1jax float32 vs modeling_llada.py float32 | {x['max_abs']:.3g} | "
            f"{x['mean_abs']:.3g} | {100 * x['argmax_agree']:.1f}% |",
            f"(float32 logits' standard deviation {ours['f32_logit_std']:.3g})"]


def render(run: dict) -> str:
    parts = [f"Device: {run['device']}; {run['jax']}; commit {run['commit']}.", ""]
    if "cycles" in run["d1jax"]:
        parts += cycle_table(run) + [""]
    parts += program_table(run) + [""]
    line = fast_dllm_line(run)
    if line:
        parts += [line, ""]
    parts += numerics_lines(run)
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print(render(json.load(f)))
