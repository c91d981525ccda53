"""Choosing k without labels from one upload of local centres and one round of summable statistics.

Nobody knows k for a site's own unlabelled file, and a sweep of whole runs over k would multiply the
cost by the number of candidates. The protocol here adds two rounds to any horizontal method:

A. each client sends k-FED's local step in the method's representation space: k' = `k_max` floored
   local k-means centres and their sizes (`local_summary`; the privacy floor caps k' at n // floor and
   merges smaller clusters, `fedapp.privacy.floor`). The server clusters the size-weighted union of all
   clients' centres once for every candidate k in [k_min, k_max] (`candidate_centres`).
B. the server broadcasts every candidate's centres at once; each client assigns its rows to the nearest
   centre of each candidate and returns, per candidate and cluster, the row count, feature sum, sum of
   distances and of squared distances to the candidate centre, and the simplified-silhouette sum
   (`candidate_statistics`). All are sums, so the server merges them by addition (SecAgg+ could too);
   a cluster holding fewer than the privacy floor of a client's rows is withheld by that client.

The server then scores each candidate (`candidate_criteria`) with `fedapp.metrics.label_free`: the
squared distances are moved exactly from the candidate centre c to the pooled mean mu by
sum ||x - mu||^2 = sum ||x - c||^2 - n ||mu - c||^2 (both terms arrive in round B), so inertia and
Calinski-Harabasz are those of the pooled clustering; Davies-Bouldin's spreads and the silhouette are
taken around c (one Lloyd step away from mu). `choose_k` applies the documented rule (`RULE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedapp.maths.clustering import kmeans, squared_distances
from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    label_free_metrics,
    merge_cluster_sums,
    merge_distance_sums,
    pooled_means,
)
from fedapp.privacy.floor import floored_kmeans

DEFAULT_K_MIN, DEFAULT_K_MAX = 2, 30
SERVER_RESTARTS = 10  # k-means++ restarts of the server's clustering of the union, per candidate
CRITERIA = ("simplified_silhouette", "calinski_harabasz", "davies_bouldin")
RULE = "davies_bouldin"  # see `choose_k` (validated on the benchmarks in docs/model-selection.md)


class SelectionError(ValueError):
    """Settings or statistics from which no k can be chosen."""


def check_range(k_min: int, k_max: int) -> None:
    """A candidate range the criteria can score: 2 <= k_min <= k_max (one line naming both)."""
    if not 2 <= k_min <= k_max:
        raise SelectionError(f"k-min={k_min}, k-max={k_max}: need 2 <= k-min <= k-max")


def local_summary(X: np.ndarray, k_max: int, seed: int, floor: int) -> tuple[np.ndarray, np.ndarray]:
    """Client, round A: (centres (k', D), sizes (k',)) of a floored local k-means with k' <= k_max."""
    centres, counts, _ = floored_kmeans(np.asarray(X, dtype=np.float64), k_max, seed, floor)
    return centres, counts


def candidate_centres(
    centres: Sequence[np.ndarray], sizes: Sequence[np.ndarray], k_min: int, k_max: int, seed: int
) -> dict[int, np.ndarray]:
    """Server, after round A: for every k in [k_min, min(k_max, number of centres)], the k centres of a
    size-weighted k-means over the union of the clients' local centres (k-FED's server step)."""
    check_range(k_min, k_max)
    union = np.concatenate([np.asarray(c, dtype=np.float64) for c in centres])
    weights = np.concatenate([np.asarray(s, dtype=np.float64) for s in sizes])
    if union.shape[0] < k_min:
        raise SelectionError(f"the clients sent {union.shape[0]} local centres, fewer than k-min={k_min}")
    top = min(k_max, union.shape[0])
    return {
        k: kmeans(union, k, seed, sample_weight=weights, n_init=SERVER_RESTARTS)[0]
        for k in range(k_min, top + 1)
    }


@dataclass(frozen=True)
class CandidateStats:
    """Round B for one candidate: pass-1 sums and distance sums around the candidate's own centres."""

    sums: ClusterSums
    distances: DistanceSums


def _statistics(X: np.ndarray, centres: np.ndarray, floor: int) -> CandidateStats:
    """Counts, sums, distance and squared-distance sums to `centres`, and the simplified silhouette, of
    the rows whose cluster holds at least `floor` of this client's rows (the others are withheld)."""
    k = centres.shape[0]
    squared = squared_distances(X, centres)
    labels = squared.argmin(1)
    kept = np.bincount(labels, minlength=k)[labels] >= floor
    X, squared, labels = X[kept], squared[kept], labels[kept]
    rows = np.arange(X.shape[0])
    counts = np.bincount(labels, minlength=k).astype(np.int64)
    sums = np.zeros_like(centres)
    np.add.at(sums, labels, X)
    own_sq = squared[rows, labels]
    distance = np.sqrt(squared)
    a = distance[rows, labels]
    others = distance.copy()
    others[rows, labels] = np.inf
    b = others.min(1) if k > 1 else a
    largest = np.maximum(a, b)
    s = np.divide(b - a, largest, out=np.zeros_like(a), where=largest > 0)
    distances = DistanceSums(
        np.bincount(labels, weights=a, minlength=k),
        np.bincount(labels, weights=own_sq, minlength=k),
        float(np.clip(s.sum(), -X.shape[0], X.shape[0])),
        int(X.shape[0]),
    )
    return CandidateStats(ClusterSums(counts, sums), distances)


def candidate_statistics(
    X: np.ndarray, candidates: dict[int, np.ndarray], floor: int = 1
) -> dict[int, CandidateStats]:
    """Client, round B: this client's statistics for every candidate at once (all of them sums); a
    cluster with fewer than the privacy `floor` of its rows is sent as empty (its rows left out)."""
    X = np.asarray(X, dtype=np.float64)
    return {k: _statistics(X, centres, floor) for k, centres in candidates.items()}


def merge_statistics(parts: Sequence[dict[int, CandidateStats]]) -> dict[int, CandidateStats]:
    """Server: the element-wise sums of the clients' round-B statistics, per candidate."""
    if not parts:
        raise SelectionError("no round-B statistics to merge")
    return {
        k: CandidateStats(
            merge_cluster_sums(part[k].sums for part in parts),
            merge_distance_sums(part[k].distances for part in parts),
        )
        for k in parts[0]
    }


def candidate_criteria(stats: CandidateStats, centres: np.ndarray) -> dict[str, float | None]:
    """Server: inertia, CH, DB and the simplified silhouette of one candidate (module docstring)."""
    counts = stats.sums.counts
    shift = ((pooled_means(stats.sums) - centres) ** 2).sum(1) * counts  # n_k ||mu_k - c_k||^2
    squared = np.maximum(stats.distances.squared_sums - shift, 0.0) * (counts > 0)
    moved = DistanceSums(
        stats.distances.distance_sums, squared, stats.distances.silhouette_sum, stats.distances.n
    )
    metrics = label_free_metrics(stats.sums, moved)
    return {name: metrics[name] for name in ("inertia", *CRITERIA)} | {
        "clusters_used": metrics["n_clusters_used"]
    }  # type: ignore[return-value]


def choose_k(table: dict[int, dict[str, float | None]], rule: str = RULE) -> int:
    """The chosen k: `davies_bouldin` (the default) takes the smallest DB, `silhouette` the largest
    simplified silhouette, `calinski_harabasz` the largest CH; ties go to the smaller k. Candidates a
    criterion cannot score (fewer than two non-empty clusters) are skipped. On the benchmarks DB came
    within 5 NMI of the true k's clustering most often (docs/model-selection.md); CH always chose 2."""
    name = {"silhouette": "simplified_silhouette"}.get(rule, rule)
    if name not in CRITERIA:
        raise SelectionError(f"unknown rule {rule!r}; one of silhouette, calinski_harabasz, davies_bouldin")
    sign = -1.0 if name == "davies_bouldin" else 1.0
    scored = [(sign * float(row[name]), -k) for k, row in table.items() if row.get(name) is not None]
    if not scored:
        raise SelectionError("no candidate k could be scored (every candidate has one non-empty cluster)")
    return -max(scored)[1]


@dataclass(frozen=True)
class Selection:
    """The outcome: every candidate's criteria, the rule and the chosen k (tune.json, summary.json)."""

    table: dict[int, dict[str, float | None]]
    rule: str
    k: int

    def to_json(self) -> dict[str, object]:
        rows = [{"k": k, **row} for k, row in sorted(self.table.items())]
        return {"rule": self.rule, "chosen_k": self.k, "candidates": rows}


def select_k(
    client_rows: Sequence[np.ndarray], k_min: int, k_max: int, seed: int, floor: int, rule: str = RULE
) -> tuple[Selection, dict[int, np.ndarray]]:
    """Both rounds over in-memory clients (tests, benchmarks, the CLI's driver): the selection and every
    candidate's centres."""
    summaries = [local_summary(X, k_max, seed + index, floor) for index, X in enumerate(client_rows)]
    candidates = candidate_centres([c for c, _ in summaries], [s for _, s in summaries], k_min, k_max, seed)
    merged = merge_statistics([candidate_statistics(X, candidates, floor) for X in client_rows])
    table = {k: candidate_criteria(merged[k], candidates[k]) for k in candidates}
    return Selection(table, rule, choose_k(table, rule)), candidates


def view_consensus(choices: Sequence[int]) -> int:
    """Vertical federations: every party chooses k on its own view of all the records (`select_k` over
    its rows alone) and the run takes the mean of their choices, rounded (halves down). A single view
    sees some clusters merged (k too small: HW's and BDGP's views often choose 2) and others split (HW's
    widest views 20 and 23); the mean balances the two where the medians take one side. Measured on the
    three multi-view sets with a known k (docs/model-selection.md), which is all the support it has."""
    if not choices:
        raise SelectionError("no party chose a k")
    return int(np.ceil(np.mean([int(k) for k in choices]) - 0.5))
