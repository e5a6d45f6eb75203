"""Publishes a demo run's table: the README's (and docs/demo.md's) demo tables are generated
from a run's results.json, never copied by hand.

  python -m examples.demo.table runs/demo/results.json                  # print the table
  python -m examples.demo.table runs/demo/results.json --write          # replace it in the docs
  python -m examples.demo.table runs/demo_seeds/results.json --write    # the multi-seed table

A single run's results (``python -m examples.demo``): ``--write`` replaces the block between
``<!-- demo-table:begin -->`` and ``<!-- demo-table:end -->`` in README.md and docs/demo.md
and copies the results to docs/demo_results.json; with the GRPO metrics' summary in the
results, also the ``demo-mechanism`` block of docs/demo.md. A ``:d1like`` run's (its SFT
corpus "latin") go to the ``demo-d1like-table`` and ``demo-d1like-mechanism`` blocks of
docs/demo.md and to docs/demo_d1like_results.json; the multi-seed results of ``:d1like``
(``python -m examples.demo.seeds --config=configs/demo_sudoku.py:d1like``) to the
``demo-d1like-seeds-*`` blocks and docs/demo_d1like_seeds_results.json. The multi-seed results
(``python -m examples.demo.seeds``): the table, claims, loss and per-run blocks
(``<!-- demo-seeds-*:begin -->``) in docs/demo.md and the claims that held in every run
in README.md, from
docs/demo_seeds_results.json. tests/test_demo.py regenerates every block from those files.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from examples.demo import aggregate, report

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- demo-table:begin -->", "<!-- demo-table:end -->"
PUBLISHED = ROOT / "docs" / "demo_results.json"
PUBLISHED_SEEDS = ROOT / "docs" / "demo_seeds_results.json"
PUBLISHED_D1LIKE = ROOT / "docs" / "demo_d1like_results.json"
PUBLISHED_D1LIKE_SEEDS = ROOT / "docs" / "demo_d1like_seeds_results.json"
README, DEMO_DOC = ROOT / "README.md", ROOT / "docs" / "demo.md"
DOCS = (README, DEMO_DOC)
# A single run's blocks by its SFT corpus (demo.sft.corpus): name prefix, the documents of
# its accuracy table, its published copy. Mechanism tables go to docs/demo.md only.
SINGLE = {"sudoku": ("demo", DOCS, PUBLISHED),
          "latin": ("demo-d1like", (DEMO_DOC,), PUBLISHED_D1LIKE)}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def block(results: dict, name: str = "demo-table") -> str:
    """The generated block ``name`` of ``results`` (a single run's, or the multi-seed's)."""
    begin, end = markers(name)
    kind = name.replace("demo-d1like-seeds-", "demo-seeds-")  # the same tables, own blocks
    body = {"demo-table": report.results_table,
            "demo-mechanism": report.mechanism_table,
            "demo-d1like-table": report.results_table,
            "demo-d1like-mechanism": report.mechanism_table,
            "demo-seeds-table": aggregate.seeds_table,
            "demo-seeds-mechanism": aggregate.mechanism_table,
            "demo-seeds-claims": lambda r: aggregate.caption(r) + "\n" + aggregate.claims_list(r),
            "demo-seeds-held": lambda r: (aggregate.caption(r) + "\n"
                                          + aggregate.claims_list(r, held_only=True)),
            "demo-seeds-loss": aggregate.loss_table,
            "demo-seeds-runs": aggregate.runs_table}[kind](results)
    return f"{begin}\n{body}\n{end}"


# Where each multi-seed block goes.
SEEDS_BLOCKS = {"demo-seeds-table": (DEMO_DOC,), "demo-seeds-claims": (DEMO_DOC,),
                "demo-seeds-held": (README,),
                "demo-seeds-loss": (DEMO_DOC,), "demo-seeds-runs": (DEMO_DOC,)}


def published_block(text: str, name: str = "demo-table") -> str | None:
    """The block ``name`` of a document (None when it has none)."""
    begin, end = markers(name)
    m = re.search(re.escape(begin) + r".*?" + re.escape(end), text, flags=re.S)
    return m.group(0) if m else None


def has_mechanism(results: dict) -> bool:
    """Whether the results hold the GRPO rows' mechanism summary (runs before it did not)."""
    return any("mechanism" in r for r in results["rows"].values())


def targets(results: dict) -> tuple[dict[str, tuple[Path, ...]], Path]:
    """(block name -> documents, published copy) of a results dict."""
    if results.get("kind") == "multi_seed" and "d1like" in results.get("config", ""):
        blocks = {f"demo-d1like-seeds-{b}": (DEMO_DOC,)
                  for b in ("table", "claims", "runs", "mechanism")}
        return blocks, PUBLISHED_D1LIKE_SEEDS
    if results.get("kind") == "multi_seed":
        blocks = dict(SEEDS_BLOCKS)
        if has_mechanism(results):
            blocks["demo-seeds-mechanism"] = (DEMO_DOC,)
        return blocks, PUBLISHED_SEEDS
    prefix, docs, published = SINGLE[results.get("sft_corpus", "sudoku")]
    blocks = {f"{prefix}-table": docs}
    if has_mechanism(results):
        blocks[f"{prefix}-mechanism"] = (DEMO_DOC,)
    return blocks, published


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a demo run's (or demo.seeds') results.json")
    parser.add_argument("--write", action="store_true", help="update README.md and docs/demo.md")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    if "commit" not in results or results["commit"].startswith("unknown"):
        raise SystemExit(f"error: {args.results} names no commit (written before the demo "
                         "recorded one, or outside a git checkout): rerun the demo")
    blocks, published = targets(results)
    if not args.write:
        print("\n\n".join(block(results, name) for name in blocks))
        return
    for name, docs in blocks.items():
        new = block(results, name)
        for doc in docs:
            text = doc.read_text()
            old = published_block(text, name)
            if old is None:
                raise SystemExit(f"error: {doc} has no {' ... '.join(markers(name))} block")
            doc.write_text(text.replace(old, new))
    if args.results.resolve() != published.resolve():
        shutil.copyfile(args.results, published)
    print(f"wrote the tables of commit {results['commit']} to "
          + ", ".join(sorted({d.name for docs in blocks.values() for d in docs})))


if __name__ == "__main__":
    main()
