"""Small clustering kernels shared by several methods (framework-free)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

import numpy as np

from fedapp.maths.chunks import row_chunks
from fedapp.maths.threads import one_blas_thread, one_openmp_thread

# Below this many entries (n_samples x n_features) scikit-learn's OpenMP threads cost more than they save:
# one thread made a 700 x 784 MNIST client's k-means (10 restarts) 2.5x faster on 2 cores (0.31 -> 0.12 s)
# and was still faster at 3,000 x 784; at 5,000 x 784 two threads win. Ray clients already run with
# OMP_NUM_THREADS=1; this is what the in-process engine and the server (k-FED's merge) gain.
SINGLE_THREAD_BELOW = 3_000_000


def squared_distances(X: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """(n, k) squared Euclidean distances (float64) without forming the (n, k, d) difference tensor;
    float32 rows are converted a chunk at a time, not copied whole."""
    centres = np.asarray(centres, dtype=np.float64)
    out = np.empty((len(X), centres.shape[0]), dtype=np.float64)
    for rows in row_chunks(len(X), max(centres.shape[0], np.shape(X)[1])):
        out[rows] = _chunk_squared_distances(X[rows], centres)
    return out


def _chunk_squared_distances(X: np.ndarray, centres: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    d2 = (X * X).sum(1)[:, None] - 2.0 * X @ centres.T + (centres * centres).sum(1)[None, :]
    return np.maximum(d2, 0.0)


def nearest_centre(X: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Index of the closest centre for every row (ties -> lowest index), a chunk of rows at a time."""
    centres = np.asarray(centres, dtype=np.float64)
    labels = np.empty(len(X), dtype=np.int64)
    for rows in row_chunks(len(X), max(centres.shape[0], np.shape(X)[1])):
        labels[rows] = _chunk_squared_distances(X[rows], centres).argmin(1)
    return labels


def kmeans(
    X: np.ndarray, k: int, seed: int, *, sample_weight: np.ndarray | None = None, n_init: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded k-means++ / Lloyd (scikit-learn's); returns (centres (k, d) float64, labels).

    float32 records are copied to float64 for the fit: scikit-learn's k-means++ upcasts float32 in small
    blocks, which made a 250,000 x 32 fit 1.3x slower than the float64 copy (4.2 s against 3.2 s)."""
    # here, not at the top: a ClientApp process (one per message in a deployment) whose message needs no
    # k-means does not pay scikit-learn's ~1 s import; before the thread limit, so that it sees the BLAS
    # scikit-learn loads
    import sklearn.cluster  # noqa: F401

    X = np.array(X, dtype=np.float64, order="C")  # a copy: the fit centres it in place
    if not 1 <= k <= X.shape[0]:
        raise ValueError(f"k-means needs 1 <= k <= n_samples, got k={k}, n_samples={X.shape[0]}")
    if X.size < SINGLE_THREAD_BELOW:  # not thread-safe across concurrent calls; the engines call it serially
        with one_blas_thread():
            return _fit(X, k, seed, sample_weight, n_init, threads=1)
    return _fit(X, k, seed, sample_weight, n_init, threads=None)


def _fit(
    X: np.ndarray, k: int, seed: int, sample_weight: np.ndarray | None, n_init: int, threads: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """`KMeans(k, n_init=n_init, random_state=seed).fit(X, sample_weight)` on dense float64 records, step
    for step (the same tolerance, centring, seeding, Lloyd runs and choice among restarts, so the same
    centres and labels to the last bit: `tests/test_kfed_ffcm.py`), without the estimator's parameter
    validation and thread-pool queries; records and weights are checked as it checks them. 600 x 64,
    k = 30, 3 restarts: 22 -> 16 ms a fit; 300 x 8, k = 10, 10 restarts: 29 -> 23 ms; one `select_k` over
    a 2,000-row cloud on 4 clients: 9.7 -> 5.8-7.3 s. `threads`: Lloyd's OpenMP threads (None:
    scikit-learn's default; 1: the caller also holds one BLAS thread). `X` is centred in place."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    try:
        from sklearn.cluster._k_means_common import _is_same_clustering
        from sklearn.cluster._kmeans import _kmeans_single_lloyd, _tolerance
        from sklearn.utils._openmp_helpers import _openmp_effective_n_threads
    except ImportError:  # a scikit-learn whose private kernels moved: its estimator, the same fit, slower
        from sklearn.cluster import KMeans

        seeds = _kmeans_plusplus(sample_weight)

        def init(X: np.ndarray, n_clusters: int, random_state: np.random.RandomState) -> np.ndarray:
            return seeds(X, n_clusters, random_state)[0]  # one restart a call: the estimator's protocol

        model = KMeans(n_clusters=k, n_init=n_init, random_state=seed, init=init)
        with one_openmp_thread() if threads == 1 else nullcontext():
            model.fit(X, sample_weight=sample_weight)
        return model.cluster_centers_.astype(np.float64), model.labels_.astype(np.int64)

    # the estimator's input checks that matter here: finite records, one finite weight a record
    weights = np.ones(X.shape[0]) if sample_weight is None else np.array(sample_weight, dtype=np.float64)
    if weights.shape != (X.shape[0],):
        raise ValueError(f"k-means needs one weight a record, got {weights.shape} for {X.shape[0]} records")
    if not (np.isfinite(X).all() and np.isfinite(weights).all()):
        raise ValueError("k-means input contains NaN or infinity")
    random_state = np.random.RandomState(seed)
    tol = _tolerance(X, 1e-4)
    mean = X.mean(axis=0)
    X -= mean
    # the checked weights; every restart's start at once (Lloyd draws nothing: the same draws)
    starts = _kmeans_plusplus(weights, uniform=sample_weight is None)(X, k, random_state, n_init)
    lloyd = _kmeans_single_lloyd
    if threads == 1:  # `kmeans` holds one BLAS thread around this fit: skip scikit-learn's own limit, which
        # queries and resets the thread pools at every restart (~10 % of a `select_k`; the same Lloyd)
        lloyd = getattr(lloyd, "__wrapped__", lloyd)
    threads = _openmp_effective_n_threads() if threads is None else threads
    best_inertia, best_labels, best_centres = None, None, None
    for start in starts:
        labels, inertia, centres, _iterations = lloyd(
            X, weights, start, max_iter=300, tol=tol, n_threads=threads
        )
        # a restart replaces the best only with a lower inertia and another partition (scikit-learn's rule)
        if best_inertia is None or (
            inertia < best_inertia and not _is_same_clustering(labels, best_labels, k)
        ):
            best_inertia, best_labels, best_centres = inertia, labels, centres
    assert best_labels is not None and best_centres is not None
    best_centres += mean
    used = np.unique(best_labels).size
    if used < k:  # scikit-learn's warning, as its estimator gives it
        warnings.warn(
            f"Number of distinct clusters ({used}) found smaller than n_clusters ({k}). "
            "Possibly due to duplicate points in X.",
            ConvergenceWarning,
            stacklevel=3,
        )
    return best_centres, best_labels.astype(np.int64)


def _kmeans_plusplus(
    sample_weight: np.ndarray | None, *, uniform: bool | None = None
) -> Callable[[np.ndarray, int, np.random.RandomState, int], np.ndarray]:
    """scikit-learn's (weighted, greedy) k-means++ seeding, step for step: `seeds(X, k, random_state,
    restarts)` gives the starts of `restarts` consecutive restarts, (restarts, k, d).

    The same random draws and the same float64 operations in the same order, so `KMeans` fits the same
    centres as with `init="k-means++"` (`tests/test_kfed_ffcm.py` checks it), without the input checks
    scikit-learn runs at every chosen centre, which were two thirds of a fit on the server's unions of a
    few hundred local centres (600 x 64, k = 30, 3 restarts: 36 -> 21-26 ms a fit; one `select_k` over a
    2,000-row cloud on 4 clients, k = 2..30: 12.7 -> 7.8 s). `uniform` (default: no weights given) says
    every weight is 1, so the cumulative potential skips the product with them (x 1 is exact).

    Lloyd draws nothing, so the restarts' draws are consecutive in the stream: restarts are seeded
    together, a batch at a time (as many as fit `SEED_BATCH_CELLS` candidate distances), one pass of the
    loop choosing a centre for each. The loop runs k - 1 times a batch, not a restart; it is numpy's
    per-call cost on unions of a few hundred rows (600 seedings: 5.1 -> 2.8 s, the same centres to the
    last bit). A batch's matrix products are a stack of the single restart's products, each the same
    BLAS call; the candidates are the counts of partial sums below each draw (`searchsorted`'s left
    side on a non-decreasing row)."""
    uniform = sample_weight is None if uniform is None else uniform

    def seeds(X: np.ndarray, k: int, random_state: np.random.RandomState, restarts: int = 1) -> np.ndarray:
        n = X.shape[0]
        weights = np.ones(n, dtype=X.dtype) if sample_weight is None else np.asarray(sample_weight, X.dtype)
        column, rows_t, last = weights.reshape(-1, 1), X.T, n - 1
        norms = np.einsum("ij,ij->i", X, X)
        trials = 2 + int(np.log(k))
        # `random_state.choice(n, p=weights / weights.sum())`'s first centre: its cdf, one draw a restart
        cdf = (weights / weights.sum()).cumsum()
        cdf /= cdf[-1]
        starts = np.empty((restarts, k, X.shape[1]), dtype=X.dtype)
        batch = max(1, min(restarts, SEED_BATCH_CELLS // (trials * n)))
        draw, cumsum, minimum = random_state.random_sample, np.cumsum, np.minimum
        for begin in range(0, restarts, batch):
            size = min(batch, restarts - begin)
            draws = draw((size, 1 + (k - 1) * trials))  # each restart's draws, one row a restart
            first = cdf.searchsorted(draws[:, 0], side="right")
            in_batch, centres = np.arange(size), starts[begin : begin + size]
            centres[:, 0] = X[first]
            closest = _seed_distances(centres[:, :1], rows_t, norms, norms[first][:, None])[:, 0]
            potential = closest @ weights
            for c in range(1, k):
                # uniform(0, 1) is 0 + 1 x random_sample: the same draws, bit for bit
                targets = draws[:, 1 + (c - 1) * trials : 1 + c * trials] * potential[:, None]
                sums = cumsum(closest if uniform else weights * closest, axis=1)
                if size == 1:  # a batch of one (many records): a binary search, not n comparisons a draw
                    candidates = sums[0].searchsorted(targets[0])[None]
                else:
                    candidates = (sums[:, None, :] < targets[:, :, None]).sum(axis=2)
                minimum(candidates, last, out=candidates)  # rounding can put a draw past the last sum
                chosen = X[candidates]
                distances = _seed_distances(chosen, rows_t, norms, norms[candidates])
                minimum(closest[:, None, :], distances, out=distances)
                potentials = (distances @ column)[:, :, 0]
                best = potentials.argmin(axis=1)
                potential, closest = potentials[in_batch, best], distances[in_batch, best]
                centres[:, c] = chosen[in_batch, best]
        return starts

    return seeds


SEED_BATCH_CELLS = 1 << 16  # most candidate distances (restarts x trials x records) a seeding batch holds


def _seed_distances(A: np.ndarray, rows_t: np.ndarray, norms: np.ndarray, a_norms: np.ndarray) -> np.ndarray:
    """Squared distances from the rows of A (`a_norms`: their squared norms) to every record (`rows_t`:
    the records transposed, `norms`: their squared norms) as scikit-learn's `_euclidean_distances`
    computes them for float64: the same operations in the same order, equal to the last bit (a row's
    squared norm is the same sum whether taken from the records or from a copy of the row)."""
    distances = A @ rows_t
    distances *= -2
    distances += a_norms[..., None]
    distances += norms
    return np.maximum(distances, 0.0, out=distances)


LLOYD_PASSES = 30  # `sampled_kmeans`: most passes over every record after the sample's fit
LLOYD_TOL = 1e-4  # and its stop: the centres moved (squared, summed) <= this x the mean feature variance,
# scikit-learn's KMeans rule, so the whole fit and the passes stop alike


def sampled_kmeans(
    X: np.ndarray, k: int, seed: int, *, sample: int, n_init: int = 1, passes: int = LLOYD_PASSES
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k-means of more records than fit in memory as float64 (a memory-mapped file): `kmeans` on a seeded
    sample of `sample` rows, then Lloyd passes over every row, a chunk at a time (exact sums, no copy of
    `X`), until no record changes cluster, the centres move by at most `LLOYD_TOL` (scikit-learn's rule,
    the variance taken on the sample) or `passes` are done. Returns (centres (k, d), counts (k,),
    sums (k, d)) of the last partition; centres are its means (an emptied cluster keeps its centre, count 0).
    Memory: the sample's float64 copy, one chunk and an int32 label a record."""
    n, d = np.shape(X)
    rows = np.sort(np.random.default_rng([seed, 0x5A3]).choice(n, min(sample, n), replace=False))
    sampled = np.asarray(X[rows], dtype=np.float64)
    tol = LLOYD_TOL * float(sampled.var(axis=0).mean())
    centres, _ = kmeans(sampled, k, seed, n_init=n_init)
    del sampled
    labels = np.full(n, -1, dtype=np.int32)
    clusters = np.arange(k)
    for _ in range(passes):
        counts, sums, changed = np.zeros(k, np.int64), np.zeros((k, d)), 0
        for chunk in row_chunks(n, max(k, d)):
            x = np.asarray(X[chunk], dtype=np.float64)
            nearest = _chunk_squared_distances(x, centres).argmin(1)
            changed += int((nearest != labels[chunk]).sum())
            labels[chunk] = nearest
            counts += np.bincount(nearest, minlength=k)
            sums += (nearest[None, :] == clusters[:, None]).astype(np.float64) @ x
        used = counts > 0
        updated = centres.copy()
        updated[used] = sums[used] / counts[used, None]
        shift, centres = float(((updated - centres) ** 2).sum()), updated
        if not changed or shift <= tol:
            break
    return centres, counts, sums


def weighted_centre_sums(
    centres: Sequence[np.ndarray], counts: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_clients n_k C_k, Σ_clients n_k): per-cluster centres weighted by their sizes, summed over clients
    (the numerator and denominator of a weighted centre average such as FSTC's Eq. 16)."""
    stacked = np.stack([np.asarray(c, dtype=np.float64) for c in centres])  # m x K x D
    sizes = np.stack([np.asarray(n, dtype=np.float64) for n in counts])  # m x K
    return np.einsum("mk,mkd->kd", sizes, stacked), sizes.sum(0)


def gaussian_centres(mean: np.ndarray, std: np.ndarray, count: int, seed: int | list[int]) -> np.ndarray:
    """`count` seeded draws from N(mean, std^2) per feature: centres when only moments of the data are
    known (secure or private sums) or when there are fewer points than clusters."""
    rng = np.random.default_rng(seed)
    return mean + std * rng.standard_normal((count, mean.shape[0]))


def centres_from_moments(mean: np.ndarray, mean_square: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Initial centres for secure aggregation: k seeded draws from N(mean, variance) per feature.

    The federated mean and mean square are sums, so SecAgg+ can hide each client's share; local
    clustering centres (the default inits) cannot be merged by a sum.
    """
    return gaussian_centres(mean, np.sqrt(np.maximum(mean_square - mean**2, 0.0)), k, [seed, 0xFC3])
