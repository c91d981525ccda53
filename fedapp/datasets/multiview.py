"""Multi-view tables: HW (UCI Multiple Features), BDGP, DryBean, and any MATLAB file as ``mat:<path>``.

Catalogue files are checked against the sample counts and view widths of the data catalogue
(``README.md`` in the data directory); a count that differs is an error naming the file.

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

from pathlib import Path
from typing import Any

import numpy as np
import scipy.io
import scipy.sparse

from fedapp.datasets.common import DIGIT_NAMES, Dataset, DatasetError, OnDisk, build, read_gzip_text

MAT_PREFIX = "mat:"
MAT_DESCRIPTION = "any MATLAB v5 multi-view .mat: cell X of views, labels y or Y"


MAT_HEADER_BYTES = 128


def _load_mat(path: Path) -> dict[str, Any]:
    """scipy.io.loadmat with every failure turned into a DatasetError that names the file and says which
    failure it is: not a MATLAB file at all (no header), or a MATLAB file cut short or corrupt."""
    if path.is_dir():
        raise DatasetError(f"{path}: is a directory, not a MATLAB .mat file")
    try:
        with path.open("rb") as handle:
            header = handle.read(MAT_HEADER_BYTES)
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not header.startswith(b"MATLAB"):  # v5 / v7 / v7.3 files all start with a 128-byte text header
        raise DatasetError(f"{path}: not a MATLAB .mat file (no 'MATLAB ... MAT-file' header)")
    try:
        return scipy.io.loadmat(path)
    except NotImplementedError as exc:  # scipy's answer to v7.3 (HDF5) files
        raise DatasetError(
            f"{path}: MATLAB v7.3 (HDF5) files need h5py, which is not installed; "
            "re-save the file with save(..., '-v7')"
        ) from exc
    except (OSError, ValueError, TypeError, scipy.io.matlab.MatReadError) as exc:
        raise DatasetError(f"{path}: a MATLAB file, but truncated or corrupt: {exc}") from exc


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


def read_mat_file(name: str, path: Path) -> Dataset:
    """A ``mat:<path>`` dataset: any MATLAB v5 file with cell `X` and labels `y` or `Y`."""
    views, labels = _multiview_from_mat(_load_mat(path), path)
    return build(name, "multiview", labels, source=path, views=views)


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
    return build(
        name, "multiview", labels, source=paths[0], expected_classes=10, views=views, class_names=DIGIT_NAMES
    )


def _read_bdgp(name: str, paths: tuple[Path, ...]) -> Dataset:
    views, labels, mat = _read_catalogued_mat(paths[0], 2500, (1000, 500, 250))
    meaning = mat.get("class_meaning")
    class_names = None if meaning is None else [str(np.asarray(c).ravel()[0]) for c in meaning.ravel()]
    return build(
        name, "multiview", labels, source=paths[0], expected_classes=5, views=views, class_names=class_names
    )


# --------------------------------------------------------------------------- DryBean (ARFF)

_DRYBEAN_FEATURES = 16
_DRYBEAN_SHAPE_VIEW_START = 12  # columns 1-12: dimension features; 13-16: shape factors


def _read_drybean(name: str, paths: tuple[Path, ...]) -> Dataset:
    """Parse the UCI ARFF: 16 numeric attributes then the nominal `Class`."""
    path = paths[0]
    header, sep, body = read_gzip_text(path).partition("@DATA")
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
    return build(name, "multiview", labels, source=path, expected_n=13_611, expected_classes=7, views=views)


DATASETS: dict[str, OnDisk] = {
    "hw": OnDisk(
        "multiview",
        "Handwritten (UCI Multiple Features), 2,000 samples, 6 views, 10 classes",
        ("hw/Handwritten.mat",),
        _read_hw,
    ),
    "bdgp": OnDisk(
        "multiview",
        "BDGP, 2,500 samples, 3 SIFT views (1000/500/250), 5 classes",
        ("bdgp/BDGP_fea.mat",),
        _read_bdgp,
    ),
    "drybean": OnDisk(
        "multiview",
        "DryBean, 13,611 samples, views: 12 dimension + 4 shape features, 7 classes",
        ("drybean/Dry_Bean_Dataset.arff.gz",),
        _read_drybean,
    ),
}
