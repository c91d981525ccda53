"""FSTC says when sites hold different clusters (label skew), where it was measured far below FSBERT k-FED."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedapp.launch.resolve import build_overrides
from fedapp.maths.fstc import site_skew
from simulation.runner import execute

QUICK = {"fstc.local-iters": 5, "fstc.batch-size": 32, "fstc.warmup-iters": 2, "fstc.label-updates": 1}


def _blobs(rng: np.random.Generator, which: list[int], n: int) -> np.ndarray:
    """n points of the given blobs (centres 10 apart on the axes of R^5), equally many of each."""
    centres = 10.0 * np.eye(5)
    return np.vstack([centres[b] + rng.normal(size=(n // len(which), 5)) for b in which])


def test_site_skew_is_small_for_iid_sites_and_large_when_each_holds_its_own_clusters() -> None:
    rng = np.random.default_rng(0)
    centres = 10.0 * np.eye(5)
    iid = [_blobs(rng, [0, 1, 2, 3, 4], 50) for _ in range(4)]
    skewed = [_blobs(rng, blobs, 50) for blobs in ([0], [1, 2], [3], [4, 0])]
    ones = [np.ones(50) for _ in range(4)]
    assert max(site_skew(iid, ones, centres)) < 0.05
    skews = site_skew(skewed, ones, centres)
    assert min(skews) > 0.45  # the client with two blobs, one of them shared: 0.5
    # a client holding exactly the federation's mix is at 0, whatever the others hold
    assert (
        site_skew([_blobs(rng, [0, 1], 50), _blobs(rng, [0, 1], 50)], ones[:2], centres)
        == [pytest.approx(0.0, abs=1e-12)] * 2
    )


@pytest.mark.parametrize(("partition", "warned"), [("iid", False), ("by-group", True)])
def test_fstc_warns_when_sites_hold_different_clusters(tmp_path: Path, partition: str, warned: bool) -> None:
    overrides = {"method": "fstc", "dataset": "texts-demo", "num-clients": 2, "num-rounds": 2, "seed": 0}
    overrides.update(partition=partition, **QUICK)
    summary = execute(build_overrides(overrides, tmp_path / "out"), "inprocess", quiet=True)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    skew = summary["fstc"]["site_skew"]
    assert (skew > 0.3) if warned else (skew < 0.15)
    assert any("sites hold different clusters" in w for w in summary["warnings"]) == warned
