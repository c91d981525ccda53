"""The privacy floor: no message carries a statistic of fewer than `min-cluster-size` records.

A cluster centre, sum or count of one record is that record. Whoever runs the server writes the run
config, so the client cannot trust it to keep clusters large (`kfed.local-k=100000` once made every
client upload all its rows): the client enforces the floor itself. The floor is the largest of the
client's own default (`CLIENT_MIN_CLUSTER`), the node's `min-cluster-size` (node config) and the run
config's `min-cluster-size`, so the run config can raise it but never lower it.

Clients (1) cap their local cluster count at n // floor, (2) merge a cluster below the floor into its
nearest neighbour (by centre) until every cluster they report holds at least `floor` records, and (3)
withhold (report as empty) what still falls below it — e.g. a fuzzy cluster whose membership mass is
smaller than the floor. They say how many clusters they merged or withheld in their reply's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedapp.maths.clustering import kmeans

CLIENT_MIN_CLUSTER = 5  # a client never reports a statistic of fewer records, whatever the run config says
MERGED_KEY = "floor-merged"  # reply metrics: clusters this client merged into a neighbour (below the floor)
WITHHELD_KEY = "floor-withheld"  # reply metrics: clusters this client reported as empty (below the floor)


class PrivacyFloorError(ValueError):
    """This client holds fewer records than the floor: it has nothing it may send."""


def min_cluster_size(run_value: int, node_config: Mapping[str, object]) -> int:
    """The floor this client enforces: max(its default, the node's, the run config's)."""
    node_value = node_config.get("min-cluster-size", 0)
    try:
        node_floor = int(node_value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise PrivacyFloorError(f"node config min-cluster-size={node_value!r} is not an integer") from None
    return max(CLIENT_MIN_CLUSTER, node_floor, int(run_value))


def capped_clusters(k_local: int, n_records: int, floor: int) -> int:
    """k' at most n // floor (so that k' clusters of at least `floor` records can exist)."""
    if n_records < floor:
        raise PrivacyFloorError(
            f"{n_records} records, fewer than the privacy floor min-cluster-size={floor}: nothing may be sent"
        )
    return max(1, min(k_local, n_records // floor))


def merge_small_clusters(points: np.ndarray, labels: np.ndarray, floor: int) -> tuple[np.ndarray, int]:
    """Relabel the rows of every cluster below `floor` to the cluster whose centre is nearest to its
    centre, smallest cluster first, until every non-empty cluster holds >= floor rows (or one is left).
    Returns (labels, number of clusters merged away)."""
    labels = np.asarray(labels, dtype=np.int64).copy()
    points = np.asarray(points)  # float32 stays float32: the means below are taken in float64
    merged = 0
    while True:
        present, sizes = np.unique(labels, return_counts=True)
        if len(present) <= 1 or sizes.min() >= floor:
            return labels, merged
        small = present[np.argmin(sizes)]
        centres = np.stack([points[labels == c].mean(0, dtype=np.float64) for c in present])
        own = centres[present == small][0]
        distances = ((centres - own) ** 2).sum(1)
        distances[present == small] = np.inf
        labels[labels == small] = present[np.argmin(distances)]
        merged += 1


def merge_small_sums(sums: np.ndarray, counts: np.ndarray, floor: int) -> tuple[np.ndarray, np.ndarray, int]:
    """`merge_small_clusters` on per-cluster (sums, counts) instead of rows, for a partition too large to
    relabel in memory (`fedapp.maths.clustering.sampled_kmeans`): the same merges in the same order (a
    cluster's centre is its sum / count). Empty clusters are dropped. Returns (sums, counts, merged)."""
    present = np.asarray(counts) > 0
    sums = np.array(sums, dtype=np.float64)[present]
    counts = np.array(counts, dtype=np.int64)[present]
    merged = 0
    while len(counts) > 1 and counts.min() < floor:
        small = int(np.argmin(counts))
        centres = sums / counts[:, None]
        distances = ((centres - centres[small]) ** 2).sum(1)
        distances[small] = np.inf
        into = int(np.argmin(distances))
        sums[into] += sums[small]
        counts[into] += counts[small]
        sums, counts = np.delete(sums, small, axis=0), np.delete(counts, small)
        merged += 1
    return sums, counts, merged


def floored_kmeans(
    points: np.ndarray, k_local: int, seed: int, floor: int, n_init: int = 10
) -> tuple[np.ndarray, np.ndarray, int]:
    """Local k-means whose every cluster holds >= floor records: k' = min(k_local, n // floor), clusters
    below the floor merged into their nearest neighbour. Returns (centres, counts, clusters merged);
    without a merge the centres are k-means' own, a merged cluster's centre is the mean of its rows."""
    centres, labels = kmeans(points, capped_clusters(k_local, points.shape[0], floor), seed, n_init=n_init)
    labels, merged = merge_small_clusters(points, labels, floor)
    if merged:
        kept = np.unique(labels)
        centres = np.stack([points[labels == c].mean(0, dtype=np.float64) for c in kept])
        labels = np.searchsorted(kept, labels)
    return centres, np.bincount(labels, minlength=len(centres)).astype(np.int64), merged
