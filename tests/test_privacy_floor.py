"""The privacy floor (`fedapp.privacy.floor`) in every method that sends per-cluster statistics: the floor's
value (client default, node, run config), and what each client does with a cluster below it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.functional import normalize

from clients.ccfc import local_centroids
from clients.ffcm import membership_sums
from fedapp.maths.fstc import aggregate_centres, local_kmeans_summary, withhold_small_clusters
from fedapp.privacy.floor import (
    CLIENT_MIN_CLUSTER,
    PrivacyFloorError,
    min_cluster_size,
)
from strategies.ffcm import centres_from_totals


def _with_outliers(n: int = 60, dim: int = 4, outliers: int = 2, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, dim))
    rows[:outliers] += 40.0  # a tiny far cluster that k-means would happily give its own centre
    return rows


def _is_a_record(centre: np.ndarray, rows: np.ndarray) -> bool:
    return bool((np.abs(rows - centre).max(axis=1) < 1e-9).any())


def test_the_run_config_can_raise_the_floor_but_never_lower_it() -> None:
    assert min_cluster_size(1, {}) == CLIENT_MIN_CLUSTER == 5
    assert min_cluster_size(1, {"min-cluster-size": 20}) == 20  # the node's floor holds against the run's
    assert min_cluster_size(50, {"min-cluster-size": 20}) == 50  # the run config may raise it
    with pytest.raises(PrivacyFloorError, match="not an integer"):
        min_cluster_size(5, {"min-cluster-size": "many"})


def test_fstc_initial_summary_and_round_centres_keep_the_floor() -> None:
    rows = _with_outliers()
    centres, counts = local_kmeans_summary(rows, 100, seed=0)
    assert (counts >= 5).all() and counts.sum() == 60 and len(centres) <= 12
    assert not any(_is_a_record(c, rows) for c in centres)
    with pytest.raises(PrivacyFloorError):
        local_kmeans_summary(rows[:4], 2, seed=0)
    sent, sizes, withheld = withhold_small_clusters(torch.ones(3, 2), torch.tensor([7.0, 2.0, 0.0]), 5)
    assert withheld == 1 and sizes.tolist() == [7.0, 0.0, 0.0] and sent[1].abs().sum() == 0
    previous = np.full((3, 2), 9.0)  # Eq. 16 keeps the previous centre of a cluster nobody sent
    merged = aggregate_centres([sent.double().numpy()], [sizes.numpy()], previous)
    np.testing.assert_array_equal(merged, [[1.0, 1.0], [9.0, 9.0], [9.0, 9.0]])


def test_ccfc_local_centroids_average_at_least_the_floor() -> None:
    z = torch.as_tensor(_with_outliers(outliers=3), dtype=torch.float32)
    centroids = local_centroids(z, 6, seed=0)
    unit = normalize(z, dim=1).numpy()
    assert centroids.shape == (6, 4) and not any(_is_a_record(c, unit) for c in centroids.astype(np.float64))
    with pytest.raises(PrivacyFloorError):
        local_centroids(z[:6], 6, seed=0, floor=10)


def test_ffcm_withholds_a_cluster_of_little_membership_and_the_server_keeps_its_centre() -> None:
    rows = _with_outliers(outliers=2)
    centres = np.vstack([rows[2:].mean(0), rows[:2].mean(0)])  # the second centre sits on 2 records
    sums, mass = membership_sums(rows, centres, 2.0, floor=5)
    assert mass[1] == 0 and not sums[1].any() and mass[0] > 0
    unfloored_sums, unfloored_mass = membership_sums(rows, centres, 2.0)
    assert unfloored_mass[1] > 0  # the same data without a floor would have sent it
    updated = centres_from_totals(sums, mass, previous=centres)
    np.testing.assert_array_equal(updated[1], centres[1])
    with pytest.raises(ValueError, match="zero membership mass"):
        centres_from_totals(sums, mass)
