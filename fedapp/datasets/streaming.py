"""Own vector files larger than memory: parsed batch by batch straight into a memory-mapped ``.npy``.

`fedapp.datasets.sources` reads a file whole (pandas / pyarrow), then keeps one array: the file must fit
in memory once. Above `STREAM_ABOVE_BYTES` a node's CSV, TSV, Parquet or ``.npy`` file that gives vectors
is read in bounded batches instead - Parquet row groups through `ParquetFile.iter_batches`, CSV/TSV through
pyarrow's streaming CSV reader (every cell as its text, as the whole read takes it), ``.npy`` through a
read-only memory map - each batch validated by the whole read's own checks (the same one-line errors,
rows counted over the whole file) and appended to a ``.npy`` whose header is written last, so peak memory
is about one batch (a Parquet row group) and the labels and ids, not the file. The node cache
(`fedapp.datasets.node_cache`) keeps that ``.npy`` as its entry's features and maps it.

Where a batch cannot see the whole file, the rule is the first batch's: without `feature-columns` the
first batch decides which columns are mostly numbers (the whole read decides over the whole column), and a
later batch's odd non-number in such a column is the same error as any bad cell. A CSV row with fewer
fields than the header is a parse error here (pandas fills it with empty cells, which then fail as missing
values). JSONL and ``.npz`` are not streamed (a zip member is one compressed stream; JSONL rows are
objects): they are read whole, as are text sets and images.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from fedapp.datasets import sources as src
from fedapp.datasets.common import Dataset, DatasetError, build
from fedapp.private_files import owner_only_fd

if TYPE_CHECKING:  # pandas and pyarrow load where a file is streamed: the demo data needs neither
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

STREAMED_PREFIXES = ("csv:", "tsv:", "parquet:", "npy:")
STREAM_ABOVE_BYTES = 64 << 20  # smaller files are read whole, as before (one parse shared with the preflight)
BATCH_ROWS = 65_536  # most Parquet and .npy rows a batch (2 MiB a float32 column)
BATCH_VALUES = 1 << 21  # and at most about this many cells: wide files take fewer rows a batch
_COLUMN_BUFFER = 1 << 16  # Parquet reads a column chunk through a buffer this big, not whole
CSV_BLOCK_BYTES = 1 << 24  # CSV/TSV text a batch
_HEADER_BYTES = 128  # room left for the .npy header, written last (a multiple of 64 keeps rows aligned)
_SCAN_BLOCK = 1 << 22


@dataclass(frozen=True)
class Summary:
    """What the preflight needs of a streamed file, read without holding it (`summary`)."""

    name: str
    n_samples: int
    width: int
    labelled: bool
    n_classes: int


def streams(spec: str, columns: src.Columns, partition_id: int | None, expect_kind: str | None) -> bool:
    """Whether this file is parsed in batches: CSV/TSV/Parquet/npy, above `STREAM_ABOVE_BYTES` (read at
    call time), giving vectors. Anything else, or a file whose header already fails, is read whole."""
    prefix = src._prefix(spec)
    if prefix not in STREAMED_PREFIXES or expect_kind not in (None, "vectors"):
        return False
    try:
        path = src.source_path(spec, partition_id)
        if not (path.is_file() and path.stat().st_size > STREAM_ABOVE_BYTES):
            return False
        return src.source_kind(spec, columns, partition_id) == "vectors"
    except (OSError, DatasetError):
        return False  # the whole read names the problem


def stream_source(
    spec: str, columns: src.Columns, partition_id: int | None, features: Path, expect_kind: str | None = None
) -> Dataset:
    """Parse a vector file in batches, writing its features to `features` (a ``.npy``, replaced
    atomically, 0600); the dataset maps it. Errors are the whole read's (`sources.read_source`)."""
    prefix = src._prefix(spec)
    path = src.source_path(spec, partition_id)
    name = src.substituted(spec, partition_id)
    if expect_kind not in (None, "vectors"):
        raise DatasetError(f"{path}: '{prefix}' is streamed as vectors, but {expect_kind} are expected")
    with _NpyStream(features) as out:
        if prefix == "npy:":
            for block in _npy_blocks(path):
                out.append(block)
            n = out.rows
            raw, ids, labelled = np.zeros(n, np.int64), None, False
        else:
            raw, ids, labelled = _stream_table(path, prefix, columns, out.append)
    _release_arrow_memory()
    vectors = np.load(features, mmap_mode="r", allow_pickle=False)
    return build(name, "vectors", raw, source=path, vectors=vectors, ids=ids, labelled=labelled)


def summary(
    spec: str, columns: src.Columns, partition_id: int | None, expect_kind: str | None = None
) -> Summary:
    """Records, width, labels present and classes of a streamed file, for the preflight: the first batch
    parsed and checked, the row count from Parquet's metadata or the ``.npy`` header, the labels (or, for
    an unlabelled CSV, one column) streamed. The clients' streamed parse checks every other cell."""
    prefix = src._prefix(spec)
    path = src.source_path(spec, partition_id)
    name = src.substituted(spec, partition_id)
    if prefix == "npy:":
        array = _npy_map(path)
        return Summary(name, int(array.shape[0]), int(array.shape[1]), False, 1)
    names, columns = _table_columns(path, prefix, columns)
    first = next(_table_batches(path, prefix, names, _needed(names, columns)))
    width = src._table_feature_columns(first, columns)[0].shape[1]
    labelled = bool(columns.label) and columns.label in names
    counted = [columns.label] if labelled else names[:1]
    rows, labels = 0, _Labels()
    if prefix == "parquet:" and not labelled:
        rows = _parquet_file(path).metadata.num_rows
    else:
        for batch in _table_batches(path, prefix, names, counted):
            if labelled:
                labels.add(batch.column(columns.label), batch, columns.label)
            rows += batch.n_rows
    n_classes = len(np.unique(labels.raw(path))) if labelled else 1
    _release_arrow_memory()
    return Summary(name, rows, width, labelled, n_classes)


# --------------------------------------------------------------------------- tables


def _table_columns(path: Path, prefix: str, columns: src.Columns) -> tuple[list[str], src.Columns]:
    """The header's names and the columns as the whole read resolves them (default id, checks)."""
    names = src._table_names(path, prefix)
    header = src._Table(path, names, 0, _no_column)
    columns = src._with_default_id(header, columns)
    kind = src._table_kind(path, names, columns, "vectors")
    src._check_named_columns(header, columns, kind)
    return names, columns


def _no_column(name: str) -> pd.Series:
    raise AssertionError(f"a header has no cells ({name})")


def _needed(names: list[str], columns: src.Columns) -> list[str]:
    """The columns a vector parse reads: named features (else every column), label and id."""
    if not columns.features:
        return names
    return [name for name in names if name in (*columns.features, columns.label, columns.id)]


def _stream_table(
    path: Path, prefix: str, columns: src.Columns, write: Callable[[np.ndarray], None]
) -> tuple[np.ndarray, list[str] | None, bool]:
    """Every batch's features to `write`; returns (raw labels, ids, labelled) as the whole read has them,
    ids None for row numbers (`LocalData.ids` makes them when asked: 2.5 M strings are ~150 MB)."""
    names, columns = _table_columns(path, prefix, columns)
    labelled = bool(columns.label) and columns.label in names
    labels, chosen, rows = _Labels(), None, 0
    ids: list[str] = []
    for batch in _table_batches(path, prefix, names, _needed(names, columns)):
        if columns.id:
            ids += src._table_ids(batch, columns)
        if labelled:
            labels.add(batch.column(columns.label), batch, columns.label)
        block, chosen = src._table_feature_columns(batch, columns, chosen)
        write(block)
        rows += batch.n_rows
    if columns.id:
        src._check_unique_ids(ids, path, _data_row)
    raw = labels.raw(path) if labelled else np.zeros(rows, np.int64)
    return raw, (ids if columns.id else None), labelled


def _data_row(row: int) -> str:
    return f"data row {row} (0-based)"


class _Labels:
    """A label column gathered batch by batch; `raw` is what `sources._labels` gives for the whole column."""

    def __init__(self) -> None:
        self.strings: list[np.ndarray] = []
        self.numbers: list[np.ndarray] = []

    def add(self, series: pd.Series, batch: src._Table, column: str) -> None:
        import pandas as pd

        row = src._first(src._missing(series))
        if row is not None:
            raise DatasetError(f"{batch.path}: {batch.where(row)}, column '{column}': missing label")
        strings = series.astype(str).str.strip()
        self.strings.append(strings.to_numpy(dtype=str))
        self.numbers.append(pd.to_numeric(strings, errors="coerce").to_numpy(np.float64))

    def raw(self, path: Path) -> np.ndarray:
        if not self.numbers:
            raise DatasetError(f"{path}: no rows")
        numbers = np.concatenate(self.numbers)
        if not np.isfinite(numbers).all():
            return np.concatenate(self.strings)
        return numbers.astype(np.int64) if (numbers == np.round(numbers)).all() else numbers


def _table_batches(path: Path, prefix: str, names: list[str], needed: list[str]) -> Iterator[src._Table]:
    """The table's rows in batches, as `sources._Table`s whose messages count rows over the whole file."""
    batches = _parquet_batches(path, needed) if prefix == "parquet:" else _csv_batches(path, prefix, needed)
    first_row = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        yield src._Table(path, names, batch.num_rows, _column_of(path, batch), first_row=first_row)
        first_row += batch.num_rows
    if first_row == 0:
        empty = "no rows" if prefix == "parquet:" else "no data rows (header only)"
        raise DatasetError(f"{path}: {empty}")


def _batch_rows(columns: int) -> int:
    """Rows a batch of this many columns: `BATCH_ROWS`, fewer for wide files (`BATCH_VALUES` cells)."""
    return max(1, min(BATCH_ROWS, BATCH_VALUES // max(1, columns)))


def _release_arrow_memory() -> None:
    """Hand the Arrow pool's freed blocks back to the system: its allocator keeps them otherwise, and a
    parse's batches would stay counted against the process after it (RSS, `ulimit -d`)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _column_of(path: Path, batch: pa.RecordBatch) -> Callable[[str], pd.Series]:
    import pyarrow as pa

    def column(name: str) -> pd.Series:
        try:
            return batch.column(name).to_pandas()
        except (KeyError, ValueError, pa.ArrowException) as exc:
            raise DatasetError(f"{path}: column '{name}' cannot be read: {src._one_line(exc)}") from exc

    return column


def _parquet_file(path: Path) -> pq.ParquetFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:  # no pre-buffering, buffered column reads: the Arrow pool's peak is about a row group's pages
        return pq.ParquetFile(path, pre_buffer=False, buffer_size=_COLUMN_BUFFER)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file: {src._one_line(exc)}") from exc


def _parquet_batches(path: Path, needed: list[str]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    rows = _batch_rows(len(needed))
    batches = _parquet_file(path).iter_batches(batch_size=rows, columns=needed, use_threads=False)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DatasetError(f"{path}: not a readable Parquet file: {src._one_line(exc)}") from exc
        yield batch


def _csv_batches(path: Path, prefix: str, needed: list[str]) -> Iterator[pa.RecordBatch]:
    """CSV/TSV rows as text cells ("" when empty), as `sources._read_delimited` reads them."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    header_line, _ = src._first_line(path)
    names = src._table_names(path, prefix)
    tsv = prefix == "tsv:"
    try:
        reader = pa_csv.open_csv(
            path,
            read_options=pa_csv.ReadOptions(
                column_names=names, skip_rows=header_line, block_size=CSV_BLOCK_BYTES, use_threads=False
            ),
            parse_options=pa_csv.ParseOptions(
                delimiter=src._TABLE_SEPARATORS[prefix],
                quote_char=False if tsv else '"',
                newlines_in_values=not tsv,
            ),
            convert_options=pa_csv.ConvertOptions(
                column_types={name: pa.string() for name in names},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                include_columns=needed,
            ),
        )
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            yield batch
    except (OSError, ValueError, pa.ArrowException) as exc:
        if isinstance(exc, DatasetError):
            raise
        _raise_if_not_utf8(path)
        kind = prefix.rstrip(":").upper()
        raise DatasetError(f"{path}: cannot parse as {kind}: {src._one_line(exc)}") from exc


def _raise_if_not_utf8(path: Path) -> None:
    """The whole read's error for the first byte that is not UTF-8 (offset and line), scanning in blocks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    read, newlines = 0, 0
    with path.open("rb") as handle:
        while block := handle.read(_SCAN_BLOCK):
            pending = decoder.getstate()[0]  # a character cut by the block boundary (no newline in it)
            try:
                decoder.decode(block)
            except UnicodeDecodeError:
                src._utf8(pending + block, path, read - len(pending), 1 + newlines)
            read += len(block)
            newlines += block.count(b"\n")
        pending = decoder.getstate()[0]
        if pending:  # the file ends inside a character
            src._utf8(pending, path, read - len(pending), 1 + newlines)


# --------------------------------------------------------------------------- .npy files


def _npy_map(path: Path) -> np.ndarray:
    head = src._magic(path, "npy:")
    if head.startswith(src._ZIP_MAGICS):
        raise DatasetError(f"{path}: is an .npz archive; use 'npz:' instead of 'npy:'")
    if head != src._NPY_MAGIC:
        raise DatasetError(f"{path}: not a NumPy .npy file (no .npy header)")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DatasetError(f"{path}: not a readable .npy file: {src._one_line(exc)}") from exc
    src._check_matrix(array, path, "the array")
    return array


def _npy_blocks(path: Path) -> Iterator[np.ndarray]:
    """The array's rows in batches, as float32 (when stored so) or float64; the first NaN/inf is the whole
    read's error."""
    array = _npy_map(path)
    dtype = src._check_matrix(array, path, "the array")
    step = _batch_rows(array.shape[1])
    for start in range(0, array.shape[0], step):
        block = np.asarray(array[start : start + step], dtype)
        bad = np.argwhere(~np.isfinite(block))
        if len(bad):
            row, col = bad[0]
            raise DatasetError(
                f"{path}: row {start + row}, column {col} (0-based) of the array: NaN or infinite value"
            )
        yield block


# --------------------------------------------------------------------------- the .npy written


class _NpyStream:
    """Rows appended to a ``.npy`` whose header is written last (a CSV's row count is known only at its
    end): a temporary file beside `path`, 0600, renamed over it when complete, removed on an error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows, self.dtype, self.width = 0, np.dtype(np.float64), 0
        self.temporary = ""
        self.handle: IO[bytes] | None = None

    def __enter__(self) -> _NpyStream:
        folder, prefix = self.path.parent, f".{self.path.name}."
        fd, self.temporary = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
        owner_only_fd(fd)
        self.handle = os.fdopen(fd, "wb")
        self.handle.write(b"\0" * _HEADER_BYTES)
        return self

    def append(self, block: np.ndarray) -> None:
        assert self.handle is not None
        if self.rows == 0:
            self.dtype, self.width = block.dtype, block.shape[1]
        self.handle.write(np.ascontiguousarray(block, self.dtype).data)
        self.rows += block.shape[0]

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        assert self.handle is not None
        try:
            if kind is None:
                self.handle.seek(0)
                self.handle.write(npy_header(self.dtype, (self.rows, self.width)))
                self.handle.flush()
                os.fsync(self.handle.fileno())
            self.handle.close()
            if kind is None:
                os.replace(self.temporary, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.temporary)


def npy_header(dtype: np.dtype, shape: tuple[int, int]) -> bytes:
    """A version 1.0 ``.npy`` header of exactly `_HEADER_BYTES` (spaces pad it, as NumPy's own do)."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    text = repr({"descr": descr, "fortran_order": False, "shape": shape})
    room = _HEADER_BYTES - len(src._NPY_MAGIC) - 4
    if len(text) + 1 > room:
        raise ValueError(f"an .npy header for shape {shape} does not fit {_HEADER_BYTES} bytes")
    return src._NPY_MAGIC + b"\x01\x00" + struct.pack("<H", room) + (text.ljust(room - 1) + "\n").encode()
