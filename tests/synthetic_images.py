"""Small image datasets written in the standard on-disk formats, for tests (the real files are large).

Images carry their class: class c lights a bright block at a class-specific place over a dim noisy
background, so clustering them is easy and a run on them can be checked for a sensible score.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
CIFAR_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
STL_NAMES = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")


def class_images(labels: np.ndarray, shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """uint8 images (N, C, H, W): noise up to 60, plus a 200-bright block whose place encodes the class."""
    rng = np.random.default_rng(seed)
    channels, height, width = shape
    images = rng.integers(0, 60, size=(len(labels), *shape), dtype=np.uint8)
    block_h, block_w = height // 4, width // 4
    for i, label in enumerate(labels):
        row, col = divmod(int(label), 4)
        images[i, :, row * block_h : (row + 1) * block_h, col * block_w : (col + 1) * block_w] += 140
    return images


def cycling_labels(n: int, n_classes: int = 10) -> np.ndarray:
    """0, 1, ..., n_classes-1, 0, 1, ...: every class present once n >= n_classes."""
    return np.arange(n) % n_classes


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic 0 0 8 ndim, big-endian int32 dims, then the data."""
    header = bytes((0, 0, 8, array.ndim)) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + np.ascontiguousarray(array, np.uint8).tobytes()


def write_gzip(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload))


def write_fashion_mnist(
    root: Path, n_train: int, n_test: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The four Fashion-MNIST .gz files in root/fashion-mnist; returns (images (N,1,28,28), labels)."""
    labels = cycling_labels(n_train + n_test)
    images = class_images(labels, (1, 28, 28), seed)
    blocks = (images[:n_train, 0], labels[:n_train], images[n_train:, 0], labels[n_train:])
    for name, block in zip(IDX_FILES, blocks, strict=True):
        write_gzip(root / "fashion-mnist" / name, idx_bytes(block))
    return images, labels


def write_cifar10(root: Path, per_batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cifar-10-batches-py/ with 5 train batches, test_batch and batches.meta; returns (images, labels).

    Pickled like the official files: protocol 2, bytes keys, data uint8 N x 3072, labels a list of ints.
    """
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    labels = cycling_labels(6 * per_batch)
    images = class_images(labels, (3, 32, 32), seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for b, name in enumerate(names):
        rows = slice(b * per_batch, (b + 1) * per_batch)
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(x) for x in labels[rows]],
            b"data": images[rows].reshape(per_batch, -1),
            b"filenames": [f"img{i}.png".encode() for i in range(per_batch)],
        }
        write_pickle(folder / name, batch)
    meta = {
        b"label_names": [n.encode() for n in CIFAR_NAMES],
        b"num_cases_per_batch": per_batch,
        b"num_vis": 3072,
    }
    write_pickle(folder / "batches.meta", meta)
    return images, labels


def write_pickle(path: Path, content: object) -> None:
    path.write_bytes(pickle.dumps(content, protocol=2))


def write_stl10(root: Path, n_train: int, n_test: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """stl10_binary/ with train/test X and y and class_names.txt; returns upright (images, labels 0..9).

    X files hold each 3 x 96 x 96 image column-major, as the official binaries do.
    """
    folder = root / "stl10_binary"
    folder.mkdir(parents=True, exist_ok=True)
    labels = cycling_labels(n_train + n_test)
    images = class_images(labels, (3, 96, 96), seed)
    for split, rows in (("train", slice(0, n_train)), ("test", slice(n_train, None))):
        (folder / f"{split}_X.bin").write_bytes(images[rows].transpose(0, 1, 3, 2).tobytes())
        (folder / f"{split}_y.bin").write_bytes((labels[rows] + 1).astype(np.uint8).tobytes())
    (folder / "class_names.txt").write_text("\n".join(STL_NAMES) + "\n")
    return images, labels
