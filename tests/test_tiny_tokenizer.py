"""The tiny tokenizer a random-init run trains into its workdir (d1jax.model.tokenizer)."""

import subprocess
import sys
from pathlib import Path

from d1jax.model.tokenizer import load_tokenizer, special_ids, train_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [f"{a} + {b} = {a + b}" for a in range(40) for b in range(8)]

# Every process of a multi-process run with a random-init model trains the same tokenizer into
# the shared workdir and then loads it: a process that read another's half-written folder
# failed (a JSONDecodeError on tokenizer_config.json, seen in tests/test_multihost.py). Here two
# processes do that together, into a fresh folder each round.
PEER = """
import sys, time
from pathlib import Path
from d1jax.model.tokenizer import load_tokenizer, train_tiny_tokenizer
texts = [f"{a} + {b} = {a + b}" for a in range(40) for b in range(8)]
root, me = Path(sys.argv[1]), sys.argv[2]
for i in range(int(sys.argv[3])):
    (root / f"at{i}-{me}").touch()  # both begin the round together
    deadline = time.time() + 20
    while len(ready := list(root.glob(f"at{i}-*"))) < 2:
        if time.time() > deadline:
            sys.exit("the other process never reached round %d" % i)
        time.sleep(0.002)
    time.sleep(max(0.0, max(p.stat().st_mtime for p in ready) + 0.05 - time.time()))
    train_tiny_tokenizer(texts, root / f"tok{i}", 128)
    for _ in range(10):  # the other process may be saving into the folder now
        load_tokenizer(root / f"tok{i}")
print("ok")
"""
ROUNDS = 20


def test_same_result_however_many_processes_save_it_at_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", PEER, str(tmp_path), str(i), str(ROUNDS)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [(p.returncode, out.strip()) for p, (out, _) in zip(procs, outs)] == [(0, "ok")] * 2, (
        "\n\n".join(err[-3000:] for _, err in outs))  # both: the one that failed first, too
    alone = train_tiny_tokenizer(TEXTS, tmp_path / "alone", 128)
    for i in range(ROUNDS):
        tok = load_tokenizer(tmp_path / f"tok{i}")
        assert tok.get_vocab() == alone.get_vocab()
        assert special_ids(tok) == special_ids(alone)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left
    assert (tmp_path / "alone").stat().st_mode & 0o777 == 0o755  # readable by others, as mkdir


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
