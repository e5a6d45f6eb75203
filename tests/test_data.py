"""The example iterator: deterministic order, exact mid-epoch resume, host sharding; and
how ``tasks.sources.read_file`` reports a malformed record (file and line)."""

import numpy as np
import pytest

from d1jax.tasks import sources
from d1jax.train.data import ExampleIterator


def take(it, n):
    return [next(it) for _ in range(n)]


def test_same_seed_same_order_and_epochs_cover_all():
    a = take(ExampleIterator(range(10), 4, seed=3), 4)
    b = take(ExampleIterator(range(10), 4, seed=3), 4)
    assert a == b
    epoch0 = sorted(a[0] + a[1])
    assert len(set(epoch0)) == 8  # two full batches, tail of 2 dropped
    assert take(ExampleIterator(range(10), 4, seed=4), 2) != a[:2]


def test_resume_mid_epoch_is_exact():
    it = ExampleIterator(range(13), 3, seed=0)
    take(it, 5)  # crosses the epoch boundary (4 batches per epoch)
    state = it.get_state()
    rest = take(it, 6)
    it2 = ExampleIterator(range(13), 3, seed=0)
    it2.set_state(state)
    assert take(it2, 6) == rest


def test_hosts_split_each_global_batch():
    full = take(ExampleIterator(range(16), 8, seed=1, process_index=0, process_count=1), 3)
    h0 = take(ExampleIterator(range(16), 8, seed=1, process_index=0, process_count=2), 3)
    h1 = take(ExampleIterator(range(16), 8, seed=1, process_index=1, process_count=2), 3)
    assert [a + b for a, b in zip(h0, h1)] == full


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="not divisible"):
        ExampleIterator(range(16), 7, seed=0, process_index=0, process_count=2)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        ExampleIterator(range(3), 4, seed=0)


# ------------------------------------------------ d1jax.tasks.sources.read_file: bad records

def test_broken_jsonl_line_names_file_and_line(tmp_path):
    from d1jax.tasks.sources import BadRecordError, read_file
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n')  # blank line 2 is skipped, line 3 is cut short
    with pytest.raises(BadRecordError, match=r"rows\.jsonl line 3: not valid JSON .*'\{\"a\": 2'"):
        read_file(path)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(BadRecordError, match=r"rows\.jsonl line 2: expected a JSON object.*list"):
        read_file(path)


def test_broken_json_file_names_line_or_row(tmp_path):
    from d1jax.tasks.sources import BadRecordError, read_file
    path = tmp_path / "rows.json"
    path.write_text('[{"a": 1},\n {"a": }]')
    with pytest.raises(BadRecordError, match=r"rows\.json line 2: not valid JSON"):
        read_file(path)
    path.write_text('[{"a": 1}, "oops"]')
    with pytest.raises(BadRecordError,
                       match=r"rows\.json row index 1: expected a JSON object.*'oops'"):
        read_file(path)


def test_csv_row_that_does_not_match_the_header(tmp_path):
    from d1jax.tasks.sources import BadRecordError, read_file
    path = tmp_path / "rows.csv"
    path.write_text("a,b\n1,2\n3\n")
    with pytest.raises(BadRecordError, match=r"rows\.csv line 3: 1 cell\(s\) but the header "
                                             r"has 2 columns \(a, b\); no value for 'b'"):
        read_file(path)
    path.write_text("a,b\n1,2,3\n")
    with pytest.raises(BadRecordError, match=r"rows\.csv line 2: 3 cell\(s\)"):
        read_file(path)


def test_good_files_load_and_remember_where_rows_came_from(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from d1jax.tasks.sources import read_file, where
    (tmp_path / "r.csv").write_text("a,b\n1,2\n3,4\n")
    (tmp_path / "r.jsonl").write_text('{"a": 1}\n\n{"a": 2}\n')
    pq.write_table(pa.Table.from_pylist([{"a": 1}, {"a": 2}]), tmp_path / "r.parquet")
    csv_rows, jsonl_rows = read_file(tmp_path / "r.csv"), read_file(tmp_path / "r.jsonl")
    parquet_rows = read_file(tmp_path / "r.parquet")
    assert csv_rows == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]
    assert jsonl_rows == parquet_rows == [{"a": 1}, {"a": 2}]
    assert where(csv_rows, 1) == f"{tmp_path / 'r.csv'} line 3"  # the header is line 1
    assert where(jsonl_rows, 1) == f"{tmp_path / 'r.jsonl'} line 3"  # blank lines count
    assert where(parquet_rows, 1) == f"{tmp_path / 'r.parquet'} row index 1"
    assert where([{"a": 1}], 0) == "row index 0"


def test_an_unknown_file_type_is_a_bad_record_naming_the_suffixes(tmp_path):
    bad = tmp_path / "rows.txt"
    bad.write_text("a\n")
    with pytest.raises(sources.BadRecordError, match=r"rows.txt: unsupported data file type "
                                                     r"'.txt' \(use one of "):
        sources.read_file(bad)


def test_d1_eval_subset_is_d1s_draw_and_a_smaller_source_is_scored_whole():
    """d1's eval.py: np.random.seed(42); np.random.choice(len, size, replace=False)."""
    rows = list(range(500))
    np.random.seed(42)
    assert sources.d1_eval_subset(rows, 256) == list(np.random.choice(500, 256, replace=False))
    small = list(range(40))
    np.random.seed(42)
    assert sources.d1_eval_subset(small, 256) == list(np.random.choice(40, 40, replace=False))
    assert sources.d1_eval_subset(small, None) == small
