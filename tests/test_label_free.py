"""Tests for label-free metrics (two-pass sums vs scikit-learn on pooled data) and c-TF-IDF keywords."""

from __future__ import annotations

import io

import numpy as np
import pytest
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score

from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    LabelFreeError,
    cluster_sums,
    cluster_term_counts,
    ctfidf_keywords,
    distance_sums,
    label_free_metrics,
    merge_cluster_sums,
    merge_distance_sums,
    merge_term_counts,
    pooled_means,
)
from fedapp.report.stages import (
    decode_cluster_sums,
    decode_distance_sums,
    decode_term_counts,
    encode_cluster_sums,
    encode_distance_sums,
    encode_term_counts,
)
from fedapp.wire import ReplyError

CLIENT_SIZES = (37, 120, 9)


def _make_data(
    seed: int, k: int = 4, dims: int = 5, offset: float = 0.0, skip: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs around k centres (cluster `skip` never used), shifted by `offset`."""
    rng = np.random.default_rng(seed)
    n = sum(CLIENT_SIZES)
    clusters = [c for c in range(k) if c != skip]
    labels = rng.choice(clusters, size=n)
    labels[: len(clusters)] = clusters  # every kept cluster is non-empty
    rng.shuffle(labels)
    centres = rng.normal(scale=3.0, size=(k, dims))
    features = centres[labels] + rng.normal(size=(n, dims)) + offset
    return features, labels


def _split(features: np.ndarray, labels: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    bounds = np.cumsum((0, *CLIENT_SIZES))
    return [(features[a:b], labels[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _federated(features: np.ndarray, labels: np.ndarray, k: int) -> dict:
    """Both passes over three clients, with every message through its wire form."""
    clients = _split(features, labels)
    first = merge_cluster_sums(
        decode_cluster_sums(encode_cluster_sums(cluster_sums(x, y, k))) for x, y in clients
    )
    means = pooled_means(first)
    second = merge_distance_sums(
        decode_distance_sums(encode_distance_sums(distance_sums(x, y, means, first.counts)))
        for x, y in clients
    )
    return label_free_metrics(first, second)


def _direct_silhouette(features: np.ndarray, labels: np.ndarray) -> float:
    present = np.unique(labels)
    means = np.array([features[labels == c].mean(axis=0) for c in present])
    total = 0.0
    for x, y in zip(features, labels, strict=True):
        distances = np.linalg.norm(x - means, axis=1)
        own = int(np.searchsorted(present, y))
        a, b = distances[own], np.min(np.delete(distances, own))
        total += 0.0 if max(a, b) == 0 else (b - a) / max(a, b)
    return total / len(labels)


def _direct_inertia(features: np.ndarray, labels: np.ndarray) -> float:
    return sum(
        float(((features[labels == c] - features[labels == c].mean(axis=0)) ** 2).sum())
        for c in np.unique(labels)
    )


@pytest.mark.parametrize(
    ("seed", "offset", "skip"), [(0, 0.0, None), (1, 1e3, None), (2, 0.0, 2), (3, 1e3, 0)]
)
def test_federated_metrics_equal_pooled(seed: int, offset: float, skip: int | None) -> None:
    k = 4
    features, labels = _make_data(seed, k=k, offset=offset, skip=skip)
    metrics = _federated(features, labels, k)
    assert metrics["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(features, labels), rel=1e-9)
    assert metrics["davies_bouldin"] == pytest.approx(davies_bouldin_score(features, labels), rel=1e-9)
    assert metrics["inertia"] == pytest.approx(_direct_inertia(features, labels), rel=1e-9)
    assert metrics["simplified_silhouette"] == pytest.approx(_direct_silhouette(features, labels), rel=1e-9)
    assert metrics["cluster_sizes"] == np.bincount(labels, minlength=k).tolist()
    assert metrics["n_clusters_used"] == (k if skip is None else k - 1)


def test_one_cluster_gives_none_but_inertia_and_sizes() -> None:
    features, _ = _make_data(4)
    labels = np.full(len(features), 2)
    metrics = _federated(features, labels, 3)
    assert metrics["calinski_harabasz"] is None
    assert metrics["davies_bouldin"] is None
    assert metrics["simplified_silhouette"] is None
    assert metrics["n_clusters_used"] == 1
    assert metrics["cluster_sizes"] == [0, 0, len(features)]
    assert metrics["inertia"] == pytest.approx(_direct_inertia(features, labels), rel=1e-9)


def test_coincident_points_follow_sklearn_degenerate_values() -> None:
    features = np.array([[0.0, 0.0]] * 3 + [[1.0, 1.0]] * 4)
    labels = np.array([0] * 3 + [1] * 4)
    metrics = _federated(features, labels, 2)
    assert metrics["calinski_harabasz"] == calinski_harabasz_score(features, labels) == 1.0
    assert metrics["davies_bouldin"] == davies_bouldin_score(features, labels) == 0.0
    assert metrics["simplified_silhouette"] == 1.0


def test_client_without_rows_and_mismatches() -> None:
    features, labels = _make_data(5, k=3)
    sums = cluster_sums(features, labels, 3)
    empty = cluster_sums(np.zeros((0, 5)), np.zeros(0, dtype=int), 3)
    assert np.array_equal(merge_cluster_sums([sums, empty]).counts, sums.counts)
    nothing = distance_sums(np.zeros((0, 5)), np.zeros(0, dtype=int), pooled_means(sums), sums.counts)
    assert nothing.n == 0 and nothing.silhouette_sum == 0.0
    with pytest.raises(LabelFreeError, match="part 1"):
        merge_cluster_sums([sums, cluster_sums(features, labels, 4)])
    with pytest.raises(LabelFreeError, match="labels must lie"):
        cluster_sums(features, labels, 2)
    with pytest.raises(LabelFreeError, match="pooled count is 0"):
        distance_sums(features, labels, pooled_means(sums), np.array([1, 0, 1]))
    passes = distance_sums(features, labels, pooled_means(sums), sums.counts)
    with pytest.raises(LabelFreeError, match="rows"):
        label_free_metrics(merge_cluster_sums([sums, sums]), passes)


def test_cluster_sums_round_trip() -> None:
    features, labels = _make_data(6, k=3)
    sums = cluster_sums(features, labels, 3)
    decoded = decode_cluster_sums(encode_cluster_sums(sums))
    assert np.array_equal(decoded.counts, sums.counts) and decoded.counts.dtype == np.int64
    assert np.array_equal(decoded.sums, sums.sums)
    passes = distance_sums(features, labels, pooled_means(sums), sums.counts)
    back = decode_distance_sums(encode_distance_sums(passes))
    assert np.array_equal(back.distance_sums, passes.distance_sums)
    assert np.array_equal(back.squared_sums, passes.squared_sums)
    assert (back.silhouette_sum, back.n) == (passes.silhouette_sum, passes.n)


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not an archive at all",
        _npz(counts=np.array([1, 2]), sums=np.ones((3, 2))),  # K disagrees
        _npz(counts=np.array([1, 2]), sums=np.ones(2)),  # sums 1-d
        _npz(counts=np.array([[1, 2]]), sums=np.ones((1, 2))),  # counts 2-d
        _npz(counts=np.array([1, 2]), sums=np.array([[1.0, np.nan], [0.0, 1.0]])),
        _npz(counts=np.array([1, 2]), sums=np.array([[1.0, np.inf], [0.0, 1.0]])),
        _npz(counts=np.array([-1, 2]), sums=np.ones((2, 2))),
        _npz(counts=np.array([1.5, 2.0]), sums=np.ones((2, 2))),  # non-integer counts
        _npz(counts=np.array([0, 2]), sums=np.ones((2, 2))),  # empty cluster with a sum
        _npz(counts=np.array([1, 2])),  # missing array
        _npz(counts=np.array([1, 2]), sums=np.ones((2, 2)), extra=np.zeros(1)),
        _npz(counts=np.array([1, 2]), sums=np.array([[object(), 1], [1, 1]], dtype=object)),
    ],
)
def test_decode_cluster_sums_rejects(blob: bytes) -> None:
    with pytest.raises(ReplyError) as caught:
        decode_cluster_sums(blob)
    assert "\n" not in str(caught.value)


def _distance_blob(**overrides: object) -> bytes:
    arrays = {
        "distance_sums": np.array([1.0, 2.0]),
        "squared_sums": np.array([1.0, 4.0]),
        "silhouette_sum": np.float64(0.5),
        "n": np.int64(3),
    }
    arrays.update(overrides)
    return _npz(**arrays)


def test_distance_blob_fixture_is_valid() -> None:
    assert decode_distance_sums(_distance_blob()).n == 3


@pytest.mark.parametrize(
    "overrides",
    [
        {"distance_sums": np.array([1.0, 2.0, 3.0])},  # K disagrees with squared_sums
        {"squared_sums": np.array([[1.0, 4.0]])},
        {"distance_sums": np.array([np.nan, 2.0])},
        {"squared_sums": np.array([-1.0, 4.0])},
        {"silhouette_sum": np.float64(np.nan)},
        {"silhouette_sum": np.float64(3.5)},  # |sum| > n
        {"silhouette_sum": np.array([0.5])},
        {"n": np.int64(-1)},
        {"n": np.float64(3.0)},
    ],
)
def test_decode_distance_sums_rejects(overrides: dict) -> None:
    with pytest.raises(ReplyError):
        decode_distance_sums(_distance_blob(**overrides))


def test_sums_validate_on_construction() -> None:
    with pytest.raises(LabelFreeError):
        ClusterSums(np.array([1, -2]), np.zeros((2, 3)))
    with pytest.raises(LabelFreeError):
        DistanceSums(np.zeros(2), np.zeros(2), 0.0, -1)
    with pytest.raises(ReplyError):
        decode_distance_sums(b"\x00" * 40)


APPLE = ["apple banana smoothie", "banana apple pie", "fresh apple and banana", "apple banana bread"]
ENGINE = ["engine wheel repair", "the wheel and the engine", "engine oil wheel", "new wheel engine"]


def _corpus() -> tuple[list[str], np.ndarray]:
    texts = APPLE * 3 + ENGINE * 3 + ["engine engine oddity"]  # "oddity" is in one document only
    labels = np.array([0] * 12 + [1] * 12 + [1])
    return texts, labels


def test_keywords_name_each_cluster() -> None:
    texts, labels = _corpus()
    halves = [(texts[::2], labels[::2]), (texts[1::2], labels[1::2])]
    parts = [cluster_term_counts(t, y, 3, min_documents=2) for t, y in halves]
    merged = merge_term_counts(decode_term_counts(encode_term_counts(part), 3) for part in parts)
    keywords = ctfidf_keywords(merged, top_n=2)
    assert sorted(keywords[0]) == ["apple", "banana"]
    assert sorted(keywords[1]) == ["engine", "wheel"]
    assert keywords[2] == []
    assert ctfidf_keywords(merged, top_n=2) == keywords  # deterministic
    assert merged[0]["apple"] == parts[0][0]["apple"] + parts[1][0]["apple"] == 12


def test_rare_terms_never_leave_a_client() -> None:
    texts, labels = _corpus()
    counts = cluster_term_counts(texts, labels, 2, min_documents=2)
    assert "oddity" not in counts[1]
    assert counts[1]["engine"] == 13  # a document counts once however often it holds the term
    strict = cluster_term_counts(texts, labels, 2, min_documents=13)
    assert strict == [{}, {"engine": 13}]


def test_merge_sums_counts() -> None:
    merged = merge_term_counts([[{"a": 2}, {"b": 5}], [{"a": 3, "c": 7}, {}]])
    assert merged == [{"a": 5, "c": 7}, {"b": 5}]
    with pytest.raises(LabelFreeError, match="clusters"):
        merge_term_counts([[{"a": 2}], [{"a": 2}, {}]])


def test_ctfidf_scores_follow_the_formula() -> None:
    # A = (3 + 1) / 2 = 2; "x": 2/3 ln(1 + 2/3) = 0.341 < "y": 1/3 ln(1 + 2/1) = 0.366 (idf wins).
    assert ctfidf_keywords([{"x": 2, "y": 1}, {"x": 1}]) == [["y", "x"], ["x"]]
    # A = (4 + 1) / 2 = 2.5; "x": 3/4 ln(1 + 2.5/4) = 0.364 > "y": 1/4 ln(1 + 2.5/1) = 0.313 (tf wins).
    assert ctfidf_keywords([{"x": 3, "y": 1}, {"x": 1}]) == [["x", "y"], ["x"]]
    assert ctfidf_keywords([{"b": 1, "a": 1}], top_n=1) == [["a"]]  # tie -> alphabetical


@pytest.mark.parametrize(
    "blob",
    [
        b"\xff\xfe",
        b"{not json",
        b'{"a": 1}',
        b'[{"a": 1}]',  # one cluster, two expected
        b'[{"a": 1}, {"b": 0}]',
        b'[{"a": 1}, {"b": -3}]',
        b'[{"a": 1.5}, {}]',
        b'[{"a": true}, {}]',
        b'[{"": 1}, {}]',
        b'[{"a": 1, "a": 2}, {}]',
        b'[["a", 1], {}]',
    ],
)
def test_decode_term_counts_rejects(blob: bytes) -> None:
    with pytest.raises(ReplyError):
        decode_term_counts(blob, 2)
