"""`imbalance`: a seeded long-tailed subset of any labelled dataset (real data is imbalanced)."""

from __future__ import annotations

import numpy as np
import pytest

from fedapp.config.run import parse_run_config
from fedapp.datasets.common import DatasetError, long_tail_counts
from fedapp.datasets.local import local_partition
from fedapp.datasets.registry import load_dataset


def test_the_profile_falls_geometrically_from_head_to_tail() -> None:
    counts = long_tail_counts(np.full(20, 1000), 50.0)
    assert counts[0] == 1000 and counts[-1] == 20 and np.all(np.diff(counts) <= 0)
    ratios = counts[:-1] / counts[1:]
    assert np.allclose(ratios, 50 ** (1 / 19), rtol=0.05)  # a constant step, up to rounding
    # the head is what the scarcest class (relative to its share) can give
    uneven = long_tail_counts(np.array([100, 500, 500, 500]), 10.0)
    assert uneven[0] == 100 and np.all(uneven <= np.array([100, 500, 500, 500]))


def test_a_long_tailed_subset_is_seeded_and_keeps_the_ratio() -> None:
    first = load_dataset("digits", imbalance=10.0, seed=0)
    again = load_dataset("digits", imbalance=10.0, seed=0)
    other = load_dataset("digits", imbalance=10.0, seed=1)
    sizes = np.bincount(first.y, minlength=first.n_classes)
    assert sizes.max() / sizes.min() == pytest.approx(10.0, rel=0.06)
    assert np.array_equal(first.features, again.features)
    assert np.array_equal(np.bincount(other.y), sizes) and not np.array_equal(first.features, other.features)
    capped = load_dataset("digits", imbalance=10.0, seed=0, max_samples=300)
    assert capped.n_samples == 300 and set(np.unique(capped.y)) == set(range(first.n_classes))


def test_clients_partition_the_long_tailed_subset() -> None:
    cfg = parse_run_config({"method": "kfed", "dataset": "digits", "imbalance": 5.0, "num-clients": 3})
    parts = [local_partition(cfg, pid, 3) for pid in range(3)]
    full = load_dataset("digits", imbalance=5.0, seed=0)
    assert sum(len(p.indices) for p in parts) == full.n_samples - full.n_samples % 3


def test_bad_imbalance_values_name_the_problem() -> None:
    with pytest.raises(DatasetError, match="imbalance must be >= 1"):
        load_dataset("digits", imbalance=0.5)
