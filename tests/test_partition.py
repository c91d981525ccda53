"""Partitioners: exact sizes, disjointness, coverage, seeding and the heterogeneity each scheme promises."""

import numpy as np
import pytest

from fedapp.datasets.partition import SCHEMES, PartitionError, parse_ratio, partition_indices, vertical_view

SCHEME_KWARGS = {
    "iid": {},
    "size-ratio": {"ratio": "3:2:2:1"},
    "p-hetero": {"p": 0.5},
    "dirichlet": {"alpha": 1.0},
    "by-group": {},
}
SEEDED = tuple(scheme for scheme in SCHEMES if scheme != "by-group")  # by-group draws nothing


def _balanced_labels(n_classes: int = 10, per_class: int = 100, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(n_classes), per_class))


def _class_shares(labels: np.ndarray, parts: list[np.ndarray], n_classes: int) -> np.ndarray:
    """Row l: the fraction of client l's samples in each class."""
    return np.array([np.bincount(labels[part], minlength=n_classes) / part.size for part in parts])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_partitions_are_sorted_disjoint_and_cover(scheme: str) -> None:
    labels = np.random.default_rng(1).integers(0, 7, 1003)  # N not divisible by 4
    parts = partition_indices(labels, 4, scheme, seed=0, **SCHEME_KWARGS[scheme])
    assert len(parts) == 4
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted and without repeats
    pooled = np.concatenate(parts)
    assert np.unique(pooled).size == pooled.size  # pairwise disjoint
    if scheme == "p-hetero":
        assert pooled.size == 4 * (1003 // 4)  # the N mod 4 leftover samples are unused
    else:
        np.testing.assert_array_equal(np.sort(pooled), np.arange(1003))


@pytest.mark.parametrize("scheme", SEEDED)
def test_same_seed_same_split_and_other_seed_another(scheme: str) -> None:
    labels = _balanced_labels()
    first, again, other = (
        partition_indices(labels, 4, scheme, seed=seed, **SCHEME_KWARGS[scheme]) for seed in (5, 5, 6)
    )
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_iid_sizes_differ_by_at_most_one() -> None:
    sizes = [part.size for part in partition_indices(np.zeros(1003), 10, "iid", seed=0)]
    assert sorted(sizes) == [100] * 7 + [101] * 3


@pytest.mark.parametrize(
    ("ratio", "n_samples", "sizes"),
    [
        ("6:4", 10_000, [6000, 4000]),
        ("7:3", 10, [7, 3]),  # exact: not floor(0.7 * 10) computed in binary floating point
        ("9:1", 1003, [903, 100]),  # floor gives 902 + 100; the leftover sample goes to the larger part
        ("8:2", 999, [800, 199]),
        ("1:2", 7, [2, 5]),
        ("1:1:1", 10, [4, 3, 3]),  # ties: the lower index gets the leftover
        ((0.7, 0.3), 10, [7, 3]),
        ([1, 3, 1], 11, [2, 7, 2]),
    ],
)
def test_size_ratio_sizes_are_exact(ratio: str | list[float], n_samples: int, sizes: list[int]) -> None:
    parts = partition_indices(np.zeros(n_samples), len(sizes), "size-ratio", seed=0, ratio=ratio)
    assert [part.size for part in parts] == sizes


def test_parse_ratio() -> None:
    np.testing.assert_allclose(parse_ratio("6:4", 2), [0.6, 0.4])
    np.testing.assert_allclose(parse_ratio(" 9 : 1 ", 2), [0.9, 0.1])
    np.testing.assert_allclose(parse_ratio([1, 1, 2], 3), [0.25, 0.25, 0.5])


@pytest.mark.parametrize(
    ("ratio", "num_partitions", "message"),
    [
        ("6:4", 3, "has 2 parts but num_partitions=3"),
        ("6:0", 2, "positive"),
        ("-1:2", 2, "positive"),
        ("a:b", 2, "not a list of numbers"),
        ("", 1, "not a list of numbers"),
        ((float("nan"), 1.0), 2, "not a list of numbers"),
    ],
)
def test_parse_ratio_rejects_bad_ratios(ratio: str, num_partitions: int, message: str) -> None:
    with pytest.raises(PartitionError, match=message):
        parse_ratio(ratio, num_partitions)


def test_p_hetero_sizes_are_exact() -> None:
    labels = np.random.default_rng(2).integers(0, 3, 1003)
    parts = partition_indices(labels, 7, "p-hetero", seed=0, p=0.8)
    assert [part.size for part in parts] == [1003 // 7] * 7


def test_p_hetero_p1_gives_one_pure_class_per_client() -> None:
    labels = _balanced_labels()
    shares = _class_shares(labels, partition_indices(labels, 10, "p-hetero", seed=0, p=1.0), 10)
    np.testing.assert_array_equal(shares, np.eye(10))


def test_p_hetero_p0_is_roughly_proportional() -> None:
    labels = _balanced_labels()
    shares = _class_shares(labels, partition_indices(labels, 10, "p-hetero", seed=0, p=0.0), 10)
    assert shares.max() < 0.3  # each class is 10% of the data
    assert np.abs(shares.mean(axis=0) - 0.1).max() < 0.02


def test_p_hetero_half_gives_the_own_class_at_least_half() -> None:
    labels = _balanced_labels()
    shares = _class_shares(labels, partition_indices(labels, 10, "p-hetero", seed=0, p=0.5), 10)
    assert np.all(np.diag(shares) >= 0.5)
    assert np.all(np.diag(shares) < 0.7)  # the other half is random, mostly other classes


def test_p_hetero_fills_a_short_class_from_the_pool() -> None:
    labels = np.concatenate([np.zeros(20, int), np.ones(380, int)])  # class 0 too small for client 0
    parts = partition_indices(labels, 4, "p-hetero", seed=0, p=1.0)  # clients 0, 2 own class 0
    assert [part.size for part in parts] == [100] * 4
    assert np.sum(labels[parts[0]] == 0) + np.sum(labels[parts[2]] == 0) == 20
    assert np.all(labels[parts[1]] == 1) and np.all(labels[parts[3]] == 1)


def test_dirichlet_small_alpha_is_skewed() -> None:
    labels = _balanced_labels()
    iid_shares = _class_shares(labels, partition_indices(labels, 10, "iid", seed=0), 10)
    skewed_shares = _class_shares(labels, partition_indices(labels, 10, "dirichlet", seed=0, alpha=0.1), 10)
    assert skewed_shares.max(axis=1).mean() > iid_shares.max(axis=1).mean() + 0.25


def test_dirichlet_honours_min_size_or_says_why() -> None:
    labels = _balanced_labels()
    parts = partition_indices(labels, 10, "dirichlet", seed=0, alpha=0.3, min_size=30)
    assert min(part.size for part in parts) >= 30
    with pytest.raises(PartitionError, match="raise alpha"):
        partition_indices(labels, 10, "dirichlet", seed=0, alpha=0.5, min_size=101)


def test_dirichlet_matches_flwr_datasets() -> None:
    """Same seed, same index sets as flwr_datasets' DirichletPartitioner(self_balancing=False)."""
    datasets = pytest.importorskip("datasets")
    partitioner_module = pytest.importorskip("flwr_datasets.partitioner")
    labels = np.random.default_rng(4).integers(0, 6, 400)
    partitioner = partitioner_module.DirichletPartitioner(
        num_partitions=5, partition_by="label", alpha=0.3, min_partition_size=5, seed=3
    )
    partitioner.dataset = datasets.Dataset.from_dict({"label": labels, "idx": np.arange(400)}).with_format(
        "numpy"
    )
    ours = partition_indices(labels, 5, "dirichlet", seed=3, alpha=0.3, min_size=5)
    for partition_id, part in enumerate(ours):
        np.testing.assert_array_equal(np.sort(partitioner.load_partition(partition_id)["idx"]), part)


@pytest.mark.parametrize(
    ("num_partitions", "scheme", "kwargs", "message"),
    [
        (2, "shards", {}, "iid, p-hetero, size-ratio, dirichlet"),
        (0, "iid", {}, "num_partitions must be >= 1, got 0"),
        (11, "iid", {}, "num_partitions=11 exceeds the number of samples N=10"),
        (2, "p-hetero", {"p": 1.5}, r"p must lie in \[0, 1\]"),
        (2, "p-hetero", {"p": -0.1}, r"p must lie in \[0, 1\]"),
        (2, "dirichlet", {"alpha": 0.0}, "alpha must be > 0"),
        (2, "dirichlet", {"alpha": -1.0}, "alpha must be > 0"),
        (2, "iid", {"min_size": 0}, "min_size must be >= 1"),
        (2, "iid", {"min_size": 6}, "below min_size=6"),
        (2, "size-ratio", {"ratio": "9:1", "min_size": 2}, r"sizes \[9, 1\]"),
        (2, "size-ratio", {"ratio": "1:1:1"}, "has 3 parts but num_partitions=2"),
    ],
)
def test_bad_requests_raise_partition_error(
    num_partitions: int, scheme: str, kwargs: dict, message: str
) -> None:
    with pytest.raises(PartitionError, match=message):
        partition_indices(np.arange(10) % 2, num_partitions, scheme, seed=0, **kwargs)


def test_labels_must_be_one_dimensional() -> None:
    with pytest.raises(PartitionError, match="1-D"):
        partition_indices(np.zeros((4, 2)), 2, "iid", seed=0)


def test_vertical_view_gives_client_v_view_v() -> None:
    views = [np.zeros((5, 3)), np.ones((5, 2))]
    np.testing.assert_array_equal(vertical_view(views, 1, 2), np.ones((5, 2)))


@pytest.mark.parametrize(
    ("partition_id", "num_partitions", "message"),
    [
        (0, 3, "num_partitions=3 but the dataset has 2 views"),
        (2, 2, r"partition_id=2 is outside \[0, 2\)"),
        (-1, 2, r"partition_id=-1 is outside \[0, 2\)"),
    ],
)
def test_vertical_view_rejects_mismatched_clients(
    partition_id: int, num_partitions: int, message: str
) -> None:
    with pytest.raises(PartitionError, match=message):
        vertical_view([np.zeros((5, 3)), np.zeros((5, 2))], partition_id, num_partitions)


def test_vertical_views_must_hold_the_same_samples() -> None:
    with pytest.raises(PartitionError, match=r"row counts are \[5, 4\]"):
        vertical_view([np.zeros((5, 3)), np.zeros((4, 2))], 0, 2)
