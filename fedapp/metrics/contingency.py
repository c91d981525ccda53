"""Clustering metrics computed from a contingency table, so ground-truth labels never leave a client.

Each client counts (predicted cluster x true class) pairs on its own data; the server sums the tables and
calls `clustering_metrics`. Every metric is a function of the summed table alone, and equals what
scikit-learn returns on the pooled label vectors (tests check this to 1e-9), degenerate cases included.
"""

import numpy as np

from fedapp.wire import encode_counts


class MetricsError(ValueError):
    """Labels or a contingency table that cannot be evaluated."""


def contingency_table(pred: np.ndarray, true: np.ndarray, n_clusters: int, n_classes: int) -> np.ndarray:
    """Count (predicted cluster, true class) pairs: the only evaluation data a client sends.

    The shape is fixed by `n_clusters` x `n_classes` (not by the labels a client happens to hold) so
    that tables from different clients can be summed element-wise.
    """
    if n_clusters < 1 or n_classes < 1:
        raise MetricsError(f"n_clusters and n_classes must be >= 1, got {n_clusters} and {n_classes}")
    pred = _check_labels(pred, "pred", n_clusters)
    true = _check_labels(true, "true", n_classes)
    if pred.shape != true.shape:
        raise MetricsError(f"pred has {pred.size} labels but true has {true.size}")
    flat = np.bincount(pred * n_classes + true, minlength=n_clusters * n_classes)
    return flat.reshape(n_clusters, n_classes).astype(np.int64, copy=False)


def clustering_metrics(table: np.ndarray) -> dict[str, float]:
    """ACC, NMI, ARI, purity and Cohen's kappa (all fractions) of a summed contingency table.

    Kappa is NaN where scikit-learn's `cohen_kappa_score` is undefined (all samples share one true class
    and all clusters map to that class), matching its default `replace_undefined_by=np.nan`.
    """
    counts = _check_table(table)
    n_samples = int(counts.sum())
    if n_samples == 0:
        raise MetricsError("the contingency table holds no samples; clustering metrics are undefined")
    rows, cols = _best_matching(counts)
    return {
        # FSTC Eq. 19: accuracy under the best one-to-one cluster -> class map (Hungarian algorithm).
        "acc": float(counts[rows, cols].sum() / n_samples),
        "nmi": _normalized_mutual_info(counts),
        "ari": _adjusted_rand_index(counts),
        # CeFMC Sec. V-A: purity, each cluster credited with its majority class.
        "purity": float(counts.max(axis=1).sum() / n_samples),
        "kappa": _cohen_kappa(counts, _mapping_from(counts, rows, cols)),
    }


def hungarian_mapping(table: np.ndarray) -> np.ndarray:
    """Cluster index -> class index under the best one-to-one matching (FSTC Eq. 19's `map`).

    With more clusters than classes, clusters left unmatched map to their majority class (an empty
    one to class 0), so every predicted label can be turned into a class label.
    """
    counts = _check_table(table)
    return _mapping_from(counts, *_best_matching(counts))


def _best_matching(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Hungarian matching of most samples. SciPy's optimize package is imported here, not with the
    module: a deployment starts a ClientApp process per message, and most never score (0.33 s each)."""
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment(counts, maximize=True)


def encode_table(table: np.ndarray) -> bytes:
    """A contingency table's wire form for a Flower metrics value (`fedapp.wire.encode_counts`; the
    server reads it with `decode_counts`)."""
    return encode_counts(_check_table(table))


def _check_labels(labels: np.ndarray, name: str, n_values: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise MetricsError(f"{name} labels must be 1-D, got shape {labels.shape}")
    if labels.size == 0:
        return labels.astype(np.int64)
    if not np.issubdtype(labels.dtype, np.integer):
        raise MetricsError(f"{name} labels must be integers, got dtype {labels.dtype}")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= n_values:
        raise MetricsError(f"{name} labels must lie in [0, {n_values}), found values in [{low}, {high}]")
    return labels.astype(np.int64, copy=False)


def _check_table(table: np.ndarray) -> np.ndarray:
    counts = np.asarray(table)
    if counts.ndim != 2 or 0 in counts.shape:
        raise MetricsError(f"a contingency table must be a non-empty 2-D array, got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.integer):
        raise MetricsError(f"contingency counts must be integers, got dtype {counts.dtype}")
    if (counts < 0).any():
        raise MetricsError("contingency counts must be non-negative")
    return counts.astype(np.int64, copy=False)


def _mapping_from(counts: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    mapping = counts.argmax(axis=1)
    mapping[rows] = cols
    return mapping.astype(np.int64, copy=False)


def _entropy(sizes: np.ndarray) -> float:
    """Shannon entropy (nats) of a partition with the given non-zero part sizes."""
    if sizes.size == 1:
        return 0.0
    total = sizes.sum()
    return float(-np.sum(sizes / total * (np.log(sizes) - np.log(total))))


def _normalized_mutual_info(counts: np.ndarray) -> float:
    """NMI with arithmetic-mean normalisation, I / ((H(clusters) + H(classes)) / 2).

    This is scikit-learn's default (Vinh et al., JMLR 2010). FSTC Eq. 20 normalises by the geometric
    mean instead, so NMI values there can differ slightly from ours.
    """
    # scikit-learn only sees labels that occur, so empty clusters/classes play no part.
    counts = counts[counts.sum(axis=1) > 0][:, counts.sum(axis=0) > 0]
    if counts.shape == (1, 1):
        return 1.0  # both partitions a single block: scikit-learn calls this a perfect match
    if 1 in counts.shape:
        return 0.0  # one partition has zero entropy, hence zero mutual information
    cluster_sizes = counts.sum(axis=1).astype(np.float64)
    class_sizes = counts.sum(axis=0).astype(np.float64)
    n_samples = cluster_sizes.sum()
    rows, cols = np.nonzero(counts)
    joint = counts[rows, cols].astype(np.float64)
    terms = (
        joint
        / n_samples
        * (np.log(joint) + np.log(n_samples) - np.log(cluster_sizes[rows]) - np.log(class_sizes[cols]))
    )
    # Like scikit-learn: drop round-off-sized terms and clip, so independent partitions give exactly 0.
    terms[np.abs(terms) < np.finfo(np.float64).eps] = 0.0
    mutual_info = max(float(terms.sum()), 0.0)
    if mutual_info == 0.0:
        return 0.0
    # a perfect match computes as 1.0000000000000007 in floating point: NMI is a fraction
    return min(mutual_info / ((_entropy(cluster_sizes) + _entropy(class_sizes)) / 2), 1.0)


def _adjusted_rand_index(counts: np.ndarray) -> float:
    """ARI (Hubert & Arabie, 1985) from ordered pair counts, as scikit-learn's pair_confusion_matrix.

    The products are taken in Python ints, which cannot overflow however large N is.
    """
    n_samples = int(counts.sum())
    sum_squares = int(np.sum(counts**2))
    cluster_only = int(np.sum(counts.sum(axis=1) ** 2)) - sum_squares  # same cluster, different class
    class_only = int(np.sum(counts.sum(axis=0) ** 2)) - sum_squares  # same class, different cluster
    together = sum_squares - n_samples  # same cluster and same class
    apart = n_samples**2 - cluster_only - class_only - sum_squares  # different cluster and class
    if cluster_only == 0 and class_only == 0:
        return 1.0  # identical partitions (or N = 1)
    numerator = 2.0 * (together * apart - class_only * cluster_only)
    denominator = (together + class_only) * (class_only + apart) + (together + cluster_only) * (
        cluster_only + apart
    )
    return numerator / denominator


def _cohen_kappa(counts: np.ndarray, mapping: np.ndarray) -> float:
    """Cohen's kappa (Cohen, 1960; CCFC's Kappa [20]) between true classes and mapped clusters."""
    n_classes = counts.shape[1]
    # confusion[true class, mapped class]: each cluster's counts folded into the class it maps to.
    confusion = counts.T.astype(np.float64) @ np.eye(n_classes)[mapping]
    n_samples = confusion.sum()
    expected = np.outer(confusion.sum(axis=1), confusion.sum(axis=0)) / n_samples
    off_diagonal = ~np.eye(n_classes, dtype=bool)
    expected_disagreement = expected[off_diagonal].sum()
    if expected_disagreement == 0:
        return float("nan")  # one label shared by both sides: undefined, as in scikit-learn
    return float(1.0 - confusion[off_diagonal].sum() / expected_disagreement)
