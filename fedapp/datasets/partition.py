"""Seeded partitioners: which samples each client holds (horizontal), or which view it holds (vertical).

Horizontal partitioners return index arrays, not data, so a loader slices its own arrays (features,
labels, texts) with them, and every client can recompute the same split from the run seed alone.
"""

from collections.abc import Sequence
from fractions import Fraction

import numpy as np


class PartitionError(ValueError):
    """A partitioning request that cannot be met (unknown scheme, bad sizes or parameters)."""


SCHEMES = ("iid", "p-hetero", "size-ratio", "dirichlet", "by-group")

# Dirichlet draws are repeated until every partition reaches `min_size`; past this many tries the
# request (alpha too small for that many partitions) is reported instead of looping on.
_DIRICHLET_MAX_TRIES = 100


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    *,
    seed: int,
    p: float = 0.0,
    ratio: str | Sequence[float] = "6:4",
    alpha: float = 0.5,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Split sample indices 0..N-1 into `num_partitions` sorted, pairwise disjoint int64 arrays.

    `iid`, `size-ratio` and `dirichlet` cover every sample; `p-hetero` gives every client exactly
    N // num_partitions samples and leaves the other N mod num_partitions unused; `by-group` gives client
    i every sample whose label is the i-th (mod num_partitions) label value (the gFedNTM nodes, the 20
    Newsgroups families). Every partition holds at least `min_size` samples, otherwise PartitionError.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be 1-D (one per sample), got shape {labels.shape}")
    n_samples = labels.shape[0]
    if scheme not in SCHEMES:
        raise PartitionError(
            f"unknown partition scheme {scheme!r}; choose one of {', '.join(SCHEMES)} "
            "(vertical partitioning uses vertical_view)"
        )
    if num_partitions < 1:
        raise PartitionError(f"num_partitions must be >= 1, got {num_partitions}")
    if num_partitions > n_samples:
        raise PartitionError(f"num_partitions={num_partitions} exceeds the number of samples N={n_samples}")
    if min_size < 1:
        raise PartitionError(f"min_size must be >= 1, got {min_size}")
    rng = np.random.default_rng(seed)
    if scheme == "by-group":
        parts = _by_group(labels, num_partitions)
    elif scheme == "iid":
        parts = _iid(n_samples, num_partitions, rng)
    elif scheme == "size-ratio":
        parts = _size_ratio(n_samples, _ratio_parts(ratio, num_partitions), rng)
    elif scheme == "p-hetero":
        if not 0.0 <= p <= 1.0:
            raise PartitionError(
                f"p must lie in [0, 1] (0: random clients, 1: one class per client), got {p}"
            )
        parts = _p_hetero(labels, num_partitions, p, rng)
    else:
        if not alpha > 0:
            raise PartitionError(f"alpha must be > 0 (smaller alpha, stronger label skew), got {alpha}")
        parts = _dirichlet(labels, num_partitions, alpha, min_size, rng)
    sizes = [part.size for part in parts]
    if min(sizes) < min_size:
        raise PartitionError(
            f"scheme {scheme!r} gives partition sizes {sizes} for N={n_samples}, below min_size={min_size}"
        )
    return [np.sort(part).astype(np.int64, copy=False) for part in parts]


def parse_ratio(ratio: str | Sequence[float], num_partitions: int) -> np.ndarray:
    """Normalised size weights: "6:4" -> [0.6, 0.4] (FSTC Sec. 5.1's non-IID level rho = 1)."""
    parts = _ratio_parts(ratio, num_partitions)
    total = sum(parts)
    return np.array([float(part / total) for part in parts])


def vertical_view(views: Sequence[np.ndarray], partition_id: int, num_partitions: int) -> np.ndarray:
    """The view client `partition_id` holds: vertical federations (CeFMC) put view v of all N samples
    on client v, so there must be exactly one client per view."""
    if num_partitions != len(views):
        raise PartitionError(
            f"vertical partitioning needs one client per view: num_partitions={num_partitions} but the "
            f"dataset has {len(views)} views"
        )
    if not 0 <= partition_id < num_partitions:
        raise PartitionError(f"partition_id={partition_id} is outside [0, {num_partitions})")
    n_rows = [np.shape(view)[0] for view in views]
    if len(set(n_rows)) != 1:
        raise PartitionError(f"all views must hold the same samples, but their row counts are {n_rows}")
    return np.asarray(views[partition_id])


def _iid(n_samples: int, num_partitions: int, rng: np.random.Generator) -> list[np.ndarray]:
    # Not flwr_datasets' IidPartitioner: it takes contiguous shards without shuffling and has no seed.
    return np.array_split(rng.permutation(n_samples), num_partitions)


def _ratio_parts(ratio: str | Sequence[float], num_partitions: int) -> list[Fraction]:
    """Ratio parts as exact fractions, so e.g. 7:3 of N=10 gives sizes 7 and 3, not 6 and 3."""
    texts = ratio.split(":") if isinstance(ratio, str) else [str(part) for part in ratio]
    try:
        # str() first: a float such as 0.7 then means the decimal 7/10, not its binary approximation.
        parts = [Fraction(text.strip()) for text in texts]
    except (ValueError, ZeroDivisionError) as exc:
        raise PartitionError(f"ratio {ratio!r} is not a list of numbers such as '6:4': {exc}") from exc
    if len(parts) != num_partitions:
        raise PartitionError(
            f"ratio {ratio!r} has {len(parts)} parts but num_partitions={num_partitions}; "
            "give one part per client"
        )
    if any(part <= 0 for part in parts):
        raise PartitionError(f"ratio {ratio!r} must have positive parts")
    return parts


def _size_ratio(n_samples: int, parts: list[Fraction], rng: np.random.Generator) -> list[np.ndarray]:
    # FSTC Sec. 5.1 (non-IID partition): shuffle, then split by proportions 6:4, 7:3, 8:2, 9:1 (rho=1..4).
    total = sum(parts)
    sizes = np.array([part * n_samples // total for part in parts], dtype=np.int64)  # floor(w_i N)
    # The N - sum(floor) < num_partitions leftover samples go one each to the largest parts (ties: lower
    # index first), so sizes are a deterministic function of (ratio, N).
    largest_first = sorted(range(len(parts)), key=lambda i: (-parts[i], i))
    sizes[largest_first[: n_samples - int(sizes.sum())]] += 1
    return np.split(rng.permutation(n_samples), np.cumsum(sizes)[:-1])


def _p_hetero(
    labels: np.ndarray, num_partitions: int, p: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """CCFC Sec. 4.1: client l draws round(p*s) samples of class l (mod the class count), the rest at random.

    Own-class draws are made for all clients first, then the random fills, so a client's own class is
    not depleted by earlier clients' random draws. If too few samples of the class are left (more
    clients than classes, or unbalanced classes), the client takes what is left and the shortfall is
    filled from the random pool; every client still gets exactly s = N // num_partitions samples.
    """
    classes, class_of = np.unique(labels, return_inverse=True)
    size = labels.shape[0] // num_partitions
    n_own = round(p * size)
    shuffled = rng.permutation(labels.shape[0])
    class_pools = [shuffled[class_of[shuffled] == c] for c in range(classes.size)]
    pool_used = np.zeros(classes.size, dtype=np.int64)
    own_draws = []
    for client in range(num_partitions):
        own_class = client % classes.size
        start = pool_used[own_class]
        own_draws.append(class_pools[own_class][start : start + n_own])
        pool_used[own_class] += own_draws[-1].size
    taken = np.zeros(labels.shape[0], dtype=bool)
    taken[np.concatenate(own_draws)] = True
    remaining = rng.permutation(np.flatnonzero(~taken))
    fill_ends = np.cumsum([size - own.size for own in own_draws])
    fills = np.split(remaining[: fill_ends[-1]], fill_ends[:-1])
    return [np.concatenate([own, fill]) for own, fill in zip(own_draws, fills, strict=True)]


def _by_group(labels: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """Label value i (in sorted order) goes to client i mod num_partitions: whole groups, no sampling."""
    values, group = np.unique(labels, return_inverse=True)
    if num_partitions > values.size:
        raise PartitionError(
            f"by-group needs at most one client per group: {values.size} groups, "
            f"num_partitions={num_partitions}"
        )
    return [np.flatnonzero(group % num_partitions == client) for client in range(num_partitions)]


def _dirichlet(
    labels: np.ndarray, num_partitions: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Label skew: each class is split over clients by proportions drawn from Dir(alpha * 1).

    Same algorithm and random stream as flwr_datasets' DirichletPartitioner(self_balancing=False), so a
    given seed yields the same index sets (tested). That class is not used itself because, with
    `datasets` 4, it reads the label column row by row (seconds for 70k samples, for every client) and
    gives up after 11 tries.
    """
    class_members = [np.flatnonzero(labels == label) for label in np.unique(labels)]
    concentration = np.full(num_partitions, float(alpha))
    for _ in range(_DIRICHLET_MAX_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        for members in class_members:
            cut_points = (np.cumsum(rng.dirichlet(concentration)) * members.size).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(members, cut_points), strict=True):
                part.append(chunk)
        if min(sum(chunk.size for chunk in part) for part in parts) >= min_size:
            return [np.concatenate(part) for part in parts]
    raise PartitionError(
        f"no Dirichlet(alpha={alpha}) split over {num_partitions} partitions gave every partition "
        f">= {min_size} samples in {_DIRICHLET_MAX_TRIES} tries; raise alpha or lower num_partitions/min_size"
    )
