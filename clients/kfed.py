"""k-FED client (Dennis et al., ICML 2021, Alg. 1 local step): k' local k-means centres, sent once.

Under differential privacy (`dp.epsilon` > 0, `fedapp.privacy.dp`) local k-means is replaced by DP-Lloyd on
the
records clipped to `dp.clip`, `dp.lloyd-iters` noisy releases of (per-cluster sums, per-cluster counts)
(sensitivity sqrt(clip^2 + 1)): the first is the noisy mean (one cluster), and the initial centres are
that mean plus seeded data-independent offsets (random directions through the origin put almost every
record of non-negative data such as pixels into one cluster); each later release assigns the records to
the previous *noisy* centres. Centre = noisy sum / max(noisy count, 1), pulled back into the clip ball
(post-processing). Plain k-means would not do: one record can reshuffle its whole partition,
so per-cluster sums of a k-means partition have no bounded sensitivity. Only the last iteration's
centres and their noisy counts, rounded and clamped at 0 (post-processing), are sent. The privacy
floor's merging and the cap k' <= n / floor are off under DP (both decide by the data: the noise covers
small clusters instead), and the reply's example count is 0.
"""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.maths.clustering import nearest_centre, sampled_kmeans
from fedapp.methods.kfed import LOCAL_SAMPLE, KFedConfig, local_restarts
from fedapp.metrics.label_free import cluster_sums
from fedapp.privacy.dp import clip_rows, gaussian_mechanism, sum_count_sensitivity
from fedapp.privacy.floor import (
    CLIENT_MIN_CLUSTER,
    MERGED_KEY,
    capped_clusters,
    floored_kmeans,
    merge_small_sums,
)
from fedapp.privacy.uplink import Uplink
from fedapp.report.stages import Assignment, nearest_with_distance

LOCAL_RESTARTS = 10  # k-means++ restarts of a local k-means that has no key for them (FSBERT-kFED)


def local_centres(
    X: np.ndarray, k_local: int, seed: int, restarts: int = LOCAL_RESTARTS, floor: int = CLIENT_MIN_CLUSTER
) -> tuple[np.ndarray, np.ndarray, int]:
    """Local k-means with k' = min(k_local, n // floor) centres, a cluster below the privacy `floor`
    merged into its nearest neighbour (`fedapp.privacy.floor`); returns (centres, counts, clusters merged).

    Above `LOCAL_SAMPLE` records: k-means on a seeded sample, then exact Lloyd passes over every record in
    chunks (`sampled_kmeans`), so a memory-mapped file is never copied whole (docs/scale.md)."""
    if len(X) <= LOCAL_SAMPLE:
        return floored_kmeans(X, k_local, seed, floor, n_init=restarts)
    k = capped_clusters(k_local, len(X), floor)
    _, counts, sums = sampled_kmeans(X, k, seed, sample=LOCAL_SAMPLE, n_init=restarts)
    sums, counts, merged = merge_small_sums(sums, counts, floor)
    return sums / counts[:, None], counts, merged


def dp_lloyd(
    X: np.ndarray,
    k_local: int,
    clip: float,
    noise_multiplier: float,
    iters: int,
    seed: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """DP-Lloyd (module docstring): (centres (k', d), noisy counts (k',)) after `iters` >= 2 noisy
    releases (the noisy mean, then `iters` - 1 Lloyd steps).

    `seed` only places the data-independent offsets around the mean; the noise comes from `rng`."""
    if iters < 2:
        raise ValueError(f"DP-Lloyd needs >= 2 releases (the mean, then Lloyd steps), got {iters}")
    X = clip_rows(X, clip)
    sensitivity = sum_count_sensitivity(clip)
    total, count = gaussian_mechanism([X.sum(0), np.array([X.shape[0]])], sensitivity, noise_multiplier, rng)
    mean = clip_rows(total[None] / max(count[0], 1.0), clip)
    directions = np.random.default_rng([seed, 0xD9]).standard_normal((k_local, X.shape[1]))
    centres = mean + 0.1 * clip * directions / np.linalg.norm(directions, axis=1, keepdims=True)
    counts = np.zeros(k_local)
    for _ in range(iters - 1):
        exact = cluster_sums(X, nearest_centre(X, centres), k_local)
        sums, counts = gaussian_mechanism(
            [exact.sums, exact.counts.astype(np.float64)], sensitivity, noise_multiplier, rng
        )
        centres = clip_rows(sums / np.maximum(counts, 1.0)[:, None], clip)  # a mean of clipped rows is inside
    return centres, counts


def kfed_reply(
    uplink: Uplink, X: np.ndarray, k_local: int, seed: int, restarts: int, identity: dict[str, Scalar]
) -> tuple[NDArrays, int, dict[str, Scalar]]:
    """k-FED's local step as a reply: floored local k-means centres and their sizes; under DP (k-FED's
    own protocol under DP) DP-Lloyd's centres and rounded noisy counts, its `dp.lloyd-iters` releases
    counted against the plan first (a second request fails: the plan is one DP-Lloyd run)."""
    if uplink.private:
        capped_clusters(1, X.shape[0], uplink.privacy_floor)  # fewer records than the floor: nothing
        dp = uplink.cfg.dp
        release = uplink.release(dp.lloyd_iters)
        centres, counts = dp_lloyd(
            X, k_local, dp.clip, release.noise_multiplier, dp.lloyd_iters, seed, release.rng()
        )
        return (
            [centres, np.rint(np.maximum(counts, 0.0)).astype(np.int64)],
            0,
            {**identity, **release.metrics},
        )
    centres, counts, merged = local_centres(X, k_local, seed, restarts, uplink.floor)
    return [centres, counts], X.shape[0], {**identity, MERGED_KEY: merged}


class KFedClient(ClusteringClient):
    """Round 1: send local centres + counts. Evaluation: label by the nearest global centre."""

    @property
    def space(self) -> np.ndarray:
        """The vectors this client clusters: its records as the uplink lets it use them (clipped under DP)."""
        return self.uplink.records(self.data.features)

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        k_local = int(config.get("local-k", 0)) or self.k
        restarts = local_restarts(self.cfg.params(KFedConfig).local_restarts, self.data.n_samples)
        return kfed_reply(
            self.uplink, self.data.features, k_local, self.seed, restarts, self.identity_metrics()
        )

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        return nearest_centre(self.space, parameters[0])

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        labels, distances = nearest_with_distance(self.space, parameters[0])
        # under DP the report clips and noises (or withholds) its statistics itself (clients/base.py)
        return Assignment(labels, distances, "distance", self.data.features)
