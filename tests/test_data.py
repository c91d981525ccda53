"""Tests for the dataset registry: embedded data, errors, caching, subsampling, `mat:` files, data dirs.

Image families (MNIST, Fashion-MNIST, CIFAR-10, STL-10) are tested in test_datasets_images.py."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from fedapp.datasets import (
    DATA_DIR_ENV,
    EMBEDDED,
    Dataset,
    DatasetError,
    available_datasets,
    load_dataset,
    registry,
    resolve_data_dir,
    synthetic,
)
from fedapp.datasets import images as image_family
from fedapp.datasets.common import stratified_counts

# The synthetic LDA variants are one generator with other parameters: two of them (the default and the
# tiny one) in the default run, the other nine under `slow` (bash scripts/test.sh --all)
ONE_GENERATOR = ("synthetic-lda", "synthetic-lda-tiny")
EVERY_EMBEDDED = [
    pytest.param(name, marks=pytest.mark.slow)
    if name.startswith("synthetic-lda") and name not in ONE_GENERATOR
    else name
    for name in EMBEDDED
]

SHARED = resolve_data_dir()
without_shared_data = pytest.mark.skipif(
    SHARED is None or not SHARED.is_dir(), reason="no ../shared/data (or $FEDAPP_DATA_DIR) to read"
)


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    """Empty the per-process cache so a test really re-reads (and restores isolation afterwards)."""
    registry._load_cached.cache_clear()
    yield
    registry._load_cached.cache_clear()


def _cells(*views: np.ndarray) -> np.ndarray:
    """A MATLAB cell array (V x 1) for scipy.io.savemat."""
    cells = np.empty((len(views), 1), dtype=object)
    for i, view in enumerate(views):
        cells[i, 0] = view
    return cells


def _write_gzip(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload))


# --------------------------------------------------------------------------- embedded datasets


def test_embedded_names_are_listed() -> None:
    listing = available_datasets()
    assert set(EMBEDDED) <= set(listing)
    assert {
        "mnist",
        "mnist-test",
        "hw",
        "bdgp",
        "drybean",
        "stackoverflow",
        "biomedical",
        "agnews",
        "20news",
    } <= set(listing)
    assert all(isinstance(text, str) and text for text in listing.values())


def test_digits() -> None:
    ds = load_dataset("digits")
    assert (ds.kind, ds.n_samples, ds.n_classes) == ("images", 1797, 10)
    assert ds.images is not None and ds.images.shape == (1797, 1, 8, 8) and ds.image_shape == (1, 8, 8)
    assert ds.features is not None and ds.features.shape == (1797, 64) and ds.features.dtype == np.float64
    assert ds.features.min() == 0.0 and ds.features.max() == 1.0
    # features stay bit-identical to the flattened pixels / 16 of earlier versions (results must not move)
    from sklearn.datasets import load_digits

    np.testing.assert_array_equal(ds.features, load_digits().data / 16.0)
    np.testing.assert_array_equal(ds.unit_images(np.arange(3)), ds.images[:3])
    assert ds.y.dtype == np.int64 and set(np.unique(ds.y)) == set(range(10))
    assert ds.class_names == tuple("0123456789")


def test_digits_are_read_without_scikit_learn_as_load_digits_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bundled CSV read directly (no scikit-learn import in a deployment's per-message process), and
    the fallback for another package layout: both give `load_digits`' images and labels."""
    from sklearn.datasets import load_digits

    from fedapp.datasets import embedded

    bunch = load_digits()
    direct = embedded._digit_images()
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    fallback = embedded._digit_images()
    for images, labels in (direct, fallback):
        np.testing.assert_array_equal(images, bunch.images / 16.0)
        np.testing.assert_array_equal(labels, bunch.target)
        assert labels.dtype == bunch.target.dtype


def test_digits_multiview() -> None:
    ds = load_dataset("digits-mv")
    assert (ds.kind, ds.n_samples, ds.n_classes) == ("multiview", 1797, 10)
    assert ds.views is not None and [v.shape for v in ds.views] == [(1797, 64), (1797, 16), (1797, 32)]
    assert all(v.dtype == np.float64 for v in ds.views)
    np.testing.assert_array_equal(ds.features, np.hstack(ds.views))
    np.testing.assert_array_equal(ds.views[0], load_dataset("digits").features)
    # 2x2 pooling keeps the mean intensity; gradient magnitudes are non-negative.
    np.testing.assert_allclose(ds.views[1].mean(axis=1), ds.views[0].mean(axis=1))
    assert ds.views[2].min() >= 0.0 and ds.views[2].max() > 0.0


def test_blobs_follow_the_seed() -> None:
    ds = load_dataset("blobs", seed=3)
    assert ds.features is not None and ds.features.shape == (2000, 10)
    assert ds.n_classes == 5 and np.bincount(ds.y).tolist() == [400] * 5
    assert not np.array_equal(ds.features, load_dataset("blobs", seed=4).features)


@pytest.mark.parametrize("name", EVERY_EMBEDDED)
def test_embedded_datasets_are_deterministic(name: str, fresh_cache: None) -> None:
    first = load_dataset(name, seed=1)
    registry._load_cached.cache_clear()
    synthetic.synthetic_truth.cache_clear()  # its own per-process cache would hand back the same draw
    second = load_dataset(name, seed=1)
    assert first is not second
    np.testing.assert_array_equal(first.y, second.y)
    np.testing.assert_array_equal(first.features, second.features)


@pytest.mark.parametrize("name", EVERY_EMBEDDED)
def test_arrays_are_read_only(name: str) -> None:
    ds = load_dataset(name)
    arrays = [a for a in (ds.y, ds.features, ds.images, ds.vectors, *(ds.views or ())) if a is not None]
    assert all(not a.flags.writeable for a in arrays)
    with pytest.raises(ValueError, match="read-only"):
        ds.y[0] = 1


# --------------------------------------------------------------------------- errors


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(DatasetError, match="unknown dataset 'cifar'") as info:
        load_dataset("cifar")
    for name in (*EMBEDDED, "mnist", "hw", "20news", "mat:<path>"):
        assert name in str(info.value)


def test_missing_files_name_directory_and_every_expected_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist", tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    for file_name in image_family.MNIST_COUNTS:
        assert f"mnist/{file_name}" in message


def test_partly_missing_files(tmp_path: Path) -> None:
    _write_gzip(tmp_path / "stackoverflow" / "title_StackOverflow.txt.gz", b"a title\n")
    with pytest.raises(
        DatasetError, match="missing stackoverflow/label_StackOverflow.txt.gz in data directory"
    ):
        load_dataset("stackoverflow", tmp_path)


def test_no_data_directory_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "PROJECT_ROOT", tmp_path / "project")
    with pytest.raises(DatasetError, match=r"no data directory.*hw/Handwritten\.mat"):
        load_dataset("hw")


MNIST_IMAGES, MNIST_LABELS = "mnist/t10k-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz"
# an IDX header: unsigned bytes, 3 dimensions, 3 images of 28 x 28
IDX_HEADER_3_IMAGES = bytes((0, 0, 8, 3)) + b"".join(d.to_bytes(4, "big") for d in (3, 28, 28))


@pytest.mark.parametrize(
    ("name", "files", "message"),
    [
        pytest.param(
            "mnist-test",
            {MNIST_IMAGES: b"not an idx file", MNIST_LABELS: b"\x00\x00\x08\x01\x00\x00\x00\x01\x07"},
            r"t10k-images-idx3-ubyte\.gz: not an IDX file",
            id="malformed-idx-names-the-file",
        ),
        pytest.param(
            "mnist-test",
            {
                MNIST_IMAGES: IDX_HEADER_3_IMAGES + bytes(3 * 28 * 28),
                MNIST_LABELS: bytes((0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3)),
            },
            "expected 10000 items, found 3",
            id="idx-count-mismatch",
        ),
        pytest.param(
            "agnews",
            {"agnews/agnewsdataraw-8000.gz": b"1\tfine text\nno tab here\n"},
            "line 2 is not 'label<TAB>text'",
            id="malformed-text-line",
        ),
        pytest.param(
            "agnews",
            {"agnews/agnewsdataraw-8000.gz": b"1\tone\n2\ttwo\n"},
            "expected 8000 samples, found 2",
            id="text-count-mismatch",
        ),
        pytest.param(
            "drybean",
            {"drybean/Dry_Bean_Dataset.arff.gz": b"@RELATION beans\n"},
            "Dry_Bean_Dataset.arff.gz: expected 16 numeric attributes",
            id="malformed-arff",
        ),
    ],
)
def test_malformed_files_are_reported(
    tmp_path: Path, name: str, files: dict[str, bytes], message: str
) -> None:
    for path, payload in files.items():
        _write_gzip(tmp_path / path, payload)
    with pytest.raises(DatasetError, match=message):
        load_dataset(name, tmp_path)


def test_dataset_checks_its_own_consistency() -> None:
    labels = np.zeros(2, np.int64)
    with pytest.raises(DatasetError, match="kind must be one of"):
        Dataset(name="x", kind="graphs", y=labels, n_classes=1, vectors=np.zeros((2, 1)))
    with pytest.raises(DatasetError, match="payload row counts"):
        Dataset(name="x", kind="vectors", y=labels, n_classes=1, vectors=np.zeros((3, 1)))
    with pytest.raises(DatasetError, match="needs its payload"):
        Dataset(name="x", kind="texts", y=labels, n_classes=1)
    with pytest.raises(DatasetError, match="needs its payload"):
        Dataset(name="x", kind="images", y=labels, n_classes=1, vectors=np.zeros((2, 4)))
    with pytest.raises(DatasetError, match="images must be N x C x H x W"):
        Dataset(name="x", kind="images", y=labels, n_classes=1, images=np.zeros((2, 4, 4), np.uint8))
    with pytest.raises(DatasetError, match="has no images"):
        Dataset(name="x", kind="vectors", y=labels, n_classes=1, vectors=np.zeros((2, 1))).unit_images()


# --------------------------------------------------------------------------- caching and subsampling


def test_cache_returns_the_same_object(tmp_path: Path) -> None:
    assert load_dataset("digits") is load_dataset("digits")
    assert load_dataset("digits", tmp_path) is load_dataset("digits")  # embedded data ignore the directory
    assert load_dataset("digits", seed=5) is load_dataset("digits", seed=6)  # only blobs uses the seed
    assert load_dataset("blobs", seed=1) is not load_dataset("blobs", seed=2)
    assert load_dataset("digits-mv", max_samples=50, seed=2) is load_dataset(
        "digits-mv", max_samples=50, seed=2
    )


def test_subsample_is_exact_stratified_and_seeded(fresh_cache: None) -> None:
    full = load_dataset("digits-mv")
    first = load_dataset("digits-mv", max_samples=123, seed=7)
    assert first.n_samples == 123 and first.n_classes == full.n_classes
    assert first.views is not None and all(len(v) == 123 for v in first.views)
    np.testing.assert_array_equal(first.features, np.hstack(first.views))
    assert np.bincount(first.y, minlength=10).min() >= 12  # about 123 / 10 per class
    registry._load_cached.cache_clear()
    again = load_dataset("digits-mv", max_samples=123, seed=7)
    np.testing.assert_array_equal(first.features, again.features)
    np.testing.assert_array_equal(first.y, again.y)
    other = load_dataset("digits-mv", max_samples=123, seed=8)
    assert not np.array_equal(first.features, other.features)
    assert not first.y.flags.writeable and not first.views[0].flags.writeable


def test_subsample_rows_come_from_the_full_data() -> None:
    full = load_dataset("digits")
    part = load_dataset("digits", max_samples=40, seed=0)
    rows = {row.tobytes(): label for row, label in zip(full.features, full.y, strict=True)}
    assert all(rows[row.tobytes()] == label for row, label in zip(part.features, part.y, strict=True))


def test_subsample_limits() -> None:
    assert load_dataset("digits", max_samples=5000) is load_dataset("digits")
    with pytest.raises(DatasetError, match="cannot hold all 10 classes"):
        load_dataset("digits", max_samples=9)
    with pytest.raises(DatasetError, match="max_samples must be >= 0"):
        load_dataset("digits", max_samples=-1)


def test_stratified_counts_keep_rare_classes() -> None:
    sizes = np.array([1000, 10, 1, 300])
    counts = stratified_counts(sizes, 50)
    assert counts.sum() == 50 and (counts >= 1).all() and (counts <= sizes).all()
    assert counts[0] > counts[3] > counts[1] >= counts[2] == 1


# --------------------------------------------------------------------------- mat: files


def test_mat_rows_are_samples(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    views = (rng.random((12, 3)), rng.integers(0, 9, (12, 5)).astype(np.uint8))
    scipy.io.savemat(tmp_path / "a.mat", {"X": _cells(*views), "y": np.repeat([3, 5, 9], 4)[:, None]})
    ds = load_dataset("mat:a.mat", tmp_path)
    assert (ds.kind, ds.n_samples, ds.n_classes) == ("multiview", 12, 3)
    assert ds.views is not None and all(v.dtype == np.float64 for v in ds.views)
    for loaded, written in zip(ds.views, views, strict=True):
        np.testing.assert_array_equal(loaded, written)
    np.testing.assert_array_equal(ds.y, np.repeat([0, 1, 2], 4))


def test_mat_columns_are_samples_and_labels_in_capital_y(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    views = (rng.random((12, 4)), rng.random((12, 2)))
    labels = np.array([2.0, 7.5, -1.0] * 4)  # any numeric vector, row layout
    scipy.io.savemat(tmp_path / "b.mat", {"X": _cells(*(v.T for v in views)), "Y": labels[None, :]})
    ds = load_dataset(f"mat:{tmp_path / 'b.mat'}")  # absolute path, no data directory needed
    assert [v.shape for v in ds.views or ()] == [(12, 4), (12, 2)]
    np.testing.assert_array_equal(ds.views[0], views[0])
    np.testing.assert_array_equal(ds.y, np.array([1, 2, 0] * 4))


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        ({"X": _cells(np.ones((12, 3)), np.ones((7, 4))), "y": np.arange(12)}, "neither side matches"),
        ({"X": _cells(np.ones((12, 12))), "y": np.arange(12)}, "ambiguous"),
        ({"X": np.ones((12, 3)), "y": np.arange(12)}, "cell array X"),
        ({"X": _cells(np.ones((12, 3)))}, "labels in 'y' or 'Y'"),
        ({"X": _cells(np.ones((12, 3))), "y": np.ones((12, 2))}, "must be a numeric vector"),
    ],
)
def test_mat_bad_layouts(tmp_path: Path, contents: dict[str, np.ndarray], message: str) -> None:
    scipy.io.savemat(tmp_path / "bad.mat", contents)
    with pytest.raises(DatasetError, match=message):
        load_dataset("mat:bad.mat", tmp_path)


def test_mat_v73_needs_h5py(tmp_path: Path) -> None:
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64".ljust(124) + b"\x00\x02IM"
    (tmp_path / "v73.mat").write_bytes(header + bytes(512))
    with pytest.raises(DatasetError, match="v7.3.*h5py"):
        load_dataset("mat:v73.mat", tmp_path)


def test_mat_unreadable_or_missing(tmp_path: Path) -> None:
    (tmp_path / "junk.mat").write_bytes(b"\x17" * 300)
    with pytest.raises(DatasetError, match=r"junk\.mat: not a MATLAB \.mat file"):
        load_dataset("mat:junk.mat", tmp_path)
    with pytest.raises(DatasetError, match=rf"missing none\.mat in directory {tmp_path}"):
        load_dataset("mat:none.mat", tmp_path)
    with pytest.raises(DatasetError, match="give a file after 'mat:'"):
        load_dataset("mat:", tmp_path)


# --------------------------------------------------------------------------- data directory


def test_resolve_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = tmp_path.resolve()
    beside_cwd = tmp_path / "a" / "shared" / "data"
    beside_project = tmp_path / "b" / "shared" / "data"
    for folder in (beside_cwd, beside_project, tmp_path / "a" / "work", tmp_path / "b" / "main"):
        folder.mkdir(parents=True)
    monkeypatch.setattr(registry, "PROJECT_ROOT", tmp_path / "b" / "main")
    monkeypatch.chdir(tmp_path / "a" / "work")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "env"))

    assert resolve_data_dir(tmp_path / "explicit") == tmp_path / "explicit"  # need not exist
    assert resolve_data_dir("") == tmp_path / "env"
    assert resolve_data_dir() == tmp_path / "env"
    monkeypatch.setenv(DATA_DIR_ENV, "")
    assert resolve_data_dir() == beside_cwd
    beside_cwd.rmdir()
    assert resolve_data_dir() == beside_project
    beside_project.rmdir()
    assert resolve_data_dir() is None


# --------------------------------------------------------------------------- the shared data catalogue

REAL = [
    # name, samples, feature widths (views, or the single feature matrix; None for texts), classes
    ("mnist-test", 10_000, (784,), 10),
    ("mnist", 70_000, (784,), 10),
    ("hw", 2_000, (216, 76, 64, 6, 240, 47), 10),
    ("bdgp", 2_500, (1000, 500, 250), 5),
    ("drybean", 13_611, (12, 4), 7),
    ("stackoverflow", 20_000, None, 20),
    ("biomedical", 20_000, None, 20),
    ("agnews", 8_000, None, 4),
    ("20news", 18_846, None, 20),
]


@pytest.mark.parametrize(("name", "n", "widths", "n_classes"), REAL)
@pytest.mark.shared_data
@without_shared_data
def test_shared_dataset_shapes(name: str, n: int, widths: tuple[int, ...] | None, n_classes: int) -> None:
    ds = load_dataset(name, SHARED)
    assert (ds.n_samples, ds.n_classes) == (n, n_classes)
    assert np.array_equal(np.unique(ds.y), np.arange(n_classes))
    if ds.kind == "texts":
        assert widths is None and ds.texts is not None and len(ds.texts) == n
    elif ds.kind == "multiview":
        assert ds.views is not None and tuple(v.shape[1] for v in ds.views) == widths
        assert ds.features is not None and ds.features.shape == (n, sum(widths))
    else:
        assert ds.features is not None and ds.features.shape == (n, *widths)
        if ds.kind == "images":
            assert ds.images is not None and ds.images.dtype == np.uint8
            assert ds.images.shape == (n, 1, 28, 28)
            np.testing.assert_array_equal(ds.features[:50], ds.images[:50].reshape(50, -1) / np.float32(255))


@pytest.mark.shared_data
@without_shared_data
def test_shared_dataset_details() -> None:
    mnist = load_dataset("mnist-test", SHARED)
    assert mnist.features.dtype == np.float32 and 0.0 <= mnist.features.min() < mnist.features.max() <= 1.0
    assert np.bincount(mnist.y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    beans = load_dataset("drybean", SHARED)
    assert beans.class_names == ("BARBUNYA", "BOMBAY", "CALI", "DERMASON", "HOROZ", "SEKER", "SIRA")
    assert np.bincount(beans.y).tolist() == [1322, 522, 1630, 3546, 1928, 2027, 2636]
    titles = load_dataset("stackoverflow", SHARED)
    assert "LINQ" in titles.texts[0] and titles.class_names[titles.y[0]] == "linq"
    assert load_dataset("bdgp", SHARED).class_names == tuple(f"stage_{i}" for i in range(1, 6))
    assert np.bincount(load_dataset("hw", SHARED).y).tolist() == [200] * 10


@pytest.mark.shared_data
@without_shared_data
def test_generic_mat_reader_matches_catalogue_loaders() -> None:
    for name, path in (("hw", "hw/Handwritten.mat"), ("bdgp", "bdgp/BDGP_fea.mat")):
        catalogue, generic = load_dataset(name, SHARED), load_dataset(f"mat:{path}", SHARED)
        np.testing.assert_array_equal(catalogue.y, generic.y)
        for a, b in zip(catalogue.views, generic.views, strict=True):
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- registry listing


def test_registry_entries_say_kind_files_and_methods() -> None:
    from fedapp.datasets import dataset_info, dataset_infos
    from fedapp.methods import METHODS, methods_for_kind

    infos = {info.name: info for info in dataset_infos()}
    assert set(infos) == set(available_datasets())
    assert infos["digits"].files == () and infos["digits"].kind == "images"
    assert infos["hw"].files == ("hw/Handwritten.mat",)
    hw_methods, mnist_methods = (methods_for_kind(infos[name].kind) for name in ("hw", "mnist"))
    assert "cefmc" in hw_methods and "cefmc" not in mnist_methods
    for kind in {info.kind for info in infos.values()}:
        assert methods_for_kind(kind) == tuple(m for m, spec in METHODS.items() if kind in spec.modalities)
    assert methods_for_kind("texts") == tuple(m for m, s in METHODS.items() if "texts" in s.modalities)
    assert dataset_info("mat:a/b.mat").files == ("a/b.mat",)
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        dataset_info("nope")


def test_cli_lists_every_dataset_with_kind_methods_and_files(capsys: pytest.CaptureFixture[str]) -> None:
    from simulation.__main__ import main

    assert main(["datasets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["name", "kind", "methods", "files", "description"]
    rows = {line.split()[0]: line for line in lines[2:] if line and not line.startswith(" ")}
    assert set(rows) == set(available_datasets())
    assert rows["hw"].split()[1:3] == ["multiview", "kmeans,"] and "hw/Handwritten.mat" in rows["hw"]
    assert rows["agnews"].split()[1] == "texts" and "agnews/agnewsdataraw-8000.gz" in rows["agnews"]
    assert rows["digits"].split()[1] == "images" and "(embedded)" in rows["digits"]
    text = "\n".join(lines)
    for name in ("train_X.bin", "batches.meta", "fashion-mnist/t10k-labels-idx1-ubyte.gz"):
        assert name in text


def test_require_files_checks_without_reading(tmp_path: Path) -> None:
    from fedapp.datasets import require_files

    require_files("digits", tmp_path)  # embedded: nothing to check
    with pytest.raises(DatasetError, match=r"missing agnews/agnewsdataraw-8000\.gz in data directory"):
        require_files("agnews", tmp_path)
    (tmp_path / "agnews").mkdir()
    (tmp_path / "agnews" / "agnewsdataraw-8000.gz").write_bytes(b"not even gzip")
    require_files("agnews", tmp_path)  # present is enough: nothing is read
    with pytest.raises(DatasetError, match="cannot read as gzipped UTF-8"):
        load_dataset("agnews", tmp_path)
    with pytest.raises(DatasetError, match=r"missing x\.mat in directory"):
        require_files("mat:x.mat", tmp_path)
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        require_files("nope", tmp_path)


def test_families_cannot_register_a_name_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedapp.datasets import embedded

    monkeypatch.setattr(registry, "FAMILIES", (*registry.FAMILIES, embedded))
    with pytest.raises(
        DatasetError, match=r"fedapp\.datasets\.embedded registers dataset names already taken"
    ):
        registry._gather()
