"""Publishes a demo run's table: the README's (and docs/demo.md's) demo table is generated
from a run's results.json, never copied by hand.

  python -m examples.demo.table runs/demo/results.json            # print the table
  python -m examples.demo.table runs/demo/results.json --write    # replace it in the docs

``--write`` replaces the block between ``<!-- demo-table:begin -->`` and
``<!-- demo-table:end -->`` in README.md and docs/demo.md, and copies results.json to
docs/demo_results.json, from which tests/test_demo.py regenerates the README's table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from examples.demo import report

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- demo-table:begin -->", "<!-- demo-table:end -->"
PUBLISHED = ROOT / "docs" / "demo_results.json"
DOCS = (ROOT / "README.md", ROOT / "docs" / "demo.md")


def block(results: dict) -> str:
    return f"{BEGIN}\n{report.results_table(results)}\n{END}"


def published_block(text: str) -> str | None:
    """The demo-table block of a document (None when it has none)."""
    m = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, flags=re.S)
    return m.group(0) if m else None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a demo run's results.json")
    parser.add_argument("--write", action="store_true", help="update README.md and docs/demo.md")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    if "commit" not in results:
        raise SystemExit(f"error: {args.results} names no commit (written before the demo "
                         "recorded one): rerun the demo")
    new = block(results)
    if not args.write:
        print(new)
        return
    for doc in DOCS:
        text = doc.read_text()
        if published_block(text) is None:
            raise SystemExit(f"error: {doc} has no {BEGIN} ... {END} block")
        doc.write_text(text.replace(published_block(text), new))
    if args.results.resolve() != PUBLISHED.resolve():
        shutil.copyfile(args.results, PUBLISHED)
    print(f"wrote the table of commit {results['commit']} to "
          + ", ".join(d.name for d in DOCS))


if __name__ == "__main__":
    main()
