"""Files larger than memory: the streamed parse (`fedapp.datasets.streaming`) equals the whole read -
values, dtypes, labels, ids and the one-line errors - on files cut into many small batches, and the node
cache maps what it streamed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedapp.datasets import Columns, DatasetError
from fedapp.datasets import streaming as st
from fedapp.datasets.node_cache import cached_source, entry_stem
from fedapp.datasets.sources import DEFAULT_COLUMNS, read_source


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "BATCH_ROWS", 7)  # uneven batches over 50 rows
    monkeypatch.setattr(st, "CSV_BLOCK_BYTES", 200)
    monkeypatch.setattr(st, "_SCAN_BLOCK", 16)


def _frame(n: int = 50, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"id": [f"r{i:03d}" for i in range(n)], "a": rng.normal(size=n)})
    frame["b"] = rng.normal(size=n).astype(np.float32)
    frame["label"] = rng.choice(["cat", "dog", "eel"], n)
    return frame


def _streamed(spec: str, tmp_path: Path, columns: Columns = DEFAULT_COLUMNS) -> object:
    return st.stream_source(spec, columns, None, tmp_path / "features.npy")


def _ids(data: object) -> list[str]:
    """The record ids as a client sees them (`LocalData.ids`): None is the row numbers."""
    return list(data.ids) if data.ids is not None else [str(i) for i in range(data.n_samples)]


def _same(whole: object, streamed: object) -> None:
    assert streamed.kind == whole.kind == "vectors"
    assert streamed.vectors.dtype == whole.vectors.dtype
    np.testing.assert_array_equal(np.asarray(streamed.vectors), whole.vectors)
    np.testing.assert_array_equal(streamed.y, whole.y)
    assert _ids(streamed) == _ids(whole)
    assert (streamed.labelled, streamed.n_classes, streamed.class_names) == (
        whole.labelled,
        whole.n_classes,
        whole.class_names,
    )


@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet"])
def test_a_streamed_table_equals_the_whole_read(fmt: str, tmp_path: Path) -> None:
    frame = _frame()
    path = tmp_path / f"site.{fmt}"
    if fmt == "parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, sep="\t" if fmt == "tsv" else ",", index=False)
    spec = f"{fmt}:{path}"
    streamed = _streamed(spec, tmp_path)
    _same(read_source(spec), streamed)
    assert isinstance(streamed.vectors, np.memmap)  # mapped, not held
    assert streamed.vectors.dtype == (np.float64 if fmt != "parquet" else np.float64)  # a float64 column
    summary = st.summary(spec, Columns(), None)
    assert (summary.n_samples, summary.width, summary.labelled, summary.n_classes) == (50, 2, True, 3)


def test_float32_parquet_numeric_labels_and_row_ids_stream_as_read(tmp_path: Path) -> None:
    frame = _frame().drop(columns=["id", "a"])
    frame["label"] = np.arange(50) % 4 * 10  # numeric labels, remapped in ascending order
    path = tmp_path / "site.parquet"
    frame.to_parquet(path)
    streamed = _streamed(f"parquet:{path}", tmp_path)
    _same(read_source(f"parquet:{path}"), streamed)
    assert streamed.vectors.dtype == np.float32 and streamed.ids is None  # row numbers, made when asked


def test_a_streamed_npy_equals_the_whole_read(tmp_path: Path) -> None:
    for dtype in (np.float32, np.float64, np.int16):
        path = tmp_path / f"x-{np.dtype(dtype).name}.npy"
        np.save(path, (np.arange(150).reshape(50, 3) - 20).astype(dtype))
        _same(read_source(f"npy:{path}"), _streamed(f"npy:{path}", tmp_path))
    assert st.summary(f"npy:{path}", Columns(), None).n_samples == 50


def _error(call: object) -> str:
    with pytest.raises(DatasetError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("row", "cell", "expected"),
    [
        (33, "x7", r"data row 33 \(0-based\), column 'a': not a number: 'x7'"),
        (41, "", r"data row 41 \(0-based\), column 'a': missing value"),
        (20, "inf", r"data row 20 \(0-based\), column 'a': NaN or infinite value 'inf'"),
    ],
)
def test_a_bad_cell_in_a_later_batch_is_the_whole_reads_error(
    row: int, cell: str, expected: str, tmp_path: Path
) -> None:
    frame = _frame().astype({"a": str})
    frame.loc[row, "a"] = cell
    path = tmp_path / "site.csv"
    frame.to_csv(path, index=False)
    whole = _error(lambda: read_source(f"csv:{path}"))
    streamed = _error(lambda: _streamed(f"csv:{path}", tmp_path))
    assert streamed == whole and re.search(expected, streamed)
    assert not list(tmp_path.glob("*.npy")) and not list(tmp_path.glob(".*tmp"))  # nothing half-written


def test_missing_labels_duplicate_ids_and_bad_npy_values_are_the_whole_reads_errors(tmp_path: Path) -> None:
    frame = _frame()
    frame.loc[30, "label"] = ""
    path = tmp_path / "labels.csv"
    frame.to_csv(path, index=False)
    assert _error(lambda: _streamed(f"csv:{path}", tmp_path)) == _error(lambda: read_source(f"csv:{path}"))
    frame = _frame()
    frame.loc[45, "id"] = "r002"
    path = tmp_path / "ids.parquet"
    frame.to_parquet(path)
    message = _error(lambda: _streamed(f"parquet:{path}", tmp_path))
    assert message == _error(lambda: read_source(f"parquet:{path}")) and "duplicate id 'r002'" in message
    array = np.ones((50, 3))
    array[37, 2] = np.nan
    path = tmp_path / "x.npy"
    np.save(path, array)
    message = _error(lambda: _streamed(f"npy:{path}", tmp_path))
    assert message == _error(lambda: read_source(f"npy:{path}")) and "row 37, column 2" in message


def test_corrupt_and_non_utf8_files_are_the_whole_reads_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    text = _frame().to_csv(index=False).encode()
    at = text.index(b"\n", 900) + 3  # inside a later batch
    path.write_bytes(text[:at] + b"\xff" + text[at:])
    message = _error(lambda: _streamed(f"csv:{path}", tmp_path))
    assert message == _error(lambda: read_source(f"csv:{path}")) and "not UTF-8 text" in message
    path = tmp_path / "bad.parquet"
    _frame().to_parquet(path)
    path.write_bytes(path.read_bytes()[:-40])
    assert "not a readable Parquet file" in _error(lambda: _streamed(f"parquet:{path}", tmp_path))
    path = tmp_path / "cut.npy"
    np.save(path, np.ones((50, 3)))
    path.write_bytes(path.read_bytes()[:-100])
    assert "not a readable .npy file" in _error(lambda: _streamed(f"npy:{path}", tmp_path))
    path = tmp_path / "header.csv"
    path.write_text("a,b,label\n")
    assert _error(lambda: _streamed(f"csv:{path}", tmp_path)) == _error(lambda: read_source(f"csv:{path}"))


def test_the_node_cache_streams_a_large_file_once_and_maps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "site.parquet"
    _frame().to_parquet(path)
    spec, columns = f"parquet:{path}", Columns()
    assert not st.streams(spec, columns, None, None)  # small: read whole, as before
    monkeypatch.setattr(st, "STREAM_ABOVE_BYTES", 100)
    assert st.streams(spec, columns, None, None) and not st.streams(spec, columns, None, "texts")
    stem = entry_stem(spec, columns, None, None)

    def never() -> object:
        raise AssertionError("a streamed file is not read whole")

    def stream(features: Path) -> object:
        return st.stream_source(spec, columns, None, features)

    first = cached_source(tmp_path / "node", stem, spec, never, stream)
    again = cached_source(tmp_path / "node", stem, spec, never, None)  # the entry, mapped
    _same(read_source(spec), first)
    _same(first, again)
    assert isinstance(again.vectors, np.memmap)


def test_the_preflight_reads_a_streamed_file_by_its_summary_and_still_names_a_bad_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedapp.app import preflight
    from fedapp.config.run import ConfigError, parse_run_config

    for site in range(2):
        _frame(50, seed=site).drop(columns="id").to_parquet(tmp_path / f"site-{site}.parquet")
    monkeypatch.setattr(st, "STREAM_ABOVE_BYTES", 100)

    def whole(*_: object) -> object:
        raise AssertionError("a streamed file is not read whole by the preflight")

    monkeypatch.setattr(preflight, "load_run_dataset", whole)
    spec = f"parquet:{tmp_path}/site-{{partition-id}}.parquet"
    keys = {"method": "kfed", "dataset": spec, "out-dir": str(tmp_path / "out")}
    cfg = parse_run_config(keys)
    preflight.check_run(cfg, 2)  # 50 records a site, 3 classes, width 2
    with pytest.raises(ConfigError, match=r"client 0: .* holds 50 records, fewer than k=60"):
        preflight.check_run(parse_run_config({**keys, "k": 60}), 2)
    _frame(50, seed=5).drop(columns=["id", "b"]).to_parquet(tmp_path / "site-1.parquet")
    with pytest.raises(DatasetError, match=r"client 1: .* has shape 1 per record, client 0's file 2"):
        preflight.check_run(cfg, 2)
