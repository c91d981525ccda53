"""Image families: Fashion-MNIST (IDX), CIFAR-10 (pickled batches), STL-10 (raw binary), the images kind.

Every reader is tested on small files the tests write in the standard format (tests/synthetic_images.py),
including malformed variants; MNIST itself is covered in test_data.py and on the shared copy.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedapp.datasets import DatasetError, dataset_info, load_dataset, registry
from fedapp.datasets.images import FASHION_NAMES
from fedapp.methods import methods_for_kind
from tests.synthetic_images import (
    CIFAR_NAMES,
    IDX_FILES,
    STL_NAMES,
    idx_bytes,
    write_cifar10,
    write_fashion_mnist,
    write_gzip,
    write_pickle,
    write_stl10,
)


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """Every test writes its own files into a fresh tmp_path; keep the per-process cache out of it."""
    registry._load_cached.cache_clear()
    yield
    registry._load_cached.cache_clear()


# --------------------------------------------------------------------------- Fashion-MNIST


def test_fashion_mnist_reads_any_size(tmp_path: Path) -> None:
    images, labels = write_fashion_mnist(tmp_path, n_train=30, n_test=17)
    ds = load_dataset("fashion-mnist", tmp_path)
    assert (ds.kind, ds.n_samples, ds.n_classes, ds.image_shape) == ("images", 47, 10, (1, 28, 28))
    assert ds.images.dtype == np.uint8
    np.testing.assert_array_equal(ds.images, images)  # train first, then t10k
    np.testing.assert_array_equal(ds.y, labels)
    assert ds.class_names == FASHION_NAMES and ds.class_names[9] == "Ankle boot"
    assert ds.features.dtype == np.float32 and ds.features.shape == (47, 784)
    np.testing.assert_array_equal(ds.features, images.reshape(47, 784).astype(np.float32) / np.float32(255))


def _fashion_files(root: Path) -> dict[str, Path]:
    return {name: root / "fashion-mnist" / name for name in IDX_FILES}


def test_fashion_mnist_malformed_header(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 20, 10)
    write_gzip(_fashion_files(tmp_path)["t10k-images-idx3-ubyte.gz"], b"\x00\x00\x09\x03" + bytes(12))
    with pytest.raises(DatasetError, match=r"t10k-images-idx3-ubyte\.gz: not an IDX file"):
        load_dataset("fashion-mnist", tmp_path)


def test_fashion_mnist_truncated_data(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 20, 10)
    path = _fashion_files(tmp_path)["train-images-idx3-ubyte.gz"]
    write_gzip(path, idx_bytes(np.zeros((20, 28, 28), np.uint8))[:-5])
    with pytest.raises(DatasetError, match=r"header says \[20, 28, 28\] but holds 15675 bytes"):
        load_dataset("fashion-mnist", tmp_path)


def test_fashion_mnist_image_label_count_mismatch(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 20, 10)
    write_gzip(_fashion_files(tmp_path)["t10k-labels-idx1-ubyte.gz"], idx_bytes(np.arange(9) % 10))
    with pytest.raises(DatasetError, match=r"\(10, 28, 28\) images for 9 labels"):
        load_dataset("fashion-mnist", tmp_path)


def test_fashion_mnist_wrong_image_size(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 20, 10)
    write_gzip(_fashion_files(tmp_path)["t10k-images-idx3-ubyte.gz"], idx_bytes(np.zeros((10, 32, 32))))
    with pytest.raises(DatasetError, match=r"\(10, 32, 32\) images for 10 labels"):
        load_dataset("fashion-mnist", tmp_path)


def test_fashion_mnist_label_out_of_range(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 20, 10)
    write_gzip(_fashion_files(tmp_path)["train-labels-idx1-ubyte.gz"], idx_bytes(np.arange(20) % 11))
    with pytest.raises(
        DatasetError, match=r"train-labels-idx1-ubyte\.gz: labels must lie in 0\.\.9, found 0\.\.10"
    ):
        load_dataset("fashion-mnist", tmp_path)


def test_fashion_mnist_needs_every_class(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 5, 3)  # 8 images cannot show 10 classes
    with pytest.raises(DatasetError, match="expected 10 classes, found 8"):
        load_dataset("fashion-mnist", tmp_path)


def test_fashion_mnist_missing_files_are_listed(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 20, 10)
    _fashion_files(tmp_path)["t10k-labels-idx1-ubyte.gz"].unlink()
    with pytest.raises(DatasetError) as info:
        load_dataset("fashion-mnist", tmp_path)
    message = str(info.value)
    assert "missing fashion-mnist/t10k-labels-idx1-ubyte.gz in data directory" in message
    assert all(f"fashion-mnist/{name}" in message for name in IDX_FILES)


def test_mnist_keeps_its_catalogue_count(tmp_path: Path) -> None:
    """Same format, same names: MNIST still insists on the catalogue's 60,000 + 10,000 items."""
    write_fashion_mnist(tmp_path, 20, 10)
    (tmp_path / "fashion-mnist").rename(tmp_path / "mnist")
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte\.gz: expected 60000 items, found 20"):
        load_dataset("mnist", tmp_path)


# --------------------------------------------------------------------------- CIFAR-10


def test_cifar10_reads_batches_in_order(tmp_path: Path) -> None:
    images, labels = write_cifar10(tmp_path, per_batch=4)
    ds = load_dataset("cifar10", tmp_path)
    assert (ds.kind, ds.n_samples, ds.n_classes, ds.image_shape) == ("images", 24, 10, (3, 32, 32))
    assert ds.images.dtype == np.uint8 and ds.class_names == CIFAR_NAMES
    np.testing.assert_array_equal(ds.images, images)
    np.testing.assert_array_equal(ds.y, labels)
    # b"data" rows are the red, green, blue planes, each 32 x 32 row-major
    row = images[5].reshape(-1)
    assert ds.images[5, 1, 2, 3] == row[1 * 1024 + 2 * 32 + 3]
    np.testing.assert_array_equal(ds.features, images.reshape(24, -1).astype(np.float32) / np.float32(255))


def _cifar(root: Path) -> Path:
    return root / "cifar-10-batches-py"


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({b"labels": [0] * 4}, r"b'data' must be a uint8 N x 3072 array, found NoneType"),
        ({b"data": np.zeros((4, 3072), np.float32), b"labels": [0] * 4}, "found \\(4, 3072\\) float32"),
        ({b"data": np.zeros((4, 1024), np.uint8), b"labels": [0] * 4}, "found \\(4, 1024\\) uint8"),
        ({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0] * 3}, "b'labels' must list 4 integers"),
        ({b"data": np.zeros((4, 3072), np.uint8), b"labels": ["a"] * 4}, "b'labels' must list 4 integers"),
        ({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2, 10]}, r"labels must lie in 0\.\.9"),
    ],
)
def test_cifar10_malformed_batch(tmp_path: Path, batch: dict[bytes, object], message: str) -> None:
    write_cifar10(tmp_path, per_batch=4)
    write_pickle(_cifar(tmp_path) / "data_batch_3", batch)
    with pytest.raises(DatasetError, match=r"data_batch_3: .*" + message):
        load_dataset("cifar10", tmp_path)


def test_cifar10_unreadable_pickles(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=4)
    (_cifar(tmp_path) / "test_batch").write_bytes(b"not a pickle at all")
    with pytest.raises(DatasetError, match="test_batch: not a readable CIFAR-10 pickle"):
        load_dataset("cifar10", tmp_path)
    write_pickle(_cifar(tmp_path) / "test_batch", [1, 2, 3])
    with pytest.raises(DatasetError, match="test_batch: expected a pickled dict, found list"):
        load_dataset("cifar10", tmp_path)


class _RunsCode:
    """A pickle payload that would run a shell command when loaded by an unrestricted unpickler."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_cifar10_refuses_pickles_that_name_functions(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=4)
    marker = tmp_path / "pwned"
    (_cifar(tmp_path) / "data_batch_1").write_bytes(pickle.dumps({b"data": _RunsCode(marker)}))
    with pytest.raises(DatasetError, match=r"data_batch_1: not a readable CIFAR-10 pickle.*refusing to load"):
        load_dataset("cifar10", tmp_path)
    assert not marker.exists()


def test_cifar10_meta_needs_ten_names(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=4)
    write_pickle(_cifar(tmp_path) / "batches.meta", {b"label_names": [b"cat", b"dog"]})
    with pytest.raises(DatasetError, match=r"batches\.meta: b'label_names' must list 10 class names"):
        load_dataset("cifar10", tmp_path)


def test_cifar10_missing_batch_is_named(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=4)
    (_cifar(tmp_path) / "data_batch_5").unlink()
    with pytest.raises(DatasetError, match="missing cifar-10-batches-py/data_batch_5 in data directory"):
        load_dataset("cifar10", tmp_path)


# --------------------------------------------------------------------------- STL-10


def test_stl10_transposes_column_major_images(tmp_path: Path) -> None:
    images, labels = write_stl10(tmp_path, n_train=12, n_test=8)
    ds = load_dataset("stl10", tmp_path)
    assert (ds.kind, ds.n_samples, ds.n_classes, ds.image_shape) == ("images", 20, 10, (3, 96, 96))
    assert ds.images.dtype == np.uint8 and ds.images.flags.c_contiguous
    np.testing.assert_array_equal(ds.images, images)  # upright again; train first
    np.testing.assert_array_equal(ds.y, labels)  # file labels 1..10 -> 0..9
    assert ds.class_names == STL_NAMES


def _stl(root: Path) -> Path:
    return root / "stl10_binary"


def test_stl10_partial_image_is_an_error(tmp_path: Path) -> None:
    write_stl10(tmp_path, 12, 8)
    path = _stl(tmp_path) / "test_X.bin"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(
        DatasetError, match=r"test_X\.bin: 221183 bytes is not a whole number of 3x96x96 images"
    ):
        load_dataset("stl10", tmp_path)


def test_stl10_label_count_mismatch(tmp_path: Path) -> None:
    write_stl10(tmp_path, 12, 8)
    (_stl(tmp_path) / "train_y.bin").write_bytes(bytes(range(1, 11)))
    with pytest.raises(DatasetError, match=r"train_X\.bin: 12 images but train_y\.bin holds 10 labels"):
        load_dataset("stl10", tmp_path)


@pytest.mark.parametrize("bad", [0, 11])
def test_stl10_labels_are_one_to_ten(tmp_path: Path, bad: int) -> None:
    write_stl10(tmp_path, 12, 8)
    (_stl(tmp_path) / "test_y.bin").write_bytes(bytes([*range(1, 8), bad]))
    with pytest.raises(DatasetError, match=r"test_y\.bin: labels must lie in 1\.\.10"):
        load_dataset("stl10", tmp_path)


def test_stl10_class_names_file(tmp_path: Path) -> None:
    write_stl10(tmp_path, 12, 8)
    (_stl(tmp_path) / "class_names.txt").write_text("cat\ndog\n")
    with pytest.raises(
        DatasetError, match=r"class_names\.txt: expected 10 class names, one per line, found 2"
    ):
        load_dataset("stl10", tmp_path)


# --------------------------------------------------------------------------- the images kind


def test_image_features_are_lazy_cached_and_read_only(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=4)
    ds = load_dataset("cifar10", tmp_path)
    assert "features" not in vars(ds)  # a conv-net run never pays for the float copy
    assert ds.features is ds.features and "features" in vars(ds)
    assert not ds.features.flags.writeable and not ds.images.flags.writeable
    assert ds.features.min() >= 0.0 and ds.features.max() <= 1.0
    np.testing.assert_array_equal(ds.unit_images([2, 0]), ds.features[[2, 0]].reshape(2, 3, 32, 32))


def test_subsample_carries_images(tmp_path: Path) -> None:
    write_fashion_mnist(tmp_path, 60, 40)
    full = load_dataset("fashion-mnist", tmp_path)
    part = load_dataset("fashion-mnist", tmp_path, max_samples=30, seed=4)
    assert part.images.shape == (30, 1, 28, 28) and part.features.shape == (30, 784)
    assert np.bincount(part.y).tolist() == [3] * 10 and part.class_names == full.class_names
    by_pixels = {image.tobytes(): label for image, label in zip(full.images, full.y, strict=True)}
    assert all(by_pixels[image.tobytes()] == label for image, label in zip(part.images, part.y, strict=True))
    np.testing.assert_array_equal(part.features, part.images.reshape(30, -1) / np.float32(255))
    assert not part.images.flags.writeable


def test_registry_entries_for_images() -> None:
    info = dataset_info("cifar10")
    assert info.kind == "images" and len(info.files) == 7
    assert (
        info.files[0] == "cifar-10-batches-py/data_batch_1"
        and info.files[-1] == "cifar-10-batches-py/batches.meta"
    )
    methods = methods_for_kind(info.kind)
    assert {"kmeans", "kfed", "ffcm"} <= set(methods) and "cefmc" not in methods
    assert dataset_info("stl10").files[-1] == "stl10_binary/class_names.txt"
    assert all(
        dataset_info(name).kind == "images" for name in ("digits", "mnist", "mnist-test", "fashion-mnist")
    )


def test_cifar10_reads_pickles_written_by_numpy_1(tmp_path: Path) -> None:
    """The official files name numpy.core.multiarray (NumPy < 2), NumPy 2's deprecated alias."""
    images, _ = write_cifar10(tmp_path, per_batch=4)
    path = _cifar(tmp_path) / "data_batch_2"
    old_style = path.read_bytes().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    assert b"numpy.core.multiarray" in old_style
    path.write_bytes(old_style)
    np.testing.assert_array_equal(load_dataset("cifar10", tmp_path).images[4:8], images[4:8])


def test_kfed_runs_on_fashion_mnist_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Acceptance: `python -m simulation run --method kfed --dataset fashion-mnist --data-dir D` runs."""
    from simulation.__main__ import main

    write_fashion_mnist(tmp_path / "data", n_train=500, n_test=100)
    argv = ["run", "--method", "kfed", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "data")]
    assert main([*argv, "--engine", "inprocess", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["method"], summary["dataset"], summary["num_clients"]) == ("kfed", "fashion-mnist", 10)
    assert summary["metrics"]["nmi"] > 0.9  # the synthetic classes are well separated
    assert "| kfed | fashion-mnist |" in capsys.readouterr().out


def test_run_with_missing_files_stops_before_any_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulation.__main__ import main

    argv = ["run", "--method", "kfed", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path)]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2  # default engine: flwr, never started
    assert "missing fashion-mnist/train-images-idx3-ubyte.gz" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
