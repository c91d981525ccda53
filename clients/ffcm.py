"""Federated fuzzy c-means client (Stallmann & Wilbik, FL-AAAI 2022), framework-free maths + glue.

Round 1: local FCM centres and their membership mass initialise the federation. Later rounds: the client
computes its memberships to the global centres and returns the membership-weighted sums
sum_i u_ij^m x_i (k x d) and sum_i u_ij^m (k); summing these over clients gives exactly the centralized
FCM centre update, so with `local-iters = 1` federated FCM equals FCM on the pooled data.

What leaves the client is the uplink's (`fedapp.privacy.uplink`): the sums go out plain, as SecAgg+
shares, or as one DP release each round. Under DP (`dp.epsilon` > 0) the client works on its records
clipped to `dp.clip` (`uplink.records`), round 1 sends the noisy moments (the server asks for moments
whenever only sums may reach it; local FCM iterates on private data, so its centres have no bounded
sensitivity and the uplink refuses them), and the centres it computes memberships to come from the
server, i.e. from earlier noisy releases, so one record moves a round's statistics by at most
sqrt(clip^2 + 1). The privacy floor's withholding is off under DP (`uplink.floor`) and the example count
is 0 (a record count is private under add/remove).
"""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.maths.chunks import row_chunks
from fedapp.maths.clustering import nearest_centre, squared_distances
from fedapp.methods.ffcm import FFCMConfig
from fedapp.privacy.dp import sum_count_sensitivity
from fedapp.privacy.floor import WITHHELD_KEY, capped_clusters
from fedapp.privacy.secagg import CLEAR, SUM
from fedapp.report.stages import Assignment

INIT_ITERS = 100
INIT_TOL = 1e-6
INIT_SAMPLE = 50_000  # round 1's local FCM iterates on at most this many records (`local_init`)


def fcm_memberships(X: np.ndarray, centres: np.ndarray, m: float) -> np.ndarray:
    """FCM memberships u_ij = 1 / sum_l (d_ij / d_il)^(2/(m-1)); rows sum to 1 (Bezdek 1981)."""
    d2 = np.maximum(squared_distances(X, centres), 1e-300)
    # u_ij ∝ d_ij^(-2/(m-1)) = (d2_ij)^(-1/(m-1)); normalise in log space so tiny distances do not overflow
    log_w = -np.log(d2) / (m - 1.0)
    log_w -= log_w.max(1, keepdims=True)
    w = np.exp(log_w)
    return w / w.sum(1, keepdims=True)


def membership_sums(
    X: np.ndarray, centres: np.ndarray, m: float, floor: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(sum_i u_ij^m x_i, sum_i u_ij^m): the sufficient statistics of the FCM centre update.

    `floor` > 0 (the privacy floor, `fedapp.privacy.floor`): a cluster whose membership mass sum_i u_ij -
    its effective number of records - is below the floor is withheld (zero sums and mass)."""
    k = np.shape(centres)[0]
    sums, mass, effective = np.zeros((k, np.shape(X)[1])), np.zeros(k), np.zeros(k)
    for rows in row_chunks(len(X), max(k, np.shape(X)[1])):  # bounded memory: no n x k temporaries
        u = fcm_memberships(X[rows], centres, m)
        um = u**m
        sums += um.T @ np.asarray(X[rows], dtype=np.float64)
        mass += um.sum(0)
        effective += u.sum(0)
    withheld = effective < floor
    sums[withheld], mass[withheld] = 0.0, 0.0
    return sums, mass


def membership_mass(X: np.ndarray, centres: np.ndarray, m: float) -> np.ndarray:
    """sum_i u_ij per centre (each cluster's effective number of records), a chunk of rows at a time."""
    mass = np.zeros(np.shape(centres)[0])
    for rows in row_chunks(len(X), max(np.shape(centres)[0], np.shape(X)[1])):
        mass += fcm_memberships(X[rows], centres, m).sum(0)
    return mass


def local_fcm(
    X: np.ndarray,
    k: int,
    m: float,
    seed: int,
    *,
    centres: np.ndarray | None = None,
    iters: int = INIT_ITERS,
    tol: float = INIT_TOL,
) -> tuple[np.ndarray, np.ndarray]:
    """Plain FCM on local data (k-means++ init unless `centres` given); returns (centres, membership mass)."""
    if len(X) <= INIT_SAMPLE:  # once, not per iteration and chunk (and k-means++ is faster); a larger X
        X = np.asarray(X, dtype=np.float64)  # (`local-iters` > 1 on a mapped file) converts chunk by chunk
    if centres is None:
        from sklearn.cluster import kmeans_plusplus  # lazily: `fedapp.maths.clustering` says why

        centres, _ = kmeans_plusplus(X, n_clusters=min(k, X.shape[0]), random_state=seed)
    for _ in range(iters):
        sums, mass = membership_sums(X, centres, m)
        updated = sums / mass[:, None]
        shift = np.abs(updated - centres).max()
        centres = updated
        if shift <= tol:
            break
    return centres, membership_sums(X, centres, m)[1]


def local_init(X: np.ndarray, k: int, m: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Round 1's local FCM (centres, membership mass); above `INIT_SAMPLE` records the FCM iterations run
    on a seeded sample of that many and the mass is taken over every record. The centres only initialise
    the federation, whose later rounds are exact FCM on all records; on 250,000-record sites the full local
    FCM took 20 s a site, most of an FFCM run (docs/scale.md)."""
    if len(X) <= INIT_SAMPLE:
        return local_fcm(X, k, m, seed)
    rows = np.sort(np.random.default_rng([seed, 0xFC1]).choice(len(X), INIT_SAMPLE, replace=False))
    centres, _ = local_fcm(X[rows], k, m, seed)
    return centres, membership_sums(X, centres, m)[1]


class FFCMClient(ClusteringClient):
    @property
    def space(self) -> np.ndarray:
        """The vectors this client clusters: its records as the uplink lets it use them (clipped under DP)."""
        return self.uplink.records(self.data.features)

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        m = float(config["fuzziness"])
        X, n = self.space, self.data.n_samples
        capped_clusters(1, n, self.floor)  # fewer records than the floor: nothing may be sent
        if config["phase"] == "moments":  # sums the server may only see in total (SecAgg+, DP)
            return self.uplink.send_moments(X, self.identity_metrics())
        if config["phase"] == "init":  # local FCM centres are not sums: the server asks only plain runs
            centres, mass = local_init(X, capped_clusters(self.k, n, self.floor), m, self.seed)
            effective = membership_mass(X, centres, m)  # records' worth of membership
            withheld = effective < self.floor
            centres[withheld], mass[withheld] = 0.0, 0.0
            metrics = {**self.identity_metrics(), WITHHELD_KEY: int(withheld.sum())}
            return self.uplink.send([centres, mass], [CLEAR, CLEAR], n, metrics)  # refused under DP
        centres = parameters[0]
        extra_iters = int(config.get("local-iters", 1)) - 1
        if extra_iters > 0:  # local refinement before reporting (not exact FCM any more; documented)
            centres, _ = local_fcm(X, centres.shape[0], m, self.seed, centres=centres, iters=extra_iters)
        sums, mass = membership_sums(X, centres, m, self.uplink.floor)
        metrics = {**self.identity_metrics(), WITHHELD_KEY: int((mass == 0).sum())}
        sensitivity = sum_count_sensitivity(self.cfg.dp.clip)  # one record's weights sum to <= 1 (DP)
        return self.uplink.send([sums, mass], [SUM, SUM], n, metrics, sensitivity=sensitivity)

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        # argmax_j u_ij is the nearest centre, so hard labels need no memberships
        return nearest_centre(self.space, parameters[0])

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """Hard label = nearest centre; score = its FCM membership under the run's fuzzifier."""
        labels = self.predict(parameters, config)
        X, m = self.space, self.cfg.params(FFCMConfig).fuzziness
        scores = np.empty(len(labels))
        for rows in row_chunks(len(labels), max(parameters[0].shape[0], X.shape[1])):
            memberships = fcm_memberships(X[rows], parameters[0], m)
            scores[rows] = np.take_along_axis(memberships, labels[rows, None], axis=1)[:, 0]
        # under DP the report clips and noises (or withholds) its statistics itself (clients/base.py)
        return Assignment(labels, scores, "membership", self.data.features)
