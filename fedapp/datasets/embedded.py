"""Embedded datasets: generated in memory, no files needed.

- ``digits``: scikit-learn's 8x8 digits, 1,797 images (1 x 8 x 8) with pixels / 16 in [0, 1] (float64),
  10 classes; `features` are the 64 pixels row-major.
- ``digits-mv``: the same images as three views - 64 pixels; 2x2 average pooling (16); a histogram of
  oriented gradients (32: central-difference gradients, unsigned orientation in 8 bins weighted by
  magnitude, over 4 cells of 4x4 pixels). The third view is a non-linear function of the image, so it
  is a genuinely different view rather than a linear map of the first.
- ``blobs``: `sklearn.datasets.make_blobs`, 2,000 x 10, 5 centres, cluster_std 1.0, random_state=seed.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from fedapp.datasets.common import DIGIT_NAMES, Dataset, Embedded, build


def _digit_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits as (N, 8, 8) images in [0, 1] and their labels.

    Read from the package's `digits.csv.gz` as `load_digits` reads it, without importing scikit-learn
    (1.2 s): a deployment starts a process per message, and this is the demo dataset."""
    spec = importlib.util.find_spec("sklearn")
    folders = spec.submodule_search_locations if spec is not None else None
    path = Path(folders[0], "datasets", "data", "digits.csv.gz") if folders else None
    if path is None or not path.is_file():  # another layout: ask scikit-learn itself
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images / 16.0, bunch.target
    with gzip.open(path, "rt") as file:
        table = np.loadtxt(file, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8) / 16.0, table[:, -1].astype(int)


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
    return build(
        name,
        "images",
        labels,
        source="sklearn.datasets.load_digits",
        images=images[:, None],  # one grey channel
        class_names=DIGIT_NAMES,
    )


def _read_digits_multiview(name: str, seed: int) -> Dataset:
    images, labels = _digit_images()
    n = len(images)
    pixels = images.reshape(n, -1)
    pooled = images.reshape(n, 4, 2, 4, 2).mean(axis=(2, 4)).reshape(n, -1)
    views = (pixels, pooled, _oriented_gradients(images))
    return build(
        name, "multiview", labels, source="sklearn.datasets.load_digits", views=views, class_names=DIGIT_NAMES
    )


def _read_blobs(name: str, seed: int) -> Dataset:
    from sklearn.datasets import make_blobs

    vectors, labels = make_blobs(n_samples=2000, n_features=10, centers=5, cluster_std=1.0, random_state=seed)
    return build(name, "vectors", labels, source="sklearn.datasets.make_blobs", vectors=vectors)


DATASETS: dict[str, Embedded] = {
    "digits": Embedded(
        "images", "scikit-learn digits, 1,797 images 1x8x8, pixels / 16 in [0, 1], 10 classes", _read_digits
    ),
    "digits-mv": Embedded(
        "multiview",
        "digits as 3 views: pixels (64), 2x2 pooled (16), oriented gradients (32); 10 classes",
        _read_digits_multiview,
    ),
    "blobs": Embedded(
        "vectors", "make_blobs, 2,000 x 10, 5 centres, std 1.0, random_state=seed", _read_blobs, seeded=True
    ),
}
