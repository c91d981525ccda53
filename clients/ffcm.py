"""Federated fuzzy c-means client (Stallmann & Wilbik, FL-AAAI 2022), framework-free maths + glue.

Round 1: local FCM centres and their membership mass initialise the federation. Later rounds: the client
computes its memberships to the global centres and returns the membership-weighted sums
sum_i u_ij^m x_i (k x d) and sum_i u_ij^m (k); summing these over clients gives exactly the centralized
FCM centre update, so with `local-iters = 1` federated FCM equals FCM on the pooled data.

Under differential privacy (`dp.epsilon` > 0, `fedapp.privacy.dp`) the client works on its records clipped to
`dp.clip`, round 1 sends noisy (sum x, sum x*x, count) instead of local FCM centres (local FCM iterates
on private data, so its centres have no bounded sensitivity), and every later round sends the noisy
sums and masses; the centres it computes memberships to come from the server, i.e. from earlier noisy
releases, so one record moves a round's statistics by at most sqrt(clip^2 + 1). The privacy floor's
withholding is off under DP: deciding by the data whether to send would itself leak (the noise covers
small clusters instead). The reply's example count is 0: a record count is private under add/remove.
"""

from __future__ import annotations

import numpy as np
from flwr.app import MetricRecord
from flwr.common import NDArrays, Scalar
from sklearn.cluster import kmeans_plusplus

from clients.base import ClusteringClient
from fedapp.maths.clustering import nearest_centre, squared_distances
from fedapp.methods.ffcm import FFCMConfig
from fedapp.privacy.dp import (
    RELEASES_KEY,
    STATE_KEY,
    clip_rows,
    gaussian_mechanism,
    moments_sensitivity,
    next_release,
    noise_multiplier,
    planned_releases,
    secret_rng,
    sum_count_sensitivity,
)
from fedapp.privacy.floor import WITHHELD_KEY, capped_clusters
from fedapp.report.stages import Assignment

INIT_ITERS = 100
INIT_TOL = 1e-6


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
    u = fcm_memberships(X, centres, m)
    um = u**m
    sums, mass = um.T @ np.asarray(X, dtype=np.float64), um.sum(0)
    withheld = u.sum(0) < floor
    sums[withheld], mass[withheld] = 0.0, 0.0
    return sums, mass


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
    X = np.asarray(X, dtype=np.float64)
    if centres is None:
        centres, _ = kmeans_plusplus(X, n_clusters=min(k, X.shape[0]), random_state=seed)
    for _ in range(iters):
        sums, mass = membership_sums(X, centres, m)
        updated = sums / mass[:, None]
        shift = np.abs(updated - centres).max()
        centres = updated
        if shift <= tol:
            break
    return centres, membership_sums(X, centres, m)[1]


class FFCMClient(ClusteringClient):
    @property
    def space(self) -> np.ndarray:
        """The vectors this client clusters: its features, clipped to dp.clip when DP is on."""
        if self.cfg.dp.enabled:
            return clip_rows(self.data.features, self.cfg.dp.clip)
        return self.data.features

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        m = float(config["fuzziness"])
        X = self.data.features
        n = self.data.n_samples
        capped_clusters(1, n, self.floor)  # fewer records than the floor: nothing may be sent
        if self.cfg.dp.enabled:
            return self.fit_private(parameters, config, m)
        if config["phase"] == "moments":  # a sum the server may only see in total (SecAgg+)
            X64 = np.asarray(X, dtype=np.float64)
            return [X64.mean(0), (X64**2).mean(0)], n, self.identity_metrics()
        if config["phase"] == "init":
            centres, mass = local_fcm(X, capped_clusters(self.k, n, self.floor), m, self.seed)
            effective = fcm_memberships(X, centres, m).sum(0)  # records' worth of membership
            withheld = effective < self.floor
            centres[withheld], mass[withheld] = 0.0, 0.0
            return [centres, mass], n, {**self.identity_metrics(), WITHHELD_KEY: int(withheld.sum())}
        centres = parameters[0]
        extra_iters = int(config.get("local-iters", 1)) - 1
        if extra_iters > 0:  # local refinement before reporting (not exact FCM any more; documented)
            centres, _ = local_fcm(X, centres.shape[0], m, self.seed, centres=centres, iters=extra_iters)
        sums, mass = membership_sums(X, centres, m, self.floor)
        metrics = {**self.identity_metrics(), WITHHELD_KEY: int((mass == 0).sum())}
        if config.get("secagg"):  # SecAgg+ averages with weights n: send per-sample means, bounded values
            sums, mass = sums / n, mass / n
        return [sums, mass], n, metrics

    def fit_private(
        self, parameters: NDArrays, config: dict[str, Scalar], m: float
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """One noisy release (module docstring): counted against the planned schedule first."""
        dp = self.cfg.dp
        planned = planned_releases("ffcm", self.cfg.num_rounds, dp.lloyd_iters)
        made = int(self.context.state[STATE_KEY]["releases"]) if STATE_KEY in self.context.state else 0
        made = next_release(made, planned)  # raises once the plan is spent
        self.context.state[STATE_KEY] = MetricRecord({"releases": made})
        z = noise_multiplier(dp, "ffcm", self.cfg.num_rounds)
        X = self.space
        metrics: dict[str, Scalar] = {**self.identity_metrics(), RELEASES_KEY: made}
        if config["phase"] == "moments":
            stats = [X.sum(0), (X**2).sum(0), np.array([float(X.shape[0])])]
            return (
                gaussian_mechanism(
                    stats, moments_sensitivity(dp.clip), z, secret_rng(dp, self.partition_id, made)
                ),
                0,
                metrics,
            )
        if config["phase"] != "update":
            raise ValueError(f"phase '{config['phase']}' sends unbounded statistics; under DP only moments")
        sums, mass = membership_sums(X, parameters[0], m)
        return (
            gaussian_mechanism(
                [sums, mass], sum_count_sensitivity(dp.clip), z, secret_rng(dp, self.partition_id, made)
            ),
            0,
            metrics,
        )

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        # argmax_j u_ij is the nearest centre, so hard labels need no memberships
        return nearest_centre(self.space, parameters[0])

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """Hard label = nearest centre; score = its FCM membership under the run's fuzzifier."""
        labels = self.predict(parameters, config)
        memberships = fcm_memberships(self.space, parameters[0], self.cfg.params(FFCMConfig).fuzziness)
        # under DP the report clips and noises (or withholds) its statistics itself (clients/base.py)
        space = self.data.features
        return Assignment(labels, memberships[np.arange(len(labels)), labels], "membership", space)
