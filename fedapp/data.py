"""Dataset registry: every dataset the experiments use, read once per process into one `Dataset` type.

Flower rebuilds its clients every round, so `load_dataset` is cached per process and hands out read-only
arrays that clients may share but not mutate. Datasets come in three kinds:

- ``"vectors"``: one feature matrix (`features`, N x D).
- ``"multiview"``: aligned views (`views`, each N x D_v, float64, raw - scaling is the caller's business);
  `features` holds their concatenation for centralized baselines.
- ``"texts"``: raw strings (`texts`); embedding them is the caller's business.

Labels are always int64 in 0..n_classes-1: numeric labels are remapped in ascending order, string labels
(DryBean, 20 Newsgroups) in sorted name order, which `class_names` records.

Embedded datasets (no files):

- ``digits``: scikit-learn's 8x8 digits, 1,797 x 64, pixels / 16 in [0, 1], 10 classes.
- ``digits-mv``: the same images as three views - 64 pixels; 2x2 average pooling (16); a histogram of
  oriented gradients (32: central-difference gradients, unsigned orientation in 8 bins weighted by
  magnitude, over 4 cells of 4x4 pixels). The third view is a non-linear function of the image, so it
  is a genuinely different view rather than a linear map of the first.
- ``blobs``: `sklearn.datasets.make_blobs`, 2,000 x 10, 5 centres, cluster_std 1.0, random_state=seed.

On-disk datasets are read from the data directory (see `resolve_data_dir`) with the file names and
counts of its catalogue (``README.md`` there); a count that differs is an error naming the file.

Generic multi-view MATLAB files: the name ``mat:<path>`` (absolute, or relative to the data directory)
reads a MATLAB v5 .mat file holding

- ``X``: a cell array (1 x V or V x 1) of views, each a numeric (dense or sparse) matrix stored either
  N x d or d x N; the orientation is the one whose side matches the label count, and a view matching on
  both sides (square, N x N) or on neither is an error;
- ``y`` or ``Y`` (``y`` wins when both exist): a numeric vector of N labels (1 x N, N x 1 or N),
  integer or float, remapped to 0..C-1.

MATLAB v7.3 (HDF5) files would need h5py, which this environment does not have; they raise a
`DatasetError` that says so (re-save them with ``save(..., '-v7')``).
"""

from __future__ import annotations

import gzip
import os
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import scipy.io
import scipy.sparse

EMBEDDED = ("digits", "digits-mv", "blobs")
KINDS = ("vectors", "multiview", "texts")
MAT_PREFIX = "mat:"
DATA_DIR_ENV = "FEDAPP_DATA_DIR"
PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Label order 1..20 as given in the data catalogue (jacoxu/StackOverflow).
# fmt: off
STACKOVERFLOW_TAGS = (
    "wordpress", "oracle", "svn", "apache", "excel", "matlab", "visual-studio", "cocoa", "osx", "bash",
    "spring", "hibernate", "scala", "sharepoint", "ajax", "qt", "drupal", "linq", "haskell", "magento",
)
# fmt: on
DIGIT_NAMES = tuple(str(d) for d in range(10))


class DatasetError(ValueError):
    """A dataset cannot be provided: unknown name, missing files or a malformed file."""


@dataclass(frozen=True, eq=False)  # identity equality: comparing or hashing arrays field-wise is meaningless
class Dataset:
    """One labelled dataset; the payload field that `kind` names is set, arrays are read-only."""

    name: str
    kind: str
    y: np.ndarray
    n_classes: int
    features: np.ndarray | None = None
    views: tuple[np.ndarray, ...] | None = None
    texts: tuple[str, ...] | None = None
    class_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DatasetError(f"dataset {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        n = self.n_samples
        payload = {"vectors": self.features, "multiview": self.views, "texts": self.texts}[self.kind]
        if payload is None:
            raise DatasetError(f"dataset {self.name!r}: kind {self.kind!r} needs its payload field set")
        rows = [len(a) for a in (self.features, self.texts) if a is not None]
        rows += [len(v) for v in self.views or ()]
        if any(r != n for r in rows):
            raise DatasetError(f"dataset {self.name!r}: {n} labels but payload row counts {rows}")
        if self.class_names is not None and len(self.class_names) != self.n_classes:
            raise DatasetError(
                f"dataset {self.name!r}: {len(self.class_names)} class names for {self.n_classes} classes"
            )

    @property
    def n_samples(self) -> int:
        """Number of samples N."""
        return len(self.y)


# --------------------------------------------------------------------------- data directory


def _default_data_dirs() -> tuple[Path, ...]:
    """The fallback locations, in search order: beside the working directory, then beside the project."""
    return (Path.cwd().parent / "shared" / "data", PROJECT_ROOT.parent / "shared" / "data")


def resolve_data_dir(configured: str | os.PathLike[str] | None = None) -> Path | None:
    """The data directory: explicit argument, else $FEDAPP_DATA_DIR, else an existing ../shared/data.

    An explicit argument or the environment variable is returned even if it does not exist, so the
    missing-file error names the directory the user asked for. Returns an absolute path or None.
    """
    for chosen in (configured, os.environ.get(DATA_DIR_ENV)):
        if chosen is not None and str(chosen).strip():
            return Path(chosen).expanduser().resolve()
    for candidate in _default_data_dirs():
        if candidate.is_dir():
            return candidate.resolve()
    return None


# --------------------------------------------------------------------------- shared helpers


def _freeze(array: np.ndarray) -> np.ndarray:
    """Mark an array read-only so cached data cannot be corrupted by one client."""
    array.setflags(write=False)
    return array


def _build(
    name: str,
    kind: str,
    raw_labels: Sequence[Any] | np.ndarray,
    *,
    source: Path | str,
    expected_n: int | None = None,
    expected_classes: int | None = None,
    features: np.ndarray | None = None,
    views: Sequence[np.ndarray] | None = None,
    texts: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
) -> Dataset:
    """Remap labels to 0..C-1, check the catalogue counts, freeze arrays and assemble a `Dataset`.

    String labels give `class_names` in sorted order; numeric labels are remapped in ascending order.
    """
    raw = np.asarray(raw_labels)
    if raw.ndim != 1 or raw.dtype.kind not in "iufU":
        raise DatasetError(
            f"{source}: labels must be a vector of numbers or strings, got {raw.shape} {raw.dtype}"
        )
    if raw.dtype.kind == "f" and not np.isfinite(raw).all():
        raise DatasetError(f"{source}: labels contain NaN or infinity")
    classes, y = np.unique(raw, return_inverse=True)
    if class_names is None and raw.dtype.kind == "U":
        class_names = [str(c) for c in classes]
    if expected_n is not None and len(y) != expected_n:
        raise DatasetError(f"{source}: expected {expected_n} samples, found {len(y)}")
    if expected_classes is not None and len(classes) != expected_classes:
        raise DatasetError(f"{source}: expected {expected_classes} classes, found {len(classes)}")
    frozen_views = None
    if views is not None:
        frozen_views = tuple(_freeze(np.ascontiguousarray(v, dtype=np.float64)) for v in views)
        features = np.hstack(frozen_views)
    return Dataset(
        name=name,
        kind=kind,
        y=_freeze(y.astype(np.int64)),
        n_classes=len(classes),
        features=None if features is None else _freeze(features),
        views=frozen_views,
        texts=None if texts is None else tuple(texts),
        class_names=None if class_names is None else tuple(class_names),
    )


def _read_gzip_text(path: Path) -> str:
    """A gzipped UTF-8 text file, with read and decode failures reported against the file."""
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read().decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read as gzipped UTF-8 text: {exc}") from exc


# --------------------------------------------------------------------------- embedded datasets


def _digit_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits as (N, 8, 8) images in [0, 1] and their labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images / 16.0, bunch.target


def _oriented_gradients(images: np.ndarray, cells: int = 2, bins: int = 8) -> np.ndarray:
    """Histogram of oriented gradients: per cell, gradient magnitude summed into unsigned-angle bins."""
    n, height, width = images.shape
    grad_y, grad_x = np.gradient(images, axis=(1, 2))
    magnitude = np.hypot(grad_x, grad_y)
    angle = np.mod(np.arctan2(grad_y, grad_x), np.pi)  # unsigned: an edge and its reverse are alike
    bin_of = np.minimum((angle / np.pi * bins).astype(np.int64), bins - 1)
    weighted = (bin_of[..., None] == np.arange(bins)) * magnitude[..., None]
    per_cell = weighted.reshape(n, cells, height // cells, cells, width // cells, bins).sum(axis=(2, 4))
    return per_cell.reshape(n, cells * cells * bins)


def _read_digits(name: str, seed: int) -> Dataset:
    images, labels = _digit_images()
    return _build(
        name,
        "vectors",
        labels,
        source="sklearn.datasets.load_digits",
        features=images.reshape(len(images), -1),
        class_names=DIGIT_NAMES,
    )


def _read_digits_multiview(name: str, seed: int) -> Dataset:
    images, labels = _digit_images()
    n = len(images)
    pixels = images.reshape(n, -1)
    pooled = images.reshape(n, 4, 2, 4, 2).mean(axis=(2, 4)).reshape(n, -1)
    views = (pixels, pooled, _oriented_gradients(images))
    return _build(
        name, "multiview", labels, source="sklearn.datasets.load_digits", views=views, class_names=DIGIT_NAMES
    )


def _read_blobs(name: str, seed: int) -> Dataset:
    from sklearn.datasets import make_blobs

    features, labels = make_blobs(
        n_samples=2000, n_features=10, centers=5, cluster_std=1.0, random_state=seed
    )
    return _build(name, "vectors", labels, source="sklearn.datasets.make_blobs", features=features)


# --------------------------------------------------------------------------- MNIST (idx, gzip)

_IDX_UBYTE = 0x08
MNIST_COUNTS = {
    "train-images-idx3-ubyte.gz": 60_000,
    "train-labels-idx1-ubyte.gz": 60_000,
    "t10k-images-idx3-ubyte.gz": 10_000,
    "t10k-labels-idx1-ubyte.gz": 10_000,
}


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse a gzipped IDX file of unsigned bytes (magic 0x00 0x00 0x08 ndim, big-endian int32 dims)."""
    try:
        with gzip.open(path, "rb") as fh:
            blob = fh.read()
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path}: cannot decompress: {exc}") from exc
    header = 4 + 4 * ndim
    if len(blob) < header or blob[:4] != bytes((0, 0, _IDX_UBYTE, ndim)):
        raise DatasetError(f"{path}: not an IDX file of {ndim}-d unsigned bytes (header {blob[:4].hex()})")
    dims = [int.from_bytes(blob[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if len(blob) - header != int(np.prod(dims)):
        raise DatasetError(f"{path}: header says {dims} but holds {len(blob) - header} bytes of data")
    expected = MNIST_COUNTS.get(path.name)
    if expected is not None and dims[0] != expected:
        raise DatasetError(f"{path}: expected {expected} items, found {dims[0]}")
    return np.frombuffer(blob, np.uint8, offset=header).reshape(dims)


def _read_mnist(name: str, paths: tuple[Path, ...]) -> Dataset:
    """Pairs of (images, labels) files, concatenated in order; pixels / 255 as float32."""
    images, labels = [], []
    for image_path, label_path in zip(paths[::2], paths[1::2], strict=True):
        image_block, label_block = _read_idx(image_path, 3), _read_idx(label_path, 1)
        if image_block.shape[1:] != (28, 28) or len(image_block) != len(label_block):
            raise DatasetError(f"{image_path}: {image_block.shape} images for {len(label_block)} labels")
        images.append(image_block.reshape(len(image_block), -1))
        labels.append(label_block)
    features = np.concatenate(images).astype(np.float32) / np.float32(255.0)
    return _build(
        name,
        "vectors",
        np.concatenate(labels),
        source=paths[0].parent,
        expected_n=sum(MNIST_COUNTS[p.name] for p in paths[::2]),
        expected_classes=10,
        features=features,
        class_names=DIGIT_NAMES,
    )


# --------------------------------------------------------------------------- MATLAB multi-view


def _load_mat(path: Path) -> dict[str, Any]:
    """scipy.io.loadmat with every failure turned into a DatasetError that names the file."""
    try:
        return scipy.io.loadmat(path)
    except NotImplementedError as exc:  # scipy's answer to v7.3 (HDF5) files
        raise DatasetError(
            f"{path}: MATLAB v7.3 (HDF5) files need h5py, which is not installed; "
            "re-save the file with save(..., '-v7')"
        ) from exc
    except (OSError, ValueError, TypeError) as exc:
        raise DatasetError(f"{path}: not a readable MATLAB .mat file: {exc}") from exc


def _orient_view(view: Any, n: int, index: int, path: Path) -> np.ndarray:
    """Return view `index` as N x d, transposing d x N storage; the label count N decides."""
    if scipy.sparse.issparse(view):
        view = view.toarray()
    if not isinstance(view, np.ndarray) or view.ndim != 2 or view.dtype.kind not in "biuf":
        kind = getattr(view, "dtype", type(view).__name__)
        raise DatasetError(f"{path}: view {index} of X must be a numeric matrix, got {kind}")
    rows_match, cols_match = view.shape[0] == n, view.shape[1] == n
    if rows_match and cols_match:
        raise DatasetError(f"{path}: view {index} is {view.shape}; N x d vs d x N is ambiguous for N={n}")
    if not (rows_match or cols_match):
        raise DatasetError(f"{path}: view {index} is {view.shape}; neither side matches the {n} labels")
    return (view if rows_match else view.T).astype(np.float64)


def _multiview_from_mat(mat: dict[str, Any], path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """Views (each N x d) and raw labels from a .mat holding cell `X` and vector `y` or `Y`."""
    cells = mat.get("X")
    if not isinstance(cells, np.ndarray) or cells.dtype != object:
        raise DatasetError(f"{path}: expected a cell array X of views, found keys {sorted(mat)}")
    label_key = next((k for k in ("y", "Y") if k in mat), None)
    if label_key is None:
        raise DatasetError(f"{path}: expected labels in 'y' or 'Y', found keys {sorted(mat)}")
    labels = np.asarray(mat[label_key])
    if labels.ndim > 2 or (labels.ndim == 2 and min(labels.shape) != 1) or labels.dtype.kind not in "biuf":
        raise DatasetError(f"{path}: {label_key} must be a numeric vector, got {labels.shape} {labels.dtype}")
    labels = labels.ravel()
    views = [_orient_view(v, len(labels), i, path) for i, v in enumerate(cells.ravel())]
    if not views:
        raise DatasetError(f"{path}: cell X holds no views")
    return views, labels


def _read_mat_file(name: str, path: Path) -> Dataset:
    views, labels = _multiview_from_mat(_load_mat(path), path)
    return _build(name, "multiview", labels, source=path, views=views)


def _read_catalogued_mat(
    path: Path, n: int, dims: tuple[int, ...]
) -> tuple[list[np.ndarray], np.ndarray, dict[str, Any]]:
    """Read a catalogue .mat and check its sample count and view widths against the catalogue."""
    mat = _load_mat(path)
    views, labels = _multiview_from_mat(mat, path)
    found = tuple(v.shape[1] for v in views)
    if len(labels) != n or found != dims:
        raise DatasetError(
            f"{path}: expected {n} samples x views {list(dims)}, found {len(labels)} x {list(found)}"
        )
    return views, labels, mat


def _read_hw(name: str, paths: tuple[Path, ...]) -> Dataset:
    views, labels, _ = _read_catalogued_mat(paths[0], 2000, (216, 76, 64, 6, 240, 47))
    # UCI Multiple Features: classes 1..10 are the digits 0..9.
    return _build(
        name, "multiview", labels, source=paths[0], expected_classes=10, views=views, class_names=DIGIT_NAMES
    )


def _read_bdgp(name: str, paths: tuple[Path, ...]) -> Dataset:
    views, labels, mat = _read_catalogued_mat(paths[0], 2500, (1000, 500, 250))
    meaning = mat.get("class_meaning")
    class_names = None if meaning is None else [str(np.asarray(c).ravel()[0]) for c in meaning.ravel()]
    return _build(
        name, "multiview", labels, source=paths[0], expected_classes=5, views=views, class_names=class_names
    )


# --------------------------------------------------------------------------- DryBean (ARFF)

_DRYBEAN_FEATURES = 16
_DRYBEAN_SHAPE_VIEW_START = 12  # columns 1-12: dimension features; 13-16: shape factors


def _read_drybean(name: str, paths: tuple[Path, ...]) -> Dataset:
    """Parse the UCI ARFF: 16 numeric attributes then the nominal `Class`."""
    path = paths[0]
    header, sep, body = _read_gzip_text(path).partition("@DATA")
    attributes = [line for line in header.splitlines() if line.upper().startswith("@ATTRIBUTE")]
    class_line = attributes[-1] if attributes else ""
    if not sep or len(attributes) != _DRYBEAN_FEATURES + 1 or "{" not in class_line or "}" not in class_line:
        raise DatasetError(
            f"{path}: expected {_DRYBEAN_FEATURES} numeric attributes, a nominal class and @DATA"
        )
    declared = {c.strip() for c in class_line[class_line.index("{") + 1 : class_line.index("}")].split(",")}
    rows = [line.split(",") for line in body.split()]
    if any(len(row) != _DRYBEAN_FEATURES + 1 for row in rows):
        raise DatasetError(f"{path}: every data row must hold {_DRYBEAN_FEATURES + 1} comma-separated values")
    labels = np.array([row[-1] for row in rows])
    if not set(labels) <= declared:
        raise DatasetError(f"{path}: classes {sorted(set(labels) - declared)} are not declared in the header")
    try:
        features = np.array([row[:-1] for row in rows], dtype=np.float64)
    except ValueError as exc:
        raise DatasetError(f"{path}: non-numeric feature value: {exc}") from exc
    views = (features[:, :_DRYBEAN_SHAPE_VIEW_START], features[:, _DRYBEAN_SHAPE_VIEW_START:])
    return _build(name, "multiview", labels, source=path, expected_n=13_611, expected_classes=7, views=views)


# --------------------------------------------------------------------------- short texts


def _split_label_tab_text(rows: list[str], path: Path) -> tuple[list[int], list[str]]:
    """`label<TAB>text` rows -> integer labels and texts."""
    labels, texts = [], []
    for number, row in enumerate(rows, start=1):
        label, tab, text = row.partition("\t")
        if not tab or not label.strip().isdigit():
            raise DatasetError(f"{path}: line {number} is not 'label<TAB>text'")
        labels.append(int(label))
        texts.append(text)
    return labels, texts


def _read_stackoverflow(name: str, paths: tuple[Path, ...]) -> Dataset:
    title_path, label_path = paths
    texts = _read_gzip_text(title_path).split("\n")[:-1]  # LF-terminated, one title per line
    try:
        labels = [int(x) for x in _read_gzip_text(label_path).split()]
    except ValueError as exc:
        raise DatasetError(f"{label_path}: non-integer label: {exc}") from exc
    if len(texts) != len(labels):
        raise DatasetError(
            f"{title_path}: {len(texts)} titles but {label_path.name} holds {len(labels)} labels"
        )
    return _build(
        name,
        "texts",
        labels,
        source=title_path,
        expected_n=20_000,
        expected_classes=20,
        texts=texts,
        class_names=STACKOVERFLOW_TAGS,
    )


def _read_biomedical(name: str, paths: tuple[Path, ...]) -> Dataset:
    rows = [r for r in _read_gzip_text(paths[0]).split("\r\n") if r]  # CRLF, no final newline
    labels, texts = _split_label_tab_text(rows, paths[0])
    return _build(name, "texts", labels, source=paths[0], expected_n=20_000, expected_classes=20, texts=texts)


def _read_agnews(name: str, paths: tuple[Path, ...]) -> Dataset:
    rows = _read_gzip_text(paths[0]).split("\n")[:-1]  # LF-terminated
    labels, texts = _split_label_tab_text(rows, paths[0])
    return _build(name, "texts", labels, source=paths[0], expected_n=8_000, expected_classes=4, texts=texts)


def _read_20news(name: str, paths: tuple[Path, ...]) -> Dataset:
    """Stream the bydate tarball once (no extraction): train then test, label = newsgroup name."""
    path = paths[0]
    documents: dict[str, list[tuple[str, str]]] = {"20news-bydate-train": [], "20news-bydate-test": []}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                parts = member.name.split("/")
                if not member.isfile() or len(parts) != 3 or parts[0] not in documents:
                    continue
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                documents[parts[0]].append((parts[1], handle.read().decode("latin-1")))
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise DatasetError(f"{path}: cannot read the tar.gz archive: {exc}") from exc
    ordered = documents["20news-bydate-train"] + documents["20news-bydate-test"]
    labels = [group for group, _ in ordered]
    return _build(
        name,
        "texts",
        labels,
        source=path,
        expected_n=18_846,
        expected_classes=20,
        texts=[text for _, text in ordered],
    )


# --------------------------------------------------------------------------- registry


class _Embedded(NamedTuple):
    description: str
    read: Callable[[str, int], Dataset]


class _OnDisk(NamedTuple):
    description: str
    files: tuple[str, ...]  # relative to the data directory, in the order `read` expects them
    read: Callable[[str, tuple[Path, ...]], Dataset]


_EMBEDDED_SOURCES: dict[str, _Embedded] = {
    "digits": _Embedded(
        "scikit-learn digits, 1,797 x 64 pixels in [0, 1], 10 classes (embedded)", _read_digits
    ),
    "digits-mv": _Embedded(
        "digits as 3 views: pixels (64), 2x2 pooled (16), oriented gradients (32); 10 classes (embedded)",
        _read_digits_multiview,
    ),
    "blobs": _Embedded(
        "make_blobs, 2,000 x 10, 5 centres, std 1.0, random_state=seed (embedded)", _read_blobs
    ),
}

_MNIST_TRAIN = ("mnist/train-images-idx3-ubyte.gz", "mnist/train-labels-idx1-ubyte.gz")
_MNIST_TEST = ("mnist/t10k-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz")

_DISK_SOURCES: dict[str, _OnDisk] = {
    "mnist": _OnDisk(
        "MNIST train + t10k, 70,000 x 784 pixels / 255, 10 classes", _MNIST_TRAIN + _MNIST_TEST, _read_mnist
    ),
    "mnist-test": _OnDisk("MNIST t10k, 10,000 x 784 pixels / 255, 10 classes", _MNIST_TEST, _read_mnist),
    "hw": _OnDisk(
        "Handwritten (UCI Multiple Features), 2,000 samples, 6 views, 10 classes",
        ("hw/Handwritten.mat",),
        _read_hw,
    ),
    "bdgp": _OnDisk(
        "BDGP, 2,500 samples, 3 SIFT views (1000/500/250), 5 classes", ("bdgp/BDGP_fea.mat",), _read_bdgp
    ),
    "drybean": _OnDisk(
        "DryBean, 13,611 samples, views: 12 dimension + 4 shape features, 7 classes",
        ("drybean/Dry_Bean_Dataset.arff.gz",),
        _read_drybean,
    ),
    "stackoverflow": _OnDisk(
        "StackOverflow question titles, 20,000 texts, 20 tags",
        ("stackoverflow/title_StackOverflow.txt.gz", "stackoverflow/label_StackOverflow.txt.gz"),
        _read_stackoverflow,
    ),
    "biomedical": _OnDisk(
        "Biomedical paper titles, 20,000 texts, 20 topics",
        ("biomedical/biomedical_true_text.gz",),
        _read_biomedical,
    ),
    "agnews": _OnDisk(
        "AgNews subset, 8,000 texts, 4 classes", ("agnews/agnewsdataraw-8000.gz",), _read_agnews
    ),
    "20news": _OnDisk(
        "20 Newsgroups bydate train + test, 18,846 raw messages, 20 groups",
        ("20newsgroups/20news-bydate.tar.gz",),
        _read_20news,
    ),
}


def available_datasets() -> dict[str, str]:
    """Dataset name -> one-line description, for CLI listings (``mat:<path>`` stands for any .mat file)."""
    listing = {name: source.description for name, source in {**_EMBEDDED_SOURCES, **_DISK_SOURCES}.items()}
    listing[MAT_PREFIX + "<path>"] = "any MATLAB v5 multi-view .mat: cell X of views, labels y or Y"
    return listing


def _missing_data_dir_error(name: str, expected: Sequence[str]) -> DatasetError:
    searched = ", ".join(str(p) for p in _default_data_dirs())
    return DatasetError(
        f"dataset {name!r} needs files but no data directory was found (no data_dir argument, "
        f"${DATA_DIR_ENV} unset, none of: {searched}); expected files: {', '.join(expected)}"
    )


def _read_from_disk(name: str, source: _OnDisk, data_dir: Path | None) -> Dataset:
    if data_dir is None:
        raise _missing_data_dir_error(name, source.files)
    missing = [f for f in source.files if not (data_dir / f).is_file()]
    if missing:
        raise DatasetError(
            f"dataset {name!r}: missing {', '.join(missing)} in data directory {data_dir} "
            f"(expected files: {', '.join(source.files)})"
        )
    return source.read(name, tuple(data_dir / f for f in source.files))


def _mat_path(name: str, data_dir: Path | None) -> Path:
    """The file a ``mat:<path>`` name points to: absolute, or relative to the data directory."""
    given = name.removeprefix(MAT_PREFIX).strip()
    if not given:
        raise DatasetError(
            f"dataset name {name!r}: give a file after '{MAT_PREFIX}', e.g. 'mat:hw/Handwritten.mat'"
        )
    relative = Path(given).expanduser()
    if relative.is_absolute():
        path = relative
    elif data_dir is None:
        raise _missing_data_dir_error(name, [given])
    else:
        path = data_dir / relative
    if not path.is_file():
        raise DatasetError(f"dataset {name!r}: missing {path.name} in directory {path.parent}")
    return path.resolve()


def _read(name: str, data_dir: Path | None, seed: int) -> Dataset:
    """Read one dataset from its source (embedded generator, catalogue files or a `mat:` file)."""
    if name in _EMBEDDED_SOURCES:
        return _EMBEDDED_SOURCES[name].read(name, seed)
    if name in _DISK_SOURCES:
        return _read_from_disk(name, _DISK_SOURCES[name], data_dir)
    return _read_mat_file(name, _mat_path(name, data_dir))


def _stratified_counts(class_sizes: np.ndarray, total: int) -> np.ndarray:
    """Per-class sample counts proportional to `class_sizes`, at least 1 each, summing to `total`."""
    ideal = total * class_sizes / class_sizes.sum()
    counts = np.maximum(np.floor(ideal).astype(np.int64), 1)
    while counts.sum() != total:  # at most one step per class: flooring and the minimum of 1 are each < 1 off
        gap = ideal - counts
        if counts.sum() < total:
            gap[counts >= class_sizes] = -np.inf
            counts[np.argmax(gap)] += 1
        else:
            gap[counts <= 1] = np.inf
            counts[np.argmin(gap)] -= 1
    return counts


def _subsample(full: Dataset, max_samples: int, seed: int) -> Dataset:
    """A seeded, class-stratified subset of exactly `max_samples` rows, in the original row order."""
    class_sizes = np.bincount(full.y, minlength=full.n_classes)
    rng = np.random.default_rng(seed)
    counts = _stratified_counts(class_sizes, max_samples)
    chosen = np.sort(
        np.concatenate(
            [rng.choice(np.flatnonzero(full.y == c), size=k, replace=False) for c, k in enumerate(counts)]
        )
    )
    return Dataset(
        name=full.name,
        kind=full.kind,
        y=_freeze(full.y[chosen]),
        n_classes=full.n_classes,
        features=None if full.features is None else _freeze(full.features[chosen]),
        views=None if full.views is None else tuple(_freeze(v[chosen]) for v in full.views),
        texts=None if full.texts is None else tuple(full.texts[i] for i in chosen),
        class_names=full.class_names,
    )


def load_dataset(
    name: str, data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0, max_samples: int = 0
) -> Dataset:
    """Load a dataset by name (see `available_datasets`), cached per process, arrays read-only.

    `seed` drives `blobs` and the subsample; `max_samples` > 0 keeps a class-stratified subset of exactly
    that many samples (every class kept, so it must be at least the number of classes), for quick runs.
    """
    if name not in _EMBEDDED_SOURCES and name not in _DISK_SOURCES and not name.startswith(MAT_PREFIX):
        valid = ", ".join([*_EMBEDDED_SOURCES, *_DISK_SOURCES, MAT_PREFIX + "<path>"])
        raise DatasetError(f"unknown dataset {name!r}; valid names: {valid}")
    if max_samples < 0:
        raise DatasetError(f"max_samples must be >= 0 (0 keeps every sample), got {max_samples}")
    # Normalise the cache key: embedded datasets ignore the directory, and only blobs reads the seed.
    resolved_dir = None if name in _EMBEDDED_SOURCES else resolve_data_dir(data_dir)
    full = _load_cached(name, resolved_dir, seed if name == "blobs" else 0, 0, 0)
    if max_samples == 0 or max_samples >= full.n_samples:
        return full
    if max_samples < full.n_classes:
        raise DatasetError(
            f"dataset {name!r}: max_samples={max_samples} cannot hold all {full.n_classes} classes; "
            f"use 0 (all samples) or at least {full.n_classes}"
        )
    return _load_cached(name, resolved_dir, seed if name == "blobs" else 0, max_samples, seed)


@lru_cache(maxsize=32)
def _load_cached(name: str, data_dir: Path | None, data_seed: int, max_samples: int, seed: int) -> Dataset:
    """Per-process cache: Flower rebuilds clients every round, which must not re-read files.

    Subsamples (`max_samples` > 0) are cut from the cached full dataset, so new seeds read no files.
    """
    if max_samples == 0:
        return _read(name, data_dir, data_seed)
    return _subsample(_load_cached(name, data_dir, data_seed, 0, 0), max_samples, seed)
