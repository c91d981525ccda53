"""Choosing k without labels from one upload of local centres and one round of summable statistics.

Nobody knows k for a site's own unlabelled file, and a sweep of whole runs over k would multiply the
cost by the number of candidates. The protocol here adds two rounds to any horizontal method:

A. each client sends k-FED's local step in the method's representation space: k' floored local k-means
   centres and their sizes (`local_summary`; k' from `local_k`, so that the union holds about
   `UNION_PER_K` centres per candidate k; the privacy floor caps k' at n // floor and merges smaller
   clusters, `fedapp.privacy.floor`). The server clusters the size-weighted union of all clients' centres
   once for every candidate k (`candidate_ks`: every k up to `DENSE_UP_TO`, a geometric grid beyond),
   the candidates (`candidate_centres`), and, for the stability of each k, clusters `SPLITS` pairs of
   disjoint random halves of that union (`split_centres`): two clusterings each that saw different data.
B. the server broadcasts every candidate's centres and the split pairs at once; each client assigns its
   rows to the nearest centre of each and returns, per candidate and cluster, the row count, feature
   sum, sum of distances and of squared distances to the candidate centre, the simplified-silhouette
   sum, and per split pair the contingency table of its rows under the pair's two clusterings
   (`candidate_statistics`). All are sums, so the server merges them by addition (SecAgg+ could too);
   a cluster holding fewer than the privacy floor of a client's rows is withheld by that client.

The server then scores each candidate (`candidate_criteria`): the label-free criteria of
`fedapp.metrics.label_free` (squared distances moved exactly from the candidate centre c to the pooled
mean mu by sum ||x - mu||^2 = sum ||x - c||^2 - n ||mu - c||^2, so inertia and Calinski-Harabasz are those
of the pooled clustering; Davies-Bouldin's spreads and the silhouette taken around c), and the
**stability**: the adjusted Rand index between the two clusterings of each split pair over every record
of the federation, averaged over the pairs (Ben-Hur, Elisseeff & Guyon 2002; Lange et al. 2004: a k that
matches structure in the data is found again from other data, a k that cuts through a cluster is not).
Stability alone is fooled by the shape of a cloud without clusters: 2-means splits an elongated Gaussian
the same way every time. So the server also measures it on **nulls** of the same shape (`null_rows`: a
Gaussian and a uniform box, each with the union's between-centre covariance plus the clients'
within-centre spread, from round A's centres, sizes and each client's sum of squared norms), split over
clients of the same sizes, through the same pipeline, and takes per k the more stable of the two
(Tibshirani, Walther & Hastie's gap statistic and Lange et al.'s normalisation do the same with a
reference distribution). The rule works on the excess, (s - s0) / (1 - s0), so a k is chosen for
structure the data has beyond its shape; no extra round, the nulls cost the server's CPU. The verdict
also compares the spread each k's clusters leave within them (`spread_left`, of the total) with the
nulls': Tibshirani et al.'s gap, normalised by the null's own reduction (`gap`). It is a mean over every
record, so it lacks the stability's noise from one draw: a box's halves may split alike by chance, but its
clusters are no tighter than a box's.
`choose_k` applies the rule (`RULE`); `confidence` says how sure it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedapp.maths.clustering import kmeans, nearest_centre, squared_distances
from fedapp.metrics.label_free import (
    ClusterSums,
    DistanceSums,
    between_cluster_sum,
    cluster_sums,
    label_free_metrics,
    merge_cluster_sums,
    merge_distance_sums,
    pooled_means,
)
from fedapp.privacy.floor import floored_kmeans

DEFAULT_K_MIN, DEFAULT_K_MAX = 2, 30
DENSE_UP_TO = 30  # every k up to here is a candidate; beyond it a geometric grid (`candidate_ks`)
GRID_RATIO = 1.1  # the grid's step beyond DENSE_UP_TO: k grows by ~10 % (NMI moves little in such a step)
UNION_PER_K = 10  # round A: the clients' local centres together number ~10 per candidate k (`local_k`)
SERVER_RESTARTS = 10  # k-means++ restarts of the server's clustering of the union, per candidate
SPLIT_RESTARTS = 3  # and of each half of a split pair
SPLITS = 4  # pairs of disjoint halves of the union whose clusterings are compared (`split_centres`)
LOCAL_RESTARTS_ABOVE = 100  # local k' above this: 3 restarts instead of 10 (cost grows with k' x restarts)
CRITERIA = ("stability", "simplified_silhouette", "calinski_harabasz", "davies_bouldin")
RULES = ("stability", "silhouette", "calinski_harabasz", "davies_bouldin")
RULE = "stability"  # see `choose_k` (validated leaving one dataset out: docs/model-selection.md)


@dataclass(frozen=True)
class StabilityRule:
    """The stability rule's constants. The choice: the largest k whose stability beyond the null
    (`excess`) is within `tolerance` of the best. The verdict is weak where the best excess is below
    `weak_below`; where the chosen k's stability exceeds its null's by less than `raw_below` (a cloud of
    yet another shape may split as reproducibly); where a k above 2k scores within `ambiguity` of the
    chosen one, or (with `ambiguity` on) beats its null by more agreement than the chosen k does
    (`raw_gain`: the excess's division favours few clusters, whose null splits reproducibly too), both
    structure at two scales (a k below k/2 as stable is only reported, `coarser`: merging separated
    clusters is as reproducible as finding them); or where one direction holds
    `dominant_above` of the data's spread (features on different scales: any clustering slices that
    direction); or where the ks within `tolerance` of the best reach below `plateau_below` times the
    chosen k (the data do not decide within that range) unless the gap settles the plateau
    (`gap_settles`: the chosen k's `depth` at least `plateau_settled` of the range's deepest, the range
    reaching twice the chosen k); or where the chosen k's clusters are tighter than
    the null's by a `gap` below `gap_below` (the stability beyond the null was noise); or where a smaller k
    about as stable (within `tolerance` of the best) has a `prediction_strength` at least
    `strength_margin` above the chosen k's (it reproduces every one of its clusters, the chosen k cuts
    some of them differently from one half of the data to the other). All were chosen
    leaving one dataset out (`simulation.bench.selection --loo`, docs/model-selection.md): each
    benchmark's row there uses the constants fitted on the others; these defaults are the fit on all of
    them. Off (None) is a check the fit found no use for; `strength_margin` is off because adding it to
    the fit made the leave-one-out table worse (a structureless cloud strong), docs/model-selection.md."""

    tolerance: float = 0.03
    weak_below: float = 0.2
    raw_below: float = 0.0
    ambiguity: float | None = 0.2
    dominant_above: float | None = 0.8
    plateau_below: float | None = 0.67
    gap_below: float | None = 0.2
    strength_margin: float | None = None
    plateau_settled: float | None = 0.95


STABILITY_RULE = StabilityRule()
NULL_FLOOR = 0.05  # `excess` divides by the null's instability 1 - s0, at least this (a null reproduced to
# within 5 % of pairs leaves nothing to measure beyond it)
EXTEND_FACTOR = 2  # a choice on the top of the range doubles k-max (`KChoice`, `fedapp tune`)
NULL_ROWS = 10_000  # the null's records at most (the federation's count below that)


class SelectionError(ValueError):
    """Settings or statistics from which no k can be chosen."""


def check_range(k_min: int, k_max: int) -> None:
    """A candidate range the criteria can score: 2 <= k_min <= k_max (one line naming both)."""
    if not 2 <= k_min <= k_max:
        raise SelectionError(f"k-min={k_min}, k-max={k_max}: need 2 <= k-min <= k-max")


def candidate_ks(k_min: int, k_max: int) -> list[int]:
    """Every k in [k_min, DENSE_UP_TO], then a geometric grid (ratio GRID_RATIO) up to k_max, k_max
    included: the candidates whose statistics round B asks for (k = 2..240 is 29 + 23 candidates)."""
    check_range(k_min, k_max)
    ks = list(range(k_min, min(k_max, DENSE_UP_TO) + 1))
    k = float(max(ks[-1], k_min)) if ks else float(k_min)
    while ks and ks[-1] < k_max:
        k *= GRID_RATIO
        step = min(max(int(round(k)), ks[-1] + 1), k_max)
        ks.append(step)
    if not ks:  # k_min beyond the dense part: the grid from k_min
        ks, k = [k_min], float(k_min)
        while ks[-1] < k_max:
            k *= GRID_RATIO
            ks.append(min(max(int(round(k)), ks[-1] + 1), k_max))
    return ks


def local_k(k_max: int, clients: int) -> int:
    """Round A's local k' per client before the privacy floor's cap: at least k_max, and enough for the
    union of `clients` clients' centres to hold UNION_PER_K per candidate k (stability needs each half
    of the union to hold several centres per cluster): 30 on 10 clients, 100 on 3, at k-max 30."""
    return max(k_max, -(-UNION_PER_K * k_max // max(clients, 1)))


def local_summary(X: np.ndarray, k_local: int, seed: int, floor: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Client, round A: (centres (k', D), sizes (k',)) of a floored local k-means with k' <= k_local, and
    the sum of the rows' squared norms (with the centres and sizes it gives the spread around them)."""
    restarts = 10 if k_local <= LOCAL_RESTARTS_ABOVE else 3
    X = np.asarray(X, dtype=np.float64)
    centres, counts, _ = floored_kmeans(X, k_local, seed, floor, n_init=restarts)
    return centres, counts, float(np.einsum("ij,ij->", X, X))


def _union(centres: Sequence[np.ndarray], sizes: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    union = np.concatenate([np.asarray(c, dtype=np.float64) for c in centres])
    weights = np.concatenate([np.asarray(s, dtype=np.float64) for s in sizes])
    return union, weights


def largest_candidate(union_size: int) -> int:
    """The largest k the union of local centres can score: each half of a split pair must hold k."""
    return union_size // 2


def candidate_centres(
    centres: Sequence[np.ndarray], sizes: Sequence[np.ndarray], ks: Sequence[int], seed: int
) -> dict[int, np.ndarray]:
    """Server, after round A: for every k in `ks` the union can score (`largest_candidate`), the k
    centres of a size-weighted k-means over the union of the clients' local centres (k-FED's server
    step)."""
    union, weights = _union(centres, sizes)
    usable = [k for k in ks if k <= largest_candidate(union.shape[0])]
    if not usable:
        raise SelectionError(
            f"the clients sent {union.shape[0]} local centres: too few for k-min={min(ks)} "
            "(each half of the union must hold k; the privacy floor caps a client's centres at n / floor)"
        )
    return {k: kmeans(union, k, seed, sample_weight=weights, n_init=SERVER_RESTARTS)[0] for k in usable}


def split_centres(
    centres: Sequence[np.ndarray],
    sizes: Sequence[np.ndarray],
    ks: Sequence[int],
    seed: int,
    splits: int = SPLITS,
) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Server, after round A: for every k, `splits` pairs of centre sets, each pair clustered (size-weighted
    k-means) from two disjoint random halves of the union of local centres."""
    union, weights = _union(centres, sizes)
    rng = np.random.default_rng([seed, 0x5B])
    halves = []
    for _ in range(splits):
        order = rng.permutation(union.shape[0])
        halves.append((order[: union.shape[0] // 2], order[union.shape[0] // 2 :]))
    out: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for k in ks:
        pairs = []
        for index, (a, b) in enumerate(halves):
            fit_a = kmeans(union[a], k, seed + index, sample_weight=weights[a], n_init=SPLIT_RESTARTS)[0]
            fit_b = kmeans(union[b], k, seed + index, sample_weight=weights[b], n_init=SPLIT_RESTARTS)[0]
            pairs.append((fit_a, fit_b))
        out[k] = pairs
    return out


NULL_SHAPES = ("gauss", "box")


def _cloud(
    centres: Sequence[np.ndarray], sizes: Sequence[np.ndarray], squares: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The federation's shape from round A: (mean, singular values and principal axes of the size-weighted
    between-centre spread, the within-centre spread per record: sum ||x||^2 - sum n_j ||c_j||^2, over n)."""
    union, weights = _union(centres, sizes)
    mean, singular, axes = principal_axes(union, weights)
    within = max(float(np.sum(squares)) - float(weights @ (union**2).sum(1)), 0.0) / float(weights.sum())
    return mean, singular, axes, within


def principal_axes(union: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The size-weighted mean of the union of local centres, and the singular values and principal axes
    of their between-centre spread, the axes signed canonically (`canonical_axes`)."""
    n = float(weights.sum())
    mean = weights @ union / n
    factor = np.sqrt(weights / n)[:, None] * (union - mean)  # factor.T @ factor = between-centre covariance
    _, singular, axes = np.linalg.svd(factor, full_matrices=False)
    return mean, singular, canonical_axes(axes)


def canonical_axes(axes: np.ndarray) -> np.ndarray:
    """Each principal axis with its largest-magnitude coordinate positive (scikit-learn's `svd_flip` on V):
    an SVD's signs depend on the BLAS (its thread count), and a flipped axis mirrors the null's seeded
    draws along it: another cloud."""
    pivot = np.argmax(np.abs(axes), axis=1)
    signs = np.sign(axes[np.arange(axes.shape[0]), pivot])
    return axes * np.where(signs == 0, 1.0, signs)[:, None]


def null_rows(
    centres: Sequence[np.ndarray],
    sizes: Sequence[np.ndarray],
    squares: Sequence[float],
    seed: int,
    limit: int = NULL_ROWS,
    shape: str = "gauss",
) -> list[np.ndarray]:
    """A null: one structureless cloud with the federation's mean and covariance, as rows of clients of
    the same relative sizes (at most `limit` rows in all); `gauss` a Gaussian, `box` a uniform box along
    the principal axes (Tibshirani et al.'s gap reference), which a k-means splits more reproducibly.
    The covariance is the size-weighted covariance of the union of local centres (the between-centre
    part, of rank <= the union's size) plus the clients' spread around their centres,
    W = sum ||x||^2 - sum n_j ||c_j||^2, spread evenly over the dimensions."""
    if shape not in NULL_SHAPES:
        raise SelectionError(f"unknown null shape {shape!r}; one of {', '.join(NULL_SHAPES)}")
    mean, singular, axes, within = _cloud(centres, sizes, squares)
    spread = np.sqrt(within / mean.shape[0])
    rng = np.random.default_rng([seed, 0x0B, NULL_SHAPES.index(shape)])
    rows = [int(np.sum(s)) for s in sizes]
    take = [max(1, int(round(r * min(1.0, limit / sum(rows))))) for r in rows]
    root3 = np.sqrt(3.0)  # U(-sqrt 3, sqrt 3) has unit variance

    def unit(size: tuple[int, int]) -> np.ndarray:
        return rng.standard_normal(size) if shape == "gauss" else rng.uniform(-root3, root3, size)

    out = []
    for count in take:
        draws = (unit((count, len(singular))) * singular) @ axes
        out.append(mean + draws + spread * unit((count, mean.shape[0])))
    return out


def _stronger_null(nulls: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """Per k, the null a structure must beat: the more stable of the clouds, and the smaller spread any
    of them leaves within its clusters."""
    stabilities = [v for null in nulls if (v := null.get("stability")) is not None]
    spreads = [v for null in nulls if (v := null.get("spread_left")) is not None]
    return {"null_stability": max(stabilities, default=None), "null_spread_left": min(spreads, default=None)}


def dominance(centres: Sequence[np.ndarray], sizes: Sequence[np.ndarray], squares: Sequence[float]) -> float:
    """The share of the data's spread along its main direction, in the null's covariance (`null_rows`):
    near 1 when one feature's scale dwarfs the others' (raw sizes beside ratios), where any clustering
    slices that one direction."""
    mean, singular, _, within = _cloud(centres, sizes, squares)  # within: a trace, spread evenly
    between = singular**2
    total = float(between.sum()) + within
    main = float(between[0]) if between.size else 0.0
    return 0.0 if total <= 0 else (main + within / mean.shape[0]) / total


def null_statistics(
    rows: Sequence[np.ndarray], ks: Sequence[int], k_local: int, floor: int, seed: int
) -> dict[int, dict[str, float | None]]:
    """Each k's `stability` and `spread_left` on the null's clients (`null_rows`), through rounds A and B
    as the real clients run them: their local centres, the candidates and split pairs from that union,
    agreement and spread over the null's rows."""
    summaries = [local_summary(X, k_local, seed + index, floor) for index, X in enumerate(rows)]
    centres, sizes = [c for c, _, _ in summaries], [s for _, s, _ in summaries]
    largest = largest_candidate(sum(len(c) for c in centres))
    usable = [k for k in ks if k <= largest]
    pairs = split_centres(centres, sizes, usable, seed)
    fitted = candidate_centres(centres, sizes, usable, seed) if usable else {}
    pooled = np.concatenate(rows)
    out: dict[int, dict[str, float | None]] = {k: {"stability": None, "spread_left": None} for k in ks}
    for k in usable:
        agreement = sum(_agreement(X, pairs[k]) for X in rows)
        out[k] = {"stability": stability(agreement)[0], "spread_left": _spread_left(pooled, fitted[k])}
    return out


def _spread_left(X: np.ndarray, centres: np.ndarray) -> float | None:
    """The share of the rows' spread around their mean left within the clusters of their nearest centres
    (each cluster around its own mean, as the data's `spread_left`)."""
    labels = nearest_centre(X, centres)
    clusters = cluster_sums(X, labels, centres.shape[0])
    within = float(((X - pooled_means(clusters)[labels]) ** 2).sum())
    return _share_left(within, between_cluster_sum(clusters))


def _share_left(within: float, between: float) -> float | None:
    """The share of the spread left within the clusters, SSW / (SSW + SSB); None: no spread at all."""
    total = within + between
    return within / total if total > 0 else None


def _agreement(X: np.ndarray, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The split pairs' contingency tables over the rows X (splits, k, k)."""
    k = pairs[0][0].shape[0] if pairs else 0
    agreement = np.zeros((len(pairs), k, k), dtype=np.int64)
    for index, (fit_a, fit_b) in enumerate(pairs):
        np.add.at(agreement[index], (nearest_centre(X, fit_a), nearest_centre(X, fit_b)), 1)
    return agreement


@dataclass(frozen=True)
class CandidateStats:
    """Round B for one candidate: pass-1 sums and distance sums around the candidate's own centres, and
    the contingency tables (splits, k, k) of the split pairs' two clusterings."""

    sums: ClusterSums
    distances: DistanceSums
    agreement: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))


def _statistics(
    X: np.ndarray, centres: np.ndarray, floor: int, pairs: Sequence[tuple[np.ndarray, np.ndarray]]
) -> CandidateStats:
    """Counts, sums, distance and squared-distance sums to `centres`, and the simplified silhouette, of
    the rows whose cluster holds at least `floor` of this client's rows (the others are withheld); the
    split pairs' contingency tables over every row (counts of rows, no values)."""
    k = centres.shape[0]
    agreement = _agreement(X, pairs) if pairs else np.zeros((0, k, k), dtype=np.int64)
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
    return CandidateStats(ClusterSums(counts, sums), distances, agreement)


def candidate_statistics(
    X: np.ndarray,
    candidates: dict[int, np.ndarray],
    floor: int = 1,
    pairs: dict[int, list[tuple[np.ndarray, np.ndarray]]] | None = None,
) -> dict[int, CandidateStats]:
    """Client, round B: this client's statistics for every candidate at once (all of them sums); a
    cluster with fewer than the privacy `floor` of its rows is sent as empty (its rows left out)."""
    X = np.asarray(X, dtype=np.float64)
    pairs = pairs or {}
    return {k: _statistics(X, centres, floor, pairs.get(k, [])) for k, centres in candidates.items()}


def merge_statistics(parts: Sequence[dict[int, CandidateStats]]) -> dict[int, CandidateStats]:
    """Server: the element-wise sums of the clients' round-B statistics, per candidate."""
    if not parts:
        raise SelectionError("no round-B statistics to merge")
    return {
        k: CandidateStats(
            merge_cluster_sums(part[k].sums for part in parts),
            merge_distance_sums(part[k].distances for part in parts),
            sum((part[k].agreement for part in parts), np.zeros_like(parts[0][k].agreement)),
        )
        for k in parts[0]
    }


def adjusted_rand(table: np.ndarray) -> float | None:
    """Hubert & Arabie's adjusted Rand index from a contingency table (as scikit-learn's
    `adjusted_rand_score`); None for fewer than two rows."""
    table = np.asarray(table, dtype=np.float64)
    n = table.sum()
    if n < 2:
        return None

    def pairs(x: np.ndarray) -> float:
        return float((x * (x - 1.0)).sum() / 2.0)

    both, rows, cols = pairs(table), pairs(table.sum(1)), pairs(table.sum(0))
    expected = rows * cols / (n * (n - 1.0) / 2.0)
    ceiling = (rows + cols) / 2.0
    return 1.0 if ceiling == expected else (both - expected) / (ceiling - expected)


def stability(agreement: np.ndarray) -> tuple[float | None, float | None]:
    """The mean adjusted Rand index of the split pairs' clusterings over every record, and its standard
    error over the pairs (None, None: no pairs)."""
    scores = [adjusted_rand(table) for table in agreement]
    scores = [s for s in scores if s is not None]
    if not scores:
        return None, None
    error = float(np.std(scores, ddof=1) / np.sqrt(len(scores))) if len(scores) > 1 else 0.0
    return float(np.mean(scores)), error


def prediction_strength(agreement: np.ndarray) -> float | None:
    """Tibshirani & Walther's (2005) prediction strength from the split pairs' contingency tables: for
    each cluster of one clustering, the share of its pairs of records the other clustering also puts
    together; the smallest over the clusters (of at least two records) and both directions, averaged over
    the pairs. Where the adjusted Rand index averages over every record, this asks the worst cluster: a k
    that cuts one true cluster differently in each half keeps a high ARI but a low prediction strength."""
    scores = []
    for table in np.asarray(agreement, dtype=np.float64):
        sides = []
        for counts in (table, table.T):
            sizes = counts.sum(1)
            held = sizes >= 2
            if held.any():
                together = (counts * (counts - 1.0)).sum(1)[held]
                sides.append(float((together / (sizes[held] * (sizes[held] - 1.0))).min()))
        if sides:
            scores.append(min(sides))
    return float(np.mean(scores)) if scores else None


def candidate_criteria(stats: CandidateStats, centres: np.ndarray) -> dict[str, float | None]:
    """Server: inertia, stability, CH, DB and the simplified silhouette of one candidate (module
    docstring)."""
    counts = stats.sums.counts
    shift = ((pooled_means(stats.sums) - centres) ** 2).sum(1) * counts  # n_k ||mu_k - c_k||^2
    squared = np.maximum(stats.distances.squared_sums - shift, 0.0) * (counts > 0)
    moved = DistanceSums(
        stats.distances.distance_sums, squared, stats.distances.silhouette_sum, stats.distances.n
    )
    metrics = label_free_metrics(stats.sums, moved)
    mean, error = stability(stats.agreement)
    return {
        "inertia": metrics["inertia"],
        "spread_left": _share_left(float(metrics["inertia"]), between_cluster_sum(stats.sums)),
        "stability": mean,
        "stability_error": error,
        "prediction_strength": prediction_strength(stats.agreement),
        **{name: metrics[name] for name in CRITERIA if name != "stability"},  # type: ignore[misc]
        "clusters_used": metrics["n_clusters_used"],
    }


def _criterion(rule: str) -> str:
    name = {"silhouette": "simplified_silhouette"}.get(rule, rule)
    if name not in CRITERIA:
        raise SelectionError(f"unknown rule {rule!r}; one of {', '.join(RULES)}")
    return name


def excess(row: dict[str, float | None]) -> float | None:
    """A candidate's stability beyond its null's, as a share of the null's instability (Lange et al.'s
    normalisation): (s - s0) / (1 - s0), 1 where the data's clusterings agree perfectly, 0 where they
    agree no better than a structureless cloud of the data's shape (the raw stability without a null)."""
    raw, null = row.get("stability"), row.get("null_stability")
    if raw is None:
        return None
    return raw if null is None else (raw - null) / max(1.0 - null, NULL_FLOOR)


def gap(row: dict[str, float | None]) -> float | None:
    """How much tighter a candidate's clusters are than a structureless cloud's of the data's shape: the
    gap of Tibshirani, Walther & Hastie, log of the share of the spread the null's clustering leaves
    within its clusters minus log of the data's (`spread_left`), divided by the null's own -log share, as
    the stability's `excess` is by the null's instability. 0: no tighter than the cloud; 1: the data's
    clusters cut its log spread twice as deep. The division makes it comparable across spaces: in 384
    dimensions of sentence embeddings a few clusters leave most of the spread, and the plain gap is small.
    Unlike the stability, a mean over every record: one draw's noise does not move it (a box's halves
    may split alike by chance; its clusters are no tighter than the box null's)."""
    deeper = depth(row)
    return None if deeper is None else deeper / -float(np.log(row["null_spread_left"]))  # type: ignore[arg-type]


def depth(row: dict[str, float | None]) -> float | None:
    """How much deeper a candidate's clusters cut the data's log spread than a structureless cloud's:
    Tibshirani, Walther & Hastie's gap itself, log of the null's share left minus log of the data's
    (`gap` divides it by the null's own -log share). Across the candidates it rises while new clusters
    find structure and flattens where they only cut the clusters found (the gap statistic's choice)."""
    data, null = row.get("spread_left"), row.get("null_spread_left")
    if data is None or null is None or not (data > 0 and 0 < null < 1):
        return None
    return float(np.log(null) - np.log(data))


def raw_gain(row: dict[str, float | None]) -> float | None:
    """A candidate's stability minus its null's, unnormalised. `excess` divides it by the null's
    instability, which is small for few clusters (a cloud splits in two almost as reproducibly as the
    data): a coarse level can top the excess while a finer one beats its null by more."""
    raw, null = row.get("stability"), row.get("null_stability")
    return None if raw is None or null is None else raw - null


def no_tighter(row: dict[str, float | None], constants: StabilityRule) -> bool:
    """The candidate's clusters cut the spread barely deeper than a cloud's (`gap` below `gap_below`)."""
    tighter = gap(row)
    return constants.gap_below is not None and tighter is not None and tighter < constants.gap_below


def choose_k(
    table: dict[int, dict[str, float | None]], rule: str = RULE, constants: StabilityRule = STABILITY_RULE
) -> int:
    """The chosen k. `stability` (the default): the largest k whose stability beyond the null
    (`excess`) is within `constants.tolerance` of the best candidate's: a k past the data's structure cuts
    clusters at random and loses stability, while among equally stable ks the larger keeps more apart
    (NMI falls faster when clusters merge than when they split). `davies_bouldin` takes the smallest DB,
    `silhouette` the largest simplified silhouette, `calinski_harabasz` the largest CH (ties: the smaller
    k). Candidates a criterion cannot score (fewer than two non-empty clusters) are skipped."""
    name = _criterion(rule)
    values = {k: excess(row) if name == "stability" else row.get(name) for k, row in table.items()}
    scored = {k: float(v) for k, v in values.items() if v is not None}
    if not scored:
        raise SelectionError("no candidate k could be scored (every candidate has one non-empty cluster)")
    if name == "stability":
        top = max(scored.values())
        return max(k for k, value in scored.items() if value >= top - constants.tolerance)
    sign = -1.0 if name == "davies_bouldin" else 1.0
    return -max((sign * value, -k) for k, value in scored.items())[1]


def structureless(
    table: dict[int, dict[str, float | None]], chosen: int, constants: StabilityRule = STABILITY_RULE
) -> bool:
    """No candidate is stable beyond the null (best excess <= `weak_below`), or the chosen k beats its null
    by under `raw_below` or its clusters are no tighter than the null's (`gap` under `gap_below`): more
    candidates would not help, so the range is not extended."""
    scored = [float(v) for row in table.values() if (v := excess(row)) is not None]
    row = table[chosen]
    if not scored or max(scored) <= constants.weak_below:
        return True
    if no_tighter(row, constants):
        return True
    null = row.get("null_stability")
    return null is not None and row["stability"] - null < constants.raw_below  # type: ignore[operator]


def gap_settles(
    table: dict[int, dict[str, float | None]], chosen: int, constants: StabilityRule = STABILITY_RULE
) -> bool:
    """The gap statistic backs the chosen k on a plateau of equally stable ks: its `depth` is within
    `plateau_settled` of the deepest over the range, and the range reaches twice the chosen k (the span
    the two-scales checks look at), so the depth was seen not to grow much further. A depth still growing
    (data with finer structure: HW's digits split into sub-styles) or a choice near the top of the
    range (nothing seen beyond it) does not settle the plateau."""
    depths = {k: d for k, row in table.items() if (d := depth(row)) is not None}
    if constants.plateau_settled is None or chosen not in depths or max(table) < 2 * chosen:
        return False
    deepest = max(depths.values())
    return deepest > 0 and depths[chosen] >= constants.plateau_settled * deepest


def confidence(
    table: dict[int, dict[str, float | None]],
    chosen: int,
    constants: StabilityRule = STABILITY_RULE,
    dominance: float | None = None,
) -> dict[str, object]:
    """How sure the choice is, from the stability beyond the null (`excess`) whatever the rule: the chosen
    k's, the best one's, the ks within the tolerance of the best (the plateau the data does not decide
    within), the runner-up ks (the best others outside the chosen k's neighbours), and the verdict with its
    reason (`StabilityRule`; `dominance`: the share of the data's spread along its main direction)."""
    scored = {k: float(v) for k, row in table.items() if (v := excess(row)) is not None}
    if not scored:
        return {"verdict": "weak", "why": "no candidate's stability could be measured"}
    top = max(scored.values())
    plateau = sorted(k for k, v in scored.items() if v >= top - constants.tolerance)
    others = sorted((k for k in scored if abs(k - chosen) > max(1, chosen // 10)), key=lambda k: -scored[k])[
        :2
    ]
    row = table[chosen]
    # a far larger k about as stable casts doubt (the chosen k may merge clusters); a far smaller one
    # does not: merging whole separated clusters is as reproducible as finding them (a nested level)
    rival = max((k for k in scored if k > 2 * chosen), key=lambda k: scored[k], default=None)
    # and the far larger k that beats its null by the most agreement, unnormalised (`raw_gain`)
    gains = {k: g for k in scored if k > 2 * chosen and (g := raw_gain(table[k])) is not None}
    finer = max(gains.items(), key=lambda item: item[1], default=None)
    coarser = sorted(
        k for k in scored if k < chosen / 2 and scored[k] >= scored[chosen] - constants.tolerance
    )
    strengths = {k: float(v) for k in plateau if (v := table[k].get("prediction_strength")) is not None}
    settled = gap_settles(table, chosen, constants)
    weakness = _weakness(
        scored, chosen, row, plateau, (rival, finer), constants, dominance, strengths, settled
    )
    verdict = "strong" if weakness is None else "weak"
    why = weakness or (
        f"k = {chosen}'s clusterings agree {row.get('stability'):.2f}, "
        f"{scored.get(chosen, 0.0):.2f} of the way from a structureless cloud of the data's shape to "
        "full agreement"
        + (
            f"; every k from {plateau[0]} to {plateau[-1]} is about as stable, and the gap to a cloud "
            f"stops growing at {chosen}"
            if settled and plateau[0] < chosen
            else ""
        )
    )
    return {
        "verdict": verdict,
        "why": why,
        "stability": row.get("stability"),
        "null_stability": row.get("null_stability"),
        "excess": scored.get(chosen),
        "gap": gap(row),
        "best_excess": top,
        "plateau": [plateau[0], plateau[-1]],
        "runner_up": others,
        **({"coarser": coarser} if coarser else {}),
        **({"dominance": round(dominance, 4)} if dominance is not None else {}),
    }


def _weakness(
    scored: dict[int, float],
    chosen: int,
    row: dict[str, float | None],
    plateau: list[int],
    rivals: tuple[int | None, tuple[int, float] | None],
    constants: StabilityRule,
    dominance: float | None,
    strengths: dict[int, float],
    settled: bool,
) -> str | None:
    """Why the choice is weak (`StabilityRule`'s checks, the first that holds), or None: strong.
    `rivals`: the k above twice the chosen one with the best excess, and the one with the best
    `raw_gain` with that gain; `strengths`: the prediction strength of the ks on the plateau; `settled`:
    the gap settles the plateau (`gap_settles`), so the plateau check stands down."""
    top = max(scored.values())
    rival, finer = rivals
    gain = raw_gain(row)
    if top <= constants.weak_below:
        return f"no candidate k is stable beyond a structureless cloud of the data's shape (best {top:.2f})"
    if gain is not None and gain < constants.raw_below:
        return (
            f"k = {chosen}'s clusterings agree {row['stability']:.2f}, a cloud of the data's shape without "
            f"clusters {row['null_stability']:.2f}: too close to tell structure from shape"
        )
    if no_tighter(row, constants):
        return (
            f"k = {chosen}'s clusters leave {row['spread_left']:.1%} of the data's spread, a cloud of the "
            f"data's shape without clusters {row['null_spread_left']:.1%}: no tighter than its shape gives"
        )
    if (
        constants.dominant_above is not None
        and dominance is not None
        and dominance >= constants.dominant_above
    ):
        return (
            f"one direction holds {dominance:.0%} of the data's spread, so any clustering slices it "
            "(features on different scales? try scaling = zscore)"
        )
    if (
        constants.ambiguity is not None
        and rival is not None
        and scored[rival] >= scored[chosen] - constants.ambiguity
    ):
        return (
            f"k = {rival} is about as stable ({scored[rival]:.2f} against {scored[chosen]:.2f}): "
            "structure at two scales"
        )
    if constants.ambiguity is not None and finer is not None and gain is not None and finer[1] > gain:
        return (
            f"k = {finer[0]} beats a structureless cloud of the data's shape by more agreement than k = "
            f"{chosen} ({finer[1]:.2f} against {gain:.2f}): structure at two scales"
        )
    if constants.plateau_below is not None and plateau[0] < constants.plateau_below * chosen and not settled:
        return (
            f"every k from {plateau[0]} to {plateau[-1]} is about as stable (within {constants.tolerance:g} "
            f"of the best): the data do not decide within that range"
        )
    if constants.strength_margin is not None and chosen in strengths:
        own = strengths[chosen]
        sharper = [k for k in strengths if k < chosen and strengths[k] >= own + constants.strength_margin]
        if sharper:
            best = max(sharper, key=lambda k: strengths[k])
            return (
                f"k = {best} is about as stable and reproduces each of its clusters better (prediction "
                f"strength {strengths[best]:.2f} against {own:.2f}): the data do not decide between them"
            )
    return None


@dataclass(frozen=True)
class Selection:
    """The outcome: every candidate's criteria, the rule, the chosen k and how sure it is (tune.json,
    summary.json)."""

    table: dict[int, dict[str, float | None]]
    rule: str
    k: int
    confidence: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        rows = [{"k": k, **row} for k, row in sorted(self.table.items())]
        return {"rule": self.rule, "chosen_k": self.k, "confidence": self.confidence, "candidates": rows}


class KSearch:
    """The choice over one or more passes of rounds A and B: a choice on the top of the range doubles
    k-max (`EXTEND_FACTOR`) and asks again for the new candidates only, until the choice lies inside the
    range, `extend` is off, or the union of local centres cannot score a larger k (the privacy floor caps
    each client's local centres at n / floor). The server's side of `KChoice` and `select_k`."""

    def __init__(
        self,
        k_min: int,
        k_max: int,
        rule: str = RULE,
        *,
        floor: int = 1,
        extend: bool = True,
        constants: StabilityRule = STABILITY_RULE,
    ) -> None:
        check_range(k_min, k_max)
        _criterion(rule)
        self.k_min, self.k_max, self.rule, self.floor, self.extend = k_min, k_max, rule, floor, extend
        self.constants = constants
        self.requested_max = k_max
        self.table: dict[int, dict[str, float | None]] = {}
        self.candidates: dict[int, np.ndarray] = {}
        self.passes = 0
        self.rows: list[int] = []  # each client's record count (its round-A sizes' sum, as in k-FED)
        self.null: dict[int, dict[str, float | None]] = {}  # this pass's null statistics per candidate
        self.dominance: float | None = None  # the first pass's share of the spread on the main direction
        self.capped: int | None = None  # the largest k the clients' local centres allow, when below k-max

    def pending(self) -> list[int]:
        """The candidate ks of the current range not scored yet (round B of this pass)."""
        return [k for k in candidate_ks(self.k_min, self.k_max) if k not in self.table]

    def local_k(self, clients: int) -> int:
        """Round A's k' per client for this pass (`local_k`)."""
        return local_k(self.k_max, clients)

    def plan(
        self,
        centres: Sequence[np.ndarray],
        sizes: Sequence[np.ndarray],
        seed: int,
        squares: Sequence[float] | None = None,
    ) -> tuple[dict[int, np.ndarray], dict[int, list[tuple[np.ndarray, np.ndarray]]]]:
        """After round A: the pending candidates the union can score and their split pairs ({} when the
        union can score none of them: an extension the privacy floor stopped), and, from the clients'
        sums of squared norms, the null's stability of the same candidates (`null_stability`)."""
        self.rows = [int(np.sum(s)) for s in sizes]
        largest = largest_candidate(sum(len(c) for c in centres))
        pending = self.pending()
        usable = [k for k in pending if k <= largest]
        if len(usable) < len(pending):
            self.capped = largest
        if not usable and self.table:
            return {}, {}
        candidates = candidate_centres(centres, sizes, pending, seed + self.passes)
        ks = sorted(candidates)
        self.null = {}
        if squares is not None:
            if self.dominance is None:
                self.dominance = dominance(centres, sizes, squares)
            # structure must beat both clouds (`_stronger_null`)
            k_local = self.local_k(len(centres))
            nulls = [
                null_statistics(
                    null_rows(centres, sizes, squares, seed + self.passes, shape=shape),
                    ks,
                    k_local,
                    self.floor,
                    seed + self.passes,
                )
                for shape in NULL_SHAPES
            ]
            self.null = {k: _stronger_null([null[k] for null in nulls]) for k in ks}
        return candidates, split_centres(centres, sizes, ks, seed + self.passes)

    def take(self, merged: dict[int, CandidateStats], candidates: dict[int, np.ndarray]) -> bool:
        """After round B: score the candidates; True when the range is extended (another pass)."""
        self.passes += 1
        self.candidates.update(candidates)
        for k in candidates:
            self.table[k] = {
                **candidate_criteria(merged[k], candidates[k]),
                **self.null.get(k, _stronger_null([])),
            }
        chosen = choose_k(self.table, self.rule, self.constants)
        if chosen < max(self.table) or not self.extend or self.capped is not None:
            return False
        if structureless(self.table, chosen, self.constants):  # a cloud: more k would not help
            return False
        # the next pass's union, as the floor caps each client's k' (merges may make it smaller still)
        next_max = self.k_max * EXTEND_FACTOR
        union = sum(min(local_k(next_max, len(self.rows)), n // max(self.floor, 1)) for n in self.rows)
        if largest_candidate(union) <= max(self.table):
            self.capped = largest_candidate(union)
            return False
        self.k_max = next_max
        return True

    def selection(self) -> Selection:
        """The outcome of the passes so far, with its confidence and what the range was."""
        chosen = choose_k(self.table, self.rule, self.constants)
        sure = confidence(self.table, chosen, self.constants, self.dominance)
        tried = [min(self.table), max(self.table)]
        sure["range"] = tried
        if chosen == tried[1] and sure["verdict"] == "strong":  # a weak choice says its own why
            if self.capped is not None:
                why = (
                    f"the best k is the largest the clients' local centres allow ({tried[1]}; the privacy "
                    "floor caps a client's centres at n / floor): it may lie beyond"
                )
            else:
                why = f"the best k is the top of the range ({tried[1]}; k-extend = false): it may lie beyond"
            sure.update(verdict="weak", why=why, edge=True)
        if self.passes > 1:
            sure["extended"] = {"from": self.requested_max, "to": tried[1], "passes": self.passes}
        return Selection(self.table, self.rule, chosen, sure)


def select_k(
    client_rows: Sequence[np.ndarray],
    k_min: int,
    k_max: int,
    seed: int,
    floor: int,
    rule: str = RULE,
    *,
    extend: bool = True,
) -> tuple[Selection, dict[int, np.ndarray]]:
    """Both rounds (and their extensions) over in-memory clients (tests, benchmarks, the CLI's driver):
    the selection and every candidate's centres."""
    search = KSearch(k_min, k_max, rule, floor=floor, extend=extend)
    while True:
        k_local = search.local_k(len(client_rows))
        summaries = [local_summary(X, k_local, seed + index, floor) for index, X in enumerate(client_rows)]
        centres, sizes, squares = ([part[i] for part in summaries] for i in range(3))
        candidates, pairs = search.plan(centres, sizes, seed, squares)
        if not candidates:
            return search.selection(), search.candidates
        merged = merge_statistics([candidate_statistics(X, candidates, floor, pairs) for X in client_rows])
        if not search.take(merged, candidates):
            return search.selection(), search.candidates


def view_consensus(choices: Sequence[int]) -> int:
    """Vertical federations: every party chooses k on its own view of all the records (`select_k` over
    its rows alone) and the run takes the mean of their choices, rounded (halves down). A single view
    sees some clusters merged (k too small: HW's and BDGP's views often choose 2) and others split (HW's
    widest views 20 and 23); the mean balances the two where the medians take one side. Measured on the
    three multi-view sets with a known k (docs/model-selection.md), which is all the support it has."""
    if not choices:
        raise SelectionError("no party chose a k")
    return int(np.ceil(np.mean([int(k) for k in choices]) - 0.5))
