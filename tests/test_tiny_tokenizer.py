"""The tiny tokenizer a random-init run trains into its workdir (d1jax.model.tokenizer)."""

import subprocess
import sys
from pathlib import Path

from d1jax.model.tokenizer import load_tokenizer, special_ids, train_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [f"{a} + {b} = {a + b}" for a in range(40) for b in range(8)]

# Every process of a multi-process run with a random-init model trains the same tokenizer into
# the shared workdir and then loads it: a process that read another's half-written folder
# failed (a JSONDecodeError on tokenizer_config.json, seen in tests/test_multihost.py).
WRITER = """
import sys, time
from pathlib import Path
from d1jax.model.tokenizer import load_tokenizer, train_tiny_tokenizer
texts = [f"{a} + {b} = {a + b}" for a in range(40) for b in range(8)]
root, start = Path(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # both processes begin together
for i in range(int(sys.argv[3])):
    train_tiny_tokenizer(texts, root / f"tok{i}", 128)
    for _ in range(20):  # the other process may be saving into the folder now
        load_tokenizer(root / f"tok{i}")
print("ok")
"""


def test_same_result_however_many_processes_save_it_at_once(tmp_path):
    import time
    start = time.time() + 8  # after both have imported transformers
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(start), "6"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == "ok", err[-3000:]
    alone = load_tokenizer(train_tiny_tokenizer(TEXTS, tmp_path / "alone", 128).name_or_path)
    for i in range(6):
        tok = load_tokenizer(tmp_path / f"tok{i}")
        assert tok.get_vocab() == alone.get_vocab()
        assert special_ids(tok) == special_ids(alone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["alone"] + [f"tok{i}" for i in range(6)])  # no temporary folder left behind


def test_saved_into_a_folder_that_already_holds_files(tmp_path):
    """A model folder with other files (or a stale partial save) keeps them and gets a
    loadable tokenizer."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "tokenizer_config.json").write_text("")  # an interrupted save's empty file
    tok = train_tiny_tokenizer(TEXTS, out, 128)
    assert (out / "config.json").read_text() == "{}"
    assert load_tokenizer(out).get_vocab() == tok.get_vocab()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
