"""JustGRPO (d1jax/objectives/justgrpo.py) against ports of LeapLabTHU/JustGRPO's code: its
``logprob_loss`` and ``compute_group_advantages`` in torch on a torch LLaDA holding the tiny
d1jax model's weights, its ``generate`` loop (block length 1) in numpy, and the exact
autoregressive log-likelihood in float64; plus the update's memory against gen length."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax import sampling
from d1jax.objectives import advantages as adv_lib
from d1jax.objectives import justgrpo as jg
from d1jax.objectives.table import GRPOConfig
from d1jax.plan import flops
from objective_checks import brute_logps, grpo_batch, training_loss

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

torch = pytest.importorskip("torch")
F = torch.nn.functional


class TorchLLaDA(torch.nn.Module):
    """modeling_llada's llama block stack written in torch from d1jax params (kernels [in, out]
    transposed to torch's [out, in]): RMSNorm, half-split RoPE, bidirectional GQA attention
    (query heads grouped on consecutive kv heads), SwiGLU, untied head."""

    def __init__(self, params, config, dtype=torch.float32):
        super().__init__()
        self.c = config
        t = lambda a: torch.nn.Parameter(torch.tensor(np.asarray(a), dtype=dtype))
        b = params["blocks"]
        self.w = torch.nn.ParameterDict({"wte": t(params["wte"]["embedding"]),
                                         "ln_f": t(params["ln_f"]["weight"]),
                                         "head": t(np.asarray(params["ff_out"]["kernel"]).T)})
        for name, leaf in b.items():
            arr = np.asarray(leaf.get("kernel", leaf.get("weight")))
            self.w[name] = t(arr.swapaxes(1, 2) if arr.ndim == 3 else arr)

    def _norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c.rms_norm_eps) * w

    def forward(self, ids, key_mask=None):
        c, w = self.c, self.w
        n, k, h = c.n_heads, c.n_kv_heads, c.head_dim
        bsz, length = ids.shape
        x = w["wte"][ids]
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, h, 2, dtype=x.dtype) / h))
        fr = torch.arange(length, dtype=x.dtype)[:, None] * inv
        sin, cos = torch.cat([fr, fr], -1).sin(), torch.cat([fr, fr], -1).cos()
        rope = lambda v: v * cos + torch.cat([-v[..., h // 2:], v[..., :h // 2]], -1) * sin
        bias = None if key_mask is None else torch.where(
            key_mask[:, None, None, :].bool(), 0.0, float("-inf")).to(x.dtype)
        for i in range(c.n_layers):
            xn = self._norm(x, w["attn_norm"][i])
            q = rope((xn @ w["q_proj"][i].T).view(bsz, length, n, h).transpose(1, 2))
            kk = rope((xn @ w["k_proj"][i].T).view(bsz, length, k, h).transpose(1, 2))
            v = (xn @ w["v_proj"][i].T).view(bsz, length, k, h).transpose(1, 2)
            kk, v = kk.repeat_interleave(n // k, 1), v.repeat_interleave(n // k, 1)
            att = F.scaled_dot_product_attention(q, kk, v, attn_mask=bias)
            x = x + att.transpose(1, 2).reshape(bsz, length, n * h) @ w["attn_out"][i].T
            xn = self._norm(x, w["ff_norm"][i])
            x = x + (F.silu(xn @ w["ff_proj"][i].T) * (xn @ w["up_proj"][i].T)) @ w["ff_out"][i].T
        return type("Out", (), {"logits": self._norm(x, w["ln_f"]) @ w["head"].T})

    def grads(self):
        """The gradients as d1jax's param tree (numpy)."""
        g = {k: p.grad.detach().numpy() for k, p in self.w.items()}
        blocks = {name: {"weight" if "norm" in name else "kernel":
                         g[name] if "norm" in name else g[name].swapaxes(1, 2)}
                  for name in ("attn_norm", "attn_out", "ff_norm", "ff_out", "ff_proj", "k_proj",
                               "q_proj", "up_proj", "v_proj")}
        return {"blocks": blocks, "ff_out": {"kernel": g["head"].T},
                "ln_f": {"weight": g["ln_f"]}, "wte": {"embedding": g["wte"]}}


def their_group_advantages(rewards, group_size):
    """JustGRPO grpo.py ``compute_group_advantages``."""
    mean = rewards.view(group_size, -1).mean(dim=0).repeat(group_size)
    std = rewards.view(group_size, -1).std(dim=0).repeat(group_size)
    return (rewards - mean) / (std + 1e-4)


def their_logprob_loss(model, inputs, valid_samples, eps=0.2, gain=1.0, temperature=1.,
                       gen_length=256, mask_id=126336, old_logps=None, ref_logps=None,
                       beta=0.0):
    """JustGRPO grpo.py ``logprob_loss`` on one process (``accelerator.gather`` the identity,
    ``accelerator.backward`` plain backward, no CUDA autocast); returns the loss it
    differentiates. ``old_logps`` [B, C] (not in theirs, whose old is the detached current)
    replaces ``token_log_prob.detach()`` in the ratio. ``beta`` with ``ref_logps`` [B, C]
    (not in theirs either) adds d1's per-token KL term, beta (exp(ref - logp) - (ref - logp)
    - 1), d1's ``diffu_grpo_trainer.compute_loss``, to each token's loss before the scale."""
    advantages, generated_ids, prompt_len = (inputs['advantages'], inputs['generated_ids'],
                                             inputs['prompt_len'])
    batch_size = advantages.shape[0]
    prompt_ids, completion_ids = generated_ids[:, :prompt_len], generated_ids[:, prompt_len:]
    valid_samples = valid_samples.float().mean().item()
    scale = gain / gen_length / (valid_samples + 1e-5)
    total = 0.0
    for t in range(gen_length):
        x = torch.cat([prompt_ids, completion_ids[:, :t],
                       torch.full((batch_size, gen_length - t), mask_id, dtype=generated_ids.dtype)],
                      dim=1)
        logits = model(x).logits / temperature
        log_prob = F.log_softmax(logits[:, prompt_len + t, :].float(), dim=-1)
        token_log_prob = log_prob.gather(-1, completion_ids[:, t:t + 1]).squeeze(-1)
        old = token_log_prob.detach() if old_logps is None else old_logps[:, t]
        ratio = (token_log_prob - old).exp()
        clipped_ratio = ratio.clamp(1 - eps, 1 + eps)
        loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
        if beta:
            delta = ref_logps[:, t] - token_log_prob
            loss = loss + beta * (torch.exp(delta) - delta - 1)
        loss.mul(scale).sum().backward()
        total += float(loss.detach().mul(scale).sum())
    return total


def _rows(config, g=4, p=5, c=8, seed=0):
    """One prompt repeated G times (JustGRPO's ``prompt.repeat``), random completions."""
    rs = np.random.RandomState(seed)
    prompt = np.repeat(rs.randint(0, config.vocab_size - 2, (1, p)), g, 0).astype(np.int32)
    comp = rs.randint(0, config.vocab_size - 2, (g, c)).astype(np.int32)
    return prompt, comp


@pytest.mark.parametrize("with_old,beta", [(False, 0.0), (True, 0.0), (True, 0.3)])
def test_loss_and_gradient_match_their_logprob_loss(tiny_model, tiny_params, tiny_config,
                                                    with_old, beta):
    """Loss and gradient equal their ``logprob_loss`` run in torch; with ``beta`` > 0 (which
    theirs does not have) d1's k3 KL to the reference added per token: its value, direction
    (KL(policy || ref), not the reverse) and weight."""
    prompt, comp = _rows(tiny_config)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])  # rows 2, 3: advantage 0, not valid
    adv_t = their_group_advantages(rewards, 4)
    adv = adv_lib.compute("grpo", rewards.numpy(), 4)
    np.testing.assert_allclose(adv, adv_t.numpy(), rtol=1e-6)
    h = jg.JustGRPOConfig(gain=1.0, position_chunk=4)  # one accumulation step's loss
    cfg = GRPOConfig(objective="justgrpo", num_iterations=1 + with_old, beta=beta, epsilon=0.2,
                     hparams=h)
    rows = grpo_batch(prompt, np.ones_like(prompt), comp, np.ones_like(comp), adv)
    old = ref = None
    lp = np.asarray(jg.ar_logps(tiny_model, tiny_params, prompt, comp, position_chunk=8))
    if with_old:  # a later inner iteration: ratios off 1, some clipped
        old = (lp + np.random.RandomState(1).normal(0, 0.3, lp.shape)).astype(np.float32)
        rows = rows.replace(old_logps=jnp.asarray(old))  # the iteration's [B, C]
    if beta:  # a reference away from the policy both ways, so k3's direction matters
        ref = (lp + np.random.RandomState(2).normal(0, 0.8, lp.shape)).astype(np.float32)
        rows = rows.replace(ref_logps=jnp.asarray(ref))

    def loss_of(params):
        from d1jax.objectives.table import OBJECTIVES
        o = OBJECTIVES["justgrpo"]
        prepared = o.prepare(tiny_model, cfg, rows, jax.random.key(0))
        return o.loss(tiny_model, cfg, params, prepared, jnp.zeros((1,), jnp.int32), None)
    (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_of, has_aux=True))(tiny_params)

    model = TorchLLaDA(tiny_params, tiny_config)
    ids = torch.tensor(np.concatenate([prompt, comp], 1), dtype=torch.long)
    valid = (adv_t != 0).sum()
    want = 0.0
    for half in (slice(0, 2), slice(2, 4)):  # train.py: repeat_times chunks of the group
        want += their_logprob_loss(
            model, {"advantages": adv_t[half], "generated_ids": ids[half], "prompt_len": 5},
            valid, gen_length=8, mask_id=tiny_config.mask_token_id,
            old_logps=None if old is None else torch.tensor(old[half]),
            ref_logps=None if ref is None else torch.tensor(ref[half]), beta=beta)
    np.testing.assert_allclose(float(loss), want, rtol=2e-5, atol=1e-7)
    if beta:  # the KL metric: k3 per token in float64, mean over all B x C positions
        k3 = np.exp(ref.astype(np.float64) - lp) - (ref - lp) - 1
        np.testing.assert_allclose(float(metrics["kl"]), k3.mean(), rtol=1e-4)
    diffs = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).max(), grads, model.grads())
    scale = max(np.abs(np.asarray(x)).max() for x in jax.tree.leaves(grads))
    print(f"with_old={with_old}, beta={beta}: loss {float(loss):.6g} vs {want:.6g}; grad max abs diff "
          f"{max(jax.tree.leaves(diffs)):.3g} (max |grad| {scale:.3g})")
    assert max(jax.tree.leaves(diffs)) < 1e-5 * max(scale, 1.0)
    assert float(metrics["valid_rows"]) == 0.5
    if with_old:
        assert 0 < float(metrics["clip_ratio"]) < 1


def test_ar_logps_equal_the_definition_in_float64(tiny_model, tiny_params, tiny_config):
    """log p(o_c | prompt, o_<c, masks) by one full forward per position: numpy float64
    log-softmax of the model's logits, and an independent float64 torch forward; with left
    padding masked out, for every chunk size."""
    rs = np.random.RandomState(3)
    prompt = rs.randint(0, 100, (3, 5)).astype(np.int32)
    pm = np.ones_like(prompt)
    pm[0, :2] = 0
    comp = rs.randint(0, 100, (3, 8)).astype(np.int32)
    attn = np.concatenate([pm, np.ones_like(comp)], 1)
    mask_id = tiny_config.mask_token_id
    model64 = TorchLLaDA(tiny_params, tiny_config, torch.float64)
    want, want64 = np.zeros((3, 8)), np.zeros((3, 8))
    for t in range(8):
        x = np.concatenate([prompt, comp[:, :t], np.full((3, 8 - t), mask_id)], 1)
        want[:, t] = brute_logps(tiny_model, tiny_params, x, comp, attn)[:, t]
        with torch.no_grad():
            lg = model64(torch.tensor(x, dtype=torch.long), torch.tensor(attn)).logits
        want64[:, t] = F.log_softmax(lg[:, 5 + t], -1).gather(
            -1, torch.tensor(comp[:, t:t + 1], dtype=torch.long))[:, 0].numpy()
    np.testing.assert_allclose(want, want64, atol=2e-6)
    for k in (1, 2, 8):
        got = jax.jit(lambda p: jg.ar_logps(tiny_model, p, prompt, comp, attn,
                                            position_chunk=k))(tiny_params)
        np.testing.assert_allclose(np.asarray(got), want64, atol=2e-6)
    with pytest.raises(ValueError, match="position_chunk=3 must divide"):
        jg.ar_logps(tiny_model, tiny_params, prompt, comp, position_chunk=3)


def their_generate(logits_fn, prompt, steps, gen_length, block_length, mask_id):
    """JustGRPO utils/generate.py ``generate`` at temperature 0, low-confidence remasking,
    no CFG, in numpy (float64 softmax), logits from ``logits_fn``."""
    x = np.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, np.int64)
    x[:, :prompt.shape[1]] = prompt
    num_blocks = gen_length // block_length
    steps //= num_blocks
    for nb in range(num_blocks):
        lo, hi = prompt.shape[1] + nb * block_length, prompt.shape[1] + (nb + 1) * block_length
        n_mask = (x[:, lo:hi] == mask_id).sum(1)
        transfer = np.array([[n // steps + (i < n % steps) for i in range(steps)] for n in n_mask])
        for i in range(steps):
            mask_index = x == mask_id
            logits = np.asarray(logits_fn(x), np.float64)
            x0 = logits.argmax(-1)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            x0_p = np.take_along_axis(p, x0[..., None], -1)[..., 0]
            x0_p[:, hi:] = -np.inf
            x0 = np.where(mask_index, x0, x)
            conf = np.where(mask_index, x0_p, -np.inf)
            for j in range(conf.shape[0]):
                sel = np.argsort(-conf[j], kind="stable")[:transfer[j, i]]
                x[j, sel] = x0[j, sel]
    return x


def test_block_length_one_sampler_equals_their_ar_rollout(tiny_model, tiny_params, tiny_config):
    """d1jax's sampler at block length 1, steps = gen length decodes left to right, one token
    a step, as their ``sample``; equal to their loop at temperature 0, fed the model's logits."""
    rs = np.random.RandomState(4)
    prompt = np.repeat(rs.randint(0, 100, (1, 6)), 2, 0).astype(np.int32)
    prompt[1, 0] = 7  # two distinct prompts of one length: no padding (theirs has none)
    gen = 12
    scfg = sampling.SamplerConfig(gen_length=gen, block_length=1, steps=gen, temperature=0.0,
                                  mask_id=tiny_config.mask_token_id)
    out = sampling.make_generate_fn(sampling.model_apply_fn(tiny_model), scfg)(
        tiny_params, jnp.asarray(prompt), None, jax.random.key(0))
    fwd = jax.jit(lambda ids: tiny_model.apply({"params": tiny_params}, ids))
    want = their_generate(lambda x: fwd(jnp.asarray(x, jnp.int32)), prompt, gen, gen, 1,
                          tiny_config.mask_token_id)
    np.testing.assert_array_equal(np.asarray(out.ids), want)
    np.testing.assert_array_equal(np.asarray(out.decoded_at), np.tile(np.arange(gen), (2, 1)))


def _update_temp_bytes(model, params, completion, chunk, prompt_len=32):
    rs = np.random.RandomState(0)
    prompt = rs.randint(0, 100, (2, prompt_len)).astype(np.int32)
    comp = rs.randint(0, 100, (2, completion)).astype(np.int32)
    batch = grpo_batch(prompt, np.ones_like(prompt), comp, np.ones_like(comp), [1.0, -1.0])
    cfg = GRPOConfig(objective="justgrpo", num_iterations=1, beta=0.0, epsilon=0.2,
                     hparams=jg.JustGRPOConfig(position_chunk=chunk))
    grad = jax.jit(jax.grad(lambda p: training_loss(model, cfg, p, batch, 0)[0]))
    return grad.lower(params).compile().memory_analysis().temp_size_in_bytes


def test_update_memory_is_one_chunk_whatever_the_gen_length(tiny_model, tiny_params):
    """XLA's temp bytes of the update's gradient at gen 16 and 64 (prompt 32): with 4
    positions a chunk they grow as one forward's at the longer sequence (L 48 -> 96), not
    with the positions; all 64 positions in one forward (chunk = C) take far more."""
    chunked = [_update_temp_bytes(tiny_model, tiny_params, c, 4) for c in (16, 64)]
    whole = _update_temp_bytes(tiny_model, tiny_params, 64, 64)
    print(f"temp bytes gen 16 -> 64: chunk 4 {chunked}; gen 64 in one forward {whole}")
    # (measured: 1.76 MB -> 3.96 MB; one forward 8.1 MB at gen 16, 94 MB at gen 64)
    assert chunked[1] / chunked[0] < 3.0 and chunked[1] < whole / 8


def test_flop_count_of_the_ar_likelihood(tiny_config):
    """C forwards of P + C tokens per row, the head on one position each; with peeled ends
    the last layer runs the chunk's K rows of each copy."""
    b, p, c = 2, 10, 8
    got = flops.ar_estimator(tiny_config, b, p, c, chunk=4, peeled=False)
    one = flops.forward(tiny_config, b, p + c, p + c, 1)
    assert got.total == pytest.approx(c * one.total)
    assert got.head == 2.0 * b * c * tiny_config.d_model * tiny_config.vocab_size
    peeled = flops.ar_estimator(tiny_config, b, p, c, chunk=4)
    assert peeled.total < got.total
    d1 = flops.estimator(tiny_config, b, p, c)
    assert got.total > (c - 1) * d1.total
    g = GRPOConfig(objective="justgrpo", num_iterations=1, beta=0.0)
    assert flops.estimator_rows(g, completion=c) == c
    with pytest.raises(ValueError, match="completion"):
        flops.estimator_rows(g)


def test_config_carries_train_py_values_and_tiny_runs(tmp_path):
    from d1jax.run import spec as spec_lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from configs import justgrpo_gsm8k
    c = justgrpo_gsm8k.get_config()
    s = c.sampler
    assert (s.gen_length, s.steps, s.block_length, s.temperature) == (256, 256, 1, 1.0)
    g = c.grpo
    assert (g.num_generations, g.prompts_per_step, g.num_iterations, g.beta, g.epsilon,
            g.advantage) == (16, 64, 1, 0.0, 0.2, "grpo")
    o = c.optim
    assert (o.learning_rate, o.b2, o.weight_decay, o.max_grad_norm, o.warmup_ratio) == (
        5e-6, 0.999, 0.0, 1.0, 0.0)
    assert not c.lora.enabled and c.train.num_steps == 125
    tiny = justgrpo_gsm8k.get_config("tiny")
    spec = spec_lib.from_config(tiny)
    assert isinstance(spec.grpo.hparams, jg.JustGRPOConfig)
    assert spec.grpo.hparams.position_chunk is None  # knob 0: chosen by the token budget
    changed = justgrpo_gsm8k.get_config("tiny")
    changed.grpo.justgrpo.gain, changed.grpo.justgrpo.position_chunk = 3.0, 2  # not defaults
    h = spec_lib.from_config(changed).grpo.hparams
    assert (h.gain, h.position_chunk) == (3.0, 2)  # JustGRPOConfig: 8.0, None
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(
        {"question": f"Tom has {i} apples and buys 3 more. How many now?",
         "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"}) for i in range(16)) + "\n")
    r = subprocess.run([sys.executable, "-m", "d1jax.main",
                        "--config=configs/justgrpo_gsm8k.py:tiny", f"--workdir={tmp_path / 'run'}",
                        f"--config.task.source={data}", "--config.train.num_steps=2",
                        "--config.train.export_hf=False"], cwd=Path(__file__).resolve().parents[1],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 2 and all(np.isfinite(x["loss"]) and "ar_logp" in x for x in rows)
    assert all(x["completion_length"] <= 16 and x["ratio_mean"] == 1.0 for x in rows)
