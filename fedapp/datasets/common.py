"""What every dataset family shares: the `Dataset` type, its errors, registry entry types and helpers.

Datasets come in four kinds, each with one payload field:

- ``"vectors"``: one feature matrix (`vectors`, N x D).
- ``"images"``: `images`, N x C x H x W, for convolutional networks; either uint8 0..255 (file-backed
  sets: CIFAR-10 is 184 MB as bytes but 737 MB as float32) or floating point already in [0, 1]
  (scikit-learn's digits, whose 17 grey levels are not bytes).
- ``"multiview"``: aligned views (`views`, each N x D_v, float64, raw - scaling is the caller's business).
- ``"texts"``: raw strings (`texts`); embedding them is the caller's business.
- ``"bow"``: documents as term counts (`counts`, a read-only N x V int64 CSR matrix) over `vocabulary`
  (V term strings): corpora that exist only as bags of words, such as generated LDA corpora.

Every kind except texts and bow also offers `features`, the one matrix that vector methods (k-means,
k-FED, FFCM) read: the vectors themselves, the concatenated views, or the images flattened row-major
(C, H, W) and scaled to [0, 1] - uint8 images as float32 pixels / 255, float images as they are. Image
features are computed on first use and cached on the dataset, so a conv-net run never pays for them.

Labels are always int64 in 0..n_classes-1 and every class occurs: numeric labels are remapped in
ascending order, string labels (DryBean, 20 Newsgroups) in sorted name order, which `class_names` records.
A user's own file may have no labels (`labelled` False): then `y` is all zeros and `n_classes` is 1, so
shape-driven code still runs, but anything that reads labels (metrics, k = number of classes) must check
`labelled` first. Such files also carry `ids`, each row's id as read, so results can be written back.
"""

from __future__ import annotations

import dataclasses
import gzip
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse

# kind -> the Dataset field that carries its payload
PAYLOADS = {"vectors": "vectors", "images": "images", "multiview": "views", "texts": "texts", "bow": "counts"}
KINDS = tuple(PAYLOADS)
DIGIT_NAMES = tuple(str(d) for d in range(10))


class DatasetError(ValueError):
    """A dataset cannot be provided: unknown name, missing files or a malformed file."""


@dataclass(frozen=True, eq=False)  # identity equality: comparing or hashing arrays field-wise is meaningless
class Dataset:
    """One dataset; the payload field that `kind` names is set, arrays are read-only.

    `ids`: each row's id as a string (user files), unique; None for catalogue datasets. `labelled` False:
    the source has no labels, `y` is all zeros and `n_classes` 1 (placeholders, not classes).
    """

    name: str
    kind: str
    y: np.ndarray
    n_classes: int
    vectors: np.ndarray | None = None
    images: np.ndarray | None = None
    views: tuple[np.ndarray, ...] | None = None
    texts: tuple[str, ...] | None = None
    class_names: tuple[str, ...] | None = None
    counts: scipy.sparse.csr_matrix | None = None
    vocabulary: tuple[str, ...] | None = None
    ids: tuple[str, ...] | None = None
    labelled: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DatasetError(f"dataset {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if getattr(self, PAYLOADS[self.kind]) is None:
            raise DatasetError(f"dataset {self.name!r}: kind {self.kind!r} needs its payload field set")
        if self.images is not None and (self.images.ndim != 4 or self.images.dtype.kind not in "uf"):
            raise DatasetError(
                f"dataset {self.name!r}: images must be N x C x H x W, uint8 or float, "
                f"got {self.images.shape} {self.images.dtype}"
            )
        n = self.n_samples
        rows = [len(a) for a in (self.vectors, self.images, self.texts) if a is not None]
        if self.counts is not None:
            rows.append(self.counts.shape[0])
            if self.vocabulary is None or len(self.vocabulary) != self.counts.shape[1]:
                raise DatasetError(f"dataset {self.name!r}: counts need one vocabulary term per column")
        rows += [len(v) for v in self.views or ()]
        if any(r != n for r in rows):
            raise DatasetError(f"dataset {self.name!r}: {n} labels but payload row counts {rows}")
        if self.class_names is not None and len(self.class_names) != self.n_classes:
            raise DatasetError(
                f"dataset {self.name!r}: {len(self.class_names)} class names for {self.n_classes} classes"
            )
        if not self.labelled and (self.n_classes != 1 or self.y.any() or self.class_names is not None):
            raise DatasetError(f"dataset {self.name!r}: unlabelled data need y all 0 and one unnamed class")
        if self.ids is not None:
            self._check_ids(n)

    def _check_ids(self, n: int) -> None:
        if len(self.ids) != n:
            raise DatasetError(f"dataset {self.name!r}: {len(self.ids)} ids for {n} samples")
        if len(set(self.ids)) != n:
            duplicate = next(i for i, count in Counter(self.ids).items() if count > 1)
            raise DatasetError(f"dataset {self.name!r}: duplicate id {duplicate!r}")

    @property
    def n_samples(self) -> int:
        """Number of samples N."""
        return len(self.y)

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """(C, H, W) of an image dataset, else None."""
        return None if self.images is None else tuple(self.images.shape[1:])

    @cached_property
    def features(self) -> np.ndarray | None:
        """The N x D matrix vector methods read (None for texts and bow); computed once, read-only."""
        if self.vectors is not None:
            return self.vectors
        if self.views is not None:
            return freeze(np.hstack(self.views))
        if self.images is not None:
            return freeze(self.unit_images().reshape(self.n_samples, -1))
        return None

    def unit_images(self, indices: np.ndarray | None = None) -> np.ndarray:
        """Images (all, or the rows `indices`) scaled to [0, 1]: uint8 as float32 / 255, float as stored."""
        if self.images is None:
            raise DatasetError(f"dataset {self.name!r} has no images (kind {self.kind!r})")
        chosen = self.images if indices is None else self.images[indices]
        if chosen.dtype == np.uint8:
            return chosen.astype(np.float32) / np.float32(255.0)
        return chosen


# --------------------------------------------------------------------------- registry entries


class Embedded(NamedTuple):
    """A dataset generated in memory; `read(name, seed)`. `seeded`: the data depend on the seed."""

    kind: str
    description: str
    read: Callable[[str, int], Dataset]
    seeded: bool = False


class OnDisk(NamedTuple):
    """A dataset read from files; `read(name, paths)` gets `files` resolved against the data directory."""

    kind: str
    description: str
    files: tuple[str, ...]  # relative to the data directory, in the order `read` expects them
    read: Callable[[str, tuple[Path, ...]], Dataset]


Source = Embedded | OnDisk


# --------------------------------------------------------------------------- helpers for readers


def freeze(array: np.ndarray) -> np.ndarray:
    """Mark an array read-only so cached data cannot be corrupted by one client."""
    array.setflags(write=False)
    return array


def build(
    name: str,
    kind: str,
    raw_labels: Sequence[Any] | np.ndarray,
    *,
    source: Path | str,
    expected_n: int | None = None,
    expected_classes: int | None = None,
    vectors: np.ndarray | None = None,
    images: np.ndarray | None = None,
    views: Sequence[np.ndarray] | None = None,
    texts: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    counts: scipy.sparse.csr_matrix | None = None,
    vocabulary: Sequence[str] | None = None,
    ids: Sequence[str] | None = None,
    labelled: bool = True,
) -> Dataset:
    """Remap labels to 0..C-1, check the catalogue counts, freeze arrays and assemble a `Dataset`.

    String labels give `class_names` in sorted order; numeric labels are remapped in ascending order.
    Unlabelled data (`labelled` False) pass all-zero `raw_labels`.
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
    return Dataset(
        name=name,
        kind=kind,
        y=freeze(y.astype(np.int64)),
        n_classes=len(classes),
        vectors=None if vectors is None else freeze(vectors),
        images=None if images is None else freeze(np.ascontiguousarray(images)),
        views=None if views is None else tuple(freeze(np.ascontiguousarray(v, np.float64)) for v in views),
        texts=None if texts is None else tuple(texts),
        class_names=None if class_names is None else tuple(class_names),
        counts=None if counts is None else _freeze_csr(scipy.sparse.csr_matrix(counts, dtype=np.int64)),
        vocabulary=None if vocabulary is None else tuple(vocabulary),
        ids=None if ids is None else tuple(ids),
        labelled=labelled,
    )


def _freeze_csr(matrix: scipy.sparse.csr_matrix) -> scipy.sparse.csr_matrix:
    for array in (matrix.data, matrix.indices, matrix.indptr):
        freeze(array)
    return matrix


def check_label_range(labels: np.ndarray, first: int, n_classes: int, source: Path) -> None:
    """Labels of a fixed class list must lie in first..first+n_classes-1 (checked before `build` remaps)."""
    last = first + n_classes - 1
    if labels.size and (labels.min() < first or labels.max() > last):
        raise DatasetError(
            f"{source}: labels must lie in {first}..{last}, found {labels.min()}..{labels.max()}"
        )


def read_gzip_text(path: Path) -> str:
    """A gzipped UTF-8 text file, with read and decode failures reported against the file."""
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read().decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read as gzipped UTF-8 text: {exc}") from exc


# --------------------------------------------------------------------------- subsampling


def stratified_counts(class_sizes: np.ndarray, total: int) -> np.ndarray:
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


def subsample(full: Dataset, max_samples: int, seed: int) -> Dataset:
    """A seeded, class-stratified subset of exactly `max_samples` rows, in the original row order."""
    class_sizes = np.bincount(full.y, minlength=full.n_classes)
    return _take_per_class(full, stratified_counts(class_sizes, max_samples), seed)


def long_tail_counts(class_sizes: np.ndarray, imbalance: float) -> np.ndarray:
    """Per-class counts of a long-tailed version: class c keeps n_max * imbalance^(-c/(C-1)) rows.

    The usual exponential ("Zipf-like") profile of long-tailed benchmarks (CIFAR-LT): class 0 is the
    head, the last class the tail, largest/smallest = `imbalance`. n_max is the largest count every class
    can give (each class must hold n_max * its share), so the profile is exact up to rounding.
    """
    n_classes = len(class_sizes)
    shares = imbalance ** (-np.arange(n_classes) / max(n_classes - 1, 1))
    head = int(np.floor(np.min(class_sizes / shares)))
    return np.maximum(np.round(head * shares).astype(np.int64), 1)


def long_tail(full: Dataset, imbalance: float, seed: int) -> Dataset:
    """A seeded long-tailed subset (see `long_tail_counts`); labelled data only."""
    if not full.labelled:
        raise DatasetError(f"dataset {full.name!r}: imbalance needs class labels, this data has none")
    if imbalance < 1:
        raise DatasetError(f"imbalance must be >= 1 (largest/smallest class), got {imbalance:g}")
    class_sizes = np.bincount(full.y, minlength=full.n_classes)
    if class_sizes.min() == 0:
        raise DatasetError(f"dataset {full.name!r}: imbalance needs every class present")
    return _take_per_class(full, long_tail_counts(class_sizes, imbalance), seed)


def _take_per_class(full: Dataset, counts: np.ndarray, seed: int) -> Dataset:
    """`counts[c]` seeded rows of every class c, in the original row order."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(
        np.concatenate(
            [rng.choice(np.flatnonzero(full.y == c), size=k, replace=False) for c, k in enumerate(counts)]
        )
    )
    return dataclasses.replace(
        full,
        y=freeze(full.y[chosen]),
        vectors=None if full.vectors is None else freeze(full.vectors[chosen]),
        images=None if full.images is None else freeze(full.images[chosen]),
        views=None if full.views is None else tuple(freeze(v[chosen]) for v in full.views),
        texts=None if full.texts is None else tuple(full.texts[i] for i in chosen),
        counts=None if full.counts is None else _freeze_csr(full.counts[chosen]),
        ids=None if full.ids is None else tuple(full.ids[i] for i in chosen),
    )
