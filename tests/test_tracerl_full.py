"""TraceRL on the full-attention families (d1jax/objectives/tracerl_full.py, the "tracerl"
objective on LLaDA and Dream) against a float64 torch port of Gen-Verse/dLLM-RL
``train/rl_llada.py`` / ``train/rl_dream.py`` (tests/dllm_rl_port.py): their rows built from
the rollout's step map (collapse_k_unique over the whole response, one noised copy per
distinct step, post_num), their old log-probs, their forward_process loss (Dream: shifted
logits, its attention mask and positions), on tiny random models with the same weights; loss
and every gradient compared."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from d1jax.model.dream import Dream
from d1jax.model.dream.weights import key_map as dream_key_map
from d1jax.model.dream.weights import load_hf_checkpoint as load_dream
from d1jax.objectives import tracerl, tracerl_full
from d1jax.objectives.table import GRPOConfig
from objective_checks import grpo_batch
from test_blockwise import compare_grads
from test_dream import CFG as DREAM_CFG
from test_dream import hf_state as dream_state
from test_dream import write_hf_dir

torch = pytest.importorskip("torch")
import dllm_rl_port as port  # noqa: E402
from test_objectives_justgrpo import TorchLLaDA  # noqa: E402
from test_tracerl import _grads_and_loss  # noqa: E402

# Compile-bound: compiled unoptimized (tests/conftest.py), seen passing that way.
COMPILE_UNOPTIMIZED = True

L0, L1 = 5, 12


def rows(vocab, pad, prompt_pads=(0, 2, 1, 0), resp_pads=(3, 0, 5, 1), seed=0):
    """Left-padded prompts [B, L0] (and their mask), right-padded responses [B, L1]."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab - 3, (len(prompt_pads), L0 + L1))
    mask = np.ones((len(prompt_pads), L0), np.int32)
    for b, (p, r) in enumerate(zip(prompt_pads, resp_pads)):
        ids[b, :p], mask[b, :p] = pad, 0
        if r:
            ids[b, -r:] = pad
    return ids, mask


def traces(n, seed=1):
    """Block-loop-like traces [n, L1] (blocks of 4): steps rising block by block, two tokens
    a step in some blocks, one in others; every position decoded (LLaDA's and the Dream
    block loop's rollouts fill the whole generation)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, L1), np.int32)
    for b in range(n):
        step = 0
        for blk in range(L1 // 4):
            per = rng.integers(1, 3)
            order = rng.permutation(4)
            out[b, blk * 4 + order] = step + np.arange(4) // per
            step += 8
    return out


def _theirs_to_bc(vals_nt, p_mask_nt, src, offset, n_rows):
    """Their per-row values [N, T] at p_mask, as one number per token [B, L1] (a token is
    scored in one row; 0 in completions they never see); ``offset``: the index of the
    response's first position in T."""
    out = np.zeros((n_rows, L1), np.float32)
    for k, b in enumerate(src):
        sel = p_mask_nt[k, offset:offset + L1].numpy()
        out[b, sel] = vals_nt[k, offset:offset + L1].detach().numpy()[sel]
    return out


def _run_trace(model, params, ids, pmask, adv, h, their_logp, offset):
    """(trace, their rows, their old log-probs, those as [B, L1]) on the same trace;
    ``their_logp(noisy, labels)`` -> ([N, T] log-probs, the p_mask aligned to them). Their
    rows come from the completions with A != 0 only: a group dLLM-RL's rl_reward.py drops
    never reaches their training data."""
    dec = traces(len(ids))
    kept = np.flatnonzero(adv != 0)
    pad = model.config.pad_token_id
    noisy, labels, p_mask, src = port.full_trace_rows(
        torch.tensor(ids[kept]), dec[kept].tolist(), L0, h.shrink, model.config.mask_token_id,
        pad, h.post_num)
    src = kept[src]
    with torch.no_grad():
        lp0, pm = their_logp(noisy, labels, p_mask)
    old = lp0 + torch.tensor(np.random.default_rng(2).normal(0, 0.3, lp0.shape))
    return dec, (noisy, labels, p_mask, src), old, _theirs_to_bc(old, pm, src, offset, len(ids))


def _check(loss, want, grads, model_t, cfg_model, name, key_map=None):
    diffs = (compare_grads(grads, model_t, cfg_model, key_map) if key_map else
             _tree_diff(grads, model_t.grads()))
    diff, scale = diffs
    print(f"{name}: loss {loss:.8g} vs {want:.8g} (abs diff {abs(loss - want):.2g}); grad max "
          f"abs diff {diff:.2g} (max |grad| {scale:.2g})")
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-7)
    assert diff < 1e-5 * max(scale, 1.0)


def _tree_diff(grads, theirs):
    d = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), grads, theirs)
    return max(jax.tree.leaves(d)), max(float(np.abs(b).max()) for b in jax.tree.leaves(theirs))


def _cfg(h):
    return GRPOConfig(objective="tracerl", num_iterations=1, beta=0.0, epsilon=0.2, hparams=h)


# ------------------------------------------------------------------------------ LLaDA

def _llada_parity(model, params, tiny_config, h, adv):
    """(d1jax metrics, prepared rows; their p_mask, old and new log-probs, source rows),
    loss and grads checked against their rl_llada.py forward_process."""
    ids, pmask = rows(tiny_config.vocab_size, tiny_config.pad_token_id)
    model_t = TorchLLaDA(params, tiny_config, torch.float64)

    def their_logp(noisy, labels, p_mask):
        return port.llada_logp(model_t, noisy, labels), p_mask
    dec, (noisy, labels, p_mask, src), old, old_bc = _run_trace(
        model, params, ids, pmask, adv, h, their_logp, L0)
    new = port.llada_logp(model_t, noisy, labels)
    want = port.their_full_rl_loss(new, old, p_mask, adv[src].astype(np.float64), beta=h.beta)
    want.backward()
    batch = grpo_batch(ids[:, :L0], pmask, ids[:, L0:], np.ones((len(ids), L1)), adv).replace(
        per_row={"decoded_at": jnp.asarray(dec)}, old_logps=jnp.asarray(old_bc))
    loss, m, grads, prepared = _grads_and_loss(model, params, _cfg(h), batch)
    _check(loss, want.item(), grads, model_t, tiny_config,
           f"LLaDA shrink={h.shrink} post_num={h.post_num} beta={h.beta} "
           f"A={adv.astype(float).round(2).tolist()}, {len(src)} rows")
    return m, prepared, (p_mask, old, new, src)


@pytest.mark.parametrize("shrink,post_num,beta", [(3, 1, 0.01)])
def test_llada_loss_and_grads_match_their_rl_llada(tiny_model, tiny_params, tiny_config,
                                                   shrink, post_num, beta):
    adv = np.array([1.2, -0.7, 0.4, -1.1], np.float32)
    # rl_llada.py passes no attention mask (padding attended): use_attention_mask False
    h = tracerl.TraceRLConfig(shrink=shrink, post_num=post_num, beta=beta,
                              use_attention_mask=False)
    m, prepared, (_, _, _, src) = _llada_parity(tiny_model, tiny_params, tiny_config, h, adv)
    assert int(np.asarray(prepared.per_row["scale"])[0] * len(src)) == len(adv)  # B / n_rows
    assert 0 < float(m["clip_ratio"]) < 1


@pytest.mark.parametrize("adv", [[0.0, 0.0, 1.0, -1.0], [1.0, 0.0, 0.0, -1.0]],
                         ids=["first_group_dropped", "middle_rows_dropped"])
def test_llada_dropped_groups_are_left_out_as_their_filter_leaves_them(
        tiny_model, tiny_params, tiny_config, adv):
    """Completions of a dropped group (A = 0, zscore_filtered) with the KL to the old policy
    on: loss and grads are their forward_process on the kept completions' copies alone; the
    per-row scale is B / n_rows with their copy count; the tokens scored and the KL metric
    are theirs."""
    adv = np.array(adv, np.float32)
    h = tracerl.TraceRLConfig(shrink=3, post_num=1, beta=0.01, use_attention_mask=False)
    m, prepared, (p_mask, old, new, src) = _llada_parity(tiny_model, tiny_params, tiny_config,
                                                         h, adv)
    b = len(adv)
    np.testing.assert_allclose(np.asarray(prepared.per_row["scale"]), np.full(b, b / len(src)),
                               rtol=1e-6)
    n_tokens = int(p_mask.sum())
    np.testing.assert_allclose(float(m["scored_tokens"]), n_tokens / b, rtol=1e-6)
    d = (new - old).detach()
    kl = ((-d).exp() - 1.0 + d)[p_mask].sum().item() / n_tokens
    np.testing.assert_allclose(float(m["kl"]), kl, rtol=1e-5)


@pytest.mark.parametrize("method", ["coupled"])  # random_masking: its first copy alone
def test_llada_random_variants_match_their_rows(tiny_model, tiny_params, tiny_config, method):
    """random_masking / coupled: the draw made by prepare (one t per row), handed to theirs."""
    model, params = tiny_model, tiny_params
    ids, pmask = rows(tiny_config.vocab_size, tiny_config.pad_token_id)
    adv = np.array([1.0, -0.6, 0.5, -0.2], np.float32)
    h = tracerl.TraceRLConfig(method=method, beta=0.01, use_attention_mask=False)
    batch = grpo_batch(ids[:, :L0], pmask, ids[:, L0:], np.ones((len(ids), L1)), adv)
    loss, _, grads, prepared = _grads_and_loss(model, params, _cfg(h), batch)
    rnd = np.asarray(prepared.per_row["round"])
    model_t = TorchLLaDA(params, tiny_config, torch.float64)
    noisy, labels, p_mask, src = port.full_masked_rows(
        torch.tensor(ids), rnd == 0, L0, tiny_config.mask_token_id, tiny_config.pad_token_id,
        0, method == "coupled")
    new = port.llada_logp(model_t, noisy, labels)
    want = port.their_full_rl_loss(new, new.detach(), p_mask, adv[src].astype(np.float64))
    want.backward()
    _check(loss, want.item(), grads, model_t, tiny_config, f"LLaDA {method}")


def test_random_draw_is_one_t_per_row():
    """Their t ~ U(lower, upper) per copy, each position masked with probability t: the
    masked fraction of a row varies between rows far more than per-position p would."""
    h = tracerl.TraceRLConfig(method="random_masking", lower_p=0.1, upper_p=0.9)
    rnd = np.asarray(tracerl_full.draw_rounds(h, jax.random.key(0), None, (512, 256)))
    frac = (rnd == 0).mean(1)
    assert 0.05 < frac.min() < 0.2 and 0.8 < frac.max() < 0.95
    assert abs(frac.std() - 0.8 / np.sqrt(12)) < 0.03  # t's spread, not a binomial's


# ------------------------------------------------------------------------------ Dream

@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    sd = dream_state(DREAM_CFG, seed=4)
    cfg, params = load_dream(write_hf_dir(tmp_path_factory.mktemp("dream") / "ckpt",
                                          DREAM_CFG, sd))
    return Dream(cfg), params, sd


@pytest.mark.parametrize("their_forward,shrink,post_num", [(True, 1, 0), (False, 2, None)])
def test_dream_loss_and_grads_match_their_rl_dream(dream, their_forward, shrink, post_num):
    """Their forward: shifted logits, prompt pad keys masked, positions 0..L-1. With
    ``their_dream_forward`` on padded prompts; the default (the rollout's positions) on
    unpadded ones, where the two agree."""
    model, params, sd = dream
    c = model.config
    ids, pmask = rows(c.vocab_size, c.pad_token_id,
                      prompt_pads=(0, 2, 1, 3) if their_forward else (0, 0, 0, 0))
    adv = np.array([0.9, -1.3, 0.6, -0.2], np.float32)
    beta = 0.01
    h = tracerl.TraceRLConfig(shrink=shrink, post_num=post_num, beta=beta,
                              their_dream_forward=their_forward)
    model_t = port.TorchSDAR(sd, c)

    def their_logp(noisy, labels, p_mask):
        return port.dream_logp(model_t, noisy, labels, L0, c.pad_token_id), p_mask[:, 1:]
    dec, (noisy, labels, p_mask, src), old, old_bc = _run_trace(
        model, params, ids, pmask, adv, h, their_logp, L0 - 1)
    new = port.dream_logp(model_t, noisy, labels, L0, c.pad_token_id)
    want = port.their_full_rl_loss(new, old, p_mask[:, 1:], adv[src].astype(np.float64),
                                   beta=beta)
    want.backward()
    batch = grpo_batch(ids[:, :L0], pmask, ids[:, L0:], np.ones((len(ids), L1)), adv).replace(
        per_row={"decoded_at": jnp.asarray(dec)}, old_logps=jnp.asarray(old_bc))
    loss, m, grads, _ = _grads_and_loss(model, params, _cfg(h), batch)
    _check(loss, want.item(), grads, model_t, c,
           f"Dream their_forward={their_forward} shrink={shrink} post_num={post_num}, "
           f"{len(src)} rows", dream_key_map)
    assert 0 < float(m["clip_ratio"]) < 1


def test_block_size_or_dreams_forward_on_llada_is_refused(tiny_model):
    with pytest.raises(ValueError, match="no training blocks"):
        tracerl_full.is_full_attention(tiny_model, tracerl.TraceRLConfig(block_size=4))
    with pytest.raises(ValueError, match="not Dream"):
        tracerl_full.is_full_attention(tiny_model,
                                       tracerl.TraceRLConfig(their_dream_forward=True))


@pytest.mark.parametrize("variant,family", [("tiny", "llada"), ("dream,tiny", "dream")])
def test_config_carries_their_yaml_values(variant, family):
    from d1jax.run.spec import from_config
    from tests.config_files import load_config
    c = load_config("configs/tracerl_math.py", variant)
    h = from_config(c, weights=False).grpo.hparams
    assert (c.model.family, h.method, h.shrink, h.post_num, h.beta) == (family, "TraceRL", 8, 0,
                                                                      0.01)
    assert h.use_attention_mask == (family == "dream")  # rl_llada.py passes no mask
