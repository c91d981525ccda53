"""Federated fuzzy c-means strategy (Stallmann & Wilbik 2022).

Round 1: weighted k-means over the clients' local FCM centres (weights = membership mass) gives the
initial global centres. Rounds >= 2: global centres = sum of clients' membership-weighted sums divided by
the summed membership mass (the FCM centre update over the union). Stops when the largest centre shift,
relative to the centres' scale, is <= `delta`.

Under differential privacy (`fedapp.privacy.dp`) the initialisation is the moments one (noisy sums of x and
x*x over a noisy count) and every reply is noisy: masses may be negative, a cluster whose summed noisy
mass is below 1 keeps its previous centre, and summary.json's `privacy` block accounts the releases.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common import Parameters, Scalar, log, ndarrays_to_parameters

from fedapp.config.run import RunConfig
from fedapp.maths.clustering import centres_from_moments, centres_from_noisy_moments, kmeans
from fedapp.methods.ffcm import FFCMConfig
from fedapp.privacy.dp import RELEASES_KEY, privacy_summary
from fedapp.wire import ArraySpec, ReplyError
from strategies.base import ClusteringStrategy
from strategies.replies import ClientReply, consistent_replies


def merge_weighted_centres(
    centres: list[np.ndarray], masses: list[np.ndarray], k: int, seed: int
) -> np.ndarray:
    """Initial global centres: k-means over local centres weighted by their membership mass (a centre a
    client withheld under its privacy floor comes with mass 0 and is left out)."""
    union, weights = np.concatenate(centres), np.concatenate(masses)
    union, weights = union[weights > 0], weights[weights > 0]
    if union.shape[0] < k:
        raise ValueError(f"only {union.shape[0]} local centres for k={k} global clusters")
    global_centres, _ = kmeans(union, k, seed, sample_weight=weights)
    return global_centres


def centres_from_sums(
    sums: list[np.ndarray],
    masses: list[np.ndarray],
    previous: np.ndarray | None = None,
    min_mass: float = 0.0,
) -> np.ndarray:
    """FCM centre update over the union: c_j = sum_clients sum_i u_ij^m x_i / sum_clients sum_i u_ij^m.

    A cluster every client withheld (its membership mass below their privacy floor), or whose summed
    mass is <= `min_mass` (noisy DP masses: a near-zero denominator would fling the centre away), keeps
    its `previous` centre; without one, such a cluster is an error."""
    total_mass = np.sum(masses, axis=0)
    empty = total_mass <= min_mass
    if empty.any() and previous is None:
        raise ValueError("a cluster received zero membership mass")
    centres = np.sum(sums, axis=0) / np.where(empty, 1.0, total_mass)[:, None]
    if empty.any():
        centres[empty] = previous[empty]  # type: ignore[index]
    return centres


def relative_shift(old: np.ndarray, new: np.ndarray) -> float:
    return float(np.abs(new - old).max() / max(np.abs(old).max(), 1e-12))


class FFCMStrategy(ClusteringStrategy):
    method = "ffcm"
    state_fields = ("centres", "shifts", "dp_releases")

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(FFCMConfig)
        # under SecAgg+ the server only ever sees sums, so the initialisation must be one too
        # under DP only sums have a bounded sensitivity, so the initialisation must be one too
        self.init = "moments" if cfg.secagg or cfg.dp.enabled else self.params.init
        self.centres: np.ndarray | None = None
        self.shifts: list[float] = []
        self.dp_releases = 0  # the most noisy releases any client reported (summary.json `privacy`)

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        phase = (
            "update" if self.centres is not None else "init" if self.init == "local-centres" else "moments"
        )
        return {
            **super().fit_config(server_round),
            "phase": phase,
            "fuzziness": self.params.fuzziness,
            "local-iters": self.params.local_iters,
            "secagg": self.cfg.secagg,
        }

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.centres is None and self.init == "moments" and self.cfg.dp.enabled:
            return [ArraySpec("sum", (None,)), ArraySpec("sum of squares", (None,)), ArraySpec("count", (1,))]
        if self.centres is None and self.init == "moments":
            return [ArraySpec("mean", (None,)), ArraySpec("mean square", (None,))]
        if self.centres is None:
            return [ArraySpec("centres", (None, None)), ArraySpec("mass", (None,))]
        k, dim = self.centres.shape
        return [ArraySpec("sums", (k, dim)), ArraySpec("mass", (k,))]

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        # the feature dimension is not known before the first replies
        if self.centres is not None:
            return replies
        return consistent_replies(replies, server_round, axis=0 if self.init == "moments" else 1)

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        first, second = reply.arrays[:2]
        if first.shape[0] != second.shape[0]:
            raise ReplyError(f"arrays of {first.shape[0]} and {second.shape[0]} rows")
        if self.cfg.dp.enabled:  # noisy masses may be negative; the client says how much it has spent
            if not isinstance(reply.metrics.get(RELEASES_KEY), int):
                raise ReplyError(f"a DP reply without an integer '{RELEASES_KEY}'")
            return
        if self.centres is not None or self.init == "local-centres":
            tolerance = 1e-4 if self.cfg.secagg else 0.0  # SecAgg+ quantisation noise around zero
            if (second < -tolerance).any():
                raise ReplyError("negative membership mass")

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        if self.cfg.dp.enabled:
            spent = max(int(r.metrics[RELEASES_KEY]) for r in replies)
            self.dp_releases = max(self.dp_releases, spent)
        if self.centres is None and self.cfg.dp.enabled:
            assert self.k is not None
            self.centres = centres_from_noisy_moments(
                *([r.arrays[i] for r in replies] for i in range(3)), self.k, self.cfg.seed
            )
            log(INFO, "FFCM: initial centres from noisy federated moments (%d replies)", len(replies))
        elif self.centres is None and self.init == "moments":
            assert self.k is not None
            weights = [r.num_examples for r in replies]  # under SecAgg+ the replies hold one average already
            mean = np.average([r.arrays[0] for r in replies], axis=0, weights=weights)
            mean_square = np.average([r.arrays[1] for r in replies], axis=0, weights=weights)
            self.centres = centres_from_moments(mean, mean_square, self.k, self.cfg.seed)
            log(INFO, "FFCM: initial centres from the federated feature moments (%d replies)", len(replies))
        elif self.centres is None:
            assert self.k is not None  # _validated rejects every reply while k is unknown
            self.centres = merge_weighted_centres(
                [r.arrays[0] for r in replies], [r.arrays[1] for r in replies], self.k, self.cfg.seed
            )
            log(INFO, "FFCM: initial centres from %d clients' local FCM centres", len(replies))
        else:
            # plain: sum_i sums_i / sum_i mass_i. SecAgg+: every reply holds the same secure average of
            # (sums_i / n_i) and (mass_i / n_i), whose ratio is that very quotient
            # DP: noisy masses are summed as they are (clipping each at 0 would bias the total upwards)
            dp = self.cfg.dp.enabled
            masses = [r.arrays[1] if dp else np.maximum(r.arrays[1], 0.0) for r in replies]
            updated = centres_from_sums(
                [r.arrays[0] for r in replies], masses, self.centres, min_mass=1.0 if dp else 0.0
            )
            self.shifts.append(relative_shift(self.centres, updated))
            self.centres = updated
            if self.shifts[-1] <= self.params.delta:
                self.finished, self.stop_reason = (
                    True,
                    f"relative centre shift {self.shifts[-1]:.2e} <= delta",
                )
        return ndarrays_to_parameters([self.centres])

    def extra_summary(self) -> dict[str, Any]:
        privacy = privacy_summary(self.cfg.dp, self.method, self.cfg.num_rounds, self.dp_releases)
        return {"centre_shift_per_round": self.shifts, "privacy": privacy}
