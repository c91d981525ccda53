"""FedCMv / FedFCMv maths (clients/fedcmv.py, strategies/fedcmv.py) and their reference runs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from clients import fedcmv as client
from fedapp.methods.fedcmv import choose_initial_samples
from simulation.papers.cefmc.reference import run_vertical_cmeans
from strategies import fedcmv as server


@pytest.fixture(autouse=True)
def _single_threaded_blas():
    """These problems are tiny: on a shared machine BLAS/OpenMP thread spin-waits cost more than the maths."""
    with threadpool_limits(limits=1):
        yield


def _views(n_samples: int = 200, dims: tuple[int, ...] = (5, 3), k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, k, n_samples)
    return [rng.normal(size=(k, d))[truth] * 3 + rng.normal(size=(n_samples, d)) for d in dims]


def test_initial_samples_are_distinct_and_seeded():
    indices = choose_initial_samples(50, 7, seed=3)
    assert len(set(indices.tolist())) == 7 and indices.min() >= 0 and indices.max() < 50
    np.testing.assert_array_equal(indices, choose_initial_samples(50, 7, seed=3))
    with pytest.raises(ValueError, match="k must be"):
        choose_initial_samples(5, 6)


def test_one_view_fedcmv_round_is_a_lloyd_step():
    (X,) = _views(dims=(6,))
    k = 3
    centroids = client.init_centroids(X, choose_initial_samples(len(X), k, seed=1))
    labels, sent, _ = server.server_round([client.squared_distances(X, centroids)], fuzzy=False)
    updated = client.update_centroids_hard(X, sent, centroids)
    np.testing.assert_array_equal(labels, cdist(X, centroids, "sqeuclidean").argmin(axis=1))
    lloyd = KMeans(n_clusters=k, init=centroids, n_init=1, max_iter=1, algorithm="lloyd").fit(X)
    np.testing.assert_allclose(updated, lloyd.cluster_centers_, atol=1e-10)


def test_vertical_split_equals_clustering_the_concatenated_views():
    views = _views()
    split = run_vertical_cmeans(views, 3, delta=0.0, max_rounds=5, seed=2)
    joined = run_vertical_cmeans([np.hstack(views)], 3, delta=0.0, max_rounds=5, seed=2)
    np.testing.assert_array_equal(split.labels, joined.labels)
    np.testing.assert_allclose(split.objectives, joined.objectives, rtol=1e-12)


def test_empty_cluster_keeps_its_previous_segment():
    X = np.array([[0.0], [1.0], [10.0]])
    previous = np.array([[0.5], [10.0], [99.0]])
    updated = client.update_centroids_hard(X, np.array([0, 0, 1]), previous)
    np.testing.assert_allclose(updated, [[0.5], [10.0], [99.0]])


def test_fuzzy_memberships_sum_to_one_and_follow_bezdek():
    rng = np.random.default_rng(0)
    distances = rng.uniform(0.1, 5.0, size=(20, 4))
    distances[3, 2] = 0.0  # a sample sitting on a centroid
    distances[4, [0, 1]] = 0.0  # ... on two coinciding centroids
    memberships = server.fuzzy_memberships(distances, fuzzifier=2.0)
    np.testing.assert_allclose(memberships.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(memberships >= 0)
    np.testing.assert_allclose(memberships[3], [0, 0, 1, 0])
    np.testing.assert_allclose(memberships[4], [0.5, 0.5, 0, 0])
    textbook = 1.0 / ((distances[0][:, None] / distances[0][None, :]) ** 1.0).sum(axis=1)  # m = 2
    np.testing.assert_allclose(memberships[0], textbook, rtol=1e-12)


@pytest.mark.parametrize("fuzzy", [False, True])
def test_objective_never_increases(fuzzy):
    run = run_vertical_cmeans(_views(), 3, fuzzy=fuzzy, delta=0.0, max_rounds=15, seed=0)
    steps = np.diff(run.objectives)
    assert np.all(steps <= 1e-10 * np.abs(run.objectives[1:]))
    assert run.labels.shape == (200,) and run.labels.max() < 3


@pytest.mark.parametrize("fuzzy", [False, True])
def test_bytes_are_distances_up_and_assignments_down(fuzzy):
    views, n_samples, k = _views(), 200, 3
    run = run_vertical_cmeans(views, k, fuzzy=fuzzy, delta=None, max_rounds=4)
    assert run.bytes_up == [0] + [len(views) * n_samples * k * 8] * 4
    assignment = n_samples * k * 8 if fuzzy else n_samples * 4
    assert run.bytes_down == [len(views) * k * 4] + [len(views) * assignment] * 4
