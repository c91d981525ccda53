"""Tests for users' own data files (source specs): every format round-trips, and bad data fails with one
line naming the file (and the row and column). All files are written in tmp_path."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from fedapp.datasets import (
    Columns,
    Dataset,
    DatasetError,
    dataset_info,
    has_placeholder,
    is_source_spec,
    load_dataset,
    read_source,
    registry,
    require_files,
    source_kind,
    source_path,
)
from fedapp.datasets.common import build
from fedapp.methods import methods_for_kind

TEXT_ROWS = [
    ("007", "the heart rate rose", "cardio"),
    ("008", "a rash, then fever", "derma"),
    ("009", "chest pain", "cardio"),
]


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    registry._load_source_cached.cache_clear()
    yield
    registry._load_source_cached.cache_clear()


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _png(path: Path, size: tuple[int, int], value: int, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value, 0, 255 - value)).save(path)


def _check_texts(data: Dataset, spec: str) -> None:
    assert data.name == spec and data.kind == "texts" and data.labelled
    assert data.texts == tuple(text for _, text, _ in TEXT_ROWS)
    assert data.ids == ("007", "008", "009")
    assert data.class_names == ("cardio", "derma")
    assert data.y.tolist() == [0, 1, 0]


# --------------------------------------------------------------------------- round trips


def _table(path: Path, content: str) -> str:
    """Write a table and return its spec, the prefix taken from the file's suffix."""
    _write(path, content)
    return f"{path.suffix.lstrip('.')}:{path}"


def test_csv_texts_keep_ids_as_strings(tmp_path: Path) -> None:
    rows = "".join(f'{i},"{t}",{label}\n' for i, t, label in TEXT_ROWS)
    spec = _table(tmp_path / "notes.csv", "id,text,label\n" + rows)
    _check_texts(read_source(spec, Columns(id="id")), spec)
    assert source_kind(spec) == "texts"


def test_tsv_texts_take_quotes_literally(tmp_path: Path) -> None:
    rows = "".join(f"{i}\t{t}\t{label}\n" for i, t, label in TEXT_ROWS)
    spec = _table(tmp_path / "notes.tsv", "id\ttext\tlabel\n" + rows + '010\t"quoted" word\tderma\n')
    data = read_source(spec, Columns(id="id"))
    assert data.texts[-1] == '"quoted" word' and data.ids[-1] == "010"


def test_jsonl_texts(tmp_path: Path) -> None:
    lines = "".join(f'{{"id": "{i}", "text": "{t}", "label": "{label}"}}\n' for i, t, label in TEXT_ROWS)
    spec = _table(tmp_path / "notes.jsonl", lines + "\n")
    _check_texts(read_source(spec, Columns(id="id")), spec)


def test_parquet_texts(tmp_path: Path) -> None:
    ids, texts, labels = zip(*TEXT_ROWS, strict=True)
    path = tmp_path / "notes.parquet"
    pq.write_table(pa.table({"id": list(ids), "text": list(texts), "label": list(labels)}), path)
    spec = f"parquet:{path}"
    _check_texts(read_source(spec, Columns(id="id")), spec)
    assert source_kind(spec) == "texts"


def test_csv_features_skip_id_label_and_text_like_columns(tmp_path: Path) -> None:
    table = "id,age,weight,label,ward\n007,31,70.5,sick,north\n008,45,80,well,south\n009,29,1e2,sick,east\n"
    spec = _table(tmp_path / "patients.csv", table)
    data = read_source(spec, Columns(id="id"))
    assert data.kind == "vectors" and data.vectors.dtype == np.float64
    np.testing.assert_array_equal(data.vectors, [[31, 70.5], [45, 80], [29, 100]])
    assert data.ids == ("007", "008", "009") and data.class_names == ("sick", "well")
    assert source_kind(spec) == "vectors"
    chosen = read_source(spec, Columns.parse("text", "label", "id", "weight, age"))
    np.testing.assert_array_equal(chosen.vectors, [[70.5, 31], [80, 45], [100, 29]])


def test_numeric_labels_are_remapped_in_ascending_order(tmp_path: Path) -> None:
    data = read_source(_table(tmp_path / "d.csv", "a,label\n1,10\n2,2\n3,10\n"))
    assert data.y.tolist() == [1, 0, 1] and data.class_names is None and data.ids == ("0", "1", "2")


def test_unlabelled_table(tmp_path: Path) -> None:
    spec = _table(tmp_path / "d.csv", "a,b\n1,2\n3,4\n5,6\n")
    data = read_source(spec)
    assert not data.labelled and data.n_classes == 1 and data.class_names is None
    assert data.y.tolist() == [0, 0, 0] and data.y.dtype == np.int64
    assert not read_source(spec, Columns(label="")).labelled


def test_npy(tmp_path: Path) -> None:
    array = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "x.npy", array)
    data = read_source(f"npy:{tmp_path / 'x.npy'}")
    np.testing.assert_array_equal(data.vectors, array)
    assert data.vectors.dtype == np.float32 and not data.labelled and data.ids == ("0", "1", "2", "3")
    assert source_kind(f"npy:{tmp_path / 'x.npy'}") == "vectors"
    np.save(tmp_path / "i.npy", array.astype(np.int16))  # float32 stays float32, anything else float64
    assert read_source(f"npy:{tmp_path / 'i.npy'}").vectors.dtype == np.float64


def test_npz_with_labels_and_ids(tmp_path: Path) -> None:
    x = np.eye(3)
    np.savez(tmp_path / "d.npz", X=x, labels=np.array(["b", "a", "b"]), ids=np.array(["007", "008", "009"]))
    data = read_source(f"npz:{tmp_path / 'd.npz'}")
    np.testing.assert_array_equal(data.vectors, x)
    assert data.labelled and data.class_names == ("a", "b") and data.y.tolist() == [1, 0, 1]
    assert data.ids == ("007", "008", "009")


def test_npz_without_labels(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", features=np.ones((2, 2)))
    data = read_source(f"npz:{tmp_path / 'd.npz'}")
    assert not data.labelled and data.n_classes == 1 and data.ids == ("0", "1")


def test_image_class_folders(tmp_path: Path) -> None:
    for i in range(3):
        _png(tmp_path / "imgs" / "dog" / f"{i}.png", (4, 5), 10 * i)
        _png(tmp_path / "imgs" / "cat" / f"{i}.png", (4, 5), 100 + i)
    _write(tmp_path / "imgs" / "cat" / "notes.txt", "not an image")
    _write(tmp_path / "imgs" / "cat" / "._0.png", b"macOS metadata, hidden")
    spec = f"images:{tmp_path / 'imgs'}"
    data = read_source(spec)
    assert data.kind == "images" and data.images.shape == (6, 1, 5, 4) and data.images.dtype == np.uint8
    assert data.ids == ("cat/0.png", "cat/1.png", "cat/2.png", "dog/0.png", "dog/1.png", "dog/2.png")
    assert data.class_names == ("cat", "dog") and data.y.tolist() == [0, 0, 0, 1, 1, 1]
    assert data.images[4].min() == data.images[4].max() == 10
    assert source_kind(spec) == "images"


def test_flat_image_folder_is_unlabelled_and_rgb_when_any_is_colour(tmp_path: Path) -> None:
    _png(tmp_path / "a.png", (3, 3), 7)
    _png(tmp_path / "b.png", (3, 3), 9, mode="RGB")
    _png(tmp_path / "sub" / "c.png", (3, 3), 11)
    data = read_source(f"images:{tmp_path}")
    assert (
        not data.labelled
        and data.images.shape == (3, 3, 3, 3)
        and data.ids == ("a.png", "b.png", "sub/c.png")
    )
    assert data.images[1, :, 0, 0].tolist() == [9, 0, 246]


def test_16_bit_greyscale_keeps_its_high_byte(tmp_path: Path) -> None:
    Image.fromarray(np.full((2, 3), 0x1234, np.uint16)).save(tmp_path / "deep.png")
    data = read_source(f"images:{tmp_path}")
    assert data.images.shape == (1, 1, 2, 3) and (data.images == 0x12).all()


def test_source_kind_reads_only_the_header(tmp_path: Path) -> None:
    # a bad cell further down does not matter for the kind; a bad header byte does, said with its offset
    assert source_kind(_table(tmp_path / "d.csv", "id,text\n1,\n")) == "texts"
    assert source_kind(_table(tmp_path / "d.jsonl", '\n{"a": 1}\n{"a": "x"}\n')) == "vectors"
    _write(tmp_path / "bad.tsv", b"a\tb\xff\n1\t2\n")
    with pytest.raises(DatasetError, match=r"bad.tsv: not UTF-8 text: byte b'\\xff' at offset 3 \(line 1\)"):
        source_kind(f"tsv:{tmp_path / 'bad.tsv'}")
    with pytest.raises(DatasetError, match="names a column twice"):
        Columns.parse("text", "label", "", "a,b,a")


def test_placeholder_picks_each_partitions_file(tmp_path: Path) -> None:
    for pid in (0, 1):
        _write(tmp_path / f"site-{pid}.csv", f"a\n{pid}\n{pid}\n")
    spec = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    assert is_source_spec(spec) and has_placeholder(spec) and not is_source_spec("digits")
    assert source_path(spec, 1) == tmp_path / "site-1.csv"
    data = read_source(spec, partition_id=1)
    assert data.name == f"csv:{tmp_path}/site-1.csv" and data.vectors[:, 0].tolist() == [1, 1]
    assert dataset_info(spec).kind == "vectors"
    with pytest.raises(DatasetError, match="partition id is needed"):
        source_path(spec)


def test_relative_and_home_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert source_path("csv:d.csv") == tmp_path / "d.csv"
    assert source_path("csv:~/d.csv") == tmp_path / "d.csv"


def test_load_dataset_subsamples_unlabelled_data(tmp_path: Path, fresh_cache: None) -> None:
    spec = _table(tmp_path / "d.csv", "id,a\n" + "".join(f"r{i},{i}\n" for i in range(10)))
    full = load_dataset(spec, columns=Columns(id="id"))
    part = load_dataset(spec, columns=Columns(id="id"), max_samples=4, seed=3)
    assert part.n_samples == 4 and not part.labelled and part.y.tolist() == [0] * 4
    assert list(part.ids) == [f"r{int(v)}" for v in part.vectors[:, 0]]
    assert set(part.ids) < set(full.ids)
    assert load_dataset(spec, columns=Columns(id="id"), max_samples=4, seed=3) is part


def test_cache_holds_until_the_file_changes(tmp_path: Path, fresh_cache: None) -> None:
    path = _write(tmp_path / "d.csv", "a\n1\n2\n")
    first = load_dataset(f"csv:{path}")
    assert load_dataset(f"csv:{path}") is first
    _write(path, "a\n1\n2\n3\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    second = load_dataset(f"csv:{path}")
    assert second is not first and second.n_samples == 3


def test_image_folder_cache_sees_a_new_image(tmp_path: Path, fresh_cache: None) -> None:
    _png(tmp_path / "a" / "0.png", (2, 2), 1)
    first = load_dataset(f"images:{tmp_path}")
    assert load_dataset(f"images:{tmp_path}") is first
    _png(tmp_path / "a" / "1.png", (2, 2), 1)
    os.utime(tmp_path / "a", ns=(0, (tmp_path / "a").stat().st_mtime_ns + 10**9))
    assert load_dataset(f"images:{tmp_path}").n_samples == 2


def test_dataset_checks_ids_and_unlabelled_invariants() -> None:
    with pytest.raises(DatasetError, match="duplicate id 'a'"):
        build("d", "vectors", [0, 1], source="d", vectors=np.ones((2, 1)), ids=["a", "a"])
    with pytest.raises(DatasetError, match="1 ids for 2 samples"):
        build("d", "vectors", [0, 1], source="d", vectors=np.ones((2, 1)), ids=["a"])
    with pytest.raises(DatasetError, match="unlabelled data need y all 0"):
        build("d", "vectors", [0, 1], source="d", vectors=np.ones((2, 1)), labelled=False)


def test_dataset_info_and_require_files(tmp_path: Path, fresh_cache: None) -> None:
    path = _write(tmp_path / "d.csv", "text\nhello\n")
    info = dataset_info(f"csv:{path}")
    assert info.kind == "texts" and info.files == (str(path),) and methods_for_kind(info.kind)
    require_files(f"csv:{path}")
    _write(tmp_path / "bad.npz", b"PK\x03\x04 corrupt")
    with pytest.raises(DatasetError, match="bad.npz"):
        require_files(f"npz:{tmp_path / 'bad.npz'}")


# --------------------------------------------------------------------------- bad data


def _npz(**arrays: np.ndarray) -> Callable[[Path], None]:
    return lambda path: np.savez(path, **arrays)


def _npy(array: np.ndarray) -> Callable[[Path], None]:
    return lambda path: np.save(path, array)


def _truncated_parquet(path: Path) -> None:
    pq.write_table(pa.table({"a": [1.0, 2.0]}), path)
    path.write_bytes(path.read_bytes()[:20])


def _bad_image(folder: Path) -> None:
    _png(folder / "ok.png", (4, 4), 1)
    _write(folder / "x.png", b"\x89PNG\r\n\x1a\n garbage")


def _mixed_sizes(folder: Path) -> None:
    _png(folder / "a.png", (5, 5), 1)
    _png(folder / "b.png", (4, 6), 1)


@dataclass(frozen=True)
class Bad:
    """A bad file: its name (the suffix picks the prefix; "imgs": an image folder), its content (text,
    bytes or a writer; None: absent), what the message must say, and how it is read."""

    file: str
    content: str | bytes | Callable[[Path], object] | None
    says: tuple[str, ...]
    columns: Columns = Columns()
    expect_kind: str | None = None


BAD_DATA = {
    "missing file": Bad("absent.csv", None, ("no such file",)),
    "directory for a file": Bad("dir.csv", Path.mkdir, ("is a directory",)),
    "corrupt parquet": Bad("d.parquet", b"PAR1 not parquet", ("not a readable Parquet",)),
    "truncated parquet": Bad("d.parquet", _truncated_parquet, ("not a readable Parquet",)),
    "corrupt npz": Bad("d.npz", b"PK\x03\x04 garbage", ("not a readable .npz",)),
    "npz that is not a zip": Bad("d.npz", b"garbage", ("not a NumPy .npz",)),
    "corrupt npy": Bad("d.npy", b"garbage", ("not a NumPy .npy",)),
    "empty csv": Bad("d.csv", "", ("empty file",)),
    "header only": Bad("d.csv", "a,b\n", ("no data rows",)),
    "blank jsonl": Bad("d.jsonl", "\n\n", ("empty file",)),
    "missing text column": Bad(
        "site-0.csv",
        "id,body\n1,hi\n",
        ("no text column 'text' (columns: id, body); set text-column",),
        expect_kind="texts",
    ),
    "missing named text column": Bad("d.csv", "a\n1\n", ("no text column 'body'",), Columns(text="body")),
    "missing label column": Bad("d.csv", "a\n1\n", ("no label column 'diag'",), Columns(label="diag")),
    "missing id column": Bad("d.csv", "a\n1\n", ("no id column 'pid'",), Columns(id="pid")),
    "missing feature column": Bad(
        "d.csv", "a,b\n1,2\n", ("no feature column 'height'",), Columns(features=("a", "height"))
    ),
    "no numeric column": Bad("d.csv", "a,b\nx,y\n", ("no numeric feature column",)),
    "non-numeric feature": Bad(
        "d.csv",
        "a,b\n1,2\n3,x\n",
        ("data row 1 (0-based), column 'b': not a number: 'x'",),
        Columns(features=("a", "b")),
    ),
    "typo in a default feature column": Bad(
        "d.csv", "a,b\n1,2\n3,2\n4,2O\n", ("data row 2 (0-based), column 'b': not a number: '2O'",)
    ),
    "missing feature": Bad("d.csv", "a,b\n1,2\n3,\n", ("data row 1 (0-based), column 'b': missing value",)),
    "NaN feature": Bad("d.csv", "a,b\n1,2\n3,nan\n", ("data row 1 (0-based), column 'b': NaN or infinite",)),
    "infinite feature": Bad("d.csv", "a,b\n-inf,2\n3,4\n", ("data row 0 (0-based), column 'a': NaN or inf",)),
    "empty text": Bad(
        "d.csv", "id,text\n1,hi\n2,\n", ("data row 1 (0-based), column 'text': empty or missing text",)
    ),
    "null text": Bad(
        "d.jsonl", '{"text": "a"}\n{"text": null}\n', ("line 2, column 'text': empty or missing",)
    ),
    "bad JSON": Bad("d.jsonl", '{"text": "a"}\n{"text": \n', ("line 2: not valid JSON",)),
    "non-UTF-8": Bad("d.csv", b"text\nhello\n\xff\xfe\n", ("not UTF-8", "offset 11 (line 3)")),
    "duplicate ids": Bad(
        "d.csv",
        "id,text\n1,a\n2,b\n1,c\n",
        ("duplicate id '1': data row 0 (0-based) and data row 2 (0-based)",),
        Columns(id="id"),
    ),
    "missing label": Bad("d.csv", "a,label\n1,x\n2,\n", ("data row 1 (0-based), column 'label': missing",)),
    "image that does not decode": Bad("imgs", _bad_image, ("x.png: not a readable image",)),
    "images of two sizes": Bad("imgs", _mixed_sizes, ("b.png: size 4x6, but", "a.png is 5x5")),
    "empty image folder": Bad("imgs", Path.mkdir, ("no image files",)),
    "npy with NaN": Bad("d.npy", _npy(np.array([[0.0, 1, 2], [3, 4, np.nan]])), ("row 1, column 2",)),
    "1-D npy": Bad("d.npy", _npy(np.arange(3.0)), ("2-D numeric array",)),
    "npz without features": Bad("d.npz", _npz(y=np.arange(2)), ("no features array",)),
    "npz labels of the wrong length": Bad(
        "d.npz", _npz(x=np.ones((3, 2)), y=np.arange(2)), ("'y' must be a vector of 3",)
    ),
    "texts where vectors are expected": Bad(
        "d.csv", "text\nhi\n", ("makes it a text set, but vectors are expected",), expect_kind="vectors"
    ),
    "npy where texts are expected": Bad(
        "d.npy", _npy(np.ones((2, 2))), ("gives vectors",), expect_kind="texts"
    ),
    "npz duplicate ids": Bad("d.npz", _npz(x=np.ones((2, 2)), ids=np.array([5, 5])), ("duplicate id '5'",)),
}


@pytest.mark.parametrize("case", BAD_DATA, ids=list(BAD_DATA))
def test_bad_data_fails_on_one_line_naming_the_file(case: str, tmp_path: Path) -> None:
    bad = BAD_DATA[case]
    path = tmp_path / bad.file
    if isinstance(bad.content, str | bytes):
        _write(path, bad.content)
    elif bad.content is not None:
        bad.content(path)
    prefix = "images" if bad.file == "imgs" else path.suffix.lstrip(".")
    with pytest.raises(DatasetError) as info:
        read_source(f"{prefix}:{path}", bad.columns, expect_kind=bad.expect_kind)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for fragment in bad.says:
        assert fragment in message
