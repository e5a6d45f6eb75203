"""Generated Sudoku text for the CPU demo's stand-in base model.

The demo's "pretraining corpus" is conversations in the chat format: a puzzle question
and an answer whose grid is right only in part (each empty cell is replaced by a wrong
digit with probability ``noise``), written in d1's ``<answer>`` format or, with
probability ``format_noise``, as four space-separated rows with no tags (``rows_answer``), which neither
d1's reward nor its evaluation parser can read (text of mixed quality and format, as a
web corpus would hold). Trained on it with the masked-diffusion objective (on the answers,
``demo.pretrain.objective="sft"``, the default, or on whole documents, ``"pretrain"``), this gives
a base model that knows the format and little Sudoku, and leaves room for SFT on clean
trajectories (d1's stage 1) and diffu-GRPO (stage 2) to improve it.

``prepare_data`` writes the demo's puzzles and tokenizer; ``pretraining_corpus`` and
``sft_corpus`` are the base and SFT stages' training data, handed to d1jax's SFT loop
(``sft.run(..., data=...)``).
"""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Sequence

import ml_collections as mlc
import numpy as np

from d1jax.model.tokenizer import load_tokenizer, train_tiny_tokenizer
from d1jax.config import ConfigError
from d1jax.tasks import DataUnavailableError, format_prompt, get_task, sudoku
from d1jax.model.tokenizer import uniform_prompt_length
from d1jax.train.sft import SFTData
from d1jax.train.sft_data import encode_sft
from examples.demo import config as demo_config
from examples.demo import difficulty, latin
from examples.demo import task as demo_task


def _peers(i: int, box: bool = True) -> list[int]:
    r, c = divmod(i, 4)
    return [j for j in range(16) if j != i and (
        j // 4 == r or j % 4 == c or (box and j // 8 == r // 2 and j % 4 // 2 == c // 2))]


def candidates(grid: str, i: int, box: bool = True) -> list[str]:
    """The digits cell ``i`` of ``grid`` may hold given its filled peers (row, column and,
    with ``box``, box)."""
    return [d for d in "1234" if all(grid[j] != d for j in _peers(i, box))]


def solver_depths(puzzle: str) -> dict[int, int]:
    """Empty cell -> the pass of naked singles (each pass fills every cell its filled peers
    leave one digit) that fills it, starting from the givens. Every unique-solution 4x4
    puzzle is filled this way; with the demo's 6-10 empty cells about 60% of the cells
    fall in the first pass."""
    grid, depth, k = list(puzzle), {}, 0
    while True:
        k += 1
        fill = {i: c[0] for i in range(16) if grid[i] == "0"
                and len(c := candidates("".join(grid), i)) == 1}
        if not fill:
            return depth
        for i, d in fill.items():
            grid[i], depth[i] = d, k


def noisy_grid(puzzle: str, solution: str, noise: float, rng: random.Random,
               solved_depth: int = 0, latin_guess: bool = False) -> str:
    """``solution`` with each of the puzzle's empty cells wrong with probability ``noise``.

    ``solved_depth`` > 0: a writer who solves only the cells that that many passes of
    naked singles fill (``solver_depths``) and guesses each other empty cell (right or not):
    uniformly among the digits the givens leave it, or with ``latin_guess`` one cell after
    another in a random order, each among the digits its filled row and column peers leave
    it at that moment (its earlier guesses included; any digit where none is left): a
    writer who keeps rows and columns consistent but uses no box beyond those passes;
    0: every cell is the solution's.
    """
    out = []
    deep = ({i for i, k in solver_depths(puzzle).items() if k > solved_depth}
            if solved_depth else set())
    for i, (p, s) in enumerate(zip(puzzle, solution)):
        if i in deep:
            out.append(rng.choice(candidates(puzzle, i)))
        elif p == "0" and rng.random() < noise:
            out.append(rng.choice([d for d in "1234" if d != s]))
        else:
            out.append(s)
    if latin_guess and deep:
        order = sorted(deep)
        rng.shuffle(order)
        for i in order:
            out[i] = "0"
        for i in order:
            out[i] = rng.choice(candidates("".join(out), i, box=False) or list("1234"))
    return "".join(out)


def rows_answer(grid: str) -> str:
    """The grid as four space-separated rows, untagged (no 16-digit run to parse); as many
    tokens as the tagged answer with the demo's tokenizer, so the answer's length does not
    give its format away."""
    return "Solution:\n\n" + " ".join(grid[i:i + 4] for i in range(0, 16, 4)) + "\n"


def pretraining_documents(task, examples: Sequence[dict], noise: float, seed: int,
                          format_noise: float = 0.0, solved_depth: int = 0,
                          latin_guess_share: float = 0.0) -> list[dict]:
    """One conversation per puzzle, its answer grid corrupted at rate ``noise`` (and guessed
    beyond ``solved_depth``, ``noisy_grid``: Latin-consistently in a share
    ``latin_guess_share`` of the documents) and written untagged with probability
    ``format_noise`` (``format_noise=0, noise=0, solved_depth=0``: clean trajectories)."""
    for name, v in (("answer_noise", noise), ("format_noise", format_noise),
                    ("latin_guess_share", latin_guess_share)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name}={v}: must be in [0, 1]")
    rng = random.Random(seed)
    docs = []
    for ex in examples:
        latin_guess = latin_guess_share > 0 and rng.random() < latin_guess_share
        grid = noisy_grid(ex["puzzle"], ex["solution"], noise, rng, solved_depth, latin_guess)
        if rng.random() < format_noise:
            completion = rows_answer(grid)
        else:
            completion = demo_task.answer(grid)
        docs.append({"prompt": task.build_messages(ex), "completion": completion})
    return docs


def encode_whole_documents(tokenizer, rows, max_length: int, split: bool = False) -> dict:
    """``encode_sft``'s tokens with prompt length 0: the whole conversation is noised and
    trained on (LLaDA's pretraining objective on chat-formatted documents)."""
    enc = encode_sft(tokenizer, rows, max_length, split=split)
    return {**enc, "prompt_len": np.zeros_like(enc["prompt_len"])}


def pretraining_corpus(demo: mlc.ConfigDict, data: dict) -> SFTData:
    """The base model's corpus: every train-pool puzzle as a noisy document; with
    ``demo.pretrain.objective == "pretrain"`` the loss covers the whole document."""
    p = demo.pretrain
    task = get_task(demo_task.NAME)
    docs = pretraining_documents(task, task.load_train(data["train"]), p.answer_noise,
                                 demo.seed, p.format_noise, p.solved_depth,
                                 p.latin_guess_share)
    if p.objective == "pretrain":
        return SFTData(docs, encode=encode_whole_documents)
    return SFTData(docs)


def latin_pool(demo: mlc.ConfigDict) -> list[dict]:
    """The Latin-square puzzles of ``demo.sft.corpus="latin"``: as many as the train pool,
    with as many empty cells, none of them a Sudoku (``latin``)."""
    return latin.generate_puzzles(demo.data.num_train, demo.data.seed,
                                  tuple(demo.data.num_empty))


def sft_corpus(demo: mlc.ConfigDict, data: dict) -> SFTData:
    """The SFT stage's data (d1's stage 1): each train-pool puzzle's prompt and a clean
    ``<answer>``, its grid the solution's, or with ``demo.sft.solved_depth`` > 0 that of a
    writer who solves that many passes of naked singles and guesses the rest (``noisy_grid``).
    With ``demo.sft.corpus="latin"`` (d1's design, ``:d1like``): Latin-square puzzles and
    their solutions instead, in the same answer format (``latin``)."""
    if demo.sft.corpus == "latin":
        return SFTData(latin.documents(latin_pool(demo)))
    task = get_task(demo_task.NAME)
    return SFTData(pretraining_documents(task, task.load_train(data["train"]), 0.0, 0,
                                         solved_depth=demo.sft.solved_depth))


def prepare_data(demo: mlc.ConfigDict, wd: Path) -> dict:
    """Train pool, held-out set and tokenizer under ``wd/data`` (kept when present), and
    GRPO's pool (``rl_train``: the train pool, or with ``demo.data.box_needed`` box-needed
    puzzles, which then make the held-out set too, ``box_needed_files``).

    Also measures the prompt length in tokens, which is the same for every puzzle: each
    stage trains and generates on sequences of exactly prompt + ``gen_length`` tokens with
    no padding. (A bidirectional model sees where a sequence ends: trained on one total
    length, it misplaces the answer's closing tokens at another.)
    """
    d = wd / "data"
    d.mkdir(parents=True, exist_ok=True)
    files = {"train": str(d / "train.csv"), "heldout": str(d / "heldout.csv"),
             "tokenizer": str(d / "tokenizer")}
    task = get_task(demo_task.NAME)
    if not (d / "tokenizer" / "tokenizer.json").exists():
        try:
            d1_test = [r["puzzle"] for r in sudoku.load_test(subsample=None)]
        except DataUnavailableError:
            d1_test = []  # offline: nothing to exclude (and no d1 column in the table)
        pool = sudoku.generate_puzzles(demo.data.num_train + demo.data.num_heldout,
                                       seed=demo.data.seed, exclude=d1_test,
                                       num_empty=tuple(demo.data.num_empty))
        write_csv(files["heldout"], pool[:demo.data.num_heldout])
        write_csv(files["train"], pool[demo.data.num_heldout:])
        # Text like the base model's corpus, at fixed noise rates (not demo.pretrain's:
        # the tokenizer, and so every published demo number, stays put when those change).
        docs = pretraining_documents(task, pool[demo.data.num_heldout:][:2000], 0.3, 0,
                                     format_noise=0.5)
        if demo.sft.corpus == "latin":  # its question's words get tokens as Sudoku's do
            docs += latin.documents(latin_pool(demo)[:2000])
        texts = [m["content"] for doc in docs for m in doc["prompt"]] + [
            doc["completion"] for doc in docs]
        train_tiny_tokenizer(texts, d / "tokenizer.tmp", demo.model.tokenizer_vocab)
        (d / "tokenizer.tmp").rename(d / "tokenizer")  # present only once complete
    tok = load_tokenizer(files["tokenizer"])
    files["rl_train"] = files["train"]  # GRPO's prompts
    if demo_config.box_needed(demo):
        files["rl_train"], files["heldout"] = box_needed_files(demo.data, d)
    probe = sudoku.load_test(files["heldout"], subsample=None)[:64]
    length = uniform_prompt_length(tok, [task.eval_prompt(tok, ex) for ex in probe])
    if demo.sft.corpus == "latin":
        texts = [format_prompt(tok, latin.build_messages(ex)) for ex in latin_pool(demo)[:64]]
        try:
            other = uniform_prompt_length(tok, texts)
        except ValueError:
            other = -1
        if other != length:
            raise ConfigError(
                f"demo.sft.corpus='latin': the Latin question is {other} tokens with the "
                f"tokenizer in {d / 'tokenizer'}, the Sudoku question {length}; a workdir made "
                "with another corpus keeps its tokenizer: use a new --workdir")
    return {**files, "prompt_length": length}


def box_needed_files(g: mlc.ConfigDict, d: Path) -> tuple[str, str]:
    """GRPO's pool and the held-out set of ``demo.data.box_needed``: ``g.box_num_train`` and
    ``g.num_heldout`` unique puzzles on which row-and-column singles stall (more than one Latin
    completion: the box rule decides half or more of their cells, ``difficulty``), spread
    evenly over ``g.box_num_empty`` (inclusive), none in the plain pool (the pretraining
    corpus's puzzles), the plain held-out set or d1's test set. Written once under ``d`` in a
    folder named by their settings; returns the paths (train, held-out)."""
    lo, hi = tuple(g.box_num_empty)
    sub = d / f"box_e{lo}-{hi}_n{g.box_num_train}+{g.num_heldout}_s{g.seed}"
    paths = (str(sub / "train.csv"), str(sub / "heldout.csv"))
    if Path(paths[1]).exists():
        return paths
    exclude = {r["puzzle"] for f in ("train.csv", "heldout.csv")
               for r in sudoku.load_test(str(d / f), subsample=None)}
    try:
        exclude |= {r["puzzle"] for r in sudoku.load_test(subsample=None)}
    except DataUnavailableError:
        pass  # offline, as the plain pool: nothing more to exclude
    counts = range(lo, hi + 1)
    held, train = [], []
    for i, k in enumerate(counts):
        n_h, n_t = (n // len(counts) + (i < n % len(counts))
                    for n in (g.num_heldout, g.box_num_train))
        need = n_h + n_t
        rows = difficulty.generate(need, k, seed=g.seed + k, box_needed=True,
                                   max_draws=200 * need + 1000, exclude=exclude)
        if len(rows) < need:
            raise ConfigError(f"demo.data.box_num_empty={(lo, hi)}: found only {len(rows)} of "
                              f"{need} box-needed puzzles with {k} empty cells; ask for fewer "
                              "(demo.data.box_num_train) or other counts (8-11 have most)")
        held += rows[:n_h]
        train += rows[n_h:]
    rng = random.Random(g.seed)  # mix the counts: an evaluation's first N puzzles span them
    rng.shuffle(held)
    rng.shuffle(train)
    sub.mkdir(exist_ok=True)
    write_csv(paths[0], train)
    write_csv(paths[1], held)  # written last: present only once both are complete
    return paths


def write_csv(path: str, rows: list[dict]) -> None:
    """Puzzles in d1's Sudoku CSV layout (Puzzle, Solution), written atomically."""
    tmp = Path(path + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Puzzle", "Solution"])
        w.writerows([r["puzzle"], r["solution"]] for r in rows)
    tmp.replace(path)
