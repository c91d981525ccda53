"""Label-free clustering metrics and cluster keywords from per-cluster sums, so no sample leaves a client.

Real data has no labels, so a run is judged by internal criteria of the global clustering. The protocol
always takes two passes:

1. each client sends `cluster_sums` (per cluster: row count and feature sum); the server merges them
   (`merge_cluster_sums`) and gets the pooled cluster means (`pooled_means`);
2. the server broadcasts the means and pooled counts; each client sends `distance_sums` (per cluster:
   sums of Euclidean and squared distances to the pooled mean, plus its simplified-silhouette sum); the
   server merges them (`merge_distance_sums`) and calls `label_free_metrics`.

Squared distances are taken around the pooled means in pass 2 rather than derived from sums of squares
(sum ||x||^2 - n ||mu||^2 cancels catastrophically when the data carry a large offset), so inertia,
Calinski-Harabasz and Davies-Bouldin equal scikit-learn's on the pooled data to rounding. Clusters no
row takes are ignored, as scikit-learn only sees the labels present.

For text methods, `cluster_term_counts` / `merge_term_counts` / `ctfidf_keywords` name each cluster by
c-TF-IDF over per-cluster document frequencies, dropping locally rare terms before anything is sent.
How these statistics travel in Flower metrics is the report protocol's (`fedapp.report.stages`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedapp.features.bow import Tokenizer
from fedapp.maths.chunks import as_float, row_chunks

LabelFreeMetrics = dict[str, float | int | list[int] | None]


class LabelFreeError(ValueError):
    """Features, labels or per-cluster sums that cannot give label-free metrics."""


def _frozen_array(values: Any, name: str, ndim: int, kinds: str, dtype: type) -> np.ndarray:
    """A read-only copy of `values` as `dtype`, after checking its dimensionality, kind and finiteness."""
    array = np.asarray(values)
    if array.ndim != ndim:
        raise LabelFreeError(f"{name} must be {ndim}-d, got shape {array.shape}")
    if array.size and array.dtype.kind not in kinds:
        raise LabelFreeError(f"{name} must have dtype kind in {kinds!r}, got {array.dtype}")
    array = np.array(array, dtype=dtype)
    if not np.all(np.isfinite(array)):
        raise LabelFreeError(f"{name} holds NaN or infinite values")
    array.flags.writeable = False
    return array


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise LabelFreeError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _check_labels(labels: Any, n_rows: int, k: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != n_rows:
        raise LabelFreeError(f"labels must be 1-d with {n_rows} entries, got shape {labels.shape}")
    if labels.size and labels.dtype.kind not in "iu":
        raise LabelFreeError(f"labels must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64, copy=False)
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise LabelFreeError(f"labels must lie in [0, {k}), got [{labels.min()}, {labels.max()}]")
    return labels


def _check_features(features: Any) -> np.ndarray:
    """Real, finite 2-d features; float32 stays float32 (the sums convert a chunk at a time)."""
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[1] < 1:
        raise LabelFreeError(f"features must be 2-d (rows x dims, dims >= 1), got shape {features.shape}")
    if features.size and features.dtype.kind not in "iuf":
        raise LabelFreeError(f"features must be real numbers, got dtype {features.dtype}")
    features = as_float(features)
    if not all(np.isfinite(features[rows]).all() for rows in row_chunks(*features.shape)):
        raise LabelFreeError("features hold NaN or infinite values")
    return features


@dataclass(frozen=True)
class ClusterSums:
    """Pass 1: per-cluster row counts and feature sums of one client, or the merge of several."""

    counts: np.ndarray  # (K,) int64, >= 0
    sums: np.ndarray  # (K, D) float64; zero rows where counts are 0

    def __post_init__(self) -> None:
        counts = _frozen_array(self.counts, "counts", 1, "iu", np.int64)
        sums = _frozen_array(self.sums, "sums", 2, "iuf", np.float64)
        if counts.size < 1 or sums.shape[0] != counts.size or sums.shape[1] < 1:
            raise LabelFreeError(f"counts {counts.shape} and sums {sums.shape} must be (K,) and (K, D>=1)")
        if np.any(counts < 0):
            raise LabelFreeError("counts must be non-negative")
        if np.any(sums[counts == 0] != 0):
            raise LabelFreeError("an empty cluster has a non-zero feature sum")
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "sums", sums)


def cluster_sums(features: np.ndarray, labels: np.ndarray, k: int) -> ClusterSums:
    """Client side, pass 1: count and feature sum of each of the `k` clusters on this client."""
    k = _check_k(k)
    features = _check_features(features)
    labels = _check_labels(labels, features.shape[0], k)
    sums = np.zeros((k, features.shape[1]), dtype=np.float64)
    for rows in row_chunks(*features.shape):
        chunk, chunk_labels = features[rows], labels[rows]
        for cluster in np.unique(chunk_labels):  # NumPy's pairwise summation within a chunk, in float64
            sums[cluster] += chunk[chunk_labels == cluster].sum(axis=0, dtype=np.float64)
    return ClusterSums(np.bincount(labels, minlength=k).astype(np.int64), sums)


def _check_mergeable(shapes: list[tuple[int, ...]], what: str, dims: str) -> None:
    """Clients' parts merge element-wise: at least one, all of one shape (`dims` names its axes)."""
    if not shapes:
        raise LabelFreeError(f"no {what} to merge")
    for index, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise LabelFreeError(f"part {index} has {dims} = {shape}, part 0 has {shapes[0]}")


def merge_cluster_sums(parts: Iterable[ClusterSums]) -> ClusterSums:
    """Server side: element-wise sum of the clients' pass-1 sums = the sums of the pooled data."""
    parts = list(parts)
    _check_mergeable([part.sums.shape for part in parts], "cluster sums", "(K, D)")
    counts = np.sum([part.counts for part in parts], axis=0)
    return ClusterSums(counts, np.sum([part.sums for part in parts], axis=0))


def pooled_means(sums: ClusterSums) -> np.ndarray:
    """Server side: (K, D) mean of each cluster's pooled rows; empty clusters get zero rows (see counts)."""
    means = np.zeros_like(sums.sums)
    used = sums.counts > 0
    means[used] = sums.sums[used] / sums.counts[used, None]
    return means


def between_cluster_sum(sums: ClusterSums) -> float:
    """Server side: SSB = sum_k n_k ||mu_k - mu||^2, the spread between the clusters' pooled means (the
    rows' spread around their mean is SSW + SSB)."""
    used = sums.counts > 0
    n = int(sums.counts.sum())
    if not n:
        return 0.0
    means = pooled_means(sums)[used]
    grand_mean = sums.sums.sum(axis=0) / n
    return float(np.sum(sums.counts[used] * ((means - grand_mean) ** 2).sum(axis=1)))


@dataclass(frozen=True)
class DistanceSums:
    """Pass 2: per-cluster distance sums around the pooled means, and the simplified-silhouette sum."""

    distance_sums: np.ndarray  # (K,) sum of ||x - mu_k|| over cluster k's rows
    squared_sums: np.ndarray  # (K,) sum of ||x - mu_k||^2 over cluster k's rows
    silhouette_sum: float  # sum over rows of the simplified silhouette, in [-n, n]
    n: int  # number of rows

    def __post_init__(self) -> None:
        distances = _frozen_array(self.distance_sums, "distance_sums", 1, "iuf", np.float64)
        squared = _frozen_array(self.squared_sums, "squared_sums", 1, "iuf", np.float64)
        if distances.size < 1 or squared.shape != distances.shape:
            raise LabelFreeError(f"distance_sums {distances.shape} and squared_sums {squared.shape} differ")
        if np.any(distances < 0) or np.any(squared < 0):
            raise LabelFreeError("distance sums must be non-negative")
        if isinstance(self.n, bool) or not isinstance(self.n, int | np.integer) or self.n < 0:
            raise LabelFreeError(f"n must be a non-negative integer, got {self.n!r}")
        if isinstance(self.silhouette_sum, bool) or not isinstance(self.silhouette_sum, int | float):
            raise LabelFreeError(f"silhouette_sum must be a real number, got {self.silhouette_sum!r}")
        if not math.isfinite(self.silhouette_sum) or abs(self.silhouette_sum) > self.n:
            raise LabelFreeError(f"silhouette_sum {self.silhouette_sum} is not finite or outside [-n, n]")
        object.__setattr__(self, "distance_sums", distances)
        object.__setattr__(self, "squared_sums", squared)
        object.__setattr__(self, "silhouette_sum", float(self.silhouette_sum))
        object.__setattr__(self, "n", int(self.n))


def distance_sums(
    features: np.ndarray,
    labels: np.ndarray,
    means: np.ndarray,
    counts: np.ndarray,
    rows: np.ndarray | None = None,
) -> DistanceSums:
    """Client side, pass 2: distances of this client's rows to the pooled means `means` (K, D).

    `rows` (a boolean mask over `features`): only those rows count, `labels` holding theirs; a chunk is
    selected at a time, so a memory-mapped file is not copied (the report's privacy floor leaves some out).

    `counts` are the pooled counts, telling which clusters are non-empty: only those are candidates for
    the silhouette's nearest other cluster. The simplified silhouette of a row (Hruschka et al. 2004) is
    s = (b - a) / max(a, b), a = ||x - mu_own||, b = min over other non-empty k of ||x - mu_k||, with
    s = 0 where a = b = 0; it is summed here and is 0 when fewer than two clusters are non-empty.
    """
    means = _frozen_array(means, "means", 2, "iuf", np.float64)
    counts = _frozen_array(counts, "counts", 1, "iu", np.int64)
    k = means.shape[0]
    if counts.shape != (k,) or k < 1:
        raise LabelFreeError(f"counts {counts.shape} must be ({k},) for means {means.shape}")
    features = _check_features(features)
    if features.shape[1] != means.shape[1]:
        raise LabelFreeError(f"features have {features.shape[1]} dims, means have {means.shape[1]}")
    if rows is not None and (rows.dtype != bool or rows.shape != (features.shape[0],)):
        raise LabelFreeError(f"rows must be a boolean mask of {features.shape[0]} entries, got {rows.shape}")
    labels = _check_labels(labels, features.shape[0] if rows is None else int(rows.sum()), k)
    if not labels.size:
        return DistanceSums(np.zeros(k), np.zeros(k), 0.0, 0)
    if not np.all(counts[labels] > 0):
        raise LabelFreeError("a row is labelled with a cluster whose pooled count is 0")
    used = np.flatnonzero(counts > 0)
    distance_per_cluster, squared_per_cluster, silhouette_sum = np.zeros(k), np.zeros(k), 0.0
    taken = 0  # labels of the rows before this chunk that count
    for chunk_rows in row_chunks(features.shape[0], max(used.size, features.shape[1])):
        if rows is None:
            x, chunk_labels = features[chunk_rows], labels[chunk_rows]
        else:
            keep = rows[chunk_rows]
            x, chunk_labels = features[chunk_rows][keep], labels[taken : taken + int(keep.sum())]
            taken += chunk_labels.size
        chunk = _chunk_distance_sums(x, chunk_labels, means, used)
        distance_per_cluster += chunk[0]
        squared_per_cluster += chunk[1]
        silhouette_sum += chunk[2]
    silhouette_sum = float(np.clip(silhouette_sum, -labels.size, labels.size))
    return DistanceSums(distance_per_cluster, squared_per_cluster, silhouette_sum, int(labels.size))


def _chunk_distance_sums(
    features: np.ndarray, labels: np.ndarray, means: np.ndarray, used: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """`distance_sums` of one chunk of rows: (distance sums, squared sums, silhouette sum)."""
    k = means.shape[0]
    x = np.asarray(features, dtype=np.float64)
    # Own-cluster distances as explicit differences, not ||x||^2 - 2 x.mu + ||mu||^2, which cancels for
    # data with a large offset: inertia, Calinski-Harabasz and Davies-Bouldin rest on them.
    offset = x - means[labels]
    squared = np.einsum("nd,nd->n", offset, offset)
    a = np.sqrt(squared)
    distance_sums_ = np.bincount(labels, weights=a, minlength=k)
    squared_sums = np.bincount(labels, weights=squared, minlength=k)
    if used.size < 2:
        return distance_sums_, squared_sums, 0.0
    # The silhouette's nearest other mean: one product around the means' centre (which removes a common
    # offset); its rounding only moves b, in a ratio summed over all rows.
    centre = means[used].mean(0)
    x = x - centre
    others = means[used] - centre
    d2 = (x * x).sum(1)[:, None] - 2.0 * x @ others.T + (others * others).sum(1)[None, :]
    d2[np.arange(labels.size), np.searchsorted(used, labels)] = np.inf
    b = np.sqrt(np.maximum(d2.min(axis=1), 0.0))
    largest = np.maximum(a, b)
    s = np.divide(b - a, largest, out=np.zeros_like(a), where=largest > 0)
    return distance_sums_, squared_sums, float(s.sum())


def merge_distance_sums(parts: Iterable[DistanceSums]) -> DistanceSums:
    """Server side: element-wise sum of the clients' pass-2 sums = the sums over the pooled data."""
    parts = list(parts)
    _check_mergeable([part.distance_sums.shape for part in parts], "distance sums", "K")
    return DistanceSums(
        np.sum([part.distance_sums for part in parts], axis=0),
        np.sum([part.squared_sums for part in parts], axis=0),
        math.fsum(part.silhouette_sum for part in parts),
        sum(part.n for part in parts),
    )


def approximate_cluster_sums(sizes: np.ndarray, sums: np.ndarray) -> ClusterSums:
    """Server side: `ClusterSums` from totals that are only approximately counts (differentially private
    noise, SecAgg+'s quantisation): counts rounded and clamped at 0, sums zeroed where a count is 0."""
    sizes = _frozen_array(sizes, "sizes", 1, "iuf", np.float64)
    sums = np.array(_frozen_array(sums, "sums", 2, "iuf", np.float64))
    counts = np.maximum(np.rint(sizes), 0).astype(np.int64)
    if sums.shape[0] != counts.size:
        raise LabelFreeError(f"sizes {counts.shape} and sums {sums.shape} must be (K,) and (K, D)")
    sums[counts == 0] = 0.0
    return ClusterSums(counts, sums)


def approximate_distance_sums(
    distances: np.ndarray, squared: np.ndarray, silhouette_sum: float, counts: np.ndarray
) -> DistanceSums:
    """Server side: `DistanceSums` from approximate totals (noise, quantisation) for the pooled `counts`:
    negative sums clamped at 0, clusters with count 0 zeroed, n = the pooled count, silhouette in [-n, n]."""
    counts = _frozen_array(counts, "counts", 1, "iu", np.int64)
    empty = counts == 0
    distances = np.where(empty, 0.0, np.maximum(_frozen_array(distances, "distances", 1, "iuf", float), 0.0))
    squared = np.where(empty, 0.0, np.maximum(_frozen_array(squared, "squared", 1, "iuf", float), 0.0))
    n = int(counts.sum())
    return DistanceSums(distances, squared, float(np.clip(silhouette_sum, -n, n)), n)


def label_free_metrics(sums: ClusterSums, distances: DistanceSums) -> LabelFreeMetrics:
    """Server side: inertia, Calinski-Harabasz, Davies-Bouldin, simplified silhouette, cluster sizes.

    CH, DB and the silhouette are None where scikit-learn refuses them: fewer than 2 or as many
    non-empty clusters as rows. Degenerate values follow scikit-learn (CH = 1 when all clusters are
    single points repeated; DB = 0 when all spreads or all centroid gaps are ~0).
    """
    counts = sums.counts
    k = counts.size
    if distances.distance_sums.shape != (k,):
        raise LabelFreeError(f"distance sums have K = {distances.distance_sums.size}, cluster sums {k}")
    n = int(counts.sum())
    if distances.n != n:
        raise LabelFreeError(f"pass 2 covered {distances.n} rows, pass 1 counted {n}")
    used = counts > 0
    if np.any(distances.distance_sums[~used] != 0) or np.any(distances.squared_sums[~used] != 0):
        raise LabelFreeError("an empty cluster has non-zero distance sums")
    n_used = int(used.sum())
    within = float(distances.squared_sums.sum())  # inertia, SSW
    metrics: LabelFreeMetrics = {
        "inertia": within,
        "calinski_harabasz": None,
        "davies_bouldin": None,
        "simplified_silhouette": None,
        "n_clusters_used": n_used,
        "cluster_sizes": [int(c) for c in counts],
    }
    if not 2 <= n_used < n:
        return metrics
    means = pooled_means(sums)[used]
    sizes = counts[used].astype(np.float64)
    # Calinski & Harabasz 1974: CH = [SSB / (K - 1)] / [SSW / (n - K)], SSB = sum_k n_k ||mu_k - mu||^2.
    between = between_cluster_sum(sums)
    metrics["calinski_harabasz"] = (
        1.0 if within == 0.0 else between * (n - n_used) / (within * (n_used - 1.0))
    )
    # Davies & Bouldin 1979: DB = mean_i max_{j != i} (S_i + S_j) / M_ij, S_i = mean ||x - mu_i|| over
    # cluster i, M_ij = ||mu_i - mu_j||.
    spread = distances.distance_sums[used] / sizes
    gaps = np.sqrt(((means[:, None, :] - means[None, :, :]) ** 2).sum(axis=2))
    if np.allclose(spread, 0) or np.allclose(gaps, 0):
        metrics["davies_bouldin"] = 0.0
    else:
        gaps[gaps == 0] = np.inf  # as scikit-learn: coincident centroids (and i = j) contribute 0
        metrics["davies_bouldin"] = float(np.mean(np.max((spread[:, None] + spread) / gaps, axis=1)))
    metrics["simplified_silhouette"] = distances.silhouette_sum / n
    return metrics


def cluster_term_counts(
    texts: Sequence[str],
    labels: np.ndarray,
    k: int,
    *,
    min_documents: int = 5,
    tokenizer: Tokenizer | None = None,
) -> list[dict[str, int]]:
    """Client side: per cluster, term -> number of this client's documents of that cluster containing it.

    Terms in fewer than `min_documents` of a cluster's local documents are dropped here, before anything
    leaves the client, so no sent term can point at a single record. Merged counts are therefore lower
    bounds of the pooled document frequencies.
    """
    k = _check_k(k)
    if isinstance(min_documents, bool) or not isinstance(min_documents, int) or min_documents < 1:
        raise LabelFreeError(f"min_documents must be a positive integer, got {min_documents!r}")
    labels = _check_labels(labels, len(texts), k)
    tokenizer = tokenizer or Tokenizer()
    per_cluster: list[Counter[str]] = [Counter() for _ in range(k)]
    for index, (text, cluster) in enumerate(zip(texts, labels.tolist(), strict=True)):
        if not isinstance(text, str):
            raise LabelFreeError(f"document {index} is a {type(text).__name__}, not a string")
        per_cluster[cluster].update(set(tokenizer(text)))
    return [
        {term: count for term, count in sorted(counts.items()) if count >= min_documents}
        for counts in per_cluster
    ]


def check_term_counts(term_counts: Any, what: str) -> list[dict[str, int]]:
    """`term_counts` if it is one term -> count (>= 1) dict per cluster; LabelFreeError naming `what`."""
    if not isinstance(term_counts, list) or not all(isinstance(c, dict) for c in term_counts):
        raise LabelFreeError(f"{what} must be a list of one term -> count dict per cluster")
    for cluster, counts in enumerate(term_counts):
        for term, count in counts.items():
            if not isinstance(term, str) or not term:
                raise LabelFreeError(f"{what}, cluster {cluster}: term {term!r} is not a non-empty string")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise LabelFreeError(f"{what}, cluster {cluster}: count {count!r} of {term!r} is not >= 1")
    return term_counts


def merge_term_counts(parts: Iterable[list[dict[str, int]]]) -> list[dict[str, int]]:
    """Server side: per-cluster sums of the clients' term counts (all parts must have the same K)."""
    parts = [check_term_counts(part, f"part {index}") for index, part in enumerate(parts)]
    if not parts:
        raise LabelFreeError("no term counts to merge")
    k = len(parts[0])
    merged: list[Counter[str]] = [Counter() for _ in range(k)]
    for index, part in enumerate(parts):
        if len(part) != k:
            raise LabelFreeError(f"part {index} has {len(part)} clusters, part 0 has {k}")
        for cluster, counts in enumerate(part):
            merged[cluster].update(counts)
    return [dict(sorted(counts.items())) for counts in merged]


def ctfidf_keywords(term_counts: list[dict[str, int]], top_n: int = 10) -> list[list[str]]:
    """Server side: the `top_n` terms of each cluster by class-based TF-IDF (Grootendorst 2022, Eq. 1).

    W_{t,c} = tf_{t,c} * log(1 + A / f_t), tf_{t,c} = count_{t,c} / sum_t count_{t,c}, f_t = sum_c
    count_{t,c}, A = mean over clusters that hold any term of sum_t count_{t,c} (BERTopic's topics are
    never empty). Ties go to the alphabetically first term; a cluster without terms gets [].
    """
    term_counts = check_term_counts(term_counts, "term counts")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise LabelFreeError(f"top_n must be a positive integer, got {top_n!r}")
    totals = [sum(counts.values()) for counts in term_counts]
    non_empty = [total for total in totals if total > 0]
    if not non_empty:
        return [[] for _ in term_counts]
    average = sum(non_empty) / len(non_empty)
    frequency: Counter[str] = Counter()
    for counts in term_counts:
        frequency.update(counts)
    keywords = []
    for counts, total in zip(term_counts, totals, strict=True):
        scores = {
            term: count / total * math.log(1.0 + average / frequency[term]) for term, count in counts.items()
        }
        keywords.append(sorted(scores, key=lambda term: (-scores[term], term))[:top_n])
    return keywords
