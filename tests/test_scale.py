"""Own data at scale: chunked maths equal the unchunked, float32 files stay float32 and cluster as well,
assignments.csv round-trips, and a node parses its file once (parsed-array cache)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import normalized_mutual_info_score

from clients.ffcm import membership_sums
from clients.kfed import local_centres
from fedapp.datasets import Columns
from fedapp.datasets.node_cache import FOLDER, cached_source, entry_stem
from fedapp.datasets.sources import read_source
from fedapp.maths import chunks
from fedapp.maths.clustering import nearest_centre
from fedapp.metrics.label_free import cluster_sums, distance_sums, pooled_means
from fedapp.report.assignments import read_assignments, write_assignments
from fedapp.report.stages import nearest_with_distance


def _blobs(n: int = 3000, d: int = 5, k: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=8.0, size=(k, d)) + 1e3  # a large offset: cancellation would show
    labels = rng.integers(0, k, n)
    return centres[labels] + rng.normal(size=(n, d)), labels


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 37)  # many uneven chunks


def _report_statistics(X: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, ...]:
    labels, distances = nearest_with_distance(X, centres)
    sums = cluster_sums(X, labels, len(centres))
    pass2 = distance_sums(X, labels, pooled_means(sums), sums.counts)
    fcm = membership_sums(X, centres, 1.5)
    silhouette = np.array([pass2.silhouette_sum])
    return labels, distances, sums.sums, pass2.distance_sums, pass2.squared_sums, silhouette, *fcm


def test_chunked_statistics_equal_the_unchunked(monkeypatch: pytest.MonkeyPatch) -> None:
    X, _ = _blobs()
    centres = local_centres(X, 4, seed=0, restarts=1)[0]
    whole = _report_statistics(X, centres)  # one chunk: 3000 x 5 is below CHUNK_ELEMENTS
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 37)
    chunked = _report_statistics(X, centres)
    np.testing.assert_array_equal(whole[0], chunked[0])
    for one, many in zip(whole[1:], chunked[1:], strict=True):
        np.testing.assert_allclose(many, one, rtol=1e-9, atol=1e-9)


def test_distance_sums_match_explicit_differences_under_a_large_offset(tiny_chunks: None) -> None:
    X, _ = _blobs()
    labels = nearest_centre(X, local_centres(X, 4, seed=0, restarts=1)[0])
    sums = cluster_sums(X, labels, 4)
    means = pooled_means(sums)
    inertia = sum(((X[labels == c] - means[c]) ** 2).sum() for c in range(4))
    squared = distance_sums(X, labels, means, sums.counts).squared_sums
    np.testing.assert_allclose(squared.sum(), inertia, rtol=1e-12)


def test_float32_records_are_not_copied_to_float64_and_cluster_alike() -> None:
    X, truth = _blobs(n=4000, k=6, seed=1)
    single = X.astype(np.float32)
    nmi = {}
    for name, data in (("float64", X), ("float32", single)):
        centres, _, _ = local_centres(data, 6, seed=0, restarts=1)
        nmi[name] = normalized_mutual_info_score(truth, nearest_centre(data, centres))
    assert abs(nmi["float64"] - nmi["float32"]) <= 0.01 and nmi["float32"] > 0.9
    sums = cluster_sums(single, truth, 6)
    np.testing.assert_allclose(sums.sums, cluster_sums(X, truth, 6).sums, rtol=1e-5)


def test_assignments_round_trip_fast_path_and_quoted_ids(tmp_path: Path) -> None:
    labels = np.array([0, 3, 1, 2])
    scores = np.array([0.1, np.nan, 1e-300, 123456789.125])
    for ids in (["a", "b", "c", "d"], ["a", 'b,"c"', "line\nbreak", "d"]):
        path = write_assignments(tmp_path / "assignments.csv", ids, labels, scores)
        read_ids, clusters, read_scores = read_assignments(path)
        assert read_ids == ids
        np.testing.assert_array_equal(clusters, labels)
        np.testing.assert_array_equal(read_scores, scores)  # NaN reads back as NaN, floats exactly
        assert path.read_bytes().startswith(b"id,cluster,score\r\n")


# ------------------------------------------------------------------------------- parsed-array cache
def _site(tmp_path: Path, n: int = 200) -> tuple[str, Columns]:
    X, labels = _blobs(n=n, d=3, k=2)
    frame = pd.DataFrame(X.astype(np.float32), columns=["a", "b", "c"])
    frame["label"], frame["id"] = labels, [f"r{i}" for i in range(n)]
    frame.to_parquet(tmp_path / "site.parquet")
    return f"parquet:{tmp_path / 'site.parquet'}", Columns.parse("", "label", "id", "")


def _cached(spec: str, columns: Columns, root: Path, reads: list[int]) -> object:
    def read() -> object:
        reads.append(1)
        return read_source(spec, columns)

    return cached_source(root, entry_stem(spec, columns, None, None), spec, read)


def test_a_cache_hit_maps_the_same_arrays_without_parsing(tmp_path: Path) -> None:
    spec, columns = _site(tmp_path)
    root, reads = tmp_path / "node", []
    first = _cached(spec, columns, root, reads)
    again = _cached(spec, columns, root, reads)
    assert reads == [1]  # parsed once
    assert isinstance(again.vectors, np.memmap) and again.vectors.dtype == np.float32
    np.testing.assert_array_equal(again.vectors, first.vectors)
    np.testing.assert_array_equal(again.y, first.y)
    assert again.ids == first.ids and again.labelled and again.n_classes == first.n_classes
    folder = root.joinpath(*FOLDER)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in folder.iterdir())
    assert not any("site" in f.name for f in folder.iterdir())  # the entry names no file


def test_a_changed_file_or_other_columns_are_a_miss(tmp_path: Path) -> None:
    spec, columns = _site(tmp_path)
    root, reads = tmp_path / "node", []
    _cached(spec, columns, root, reads)
    _cached(spec, Columns.parse("", "", "id", "a,b"), root, reads)
    _site(tmp_path, n=150)  # the file's content changes
    assert len(_cached(spec, columns, root, reads).vectors) == 150 and reads == [1, 1, 1]


@pytest.mark.parametrize("damage", ["truncate", "sidecar", "delete"])
def test_a_damaged_entry_is_parsed_again(tmp_path: Path, damage: str) -> None:
    spec, columns = _site(tmp_path)
    root, reads = tmp_path / "node", []
    first = _cached(spec, columns, root, reads)
    folder = root.joinpath(*FOLDER)
    features = next(folder.glob("*.features.npy"))
    if damage == "truncate":
        features.write_bytes(features.read_bytes()[:200])
    elif damage == "sidecar":
        next(folder.glob("*.json")).write_text("{not json", encoding="utf-8")
    else:
        os.unlink(features)
    again = _cached(spec, columns, root, reads)
    assert reads == [1, 1]
    np.testing.assert_array_equal(again.vectors, first.vectors)
    assert len(_cached(spec, columns, root, reads).vectors) == 200 and reads == [1, 1]  # rewritten


def test_ffcm_init_on_a_sample_above_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    from clients import ffcm

    X, truth = _blobs(n=2000, k=4, seed=2)
    whole = ffcm.local_init(X, 4, 1.5, seed=0)
    np.testing.assert_array_equal(whole[0], ffcm.local_fcm(X, 4, 1.5, 0)[0])  # small: unchanged
    monkeypatch.setattr(ffcm, "INIT_SAMPLE", 500)
    centres, mass = ffcm.local_init(X, 4, 1.5, seed=0)
    assert mass.sum() == pytest.approx(membership_sums(X, centres, 1.5)[1].sum())  # mass over every record
    nmi = normalized_mutual_info_score(truth, nearest_centre(X, centres))
    assert nmi == pytest.approx(normalized_mutual_info_score(truth, nearest_centre(X, whole[0])), abs=0.01)


def test_an_own_file_run_writes_each_nodes_cache_and_a_rerun_gives_the_same_result(tmp_path: Path) -> None:
    from fedapp.launch.resolve import build_overrides
    from simulation.runner import execute

    X, labels = _blobs(n=600, d=3, k=3)
    for site, rows in enumerate((slice(0, 300), slice(300, 600))):
        frame = pd.DataFrame(X[rows].astype(np.float32), columns=["a", "b", "c"])
        frame["label"] = labels[rows]
        frame.to_parquet(tmp_path / f"site-{site}.parquet")
    spec = f"parquet:{tmp_path}/site-{{partition-id}}.parquet"
    keys = {"method": "kfed", "dataset": spec, "num-clients": 2, "k": 3}
    first = execute(build_overrides(keys, tmp_path / "out"), engine="inprocess", quiet=True)
    for site in range(2):
        assert len(list((tmp_path / "out" / "nodes" / str(site)).joinpath(*FOLDER).glob("*.json"))) == 1
    again = execute(build_overrides(keys, tmp_path / "out"), engine="inprocess", quiet=True, overwrite=True)
    assert again["metrics"] == first["metrics"] and first["metrics"]["nmi"] > 0.5


def test_distance_sums_over_a_row_mask_equal_those_of_the_selected_rows(tiny_chunks: None) -> None:
    X, _ = _blobs()
    centres = local_centres(X, 4, seed=0, restarts=1)[0]
    labels = nearest_centre(X, centres)
    rows = np.random.default_rng(1).random(len(X)) < 0.7  # the report's shared clusters' rows
    sums = cluster_sums(X[rows], labels[rows], 4)
    means = pooled_means(sums)
    selected = distance_sums(X[rows], labels[rows], means, sums.counts)
    masked = distance_sums(X, labels[rows], means, sums.counts, rows)
    np.testing.assert_allclose(masked.distance_sums, selected.distance_sums, rtol=1e-12)
    np.testing.assert_allclose(masked.squared_sums, selected.squared_sums, rtol=1e-12)
    assert masked.silhouette_sum == pytest.approx(selected.silhouette_sum, rel=1e-12)
    assert masked.n == selected.n == rows.sum()


def test_row_number_ids_are_written_as_their_strings_are(tmp_path: Path) -> None:
    labels, scores = np.array([1, 0, 2, 1, 0]), np.array([0.5, np.nan, 1.0, 0.25, 1e-300])
    rows = np.array([3, 0, 7, 10, 1234567])  # a client's row numbers (`LocalData.id_values`)
    as_text = write_assignments(tmp_path / "text" / "assignments.csv", [str(i) for i in rows], labels, scores)
    as_rows = write_assignments(tmp_path / "rows" / "assignments.csv", rows, labels, scores)
    assert as_rows.read_bytes() == as_text.read_bytes()
    assert read_assignments(as_rows)[0] == ["3", "0", "7", "10", "1234567"]
