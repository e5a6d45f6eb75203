"""The sampler's static configuration and the step schedule it implies."""

from __future__ import annotations

import numpy as np

from d1jax.knobs import frozen, knob

REMASKING = ("low_confidence", "random")
# loop="sdar" (block diffusion, ``d1jax.sampling.block_diffusion``): the authors' names.
BLOCK_REMASKING = ("low_confidence_static", "low_confidence_dynamic")
KV_CACHES = ("none", "prefix", "dual")
RECOMPUTE = ("block", "masked")
PARALLEL_RULES = ("budget", "fast_dllm", "dinfer")
POST_EDIT_STEPS = 16  # SGLang JointThreshold's max_post_edit_steps default
LOOPS = ("llada", "dream", "sdar")
FAST_DEFAULTS = dict(kv_cache="dual", threshold=0.99, cache_refresh=8)


def num_transfer_tokens(block_length: int, steps: int) -> np.ndarray:
    """Tokens unmasked per step for a fully masked block: [steps], remainder first."""
    base, rem = divmod(block_length, steps)
    return np.array([base + (i < rem) for i in range(steps)], np.int32)


@frozen
class SamplerConfig:
    """Static knobs of the sampler (frozen and hashable: a static jit argument). Each knob is
    declared here once: ``config.sampler`` is made from these fields (``d1jax.config``). The
    defaults are d1's evaluation's (128 tokens, 64 steps, greedy); the GRPO configs' rollouts
    set d1's train.yaml values (``d1jax.config.defaults.sampler_fields``)."""

    gen_length: int = knob(128, "Completion length (max_completion_length).", tiny=32, low=1)
    steps: int = knob(64, "Diffusion steps over the whole completion (diffusion_steps); "
                      "steps // num_blocks a block (at least 1).", tiny=16, low=1)
    block_length: int = knob(32, "Semi-autoregressive block length (d1: 32); must divide "
                             "gen_length.", tiny=16, low=1)
    temperature: float = knob(0.0, "Gumbel-max temperature T: 0, argmax (d1's evaluation); "
                              "rollouts: 0.9, d1's DiffuGRPOConfig default.")
    cfg_scale: float = knob(0.0, "Classifier-free guidance scale w (> 0 adds a prompt-masked "
                            "pass).")
    remasking: str = knob("low_confidence", '"low_confidence" or "random"; loop "sdar": '
                          '"low_confidence_static" or "low_confidence_dynamic" (threshold).')
    use_attention_mask: bool = knob(True, "Honour prompt padding; False attends to padding "
                                    "like d1.")
    kv_cache: str = knob("none", '"none" (exact, d1\'s protocol), "prefix" or "dual" block KV '
                         "cache (Fast-dLLM).")
    # loop="sdar": low_confidence_dynamic's threshold (the authors use 0.9).
    threshold: float = knob(1.0, "Parallel decoding: also unmask every token with confidence "
                            "> tau (>= 1: off).")
    # "fast_dllm": a block runs until decoded, <= block_length steps (get_transfer_index).
    # "dinfer": d1jax.sampling.threshold (dInfer's ThresholdParallelDecoder, LLaDA2).
    parallel_rule: str = knob(
        "budget", 'With threshold < 1: "budget" unmasks at least the exact schedule\'s tokens '
        'per step; "fast_dllm" at least one (Fast-dLLM, no step cap); loop "sdar": "budget" '
        '(its remasking) or "dinfer" (dInfer\'s threshold decoder: p >= tau, else the top one '
        "and its near ties; a block runs until decoded, steps unused; top_k 0, top_p 1).")
    recompute: str = knob("block", "Dual cache steps recompute the whole block (Fast-dLLM) or "
                          'only "masked" positions.')
    cache_refresh: int = knob(0, "With kv_cache: refresh it once this many block tokens were "
                              "decoded (0: at block starts only).", low=0)
    first_position: bool = knob(
        False, 'With parallel_rule "fast_dllm": a block\'s first step unmasks its first '
        "position alone (Fast-dLLM's Dream loop).")
    # SGLang's JointThreshold (sgl-project/sglang dllm/algorithm/joint_threshold.py).
    edit_threshold: float = knob(
        -1.0, 'parallel_rule "dinfer": LLaDA2.1\'s token editing (SGLang\'s JointThreshold: '
        "M2T p > threshold, else the top one; T2T rewrites a token decoded in the block whose "
        "argmax differs with p > this); < 0: off (SGLang's default: 0).")
    max_post_edit_steps: int = knob(
        POST_EDIT_STEPS, "With edit_threshold >= 0: editing steps a block may run once it "
        "has no mask (SGLang's default).", low=0)
    # "dream" (d1jax.sampling.dream) takes steps, temperature, mask_id, alg, top_p and top_k;
    # "sdar" (d1jax.sampling.block_diffusion) steps_per_block steps a block, temperature,
    # top_p, top_k, threshold and eos_id.
    loop: str = knob(
        "llada", '"llada": LLaDA\'s semi-autoregressive blocks (d1); "dream": Dream\'s '
        "diffusion_generate over the whole completion (DiffuCoder's rollouts; block_length = "
        'gen_length); "sdar": block diffusion (SDAR, TraDo; block_length = the model\'s '
        'block_size, kv_cache "prefix" or "none").')
    alg: str = knob("entropy", 'loop "dream": which positions a step decodes (origin, '
                    "maskgit_plus, topk_margin, entropy).")
    top_p: float = knob(1.0, 'loop "dream"/"sdar": nucleus filter of the token draw (< 1 '
                        "applies it).")
    # The SDAR/TraDo engines' default top_k is 0.
    top_k: int = knob(50, 'loop "dream"/"sdar": keep the k largest logits (0: none; 50: '
                      "diffusion_generate's value when the call names none).", low=0)
    # Not knobs: the tokenizer's ids (``d1jax.run.spec.with_tokens``) and LLaDA's options.
    mask_id: int = 126336  # [MASK] token id.
    logits_eos_inf: bool = False  # LLaDA App. B.4: never sample EOS.
    confidence_eos_eot_inf: bool = False  # LLaDA App. B.4: EOS/EoT are unmasked last.
    eos_id: int = 126081  # <|endoftext|>.
    eot_id: int = 126348  # <|eot_id|>.

    def __post_init__(self):
        for name in ("gen_length", "block_length", "steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.gen_length % self.block_length:
            raise ValueError(f"block_length={self.block_length} must divide "
                             f"gen_length={self.gen_length} (LLaDA and d1 assert the same)")
        names = BLOCK_REMASKING if self.loop == "sdar" else REMASKING
        if self.remasking not in names:
            raise ValueError(f"remasking={self.remasking!r} with loop={self.loop!r}: use one of "
                             f"{names}")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} must be >= 0")
        if self.parallel_rule not in PARALLEL_RULES:
            raise ValueError(f"parallel_rule={self.parallel_rule!r}: use 'budget' (at least the "
                             "step's budget), 'fast_dllm' (at least one token per step) or "
                             "'dinfer' (loop='sdar': dInfer's threshold decoder)")
        self._check_cache()
        self._check_loop()
        self._check_dinfer()

    def _check_dinfer(self):
        """One line naming the knobs when dInfer's decoder or token editing cannot apply."""
        if self.parallel_rule == "dinfer" and self.loop != "sdar":
            raise ValueError(f"parallel_rule='dinfer' (dInfer's block decoder) needs "
                             f"loop='sdar', got loop={self.loop!r}")
        if self.parallel_rule == "dinfer" and (self.top_k or self.top_p < 1.0):
            raise ValueError(f"parallel_rule='dinfer' draws from the raw logits: set top_k=0 and "
                             f"top_p=1.0, got top_k={self.top_k}, top_p={self.top_p}")
        if self.edit_threshold >= 0 and self.parallel_rule != "dinfer":
            raise ValueError(f"edit_threshold={self.edit_threshold} (LLaDA2.1's token editing) "
                             f"needs parallel_rule='dinfer' (loop='sdar'), got "
                             f"parallel_rule={self.parallel_rule!r}; < 0 turns it off")
        if self.edit_threshold < 0 and self.max_post_edit_steps != POST_EDIT_STEPS:
            raise ValueError(f"max_post_edit_steps={self.max_post_edit_steps} applies to token "
                             f"editing, which is off (edit_threshold={self.edit_threshold}); set "
                             f"edit_threshold >= 0")

    def _check_loop(self):
        if self.loop not in LOOPS:
            raise ValueError(f"loop={self.loop!r}: use 'llada' (LLaDA's blocks), 'dream' "
                             "(Dream's diffusion_generate) or 'sdar' (block diffusion)")
        if self.loop == "sdar":
            if self.kv_cache not in ("none", "prefix") or self.recompute != "block" or \
                    self.cache_refresh or self.cfg_scale > 0 or self.parallel_rule == "fast_dllm":
                raise ValueError(
                    "loop='sdar' (block diffusion) runs kv_cache='prefix' (the committed "
                    "blocks' exact cache) or 'none', with recompute='block', cache_refresh=0, "
                    "cfg_scale=0 and parallel_rule='budget' (its threshold is "
                    "low_confidence_dynamic's) or 'dinfer'")
            if not 0.0 < self.top_p <= 1.0 or self.top_k < 0:
                raise ValueError(f"top_p={self.top_p} must be in (0, 1] and top_k={self.top_k} "
                                 ">= 0 (0: no top-k)")
            return
        if self.loop != "dream":
            return
        if self.block_length != self.gen_length:
            raise ValueError(f"loop='dream' runs no blocks: set block_length={self.gen_length} "
                             f"(= gen_length), got {self.block_length}")
        if self.kv_cache != "none" or self.threshold < 1.0 or self.cfg_scale > 0:
            raise ValueError("loop='dream' is the exact diffusion_generate: kv_cache='none', "
                             "threshold >= 1 and cfg_scale=0 are required")
        self.dream_config()  # alg, top_p, top_k checked there

    def dream_config(self):
        """The ``dream.DreamGenerationConfig`` of ``loop="dream"`` (alg_temp off, eps 1e-3:
        DiffuCoder's call passes alg_temp=0.0 and no eps)."""
        from d1jax.sampling.dream import DreamGenerationConfig
        return DreamGenerationConfig(
            max_new_tokens=self.gen_length, steps=self.steps, alg=self.alg,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or None,
            mask_token_id=self.mask_id)

    def _check_cache(self):
        if self.kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache={self.kv_cache!r}: use 'none', 'prefix' or 'dual'")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute={self.recompute!r}: use 'block' or 'masked'")
        if self.recompute == "masked" and self.kv_cache != "dual":
            raise ValueError(f"recompute='masked' needs kv_cache='dual', got "
                             f"kv_cache={self.kv_cache!r}")
        if self.cache_refresh < 0:
            raise ValueError(f"cache_refresh={self.cache_refresh} must be >= 0 (0: refresh "
                             "only at block starts)")
        if self.cache_refresh > 0 and self.kv_cache == "none":
            raise ValueError(f"cache_refresh={self.cache_refresh} needs a KV cache "
                             "(kv_cache='prefix' or 'dual')")
        if self.first_position and self.parallel_rule != "fast_dllm":
            raise ValueError("first_position=True (Fast-dLLM's Dream loop) needs "
                             f"parallel_rule='fast_dllm', got {self.parallel_rule!r}")
        if self.kv_cache != "none" and self.cfg_scale > 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} with kv_cache={self.kv_cache!r} is not "
                             "supported; use kv_cache='none' for classifier-free guidance")

    @classmethod
    def fast(cls, **overrides) -> "SamplerConfig":
        """The fast sampler's defaults under ``overrides``: Fast-dLLM's dual KV cache,
        refreshed after every 8 decoded tokens, and parallel decoding at tau 0.99 (within 1
        point of the exact sampler in docs/fast_sampler.md's accuracy sweeps; without the refresh,
        at tau 0.9 or with ``recompute="masked"`` it is not)."""
        return cls(**{**FAST_DEFAULTS, **overrides})

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        """d1's ``max(1, steps // num_blocks)``: the step budget of each block."""
        return max(1, self.steps // self.num_blocks)

    @property
    def parallel(self) -> bool:
        """Whether a step also unmasks the positions whose confidence passes tau."""
        return self.parallel_rule == "fast_dllm" or self.threshold < 1.0

    @property
    def loop_steps(self) -> int:
        """Most steps a block runs: under "budget" those after the block_length-th have a
        zero budget; under "fast_dllm" every step unmasks at least one token."""
        if self.parallel_rule == "fast_dllm":
            return self.block_length
        return min(self.steps_per_block, self.block_length)

    @property
    def step_stride(self) -> int:
        """Global step numbers reserved per block: step i of block b is ``b * stride + i``."""
        return self.block_length if self.parallel_rule == "fast_dllm" else self.steps_per_block

    def min_transfer(self) -> np.ndarray:
        """Tokens each step unmasks at least while masks are left: [loop_steps] int32 (the
        budget schedule, or one per step under "fast_dllm")."""
        if self.parallel_rule == "fast_dllm":
            return np.ones(self.loop_steps, np.int32)
        return num_transfer_tokens(self.block_length, self.steps_per_block)[:self.loop_steps]
