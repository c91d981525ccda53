"""Image datasets in their standard file formats, kept as uint8 N x C x H x W (see `Dataset.images`).

- ``mnist`` / ``mnist-test``: LeCun's gzipped IDX files in ``mnist/``; the item counts must match the
  catalogue (60,000 train, 10,000 t10k), which guards the shared copy.
- ``fashion-mnist``: the same IDX layout and file names in ``fashion-mnist/``; any number of images loads
  (so small files work), but headers, image size, image/label counts and labels 0..9 are checked.
- ``cifar10``: torchvision's / Krizhevsky's ``cifar-10-batches-py/``: pickled dicts with ``b"data"``
  (uint8, N x 3072, the red, green then blue 32x32 planes row-major) and ``b"labels"``, class names from
  ``batches.meta``. Only plain containers and NumPy arrays are unpickled (a pickle can run code).
- ``stl10``: ``stl10_binary/``: raw uint8 ``*_X.bin`` of 3 x 96 x 96 images stored column-major (each
  image is transposed on reading), ``*_y.bin`` labels 1..10, ``class_names.txt``; any number of images.

Train and test splits are concatenated, train first. Vector methods read `features`: the images
flattened row-major (C, H, W) as float32 pixels / 255; for MNIST this is bit-identical to the 784-pixel
vectors of earlier versions, so results reported with them still hold.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.datasets.common import DIGIT_NAMES, Dataset, DatasetError, OnDisk, build, check_label_range

# --------------------------------------------------------------------------- IDX (MNIST, Fashion-MNIST)

_IDX_UBYTE = 0x08
_IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
MNIST_COUNTS = dict(zip(_IDX_FILES, (60_000, 60_000, 10_000, 10_000), strict=True))
FASHION_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"
)  # fmt: skip


def _read_idx(path: Path, ndim: int, expected_items: int | None) -> np.ndarray:
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
    if expected_items is not None and dims[0] != expected_items:
        raise DatasetError(f"{path}: expected {expected_items} items, found {dims[0]}")
    return np.frombuffer(blob, np.uint8, offset=header).reshape(dims)


def _read_idx_pairs(paths: tuple[Path, ...], counts: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of (images, labels) IDX files, concatenated in order: (N, 1, 28, 28) uint8 and labels 0..9.

    `counts` maps a file name to the item count it must hold (empty: any count).
    """
    images, labels = [], []
    for image_path, label_path in zip(paths[::2], paths[1::2], strict=True):
        image_block = _read_idx(image_path, 3, counts.get(image_path.name))
        label_block = _read_idx(label_path, 1, counts.get(label_path.name))
        if image_block.shape[1:] != (28, 28) or len(image_block) != len(label_block):
            raise DatasetError(f"{image_path}: {image_block.shape} images for {len(label_block)} labels")
        check_label_range(label_block, 0, 10, label_path)
        images.append(image_block)
        labels.append(label_block)
    return np.concatenate(images)[:, None], np.concatenate(labels)


def _read_mnist(name: str, paths: tuple[Path, ...]) -> Dataset:
    images, labels = _read_idx_pairs(paths, MNIST_COUNTS)
    return build(
        name,
        "images",
        labels,
        source=paths[0].parent,
        expected_n=sum(MNIST_COUNTS[p.name] for p in paths[::2]),
        expected_classes=10,
        images=images,
        class_names=DIGIT_NAMES,
    )


def _read_fashion_mnist(name: str, paths: tuple[Path, ...]) -> Dataset:
    images, labels = _read_idx_pairs(paths, {})
    return build(
        name,
        "images",
        labels,
        source=paths[0].parent,
        expected_classes=len(FASHION_NAMES),
        images=images,
        class_names=FASHION_NAMES,
    )


# --------------------------------------------------------------------------- CIFAR-10 (pickled batches)

_CIFAR_SHAPE = (3, 32, 32)
_CIFAR_CLASSES = 10


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and NumPy arrays only: a pickle may name any callable, and run it."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),  # written by NumPy < 2 (the official CIFAR files)
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how Python 3 writes bytes under pickle protocol 2
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        # numpy.core is numpy._core's deprecated alias in NumPy 2
        return super().find_class(module.replace("numpy.core.", "numpy._core."), name)


def _unpickle(path: Path) -> dict[bytes, Any]:
    """A CIFAR-10 batch file: a pickled dict with bytes keys (Python 2 strings, hence encoding="bytes")."""
    try:
        with path.open("rb") as fh:
            content = _ArrayUnpickler(fh, encoding="bytes").load()
    except Exception as exc:  # malformed pickles fail in many ways (EOF, bad opcodes, bad arguments)
        raise DatasetError(f"{path}: not a readable CIFAR-10 pickle: {exc!r}") from exc
    if not isinstance(content, dict):
        raise DatasetError(f"{path}: expected a pickled dict, found {type(content).__name__}")
    return content


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch: images (n, 3, 32, 32) uint8 and integer labels."""
    batch = _unpickle(path)
    data, labels = batch.get(b"data"), np.asarray(batch.get(b"labels", []))
    width = int(np.prod(_CIFAR_SHAPE))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != width:
        found = f"{data.shape} {data.dtype}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"{path}: b'data' must be a uint8 N x {width} array, found {found}")
    if labels.ndim != 1 or len(labels) != len(data) or (labels.size and labels.dtype.kind not in "iu"):
        raise DatasetError(
            f"{path}: b'labels' must list {len(data)} integers, found {labels.shape} {labels.dtype}"
        )
    return data.reshape(-1, *_CIFAR_SHAPE), labels.astype(np.int64)


def _read_cifar10(name: str, paths: tuple[Path, ...]) -> Dataset:
    *batch_paths, meta_path = paths
    raw_names = _unpickle(meta_path).get(b"label_names")
    if not isinstance(raw_names, list) or len(raw_names) != _CIFAR_CLASSES:
        raise DatasetError(f"{meta_path}: b'label_names' must list {_CIFAR_CLASSES} class names")
    class_names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in raw_names]
    images, labels = [], []
    for path in batch_paths:
        batch_images, batch_labels = _read_cifar_batch(path)
        check_label_range(batch_labels, 0, _CIFAR_CLASSES, path)
        images.append(batch_images)
        labels.append(batch_labels)
    return build(
        name,
        "images",
        np.concatenate(labels),
        source=meta_path.parent,
        expected_classes=_CIFAR_CLASSES,
        images=np.concatenate(images),
        class_names=class_names,
    )


# --------------------------------------------------------------------------- STL-10 (raw binary)

_STL_SHAPE = (3, 96, 96)
_STL_CLASSES = 10


def _read_stl_split(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One split: images (n, 3, 96, 96) uint8 (a transposed view) and labels 0..9."""
    try:
        raw, labels = np.fromfile(images_path, np.uint8), np.fromfile(labels_path, np.uint8)
    except OSError as exc:
        raise DatasetError(f"{exc.filename}: cannot read: {exc}") from exc
    size = int(np.prod(_STL_SHAPE))
    if raw.size % size:
        raise DatasetError(f"{images_path}: {raw.size} bytes is not a whole number of 3x96x96 images")
    # Each image is stored column-major (Fortran order): swapping H and W gives the upright picture.
    images = raw.reshape(-1, *_STL_SHAPE).transpose(0, 1, 3, 2)
    if len(images) != len(labels):
        raise DatasetError(
            f"{images_path}: {len(images)} images but {labels_path.name} holds {len(labels)} labels"
        )
    check_label_range(labels, 1, _STL_CLASSES, labels_path)
    return images, labels.astype(np.int64) - 1


def _read_stl10(name: str, paths: tuple[Path, ...]) -> Dataset:
    *split_paths, names_path = paths
    try:
        class_names = [line.strip() for line in names_path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{names_path}: cannot read as UTF-8 text: {exc}") from exc
    class_names = [n for n in class_names if n]
    if len(class_names) != _STL_CLASSES:
        raise DatasetError(
            f"{names_path}: expected {_STL_CLASSES} class names, one per line, found {len(class_names)}"
        )
    splits = [_read_stl_split(x, y) for x, y in zip(split_paths[::2], split_paths[1::2], strict=True)]
    return build(
        name,
        "images",
        np.concatenate([labels for _, labels in splits]),
        source=names_path.parent,
        expected_classes=_STL_CLASSES,
        images=np.concatenate([images for images, _ in splits]),  # one contiguous copy
        class_names=class_names,
    )


# --------------------------------------------------------------------------- registry entries


def _in(folder: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{folder}/{n}" for n in names)


DATASETS: dict[str, OnDisk] = {
    "mnist": OnDisk(
        "images",
        "MNIST train + t10k, 70,000 images 1x28x28 (features: 784 pixels / 255), 10 digits",
        _in("mnist", *_IDX_FILES),
        _read_mnist,
    ),
    "mnist-test": OnDisk(
        "images",
        "MNIST t10k, 10,000 images 1x28x28 (features: 784 pixels / 255), 10 digits",
        _in("mnist", *_IDX_FILES[2:]),
        _read_mnist,
    ),
    "fashion-mnist": OnDisk(
        "images",
        "Fashion-MNIST train + t10k (70,000 in the real set), images 1x28x28, 10 clothing classes",
        _in("fashion-mnist", *_IDX_FILES),
        _read_fashion_mnist,
    ),
    "cifar10": OnDisk(
        "images",
        "CIFAR-10 train + test (60,000 in the real set), images 3x32x32, 10 classes",
        _in("cifar-10-batches-py", *(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"),
        _read_cifar10,
    ),
    "stl10": OnDisk(
        "images",
        "STL-10 labelled train + test (13,000 in the real set), images 3x96x96, 10 classes",
        _in("stl10_binary", "train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin", "class_names.txt"),
        _read_stl10,
    ),
}
