"""Users' own data files ("source specs"): a clinic's or a company's table, array or image folder.

A source spec is a format prefix and a path, absolute or relative to the current directory (``~``
expanded); ``{partition-id}`` in the path is replaced by the client's partition id, so each client of a
simulation can read its own file:

- ``csv:PATH``, ``tsv:PATH``, ``jsonl:PATH``, ``parquet:PATH``: a table. With the text column (`Columns`)
  it is a text set (kind ``"texts"``), else a vector set built from its numeric feature columns
  (``"vectors"``, float64; float32 where the file stores float32). CSV is UTF-8 with a header row;
  TSV is UTF-8, tab-separated, with a header row and no quoting (a field cannot hold a tab or a
  newline); JSONL holds one JSON object per line (blank lines skipped). An empty CSV/TSV cell, or a
  JSON/Parquet null, is a missing value.
- ``npy:PATH``: one 2-D numeric array, N x D features.
- ``npz:PATH``: features ``x``, ``X`` or ``features`` (first found), optional labels ``y`` or ``labels``
  and optional ``ids``; no pickled objects.
- ``images:DIR``: every .png/.jpg/.jpeg/.bmp/.gif/.tif/.tiff/.webp file below DIR (hidden files and
  folders skipped), all of one size; labelled by their first-level sub-folder when every image sits in
  one, else unlabelled. uint8 N x C x H x W, C = 1 when every image is greyscale (16-bit greyscale
  keeps its high byte), else 3 (RGB, alpha dropped); rows sorted by path.

Columns: an absent label column of the default name ``label`` means unlabelled data (as does ``label=""``);
any other column named in `Columns` must exist, so a typo is an error rather than silently lost labels.
``text=""`` never makes a text set. Without `Columns.features` every numeric column except the id and
label columns is a feature: one mostly of numbers (its odd non-number is then an error, not a reason to
drop the column). Numeric labels (all labels parse as numbers) are remapped in ascending order, others
are class names in sorted order, as for every dataset. Every row gets an id, as a string: the id column
(``id-column``, else a column named ``id``) read as text (``007`` stays ``007``), the npz ``ids``, the
image path relative to DIR, else the row number.

Every failure is a one-line `DatasetError` that names the file and, where it applies, the row - data rows
counted from 0, header not counted; "line N" (from 1) for JSONL and for undecodable bytes - and column.
"""

from __future__ import annotations

import codecs
import io
import json
import math
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.common.logger import log

from fedapp.datasets.common import Dataset, DatasetError, build

if TYPE_CHECKING:  # pandas, pyarrow and Pillow load where a file is read: the demo data needs none
    import pandas as pd

SOURCE_PREFIXES = ("csv:", "tsv:", "jsonl:", "parquet:", "npy:", "npz:", "images:")
SOURCE_DESCRIPTIONS = {
    "csv:": "your own CSV table: texts, or numeric features; labels and ids optional",
    "tsv:": "your own tab-separated table: texts, or numeric features; labels and ids optional",
    "jsonl:": "your own JSON-lines table: texts, or numeric features; labels and ids optional",
    "parquet:": "your own Parquet table: texts, or numeric features; labels and ids optional",
    "npy:": "your own N x D NumPy array of features",
    "npz:": "your own NumPy archive: features x, optional labels y and ids",
    "images:": "your own folder of images, optionally one sub-folder per class",
}
PARTITION_PLACEHOLDER = "{partition-id}"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

_TABLE_SEPARATORS = {"csv:": ",", "tsv:": "\t"}
_TABLE_PREFIXES = ("csv:", "tsv:", "jsonl:", "parquet:")
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_NPZ_FEATURES = ("x", "X", "features")
_NPZ_LABELS = ("y", "labels")
_GREY_MODES = ("1", "L", "LA", "La")  # and 16-bit greyscale, "I;16..."
_NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
_NAN_WORDS = ("nan", "+nan", "-nan")  # written by NumPy and Python; pandas does not parse them
_LISTED_COLUMNS = 20  # longer column lists are cut in messages, which must stay one line


@dataclass(frozen=True)
class Columns:
    """Which columns of a table hold what (config keys text-column, label-column, id-column,
    feature-columns); hashable, so it can key the load cache."""

    text: str = "text"  # its presence makes a table a text set; "" never
    label: str = "label"  # absent under this default name, or "": unlabelled
    id: str = ""  # "": the table's `id` column if it has one, else the row number
    features: tuple[str, ...] = ()  # (): every numeric column except id and label

    @classmethod
    def parse(cls, text: str, label: str, id: str, features: str) -> Columns:
        """From config strings; `features` is comma-separated names, "" for the default."""
        names = tuple(name.strip() for name in features.split(",") if name.strip())
        if len(set(names)) != len(names):
            raise DatasetError(f"feature-columns names a column twice: {features!r}")
        return cls(text.strip(), label.strip(), id.strip(), names)


DEFAULT_COLUMNS = Columns()
DEFAULT_ID_COLUMN = "id"  # a table's ids when id-column is not set (`_with_default_id`)


# --------------------------------------------------------------------------- specs and paths


def is_source_spec(name: str) -> bool:
    """Whether a dataset name is a user's own file (``csv:PATH`` ...) rather than a registered name."""
    return name.startswith(SOURCE_PREFIXES)


def has_placeholder(spec: str) -> bool:
    """Whether the spec's path holds ``{partition-id}``: one file per client."""
    return PARTITION_PLACEHOLDER in spec


def _prefix(spec: str) -> str:
    prefix = next((p for p in SOURCE_PREFIXES if spec.startswith(p)), None)
    if prefix is None:
        raise DatasetError(
            f"{spec!r} is not a source spec; it must start with one of {', '.join(SOURCE_PREFIXES)}"
        )
    return prefix


def substituted(spec: str, partition_id: int | None) -> str:
    """The spec with its placeholder replaced: the dataset's name and the file it reads."""
    if not has_placeholder(spec):
        return spec
    if partition_id is None:
        raise DatasetError(f"source spec {spec!r} holds {PARTITION_PLACEHOLDER}: a partition id is needed")
    if partition_id < 0:
        raise DatasetError(f"source spec {spec!r}: partition id must be >= 0, got {partition_id}")
    return spec.replace(PARTITION_PLACEHOLDER, str(partition_id))


def source_path(spec: str, partition_id: int | None = None) -> Path:
    """The file (or image folder) a spec names, placeholder substituted, made absolute against the
    current directory."""
    prefix = _prefix(spec)
    given = substituted(spec, partition_id).removeprefix(prefix).strip()
    if not given:
        raise DatasetError(
            f"source spec {spec!r}: give a path after '{prefix}', e.g. '{prefix}data/site.csv'"
        )
    path = Path(given).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def _require_file(path: Path, prefix: str) -> None:
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    if not path.is_file():
        raise DatasetError(f"{path}: is a directory, but '{prefix}' needs a file")


def _require_folder(path: Path) -> None:
    if not path.exists():
        raise DatasetError(f"{path}: no such folder")
    if not path.is_dir():
        raise DatasetError(f"{path}: is a file, but 'images:' needs a folder of images")


def _one_line(exc: BaseException) -> str:
    """An exception's message folded onto one line (pandas and PIL messages may span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED_COLUMNS])
    return shown if len(names) <= _LISTED_COLUMNS else f"{shown}, ... ({len(names)} in all)"


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or _one_line(exc)}") from exc


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class _Table:
    """A table's column names and its columns as pandas Series (missing values NaN/None, or "" in CSV)."""

    path: Path
    names: list[str]
    n_rows: int
    column: Callable[[str], pd.Series]
    lines: list[int] | None = None  # JSONL: each row's line in the file, for messages
    first_row: int = 0  # a batch of a streamed file (`fedapp.datasets.streaming`): its first row's number

    def where(self, row: int) -> str:
        if self.lines is not None:
            return f"line {self.lines[row]}"
        return f"data row {self.first_row + row} (0-based)"


def _utf8(data: bytes, path: Path, offset: int = 0, line: int = 1) -> str:
    """Bytes of `path` from byte `offset` (on `line`) as UTF-8; a bad byte is an error saying where."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = line + data.count(b"\n", 0, exc.start)
        bad_byte = data[exc.start : exc.start + 1]
        raise DatasetError(
            f"{path}: not UTF-8 text: byte {bad_byte!r} at offset {offset + exc.start} (line {bad_line}); "
            "re-save the file as UTF-8"
        ) from exc


def _decode_utf8(path: Path) -> str:
    """A text file as UTF-8 (a leading byte-order mark dropped); an empty file is an error."""
    data = _read_bytes(path)
    if not data.strip():
        raise DatasetError(f"{path}: empty file")
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    return _utf8(data[bom:], path, bom)


def _first_line(path: Path) -> tuple[int, str]:
    """(line number, text) of a file's first non-blank line: a header, or a JSONL table's first record."""
    offset = 0
    try:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if raw.strip():
                    bom = len(codecs.BOM_UTF8) if number == 1 and raw.startswith(codecs.BOM_UTF8) else 0
                    return number, _utf8(raw[bom:], path, offset + bom, number)
                offset += len(raw)
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or _one_line(exc)}") from exc
    raise DatasetError(f"{path}: empty file")


def _read_delimited(path: Path, prefix: str) -> _Table:
    import pandas as pd

    text = _decode_utf8(path)
    # Every cell as its exact text ("" when empty): ids and texts stay as written, numbers are parsed
    # here so that a bad cell can be named.
    options: dict[str, Any] = {"quoting": 3} if prefix == "tsv:" else {}  # csv.QUOTE_NONE
    try:
        frame = pd.read_csv(
            io.StringIO(text), sep=_TABLE_SEPARATORS[prefix], dtype=str, na_filter=False, **options
        )
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DatasetError(f"{path}: cannot parse as {prefix.rstrip(':').upper()}: {_one_line(exc)}") from exc
    if frame.empty:
        raise DatasetError(f"{path}: no data rows (header only)")
    return _Table(path, [str(c) for c in frame.columns], len(frame), frame.__getitem__)


def _json_record(line: str, number: int, path: Path) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: line {number}: not valid JSON: {exc.msg} (column {exc.colno})") from exc
    if not isinstance(record, dict):
        raise DatasetError(f"{path}: line {number}: expected a JSON object, got {type(record).__name__}")
    return record


def _read_jsonl(path: Path) -> _Table:
    import pandas as pd

    records, lines = [], []
    for number, line in enumerate(_decode_utf8(path).split("\n"), start=1):
        if not line.strip():
            continue
        records.append(_json_record(line, number, path))
        lines.append(number)
    if not records:
        raise DatasetError(f"{path}: no rows")
    frame = pd.DataFrame.from_records(records)
    return _Table(path, [str(c) for c in frame.columns], len(frame), frame.__getitem__, lines)


def _read_parquet(path: Path) -> _Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file: {_one_line(exc)}") from exc
    if table.num_rows == 0:
        raise DatasetError(f"{path}: no rows")

    def column(name: str) -> pd.Series:
        try:
            return table.column(name).to_pandas()
        except (ValueError, pa.ArrowException) as exc:
            raise DatasetError(f"{path}: column '{name}' cannot be read: {_one_line(exc)}") from exc

    return _Table(path, list(table.column_names), table.num_rows, column)


def _read_table(path: Path, prefix: str) -> _Table:
    _require_file(path, prefix)
    if prefix == "jsonl:":
        return _read_jsonl(path)
    if prefix == "parquet:":
        return _read_parquet(path)
    return _read_delimited(path, prefix)


def _table_names(path: Path, prefix: str) -> list[str]:
    """A table's column names, reading as little as the format allows: the Parquet schema, the CSV/TSV
    header line, the first JSONL record."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    _require_file(path, prefix)
    if prefix == "parquet:":
        try:
            return list(pq.read_schema(path).names)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DatasetError(f"{path}: not a readable Parquet file: {_one_line(exc)}") from exc
    number, line = _first_line(path)
    if prefix == "jsonl:":
        return list(_json_record(line, number, path))
    options: dict[str, Any] = {"quoting": 3} if prefix == "tsv:" else {}  # csv.QUOTE_NONE
    try:
        header = pd.read_csv(io.StringIO(line), sep=_TABLE_SEPARATORS[prefix], nrows=0, dtype=str, **options)
    except (ValueError, pd.errors.ParserError) as exc:
        raise DatasetError(f"{path}: cannot parse the header line: {_one_line(exc)}") from exc
    return [str(c) for c in header.columns]


def _table_kind(path: Path, names: list[str], columns: Columns, expect_kind: str | None) -> str:
    """A text set when the text column is there, else vectors; an error when that is not `expect_kind`."""
    if columns.text and columns.text in names:
        if expect_kind not in (None, "texts"):
            raise DatasetError(
                f"{path}: its text column '{columns.text}' makes it a text set, but {expect_kind} are "
                'expected; set text-column to "" to read its numeric columns'
            )
        return "texts"
    if expect_kind == "texts" or (columns.text and columns.text != DEFAULT_COLUMNS.text):
        raise DatasetError(
            f"{path}: no text column '{columns.text}' (columns: {_listing(names)}); set text-column"
        )
    if expect_kind not in (None, "vectors"):
        raise DatasetError(f"{path}: a table gives texts or vectors, but {expect_kind} are expected")
    return "vectors"


def _check_named_columns(table: _Table, columns: Columns, kind: str) -> None:
    """The id, label and (vectors) feature columns named in `columns` exist; the default label may not."""
    if columns.id and columns.id not in table.names:
        raise DatasetError(
            f"{table.path}: no id column '{columns.id}' (columns: {_listing(table.names)}); set id-column"
        )
    if columns.label and columns.label != DEFAULT_COLUMNS.label and columns.label not in table.names:
        raise DatasetError(
            f"{table.path}: no label column '{columns.label}' (columns: {_listing(table.names)}); "
            'set label-column, or "" for unlabelled data'
        )
    if kind != "vectors":
        return
    absent = [name for name in columns.features if name not in table.names]
    if absent:
        raise DatasetError(
            f"{table.path}: no feature column {', '.join(repr(a) for a in absent)} "
            f"(columns: {_listing(table.names)}); set feature-columns"
        )
    for role, name in (("id", columns.id), ("label", columns.label)):
        if name and name in columns.features:
            raise DatasetError(f"{table.path}: feature-columns includes the {role} column '{name}'")


def _missing(series: pd.Series) -> np.ndarray:
    """Cells that hold nothing: null/NaN, or an empty or blank string."""
    if series.dtype.kind in "biuf":
        return series.isna().to_numpy()
    return (series.isna() | (series.astype(str).str.strip() == "")).to_numpy()


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _table_ids(table: _Table, columns: Columns) -> list[str]:
    if not columns.id:
        return [str(i) for i in range(table.n_rows)]
    series = table.column(columns.id)
    row = _first(_missing(series))
    if row is not None:
        raise DatasetError(f"{table.path}: {table.where(row)}, column '{columns.id}': missing id")
    ids = [str(v) for v in series.tolist()]
    _check_unique_ids(ids, table.path, table.where)
    return ids


def _check_unique_ids(ids: list[str], path: Path, where: Callable[[int], str]) -> None:
    first_row: dict[str, int] = {}
    for row, record_id in enumerate(ids):
        earlier = first_row.setdefault(record_id, row)
        if earlier != row:
            raise DatasetError(f"{path}: duplicate id {record_id!r}: {where(earlier)} and {where(row)}")


def _labels(series: pd.Series, path: Path, where: Callable[[int], str], column: str) -> np.ndarray:
    """Labels as numbers when every one parses as a number (integers stay integers), else as strings."""
    import pandas as pd

    row = _first(_missing(series))
    if row is not None:
        raise DatasetError(f"{path}: {where(row)}, column '{column}': missing label")
    strings = series.astype(str).str.strip()
    numbers = pd.to_numeric(strings, errors="coerce").to_numpy(np.float64)
    if not np.isfinite(numbers).all():
        return strings.to_numpy(dtype=str)
    return numbers.astype(np.int64) if (numbers == np.round(numbers)).all() else numbers


def _parsed_numbers(series: pd.Series) -> np.ndarray:
    """A column as float64 (float32 if stored so: half the memory at scale), NaN where a cell is missing
    or not a number."""
    import pandas as pd

    if series.dtype == np.float32:
        return series.to_numpy(np.float32, na_value=np.nan)
    if series.dtype.kind in "iuf":
        return series.to_numpy(np.float64, na_value=np.nan)
    return pd.to_numeric(series.astype(str).str.strip(), errors="coerce").to_numpy(np.float64)


def _mostly_numeric(series: pd.Series, numbers: np.ndarray) -> bool:
    """Whether most non-empty cells are numbers (`numbers`: the column parsed; NaN and infinity count, as
    numbers gone bad that an error will name): a feature column, not a column of names or notes."""
    if series.dtype.kind in "iuf":
        return True
    present = ~_missing(series)
    nan_words = series.astype(str).str.strip().str.lower().isin(_NAN_WORDS).to_numpy()
    return bool(present.any()) and (~np.isnan(numbers) | nan_words)[present].mean() > 0.5


def _describe_cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip():
        return "missing value"
    shown = repr(value if len(str(value)) <= 40 else f"{str(value)[:40]}...")
    try:
        number = float(str(value))
    except ValueError:
        return f"not a number: {shown}"
    return f"NaN or infinite value {shown}" if not math.isfinite(number) else f"not a number: {shown}"


def _table_features(table: _Table, columns: Columns) -> np.ndarray:
    """The N x D float64 feature matrix; the first bad cell (missing, not a number, NaN/inf) is an error."""
    return _table_feature_columns(table, columns)[0]


def _table_feature_columns(
    table: _Table, columns: Columns, chosen: list[str] | None = None
) -> tuple[np.ndarray, list[str]]:
    """(`_table_features`, the columns it took). `chosen`: take these (a streamed file's later batches
    take the columns its first batch chose), with the messages of the columns being chosen."""
    named = bool(columns.features)
    others = [name for name in table.names if name not in (columns.id, columns.label)]
    candidates = chosen or columns.features or others
    parsed = {name: _parsed_numbers(table.column(name)) for name in candidates}
    if not named and chosen is None:
        parsed = {
            name: numbers for name, numbers in parsed.items() if _mostly_numeric(table.column(name), numbers)
        }
        if not parsed:
            raise DatasetError(
                f"{table.path}: no numeric feature column (columns: {_listing(table.names)}); "
                "set feature-columns, or text-column for a text set"
            )
    for name, numbers in parsed.items():
        row = _first(~np.isfinite(numbers))
        if row is not None:
            hint = "" if named else "; to leave the column out, set feature-columns"
            cell = _describe_cell(table.column(name).iloc[row])
            raise DatasetError(f"{table.path}: {table.where(row)}, column '{name}': {cell}{hint}")
    return np.column_stack(list(parsed.values())), list(parsed)


def _table_texts(table: _Table, column: str) -> list[str]:
    series = table.column(column)
    row = _first(_missing(series))
    if row is not None:
        raise DatasetError(f"{table.path}: {table.where(row)}, column '{column}': empty or missing text")
    texts = series.tolist()
    row = next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)
    if row is not None:
        raise DatasetError(
            f"{table.path}: {table.where(row)}, column '{column}': text must be a string, "
            f"got {type(texts[row]).__name__}"
        )
    return texts


def _with_default_id(table: _Table, columns: Columns) -> Columns:
    """No id-column set and the table has a column named `id`: its values are the record ids (not row
    numbers, and not a feature). Said once per process, in one info line."""
    if columns.id or DEFAULT_ID_COLUMN not in table.names:
        return columns
    if DEFAULT_ID_COLUMN in (columns.label, columns.text, *columns.features):
        return columns
    if not _DEFAULT_ID_SAID:
        _DEFAULT_ID_SAID.append(table.path)
        log(INFO, "%s: record ids from its '%s' column (no id-column set)", table.path, DEFAULT_ID_COLUMN)
    return replace(columns, id=DEFAULT_ID_COLUMN)


_DEFAULT_ID_SAID: list[Path] = []  # `_with_default_id` says it once per process, not per file and client


def _read_table_source(
    name: str, path: Path, prefix: str, columns: Columns, expect_kind: str | None
) -> Dataset:
    table = _read_table(path, prefix)
    columns = _with_default_id(table, columns)
    kind = _table_kind(path, table.names, columns, expect_kind)
    _check_named_columns(table, columns, kind)
    ids = _table_ids(table, columns)
    labelled = bool(columns.label) and columns.label in table.names
    labels = (
        _labels(table.column(columns.label), path, table.where, columns.label)
        if labelled
        else np.zeros(table.n_rows, np.int64)
    )
    if kind == "texts":
        texts = _table_texts(table, columns.text)
        return build(name, kind, labels, source=path, texts=texts, ids=ids, labelled=labelled)
    vectors = _table_features(table, columns)
    return build(name, kind, labels, source=path, vectors=vectors, ids=ids, labelled=labelled)


# --------------------------------------------------------------------------- NumPy arrays


def _magic(path: Path, prefix: str) -> bytes:
    _require_file(path, prefix)
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or _one_line(exc)}") from exc
    if not head:
        raise DatasetError(f"{path}: empty file")
    return head


def _row_where(row: int) -> str:
    return f"row {row} (0-based)"


def _feature_matrix(array: np.ndarray, path: Path, what: str) -> np.ndarray:
    """A 2-D numeric array as finite float64 N x D (float32 stays float32); the first NaN/inf is an error
    naming row and column."""
    matrix = np.asarray(array, _check_matrix(array, path, what))
    bad = np.argwhere(~np.isfinite(matrix))
    if len(bad):
        row, col = bad[0]
        raise DatasetError(f"{path}: row {row}, column {col} (0-based) of {what}: NaN or infinite value")
    return matrix


def _check_matrix(array: np.ndarray, path: Path, what: str) -> type:
    """A 2-D numeric array with rows and columns, else the error naming it; returns the dtype it is read
    as (float32 stays float32, anything else float64)."""
    if array.ndim != 2 or array.dtype.kind not in "biuf":
        raise DatasetError(
            f"{path}: {what} must be a 2-D numeric array (N x D), got shape {array.shape} {array.dtype}"
        )
    if array.shape[0] == 0:
        raise DatasetError(f"{path}: no rows")
    if array.shape[1] == 0:
        raise DatasetError(f"{path}: no feature columns (shape {array.shape})")
    return np.float32 if array.dtype == np.float32 else np.float64


def _read_npy(name: str, path: Path) -> Dataset:
    head = _magic(path, "npy:")
    if head.startswith(_ZIP_MAGICS):
        raise DatasetError(f"{path}: is an .npz archive; use 'npz:' instead of 'npy:'")
    if head != _NPY_MAGIC:
        raise DatasetError(f"{path}: not a NumPy .npy file (no .npy header)")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DatasetError(f"{path}: not a readable .npy file: {_one_line(exc)}") from exc
    vectors = _feature_matrix(array, path, "the array")
    n = len(vectors)
    return build(
        name,
        "vectors",
        np.zeros(n, np.int64),
        source=path,
        vectors=vectors,
        ids=[str(i) for i in range(n)],
        labelled=False,
    )


def _npz_member(archive: Any, key: str, path: Path) -> np.ndarray:
    try:
        return archive[key]
    except _NPZ_ERRORS as exc:
        raise DatasetError(f"{path}: array '{key}' cannot be read: {_one_line(exc)}") from exc


def _npz_vector(archive: Any, key: str, n: int, path: Path) -> pd.Series:
    """A 1-D member of length N (labels or ids), as a Series of its values."""
    import pandas as pd

    array = _npz_member(archive, key, path)
    if array.ndim != 1 or len(array) != n or array.dtype.kind not in "biufUS":
        raise DatasetError(
            f"{path}: '{key}' must be a vector of {n} numbers or strings, "
            f"got shape {array.shape} {array.dtype}"
        )
    return pd.Series(array.astype(str) if array.dtype.kind == "S" else array)


def _read_npz(name: str, path: Path) -> Dataset:
    head = _magic(path, "npz:")
    if head == _NPY_MAGIC:
        raise DatasetError(f"{path}: is an .npy file; use 'npy:' instead of 'npz:'")
    if not head.startswith(_ZIP_MAGICS):
        raise DatasetError(f"{path}: not a NumPy .npz archive (not a zip file)")
    try:
        archive = np.load(path, allow_pickle=False)
    except _NPZ_ERRORS as exc:
        raise DatasetError(f"{path}: not a readable .npz archive: {_one_line(exc)}") from exc
    with archive:
        keys = list(archive.files)
        feature_key = next((k for k in _NPZ_FEATURES if k in keys), None)
        if feature_key is None:
            raise DatasetError(
                f"{path}: no features array (looked for {', '.join(_NPZ_FEATURES)}; "
                f"found: {_listing(keys) or 'none'})"
            )
        vectors = _feature_matrix(_npz_member(archive, feature_key, path), path, f"'{feature_key}'")
        n = len(vectors)
        label_key = next((k for k in _NPZ_LABELS if k in keys), None)
        labels = (
            np.zeros(n, np.int64)
            if label_key is None
            else _labels(_npz_vector(archive, label_key, n, path), path, _row_where, label_key)
        )
        if "ids" in keys:
            id_values = _npz_vector(archive, "ids", n, path)
            row = _first(_missing(id_values))
            if row is not None:
                raise DatasetError(f"{path}: {_row_where(row)}, 'ids': missing id")
            ids = [str(v) for v in id_values.tolist()]
            _check_unique_ids(ids, path, _row_where)
        else:
            ids = [str(i) for i in range(n)]
    return build(
        name, "vectors", labels, source=path, vectors=vectors, ids=ids, labelled=label_key is not None
    )


# --------------------------------------------------------------------------- image folders


def _image_files(folder: Path) -> list[tuple[str, Path]]:
    """(path relative to `folder` with '/' separators, file) of every image below it, sorted by the former."""
    found = []
    for file in folder.rglob("*"):
        relative = file.relative_to(folder)
        hidden = any(part.startswith(".") for part in relative.parts)
        if not hidden and file.suffix.lower() in IMAGE_SUFFIXES and file.is_file():
            found.append((relative.as_posix(), file))
    return sorted(found)


def _image_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a file that is not a readable image (Pillow loads with the first image)."""
    from PIL import Image

    return (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _image_header(file: Path) -> tuple[str, tuple[int, int]]:
    from PIL import Image

    try:
        with Image.open(file) as image:
            return image.mode, image.size
    except _image_errors() as exc:
        raise DatasetError(f"{file}: not a readable image: {_one_line(exc)}") from exc


def _image_pixels(file: Path, mode: str) -> np.ndarray:
    """One image as uint8 H x W x C in `mode` ("L" or "RGB"); 16-bit greyscale keeps its high byte."""
    from PIL import Image

    try:
        with Image.open(file) as image:
            if image.mode.startswith("I;16"):
                high_bytes = (np.asarray(image, np.uint16) >> 8).astype(np.uint8)
                image = Image.fromarray(high_bytes, "L")
            pixels = np.asarray(image.convert(mode))
    except _image_errors() as exc:
        raise DatasetError(f"{file}: not a readable image: {_one_line(exc)}") from exc
    return pixels.reshape(*pixels.shape[:2], -1)


def _read_images(name: str, folder: Path) -> Dataset:
    import pandas as pd

    _require_folder(folder)
    files = _image_files(folder)
    if not files:
        raise DatasetError(f"{folder}: no image files ({', '.join(IMAGE_SUFFIXES)}) in this folder or below")
    headers = [_image_header(file) for _, file in files]
    for (_, file), (mode, _) in zip(files, headers, strict=True):
        if mode in ("I", "F"):
            raise DatasetError(
                f"{file}: image mode {mode} (32-bit) is not supported; save the image with 8 or 16 bits"
            )
    width, height = headers[0][1]
    for (_, file), (_, size) in zip(files, headers, strict=True):
        if size != (width, height):
            raise DatasetError(
                f"{file}: size {size[0]}x{size[1]}, but {files[0][1]} is {width}x{height} (width x height); "
                "all images must have one size"
            )
    mode = "L" if all(m in _GREY_MODES or m.startswith("I;16") for m, _ in headers) else "RGB"
    images = np.empty((len(files), len(mode), height, width), np.uint8)
    for i, (_, file) in enumerate(files):
        images[i] = _image_pixels(file, mode).transpose(2, 0, 1)
    ids = [relative for relative, _ in files]
    labelled = all("/" in relative for relative in ids)
    if labelled:
        folders = pd.Series([relative.split("/", 1)[0] for relative in ids])
        labels = _labels(folders, folder, lambda row: f"image {ids[row]}", "sub-folder")
    else:
        labels = np.zeros(len(ids), np.int64)
    return build(name, "images", labels, source=folder, images=images, ids=ids, labelled=labelled)


# --------------------------------------------------------------------------- public entry points


def source_kind(spec: str, columns: Columns = DEFAULT_COLUMNS, partition_id: int | None = None) -> str:
    """The kind a spec gives (texts, vectors or images), reading as little as possible: a table's header."""
    prefix = _prefix(spec)
    path = source_path(spec, partition_id)
    if prefix in _TABLE_PREFIXES:
        return _table_kind(path, _table_names(path, prefix), columns, None)
    if prefix == "images:":
        _require_folder(path)
        return "images"
    _require_file(path, prefix)
    return "vectors"


def read_source(
    spec: str,
    columns: Columns = DEFAULT_COLUMNS,
    partition_id: int | None = None,
    expect_kind: str | None = None,
) -> Dataset:
    """Read a user's own file whole, named by its spec (placeholder substituted); `expect_kind` set: a
    file of another kind is an error naming it (for a table without its text column: set text-column)."""
    prefix = _prefix(spec)
    name = substituted(spec, partition_id)
    path = source_path(spec, partition_id)
    if prefix in _TABLE_PREFIXES:
        return _read_table_source(name, path, prefix, columns, expect_kind)
    kind = "images" if prefix == "images:" else "vectors"
    if expect_kind not in (None, kind):
        raise DatasetError(f"{path}: '{prefix}' gives {kind}, but {expect_kind} are expected")
    if prefix == "images:":
        return _read_images(name, path)
    return _read_npy(name, path) if prefix == "npy:" else _read_npz(name, path)
