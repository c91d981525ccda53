"""Federated fuzzy c-means strategy (Stallmann & Wilbik 2022).

Round 1: weighted k-means over the clients' local FCM centres (weights = membership mass) gives the
initial global centres. Rounds >= 2: global centres = sum of clients' membership-weighted sums divided by
the summed membership mass (the FCM centre update over the union). Stops when the largest centre shift,
relative to the centres' scale, is <= `delta`.

Privacy is composed around it (`strategies.privacy`): where only sums may reach the server (SecAgg+) or
be noised (DP) the initialisation is the moments one; under DP every reply is noisy, so masses may be
negative and a cluster whose summed noisy mass is at most 1 (`noise_floor`) keeps its previous centre.
"""

from __future__ import annotations

from logging import INFO
from typing import Any

import numpy as np
from flwr.common import Parameters, Scalar, log, ndarrays_to_parameters

from fedapp.config.run import RunConfig
from fedapp.maths.clustering import centres_from_moments, kmeans
from fedapp.methods.ffcm import FFCMConfig
from fedapp.privacy.secagg import MEAN, SUM
from fedapp.report.keep import StartCandidate
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


def centres_from_totals(
    sums: np.ndarray, mass: np.ndarray, previous: np.ndarray | None = None, min_mass: float = 0.0
) -> np.ndarray:
    """FCM centre update over the union: c_j = sum_clients sum_i u_ij^m x_i / sum_clients sum_i u_ij^m,
    from those two totals.

    A cluster every client withheld (its membership mass below their privacy floor), or whose total mass
    is <= `min_mass` (noisy DP masses: a near-zero denominator would fling the centre away), keeps its
    `previous` centre; without one, such a cluster is an error."""
    empty = mass <= min_mass
    if empty.any() and previous is None:
        raise ValueError("a cluster received zero membership mass")
    centres = sums / np.where(empty, 1.0, mass)[:, None]
    if empty.any():
        centres[empty] = previous[empty]  # type: ignore[index]
    return centres


def relative_shift(old: np.ndarray, new: np.ndarray) -> float:
    return float(np.abs(new - old).max() / max(np.abs(old).max(), 1e-12))


class FFCMStrategy(ClusteringStrategy):
    method = "ffcm"
    state_fields = ("centres", "shifts", "initial_centres")

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.params = cfg.params(FFCMConfig)
        # only sums may reach the server (SecAgg+) or be noised (DP): then the initialisation is one too
        self.init = "moments" if self.privacy.sums_only else self.params.init
        self.centres: np.ndarray | None = None
        self.shifts: list[float] = []
        self.initial_centres: np.ndarray | None = None  # after round 1: the one-shot clustering

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        phase = (
            "update" if self.centres is not None else "init" if self.init == "local-centres" else "moments"
        )
        return {
            **super().fit_config(server_round),
            "phase": phase,
            "fuzziness": self.params.fuzziness,
            "local-iters": self.params.local_iters,
            "secagg": self.cfg.secagg,  # the protocol's flag (clients take the mode from the run config)
        }

    def reply_spec(self, server_round: int) -> list[ArraySpec]:
        if self.centres is None and self.init == "moments":
            return self.privacy.moments_spec()
        if self.centres is None:
            return [ArraySpec("centres", (None, None)), ArraySpec("mass", (None,))]
        k, dim = self.centres.shape
        return self.privacy.expected([ArraySpec("sums", (k, dim)), ArraySpec("mass", (k,))], [SUM, SUM])

    def consistent(self, server_round: int, replies: list[ClientReply]) -> list[ClientReply]:
        # the feature dimension is not known before the first replies
        if self.centres is not None:
            return replies
        return consistent_replies(replies, server_round, axis=0 if self.init == "moments" else 1)

    def check_reply(self, server_round: int, reply: ClientReply) -> None:
        first, second = reply.arrays[:2]
        if first.shape[0] != second.shape[0]:
            raise ReplyError(f"arrays of {first.shape[0]} and {second.shape[0]} rows")
        if self.centres is not None or self.init == "local-centres":
            self.privacy.check_nonnegative(second, "membership mass")

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> Parameters | None:
        # the moments are n-weighted means (SecAgg+ averages them as they are), the updates per-record sums
        replies = self.privacy.intake(
            server_round, replies, [MEAN, MEAN] if self.centres is None else [SUM, SUM]
        )
        if self.centres is None and self.init == "moments":
            assert self.k is not None
            mean, mean_square = self.privacy.moments(replies)
            self.centres = centres_from_moments(mean, mean_square, self.k, self.cfg.seed)
            log(INFO, "FFCM: initial centres from the federated feature moments (%d replies)", len(replies))
        elif self.centres is None:
            assert self.k is not None  # _validated rejects every reply while k is unknown
            self.centres = merge_weighted_centres(
                [r.arrays[0] for r in replies], [r.arrays[1] for r in replies], self.k, self.cfg.seed
            )
            log(INFO, "FFCM: initial centres from %d clients' local FCM centres", len(replies))
        else:  # the FCM centre update over the union, from the federation's totals
            sums = self.privacy.totals([r.arrays[0] for r in replies])
            mass = self.privacy.totals([r.arrays[1] for r in replies], nonnegative=True)
            updated = centres_from_totals(sums, mass, self.centres, min_mass=self.privacy.noise_floor)
            self.shifts.append(relative_shift(self.centres, updated))
            self.centres = updated
            if self.shifts[-1] <= self.params.delta:
                self.finished, self.stop_reason = (
                    True,
                    f"relative centre shift {self.shifts[-1]:.2e} <= delta",
                )
        if self.initial_centres is None:  # after round 1: the clustering training starts from
            self.initial_centres = self.centres.copy()
        return ndarrays_to_parameters([self.centres])

    def start_candidate(self) -> StartCandidate | None:
        """The initial global centres: weighted k-means over the local FCM centres (k-FED's scheme, so
        named), or with `init = moments` (always under SecAgg+) seeded draws, which no method amounts to."""
        if self.initial_centres is None:
            return None
        return StartCandidate([self.initial_centres], {}, "kfed" if self.init == "local-centres" else "")

    def effective_config(self) -> dict[str, Any]:
        return {**super().effective_config(), "ffcm.init": self.init}

    def extra_summary(self) -> dict[str, Any]:
        return {"centre_shift_per_round": self.shifts}
