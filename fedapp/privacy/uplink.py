"""How a client's statistics leave it: as they are, as SecAgg+ shares, or as differentially private releases.

Flower composes privacy around a client as a mod; here every `ClusteringClient` holds an `Uplink`. A
method computes its statistics the same way in every mode and says what they are; the uplink does the
rest:
- `send(arrays, modes, ...)`: each array is one of `fedapp.privacy.secagg`'s kinds — SUM (per-record sums:
  per-cluster sums, counts, masses), MEAN (n-weighted averages: weights, gradients), CENTRES (means weighted
  by the counts beside them) or CLEAR (not a sum). Plain: sent as they are. SecAgg+ (`secagg`): encoded so
  that only their total reaches the server. DP (`dp.epsilon` > 0): SUM arrays only, as one Gaussian
  release of the sensitivity the method states for one record, counted against the run's plan.
- `send_moments(values)`: the mean and mean square of the client's records, the initialisation a server
  that may only see sums draws its centres from (noisy sums and count under DP).
- `send_update(received, local, ...)`: a model update (with extra parts, e.g. CCFC's centroids), released
  at client level under DP: the delta clipped to `dp.model-clip` and noised (`fedapp.privacy.dp`).
It also gives the method the two things DP changes in what it computes: `records(X)` (every record
clipped to `dp.clip`, so one record's contribution is bounded) and `floor` (the privacy floor's
withholding is off under DP: deciding by the data whether to send would itself leak; the noise covers
small clusters). A method's own protocol choices under DP (k-FED's DP-Lloyd, FSTC's public space) use
`release()` directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from flwr.common import NDArrays, RecordDict, Scalar

from fedapp.privacy.dp import (
    RECORD,
    RELEASES_KEY,
    DPConfig,
    clip_rows,
    count_releases,
    gaussian_mechanism,
    moments_sensitivity,
    private_update,
    secret_rng,
)
from fedapp.privacy.floor import WITHHELD_KEY
from fedapp.privacy.plan import DPPlan, check_delta, dp_plan
from fedapp.privacy.secagg import CLEAR, MEAN, SUM, model_modes, secure_upload

if TYPE_CHECKING:
    from fedapp.config.run import RunConfig

Reply = tuple[NDArrays, int, dict[str, Scalar]]


class UnboundedMessageError(ValueError):
    """Under DP a method tried to send what has no bounded per-record sensitivity (not a SUM)."""


@dataclass(frozen=True)
class Release:
    """One DP release of a client (or several counted at once): its noise and its generators."""

    noise_multiplier: float
    made: int  # releases this client has made in the run, this one included
    dp: DPConfig
    partition: int

    def rng(self, stream: int = 0) -> np.random.Generator:
        """The noise generator of one stream of this release (`fedapp.privacy.dp.secret_rng`)."""
        return secret_rng(self.dp, self.partition, self.made, stream)

    def gaussian(self, arrays: Sequence[np.ndarray], sensitivity: float, stream: int = 0) -> list[np.ndarray]:
        """The arrays with the Gaussian mechanism's noise for `sensitivity` (one record's L2 bound)."""
        return gaussian_mechanism(list(arrays), sensitivity, self.noise_multiplier, self.rng(stream))

    @property
    def metrics(self) -> dict[str, Scalar]:
        return {RELEASES_KEY: self.made}


class Uplink:
    """A client's way out (module docstring): plain, SecAgg+ or DP, decided by the run config alone."""

    def __init__(
        self, cfg: RunConfig, state: RecordDict, partition: int, floor: int, records: int, clients: int
    ) -> None:
        self.cfg = cfg
        self.state = state  # context.state: the client's count of its releases survives rounds
        self.partition = partition
        self.privacy_floor = floor
        self.plan: DPPlan | None = dp_plan(cfg) if cfg.dp.enabled else None
        if self.plan is not None:  # a node checks its own data: the run config is the server's word
            check_delta(cfg, [records] if self.plan.support.unit == RECORD else [records] * clients)

    @property
    def private(self) -> bool:
        """Differential privacy is on: what leaves is noised."""
        return self.plan is not None

    @property
    def floor(self) -> int:
        """Clusters below this many records are withheld: the privacy floor, 0 under DP (docstring)."""
        return 0 if self.private else self.privacy_floor

    def records(self, X: np.ndarray) -> np.ndarray:
        """The records as the method may use them: clipped to dp.clip under DP, as they are otherwise."""
        return clip_rows(X, self.cfg.dp.clip) if self.private else X

    # ------------------------------------------------------------------------------------ releases
    def release(self, count: int = 1, *, report: bool = False) -> Release:
        """Count `count` more releases against the plan (training's, or the whole plan's for the final
        report); PrivacyBudgetError once it is spent, so a server asking for more gets an error, not data."""
        if self.plan is None:
            raise ValueError("a DP release without dp.epsilon > 0")
        planned = self.plan.total if report else self.plan.training
        made = count_releases(self.state, planned, count)
        return Release(self.plan.noise_multiplier, made, self.cfg.dp, self.partition)

    # --------------------------------------------------------------------------------- messages
    def send(
        self,
        arrays: Sequence[np.ndarray],
        modes: Sequence[str],
        n: int,
        metrics: dict[str, Scalar],
        *,
        sensitivity: float | None = None,
    ) -> Reply:
        """A reply of `arrays` (of `modes`) with weight n; under DP one release of `sensitivity`."""
        if self.private:
            if sensitivity is None or any(mode != SUM for mode in modes):
                raise UnboundedMessageError(
                    f"client {self.partition}: a message of {list(modes)} has no bounded per-record "
                    "sensitivity; under DP only moments and per-cluster sums may leave a client"
                )
            release = self.release()
            sent = {key: value for key, value in metrics.items() if key != WITHHELD_KEY}  # no floor under DP
            return release.gaussian(arrays, sensitivity), 0, {**sent, **release.metrics}
        if self.cfg.secagg:
            masked, extra = secure_upload(arrays, modes, n, self.cfg.secagg_clip)
            return masked, n, {**metrics, **extra}
        return list(arrays), n, metrics

    def send_moments(self, values: np.ndarray, metrics: dict[str, Scalar]) -> Reply:
        """The records' mean and mean square (n-weighted averages); under DP their noisy sums and count,
        `values` clipped by the caller (`records`)."""
        values = np.asarray(values, dtype=np.float64)
        if self.private:
            release = self.release()
            stats = [values.sum(0), (values**2).sum(0), np.array([float(values.shape[0])])]
            noisy = release.gaussian(stats, moments_sensitivity(self.cfg.dp.clip))
            return noisy, 0, {**metrics, **release.metrics}
        return self.send([values.mean(0), (values**2).mean(0)], [MEAN, MEAN], values.shape[0], metrics)

    def send_update(
        self,
        origin: Callable[[], tuple[list[np.ndarray], list[bool]]],
        local: list[np.ndarray],
        n: int,
        metrics: dict[str, Scalar],
        *,
        extra: list[np.ndarray] | None = None,
        extra_dtypes: Sequence[np.dtype] | None = None,
        private_weight: int = 1,
    ) -> Reply:
        """A model's `local` state (+ `extra` parts that are not sums, e.g. CCFC's centroids).

        Under DP one client-level release. `origin()` gives (what the update is a delta from: the
        received state, zeros for a gradient; which arrays are released: float parameters and running
        statistics); the reply is that origin plus the clipped, noised delta on the released arrays,
        `extra` a second part of the same release. The state goes back in its own dtypes, the extra parts
        in `extra_dtypes` (default: their own). The weight is `private_weight` (1: equal weights, a
        client's size is private too). `origin` runs only under DP."""
        extra = extra or []
        if self.private:
            release = self.release()
            received, released = origin()
            state, noisy = private_update(
                received,
                local,
                released,
                self.cfg.dp.model_clip,
                release.noise_multiplier,
                release.rng(),
                extra or None,
            )
            dtypes = extra_dtypes or [e.dtype for e in extra]
            noisy = [a.astype(dtype) for a, dtype in zip(noisy, dtypes, strict=True)]
            return state + noisy, private_weight, {**metrics, **release.metrics}
        return self.send(local + extra, model_modes(local) + [CLEAR] * len(extra), n, metrics)
