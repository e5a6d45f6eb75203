"""The CPU demo's config (configs/demo_sudoku.py) and the stage configs built from it.

The demo's own fields (``config.demo``) are translated here, once, into ordinary SFT,
GRPO and eval run configs of d1jax (``d1jax.config``) on the demo's task (``task.NAME``);
the sampler's fields live in ``demo.sampler`` only and reach the GRPO stages' rollouts
and the evaluations from there.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections as mlc

from d1jax import config as config_lib
from d1jax.config import ConfigError
from examples.demo import task as demo_task


def get_config(arg: str | None) -> mlc.ConfigDict:
    """base -> SFT -> diffu-GRPO on 4x4 Sudoku (examples/demo/run.py).

    ``arg``: None (the README's run, 1,627 s on a busy 2-core VM), "d1like" (the same
    recipe with d1's design of SFT data: Latin-square puzzles, a family beside the RL task, in
    its answer format, examples/demo/latin.py; "d1like,ci" shortens it as "ci"), "compare" (the same,
    plus wd1, SPG and coupled-GRPO from the SFT model on diffu-GRPO's budget; it reuses a
    default run's workdir), "seeds" (a harder toy whose pretraining and SFT converge below
    the ceiling, at the budgets where they do: the multi-seed table's runs,
    examples/demo/seeds.py) or "ci" (a shortened run for the test suite: fewer supervised
    steps, one 24-step diffu-GRPO run from the SFT model with exact rollouts, 64 puzzles
    per evaluation set).
    """
    parts = config_lib.variants.parse(arg, ("ci", "compare", "seeds", "d1like"),
                                      exclusive=[("compare", "seeds", "d1like"),
                                                 ("compare", "seeds", "ci")])
    ci = "ci" in parts
    c = mlc.ConfigDict()
    c.stage = "demo"  # python -m examples.demo runs examples/demo/run.py.
    c.workdir = ""  # Run directory (--workdir overrides); one sub-directory per stage.
    d = c.demo = mlc.ConfigDict()
    d.seed = 0  # Seed of the data, the base model's init and the SFT stage.
    # One GRPO run per seed, objective and starting model; ci: one run (seed 1) from SFT.
    d.seeds = (1,) if ci else (0, 1, 2)
    d.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor) for every stage.
    # The rollout sampler of every GRPO stage (fields: d1jax/config/defaults.py); evaluations
    # take its gen_length and block_length and decode exactly (d1's protocol).
    s = d.sampler = config_lib.sampler_fields(tiny=True)
    s.gen_length = 32  # Completion tokens: <answer> grid </answer> is 24, then EOS.
    s.block_length = 32  # d1: 32.
    s.steps = 16  # d1: gen_length / 2.
    s.temperature = 0.9  # Rollouts and sampled evaluations (d1's rollout temperature).
    # The fast sampler makes GRPO ~1.7x faster; ci keeps the exact one.
    s.kv_cache = "none" if ci else "dual"
    s.threshold = 1.0 if ci else 0.9
    d.model = _model()
    d.data = _data()
    d.pretrain = _pretrain(ci)
    d.sft = _sft(ci)
    d.grpo = _grpo(ci)
    if "seeds" in parts:  # converged supervised stages (docs/demo.md, multi-seed table)
        # Harder puzzles, and writers who solve only part of them: the base's corpus one pass
        # of naked singles, SFT's two; only the reward knows every cell. Each stage then
        # converges below the ceiling and leaves the next one room (docs/demo.md).
        d.data.num_empty = (10, 12)
        d.pretrain.solved_depth, d.sft.solved_depth = 1, 2
        d.pretrain.steps, d.sft.steps = SEEDS_PRETRAIN_STEPS, SEEDS_SFT_STEPS
        d.pretrain.save_every = d.sft.save_every = 500
        # From the converged SFT model, 1e-3 lost 1.7 held-out points and 3e-4 gained 1.1;
        # from the base both gained 7-8 (one seed each, docs/demo.md).
        d.grpo.learning_rate = 3e-4
        d.seeds = (0, 1)
    if "d1like" in parts:  # d1's design: SFT on a corpus that is not the RL task (issue 45)
        d.sft.corpus = "latin"
        # A base that knows a little Sudoku: its corpus's writer solves one pass of naked
        # singles and guesses beyond (as ':seeds'), so the later passes are left to the Latin
        # SFT's row and column reasoning and to the reward (the box rule). 400 steps left the
        # base on the loss plateau where it writes one digit everywhere (docs/demo.md).
        d.pretrain.solved_depth = 1
        d.pretrain.steps = 200 if ci else D1LIKE_PRETRAIN_STEPS
        # Rollouts as d1's: LLaDA's exact decoding, the evaluation's sampler (the fast one
        # scored 4-23 points below it, so RL from the base trained on a weaker policy than the
        # one evaluated), and twice the rollouts (256 steps): over the six runs the GRPO rows'
        # mean change rose from -0.7 / -0.8 to +0.4 / +0.1 from the base and from +1.3 / +1.7
        # to +2.2 / +2.8 from SFT (docs/demo.md, ':d1like').
        s.kv_cache, s.threshold = "none", 1.0
        _box_fields(d.data)
        d.grpo.steps = 60 if ci else D1LIKE_GRPO_STEPS
    if "compare" in parts:  # every objective of the GRPO loop on the same budget, from SFT
        d.grpo.objectives = OBJECTIVES
        d.grpo.starts = ("sft",)
    d.eval = _eval(ci)
    c.lock()
    return c


def _model() -> mlc.ConfigDict:
    g = mlc.ConfigDict()
    g.preset = "test-tiny"  # Architecture preset the widths below override ("bench-tiny": the benchmarks' model, docs/benchmarks.md).
    g.width = 128  # d_model (mlp 3x; test-tiny: 4 heads, 2 KV heads); 0 keeps the preset's.
    g.n_layers = 4  # Transformer blocks; 0 keeps the preset's.
    g.vocab_size = 0  # Model vocabulary (bench-tiny: 8192); 0: the tokenizer's, rounded up to 64.
    g.tokenizer_vocab = 320  # Byte-level BPE vocabulary trained on the puzzles' text.
    # Rounding variants of one model (same math, another XLA program): layers as straight-line
    # code (True; None: LLaDA's default, unrolled up to 8 layers) or a lax.scan loop (False).
    g.unroll_layers = mlc.config_dict.placeholder(bool)
    g.layers_per_loop = 1  # Middle layers per iteration of that loop.
    return g


# ':seeds' budgets (optimizer steps), measured on its toy with examples/demo/plateau.py
# (docs/demo.md, "Convergence"): pretraining seed 0 at 8,000 steps held-out greedy 63.6%, its
# corpus's ceiling 64.1 (4,000: 60.9); at 4,000, seed 1 was still leaving a loss plateau (base
# 46.3 and 51.6 in the two variants). SFT from a 4,000-step base at 1,000 steps 90.5% (500: 88.8).
SEEDS_PRETRAIN_STEPS, SEEDS_SFT_STEPS = 8000, 1000
# ':d1like' pretraining: the default toy's 2,000-step base had left the plateau of its first
# hundreds of steps by its second fifth (docs/demo.md, "Convergence"); 400 steps had not. At
# 1,000, pretraining seeds 1 and 2 left it and seed 0 did not (docs/demo.md, ':d1like').
D1LIKE_PRETRAIN_STEPS = 1000
D1LIKE_GRPO_STEPS = 256  # 128 rollouts of 4 prompts x 8 completions, mu 2


def _data() -> mlc.ConfigDict:
    g = mlc.ConfigDict()
    g.seed = 1234  # Seed of the generated puzzles.
    g.num_train = 20_000  # Training pool (pretraining documents, SFT and GRPO prompts).
    g.num_heldout = 256  # Held-out generated puzzles (evaluation only).
    g.num_empty = (6, 10)  # Empty cells per generated puzzle (d1's test set has 8).
    return g


def _box_fields(g: mlc.ConfigDict) -> None:
    """``demo.data``'s box-needed knob (issue 60), declared by ``:d1like`` only: the toy whose
    SFT never sees the box rule (the other variants' recorded configs stay as they were,
    tests/spec_snapshot.py); code reads it with ``box_needed(demo)``."""
    # True: GRPO's prompts and the held-out set are box-needed puzzles (row and column singles
    # stall; the box rule decides half or more of the cells, examples/demo/difficulty.py), none
    # in the train pool, which still makes the base's corpus. d1's test set stays as it is.
    g.box_needed = False
    g.box_num_empty = (8, 10)  # Empty cells of the box-needed puzzles (low, high), spread evenly.
    g.box_num_train = 4096  # Box-needed GRPO pool (':d1like' GRPO draws 512 prompts).


def box_needed(demo: mlc.ConfigDict) -> bool:
    """Whether GRPO's pool and the held-out set are box-needed puzzles (``_box_fields``)."""
    return bool(demo.data.get("box_needed", False))


def _pretrain(ci: bool) -> mlc.ConfigDict:
    g = mlc.ConfigDict()
    g.objective = "sft"  # "sft": masked diffusion on the documents' answers; "pretrain": on whole documents.
    g.steps = 100 if ci else 400  # Optimizer steps of masked-diffusion training on the noisy corpus.
    g.batch_size = 32  # Documents per step.
    g.learning_rate = 1e-3  # AdamW peak learning rate.
    g.answer_noise = 0.3  # Chance each empty cell of a document's answer is wrong.
    g.format_noise = 0.3  # Chance a document's answer is untagged rows instead of <answer>.
    # >0: the corpus's writer solves only the cells this many passes of naked singles fill
    # and guesses the others among the digits the givens leave (examples/demo/data.py);
    # 0: every cell is the solution's (before answer_noise).
    g.solved_depth = 0
    # The share of documents whose writer guesses those cells one after another keeping rows
    # and columns consistent (Latin reasoning, no box rule); the others guess each cell alone.
    g.latin_guess_share = 0.0
    g.save_every = 250  # Checkpoint period.
    return g


def _sft(ci: bool) -> mlc.ConfigDict:
    g = mlc.ConfigDict()
    g.steps = 100 if ci else 300  # Optimizer steps of masked SFT on clean trajectories.
    g.batch_size = 32  # Trajectories per step.
    g.learning_rate = 1e-3  # AdamW peak learning rate (linear decay to 0, as d1's SFT).
    g.solved_depth = 0  # >0: the trajectories' writer solves this many passes (as pretrain's).
    # "sudoku": the RL task's own puzzles and solutions; "latin": d1's design, Latin-square
    # puzzles (no box rule) in the same answer format, never a Sudoku (examples/demo/latin.py).
    g.corpus = "sudoku"
    g.save_every = 100  # Checkpoint period.
    return g


# The GRPO loop's objectives (d1jax/train/pure_steps.py OBJECTIVES) in the demo's table order.
OBJECTIVES = ("diffu_grpo", "wd1", "spg", "coupled_grpo")


def _grpo(ci: bool) -> mlc.ConfigDict:
    g = mlc.ConfigDict()
    # Policy losses, one run per (objective, start, seed), each on the same rollout and update
    # budget below; ':compare' runs all of OBJECTIVES.
    g.objectives = ("diffu_grpo",)
    g.steps = 24 if ci else 128  # Optimizer steps per GRPO run (the default demo fits in 15 minutes).
    g.starts = ("sft",) if ci else ("base", "sft")  # Starting models: "base" (+diffu-GRPO row), "sft" (d1).
    g.num_generations = 8  # G.
    g.prompts_per_step = 4  # Prompts per rollout.
    g.num_iterations = 2  # mu: optimizer steps per rollout (each with a fresh mask seed).
    g.beta = 0.04  # KL weight (d1) of the objectives with a reference term (wd1 and SPG have none).
    # Prompt-token mask rate of the log-prob estimator (d1: 0.15). The 43-token prompt's 16
    # puzzle digits are the whole problem: masking them sends the k3 KL to 20-200 per token
    # in the first updates; 0 keeps GRPO stable (README, CPU demo).
    g.p_mask_prompt = 0.0
    g.learning_rate = 1e-3  # AdamW learning rate (of the LoRA adapters).
    # Per-objective learning rate (0: learning_rate). wd1 and SPG have no KL term and no
    # ratio clip: at 1e-3 their rollout reward collapsed; these are the best of a 3-point
    # scan, seed 0 (docs/demo.md).
    g.objective_learning_rate = mlc.ConfigDict({"diffu_grpo": 0.0, "wd1": 1e-4, "spg": 3e-5,
                                                "coupled_grpo": 0.0})
    g.adam_eps = 1e-8  # Adam epsilon (torch default).
    g.warmup_ratio = 0.0001  # Linear warmup over this fraction of the steps (d1: 0.0001).
    g.lora_rank = 16  # LoRA rank (0: full fine-tuning).
    g.save_every = 40  # Checkpoint period.
    return g


def _eval(ci: bool) -> mlc.ConfigDict:
    g = mlc.ConfigDict()
    g.num_examples = 64 if ci else 256  # Puzzles per evaluation set (d1: 256).
    g.batch_size = 64  # Prompts per generate call.
    g.samples = 2  # Sampled completions per puzzle (rollout temperature) besides greedy.
    g.sampled_sets = ("heldout",)  # Sets scored on samples too ("heldout", "d1_test").
    return g


def check(demo: mlc.ConfigDict) -> None:
    """The demo's own switches, before any stage runs (the stages check the rest)."""
    starts = tuple(demo.grpo.starts)
    if not starts or set(starts) - {"base", "sft"}:
        raise ConfigError(f"demo.grpo.starts={starts!r}: a non-empty subset of ('base', 'sft')")
    objectives = tuple(demo.grpo.objectives)
    if not objectives or set(objectives) - set(OBJECTIVES) or len(set(objectives)) < len(objectives):
        raise ConfigError(f"demo.grpo.objectives={objectives!r}: distinct names from {OBJECTIVES}")
    if set(demo.eval.sampled_sets) - {"heldout", "d1_test"}:
        raise ConfigError(f"demo.eval.sampled_sets={tuple(demo.eval.sampled_sets)!r}: "
                          "a subset of ('heldout', 'd1_test')")
    if demo.sft.corpus not in ("sudoku", "latin"):
        raise ConfigError(f"demo.sft.corpus={demo.sft.corpus!r}: sudoku or latin")
    if demo.sft.corpus == "latin" and demo.sft.solved_depth:
        raise ConfigError(f"demo.sft.solved_depth={demo.sft.solved_depth} with "
                          "demo.sft.corpus='latin': the Latin corpus is solved in full (use 0)")
    if demo.pretrain.objective not in ("sft", "pretrain"):
        raise ConfigError(f"demo.pretrain.objective={demo.pretrain.objective!r}: sft or pretrain")
    for stage in ("pretrain", "sft"):
        if demo[stage].solved_depth < 0:
            raise ConfigError(f"demo.{stage}.solved_depth={demo[stage].solved_depth}: must be "
                              ">= 0")
    for name in ("answer_noise", "format_noise", "latin_guess_share"):
        if not 0.0 <= demo.pretrain[name] <= 1.0:
            raise ConfigError(f"demo.pretrain.{name}={demo.pretrain[name]}: must be in [0, 1]")
    # Counts the stages would refuse only when they start (after the stages before them).
    for key, low in (("pretrain.steps", 1), ("pretrain.batch_size", 1), ("pretrain.save_every", 1),
                     ("sft.steps", 1), ("sft.batch_size", 1), ("sft.save_every", 1),
                     ("grpo.steps", 1), ("grpo.num_generations", 2), ("grpo.prompts_per_step", 1),
                     ("grpo.num_iterations", 1), ("grpo.save_every", 1), ("grpo.lora_rank", 0),
                     ("eval.batch_size", 1), ("eval.num_examples", 1), ("data.num_heldout", 1),
                     ("data.num_train", 1)):
        group, name = key.split(".")
        if demo[group][name] < low:
            raise ConfigError(f"demo.{key}={demo[group][name]}: must be >= {low}")
    for name in ("num_empty", "box_num_empty"):
        if name not in demo.data:
            continue
        value = tuple(demo.data[name])
        if len(value) != 2 or not 0 <= value[0] <= value[1] <= 16:
            raise ConfigError(f"demo.data.{name}={value}: empty cells (low, high) of a "
                              "4x4 grid, 0 <= low <= high <= 16")
    if box_needed(demo) and demo.data.box_num_train < 1:
        raise ConfigError(f"demo.data.box_num_train={demo.data.box_num_train}: must be >= 1")


# ------------------------------------------------------------------------- stage configs

def _model_variant(c: mlc.ConfigDict, demo: mlc.ConfigDict) -> None:
    """The rounding variant of the model code, in every stage (training and evaluation)."""
    c.model.unroll_layers = demo.model.unroll_layers
    c.model.layers_per_loop = demo.model.layers_per_loop


def _common(c: mlc.ConfigDict, demo: mlc.ConfigDict, data: dict) -> None:
    c.seed = demo.seed
    _model_variant(c, demo)
    c.task.name = demo_task.NAME
    c.task.source = data["train"]
    c.task.num_train = 0
    c.model.tokenizer_path = data["tokenizer"]
    c.max_prompt_length = data["prompt_length"]
    c.mesh.shape = tuple(demo.mesh_shape)
    c.train.log_every = 1
    c.train.max_to_keep = 1
    c.train.async_checkpoints = False
    if "sft" in c:
        c.sft.tokenize = "split"


def _sft_stage(demo: mlc.ConfigDict, data: dict, p: mlc.ConfigDict, warmup: float,
               weight_decay: float) -> mlc.ConfigDict:
    """An SFT-loop run (full fine-tuning) with the demo's lengths and stage ``p``'s schedule."""
    c = config_lib.sft("tiny")
    _common(c, demo, data)
    c.lora.enabled = False
    c.sft.batch_size = p.batch_size
    c.sft.max_length = data["prompt_length"] + demo.sampler.gen_length
    c.optim.learning_rate = p.learning_rate
    c.optim.warmup_ratio = warmup
    c.optim.max_grad_norm = 1.0
    c.optim.weight_decay = weight_decay
    c.train.num_steps = p.steps
    c.train.save_every = p.save_every
    return c


def pretrain_config(demo: mlc.ConfigDict, data: dict) -> mlc.ConfigDict:
    """The base model: a random model trained on the noisy corpus (``run.py`` supplies it)."""
    c = _sft_stage(demo, data, demo.pretrain, warmup=0.05, weight_decay=0.01)
    c.model.random_init = demo.model.preset
    c.model.width = demo.model.width
    c.model.n_layers = demo.model.n_layers
    c.model.vocab_size = demo.model.vocab_size
    return c


def sft_config(demo: mlc.ConfigDict, data: dict, base: Path) -> mlc.ConfigDict:
    c = _sft_stage(demo, data, demo.sft, warmup=0.0, weight_decay=0.0)
    c.model.random_init = ""
    c.model.path = str(base / "hf")
    return c


def row_kind(objective: str, start: str) -> str:
    """The results row of GRPO runs of ``objective`` from ``start`` (diffu-GRPO keeps the
    names of the demo's first version: ``grpo_base``, ``d1``)."""
    if objective == "diffu_grpo":
        return "d1" if start == "sft" else "grpo_base"
    return f"{objective}_{start}"


def stage_name(objective: str, start: str, seed: int) -> str:
    """Sub-workdir of one GRPO run."""
    return f"{row_kind(objective, start)}_s{seed}"


def grpo_config(demo: mlc.ConfigDict, data: dict, start: Path, seed: int,
                objective: str = "diffu_grpo") -> mlc.ConfigDict:
    """One GRPO-loop run of ``objective`` from the exported model in ``start``; every knob but
    the objective (and its own defaults, d1jax/config/defaults.py) is the demo's."""
    g = demo.grpo
    c = config_lib.grpo("sudoku", "tiny", objective=objective)
    _common(c, demo, data)
    c.sampler.update(demo.sampler)
    c.task.source = data.get("rl_train", data["train"])  # box-needed with demo.data.box_needed
    c.seed = seed
    c.model.random_init = ""
    c.model.path = str(start / "hf")
    c.lora.enabled = g.lora_rank > 0
    c.lora.rank = max(g.lora_rank, 1)
    c.lora.alpha = 2.0 * max(g.lora_rank, 1)
    c.lora.dropout = 0.0
    c.grpo.num_generations = g.num_generations
    c.grpo.prompts_per_step = g.prompts_per_step
    c.grpo.num_iterations = g.num_iterations
    # wd1 and SPG have no reference term: their defaults hold beta = 0.
    c.grpo.beta = g.beta if c.grpo.beta > 0 else 0.0
    c.grpo.p_mask_prompt = g.p_mask_prompt
    # SPG draws its J noisy copies from distinct blocks of the completion; the demo's 32-token
    # completion is one block (block_length 32), so J = 1.
    c.grpo.spg.num_t = min(c.grpo.spg.num_t, demo.sampler.gen_length // demo.sampler.block_length)
    c.grpo.ref_model_sync_steps = 64
    c.optim.learning_rate = g.objective_learning_rate[objective] or g.learning_rate
    c.optim.eps = g.adam_eps
    c.optim.warmup_ratio = g.warmup_ratio
    c.optim.weight_decay = 0.0
    c.train.num_steps = g.steps
    c.train.save_every = g.save_every
    c.train.sample_every = 8
    return c


def eval_config(demo: mlc.ConfigDict, model_dir: Path) -> mlc.ConfigDict:
    """Greedy evaluation of an exported stage at the demo's length with exact decoding
    (d1's protocol: steps = gen_length / 2)."""
    c = config_lib.eval_config("sudoku,tiny")
    c.model.random_init = ""
    c.model.path = str(model_dir)
    c.task.name = demo_task.NAME
    c.mesh.shape = tuple(demo.mesh_shape)
    _model_variant(c, demo)
    c.sampler.block_length = demo.sampler.block_length
    c.eval.gen_lengths = (demo.sampler.gen_length,)
    c.eval.batch_size = demo.eval.batch_size
    c.eval.num_examples = demo.eval.num_examples
    return c
