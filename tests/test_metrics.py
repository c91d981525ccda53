"""Table-based metrics must equal scikit-learn's (and a brute-force ACC) on the pooled label vectors."""

import itertools
import warnings

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, cohen_kappa_score, normalized_mutual_info_score

from fedapp.metrics.contingency import (
    MetricsError,
    clustering_metrics,
    contingency_table,
    encode_table,
    hungarian_mapping,
)
from fedapp.wire import ReplyError, decode_counts

TOL = 1e-9


def _random_labelling(seed: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """A noisy copy of random classes: metrics then span the range instead of sitting at chance."""
    rng = np.random.default_rng(seed)
    n_clusters, n_classes = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    n_samples = int(rng.integers(1, 400))
    true = rng.integers(0, n_classes, n_samples)
    agrees = rng.random(n_samples) < rng.random()
    pred = np.where(agrees, (true + seed) % n_clusters, rng.integers(0, n_clusters, n_samples))
    return pred, true, n_clusters, n_classes


def _degenerate_cases() -> list[tuple[np.ndarray, np.ndarray, int, int]]:
    rng = np.random.default_rng(7)
    varied = rng.integers(0, 4, 50)
    return [
        (np.zeros(50, int), varied, 1, 4),  # a single cluster
        (varied, np.zeros(50, int), 4, 1),  # a single class
        (np.zeros(9, int), np.zeros(9, int), 1, 1),  # both single
        (np.array([0]), np.array([0]), 3, 2),  # N = 1
        (np.full(20, 2), np.full(20, 1), 3, 3),  # one label each, inside larger tables
        (rng.choice([0, 2], 60), rng.choice([1, 5], 60), 6, 6),  # empty rows and columns
        (np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), 2, 2),  # independent partitions
        (np.array([2, 0, 1, 1, 2]), np.array([0, 1, 2, 2, 0]), 3, 3),  # a relabelled perfect match
        (np.repeat([0, 1, 2, 3, 4], 10), np.repeat([0, 0, 1, 1, 2], 10), 5, 3),  # over-segmented
    ]


CASES = [_random_labelling(seed) for seed in range(60)] + _degenerate_cases()
CASE_IDS = [f"random{seed}" for seed in range(60)] + [f"degenerate{i}" for i in range(len(CASES) - 60)]


def _brute_force_acc(pred: np.ndarray, true: np.ndarray, n_clusters: int, n_classes: int) -> float:
    """Best accuracy over every one-to-one cluster <-> class assignment, on the label vectors."""
    if n_clusters <= n_classes:
        return max(
            float(np.mean(np.array(classes)[pred] == true))
            for classes in itertools.permutations(range(n_classes), n_clusters)
        )
    return max(
        float(np.mean(np.array(clusters)[true] == pred))
        for clusters in itertools.permutations(range(n_clusters), n_classes)
    )


def _reference(pred: np.ndarray, true: np.ndarray, n_clusters: int, n_classes: int) -> dict[str, float]:
    mapping = hungarian_mapping(contingency_table(pred, true, n_clusters, n_classes))
    majority = [
        np.bincount(true[pred == cluster], minlength=n_classes).max() for cluster in range(n_clusters)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn warns on the undefined-kappa cases
        return {
            "acc": _brute_force_acc(pred, true, n_clusters, n_classes),
            "nmi": normalized_mutual_info_score(true, pred),
            "ari": adjusted_rand_score(true, pred),
            "purity": sum(majority) / true.size,
            "kappa": cohen_kappa_score(true, mapping[pred]),
        }


def test_a_perfect_match_is_exactly_one_not_one_and_round_off() -> None:
    """Summed in floating point, I / mean(H) came out 1.0000000000000002 for this table (and was printed so
    in summary.json): the fractions stay within [0, 1]."""
    table = np.diag([191, 153, 81, 93, 13, 23, 5, 53, 244, 195])
    metrics = clustering_metrics(table)
    assert metrics["nmi"] == 1.0 and metrics["acc"] == metrics["purity"] == 1.0
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.integers(1, 300, int(rng.integers(2, 12)))
        assert clustering_metrics(np.diag(sizes))["nmi"] == pytest.approx(1.0, abs=1e-12, rel=0)
        assert clustering_metrics(np.diag(sizes))["nmi"] <= 1.0


@pytest.mark.parametrize(("pred", "true", "n_clusters", "n_classes"), CASES, ids=CASE_IDS)
def test_metrics_match_scikit_learn(
    pred: np.ndarray, true: np.ndarray, n_clusters: int, n_classes: int
) -> None:
    ours = clustering_metrics(contingency_table(pred, true, n_clusters, n_classes))
    reference = _reference(pred, true, n_clusters, n_classes)
    assert list(ours) == ["acc", "nmi", "ari", "purity", "kappa"]
    for key, value in reference.items():
        np.testing.assert_allclose(ours[key], value, rtol=0, atol=TOL, err_msg=key)  # NaN == NaN here


def test_large_tables_match_scikit_learn() -> None:
    rng = np.random.default_rng(3)
    true = rng.integers(0, 12, 20_000)
    pred = np.where(rng.random(true.size) < 0.6, (true * 5) % 15, rng.integers(0, 15, true.size))
    ours = clustering_metrics(contingency_table(pred, true, 15, 12))
    np.testing.assert_allclose(ours["nmi"], normalized_mutual_info_score(true, pred), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["ari"], adjusted_rand_score(true, pred), rtol=0, atol=TOL)


def test_degenerate_values_follow_scikit_learn_conventions() -> None:
    both_single = clustering_metrics(np.array([[5]]))
    assert both_single["nmi"] == 1.0 and both_single["ari"] == 1.0 and both_single["acc"] == 1.0
    assert np.isnan(both_single["kappa"])
    one_cluster = clustering_metrics(np.array([[3, 7]]))
    assert one_cluster["nmi"] == 0.0 and one_cluster["ari"] == 0.0
    assert one_cluster["acc"] == one_cluster["purity"] == 0.7


def test_summed_client_tables_equal_the_pooled_table() -> None:
    rng = np.random.default_rng(11)
    n_clusters, n_classes = 5, 3
    pred, true = rng.integers(0, n_clusters, 500), rng.integers(0, n_classes, 500)
    clients = np.array_split(rng.permutation(true.size), 4)
    summed = sum(contingency_table(pred[idx], true[idx], n_clusters, n_classes) for idx in clients)
    pooled = contingency_table(pred, true, n_clusters, n_classes)
    np.testing.assert_array_equal(summed, pooled)
    assert summed.dtype == np.int64
    assert clustering_metrics(summed) == clustering_metrics(pooled)


def test_contingency_table_counts() -> None:
    table = contingency_table(np.array([0, 0, 1, 2, 2, 2]), np.array([1, 1, 0, 0, 1, 1]), 4, 3)
    expected = np.array([[0, 2, 0], [1, 0, 0], [1, 2, 0], [0, 0, 0]])
    np.testing.assert_array_equal(table, expected)
    assert table.dtype == np.int64
    assert contingency_table(np.array([], int), np.array([], int), 2, 2).sum() == 0


@pytest.mark.parametrize(
    ("pred", "true", "n_clusters", "n_classes", "message"),
    [
        ([0, 1], [0], 2, 2, "2 labels but true has 1"),
        ([0, 2], [0, 1], 2, 2, r"pred labels must lie in \[0, 2\)"),
        ([0, 1], [-1, 1], 2, 2, r"true labels must lie in \[0, 2\)"),
        ([0.0, 1.0], [0, 1], 2, 2, "must be integers"),
        ([[0, 1]], [[0, 1]], 2, 2, "must be 1-D"),
        ([0], [0], 0, 2, ">= 1"),
    ],
)
def test_contingency_table_rejects_bad_labels(
    pred: list, true: list, n_clusters: int, n_classes: int, message: str
) -> None:
    with pytest.raises(MetricsError, match=message):
        contingency_table(np.array(pred), np.array(true), n_clusters, n_classes)


def test_hungarian_mapping_on_non_square_tables() -> None:
    # 4 clusters, 2 classes: clusters 0 and 3 win the matching; 1 and 2 fall back to their majority.
    table = np.array([[9, 1], [6, 4], [1, 3], [0, 8]])
    mapping = hungarian_mapping(table)
    assert mapping.tolist() == [0, 0, 1, 1]
    assert mapping.dtype == np.int64
    # 2 clusters, 4 classes: every cluster gets a distinct class.
    np.testing.assert_array_equal(hungarian_mapping(np.array([[0, 5, 5, 0], [0, 6, 0, 1]])), [2, 1])


def test_perfect_relabelled_clustering_scores_one() -> None:
    true = np.repeat(np.arange(4), 25)
    pred = np.array([2, 0, 3, 1])[true]
    table = contingency_table(pred, true, 4, 4)
    np.testing.assert_array_equal(hungarian_mapping(table)[pred], true)
    assert all(value == pytest.approx(1.0) for value in clustering_metrics(table).values())


@pytest.mark.parametrize("largest", [0, 255, 256, 70_000, 2**40])
def test_encode_decode_round_trip(largest: int) -> None:
    table = np.random.default_rng(largest).integers(0, largest + 1, size=(7, 3))
    table[0, 0] = largest
    blob = encode_table(table)
    decoded = decode_counts(blob)
    assert isinstance(blob, bytes)
    assert decoded.dtype == np.int64
    np.testing.assert_array_equal(decoded, table)


def test_encoding_is_compact() -> None:
    table = np.full((10, 10), 200)
    assert len(encode_table(table)) < table.size * 2  # one byte per count plus a small header


def _valid_blob() -> bytes:
    return encode_table(np.array([[1, 2], [3, 4]]))


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "too short"),
        (b"not a table at all", "not an encoded contingency table"),
        (_valid_blob()[:-1], "should be"),
        (_valid_blob() + b"\x00", "should be"),
        (_valid_blob()[:4] + b"<f8" + _valid_blob()[7:], "unsupported count dtype"),
        (_valid_blob()[:7] + b"\x00" * 8, "empty shape"),
        ("a string", "must be bytes"),
    ],
)
def test_decode_rejects_garbage(blob: bytes, message: str) -> None:
    with pytest.raises(ReplyError, match=message):
        decode_counts(blob)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (np.array([[1, -1]]), "non-negative"),
        (np.array([1, 2]), "2-D"),
        (np.zeros((2, 2, 2), int), "2-D"),
        (np.zeros((0, 3), int), "non-empty"),
        (np.array([[1.5, 2.0]]), "integers"),
    ],
)
def test_bad_tables_are_rejected(table: np.ndarray, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        encode_table(table)
    with pytest.raises(MetricsError, match=message):
        clustering_metrics(table)


def test_metrics_of_an_empty_table_are_an_error() -> None:
    with pytest.raises(MetricsError, match="no samples"):
        clustering_metrics(np.zeros((3, 3), int))
