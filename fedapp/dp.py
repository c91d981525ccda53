"""Differential privacy for the sum-based methods: clipping, the Gaussian mechanism and an RDP accountant.

**What is protected.** One record of one client, under add/remove-one-record adjacency. Each client
clips every record's feature vector to L2 norm <= `clip`, computes its per-cluster statistics from the
clipped records and adds Gaussian noise *before* anything leaves it (local model: the server, honest but
curious, only ever sees noisy statistics). Clients hold disjoint records, so a record's privacy loss is
the composition over the releases of its own client alone (parallel composition across clients): the
federation's (epsilon, delta) is that of one client's schedule of releases.

**Sensitivity of (per-cluster sums, per-cluster counts).** A record x adds w_j * x to cluster j's sum and
w_j to its count, with w_j >= 0 and sum_j w_j <= 1: hard assignments (k-FED) put w = 1 on one cluster;
fuzzy c-means puts w_j = u_ij^m with u_ij summing to 1 and m > 1, so sum_j u_ij^m <= 1. Adding or
removing the record changes the released vector by (w_j x, w_j)_j, whose squared L2 norm is
sum_j w_j^2 (||x||^2 + 1) <= (sum_j w_j)^2 (clip^2 + 1) <= clip^2 + 1: the sensitivity is
sqrt(clip^2 + 1) (`SUM_COUNT`), whatever k. FFCM's moment initialisation releases (sum x, sum x*x,
count); ||x*x||_2 <= ||x||_2^2 <= clip^2, so its sensitivity is sqrt(clip^2 + clip^4 + 1) (`moments`).

**Noise and accounting.** Every release adds N(0, (z * sensitivity)^2) to each coordinate with one noise
multiplier z for the whole run, so each release is a `GaussianDpEvent(z)`; the run's epsilon at delta is
the RDP accountant's (Google's `dp-accounting`) for the client's releases. `calibrate` finds the smallest
z whose *planned* schedule spends at most the target epsilon; `epsilon_spent` reports what ran.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from fedapp.config_keys import ConfigSection, config_key

# methods whose clients noise every statistic they send (clients/ffcm.py, clients/kfed.py, textkfed's
# FSBERT-kFED); FBOW/FTF-IDF are not here: their vocabulary round sends exact document frequencies
DP_METHODS = frozenset({"ffcm", "kfed", "fsbert-kfed"})
RELEASES_KEY = "dp-releases"  # fit metrics: how many noisy releases this client has made in this run
STATE_KEY = "fedapp.dp"  # context.state: the client's own count of its releases


class PrivacyBudgetError(RuntimeError):
    """A client was asked for more releases than the planned schedule its noise was calibrated for."""


@dataclass(frozen=True)
class DPConfig(ConfigSection):
    """The keys of `[tool.flwr.app.config.dp]` (`--set dp.epsilon=2`)."""

    epsilon: float = config_key(
        0.0, ge=0.0, doc="differential privacy: the run's total epsilon per record (0 = off)"
    )
    delta: float = config_key(1e-5, gt=0.0, lt=1.0, doc="differential privacy: delta (< 1 / records)")
    clip: float = config_key(
        1.0,
        gt=0.0,
        doc="differential privacy: every record's feature vector is clipped to this L2 norm (after scaling)",
    )
    lloyd_iters: int = config_key(
        5, ge=2, doc="k-FED under DP: local DP-Lloyd releases (the noisy mean, then Lloyd steps)"
    )

    @property
    def enabled(self) -> bool:
        return self.epsilon > 0


def planned_releases(method: str, num_rounds: int, lloyd_iters: int) -> int:
    """How many noisy releases one client makes in a full run (the schedule the noise is calibrated for).

    FFCM: one per fit round (round 1 the noisy moments, then the noisy membership sums). k-FED and
    FSBERT-kFED: the local DP-Lloyd iterations, sent once (the last one's centres)."""
    if method == "ffcm":
        return num_rounds
    if method in ("kfed", "fsbert-kfed"):
        return lloyd_iters
    raise ValueError(
        f"method '{method}' does not support differential privacy; use one of {sorted(DP_METHODS)}"
    )


# ------------------------------------------------------------------------------------ mechanism
def clip_rows(X: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled down to L2 norm <= `clip` (rows already inside the ball are unchanged)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def sum_count_sensitivity(clip: float) -> float:
    """L2 sensitivity of (per-cluster sums, per-cluster counts) of clipped records (module docstring)."""
    return math.sqrt(clip**2 + 1.0)


def moments_sensitivity(clip: float) -> float:
    """L2 sensitivity of (sum x, sum x*x, count) of clipped records (module docstring)."""
    return math.sqrt(clip**2 + clip**4 + 1.0)


def gaussian_mechanism(
    statistics: list[np.ndarray], sensitivity: float, noise_multiplier: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """The statistics plus N(0, (noise_multiplier * sensitivity)^2) on every coordinate: one release.

    `sensitivity` must bound the L2 change of all the arrays together when one record is added or
    removed. Use a generator the server cannot reproduce (`secret_rng`), or the noise can be subtracted."""
    scale = noise_multiplier * sensitivity
    return [np.asarray(s, dtype=np.float64) + rng.normal(0.0, scale, np.shape(s)) for s in statistics]


def secret_rng() -> np.random.Generator:
    """Fresh OS entropy: the noise must not derive from the run's seed, which the server knows."""
    return np.random.default_rng()


# ----------------------------------------------------------------------------------- accounting
def epsilon_spent(noise_multiplier: float, releases: int, delta: float) -> float:
    """Epsilon at `delta` of `releases` Gaussian releases of noise multiplier z (RDP accountant)."""
    if releases <= 0:
        return 0.0
    import dp_accounting  # heavy import (~1 s): only runs with DP pay it
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), releases)
    return float(accountant.get_epsilon(delta))


@functools.cache  # every client calls it every round with the same plan
def calibrate(epsilon: float, delta: float, releases: int, tolerance: float = 1e-4) -> float:
    """The noise multiplier z for which `releases` Gaussian releases spend epsilon in
    [target - tolerance, target] at `delta` (bisection: epsilon falls as z grows)."""
    if epsilon <= 0 or releases < 1:
        raise ValueError(f"calibration needs epsilon > 0 and >= 1 release, got {epsilon} and {releases}")
    low, high = 1e-3, 1.0
    while epsilon_spent(high, releases, delta) > epsilon:
        low, high = high, 2 * high
        if high > 1e7:
            raise ValueError(f"no noise multiplier reaches epsilon={epsilon} at delta={delta}")
    for _ in range(200):
        middle = (low + high) / 2
        if epsilon_spent(middle, releases, delta) > epsilon:
            low = middle
        else:
            high = middle
        if epsilon - epsilon_spent(high, releases, delta) <= tolerance or high - low < 1e-12:
            break
    return high  # the side that never overspends


def noise_multiplier(dp: DPConfig, method: str, num_rounds: int) -> float:
    """The run's noise multiplier: calibrated to the method's planned schedule."""
    return calibrate(dp.epsilon, dp.delta, planned_releases(method, num_rounds, dp.lloyd_iters))


def privacy_summary(dp: DPConfig, method: str, num_rounds: int, releases: int) -> dict[str, object]:
    """summary.json's `privacy` block; `releases`: the most any client made (what actually ran)."""
    if not dp.enabled:
        return {"dp": None}
    z = noise_multiplier(dp, method, num_rounds)
    return {
        "dp": {
            "epsilon_target": dp.epsilon,
            "delta": dp.delta,
            "clip": dp.clip,
            "noise_multiplier": z,
            "releases": releases,
            "planned_releases": planned_releases(method, num_rounds, dp.lloyd_iters),
            "epsilon_spent": epsilon_spent(z, releases, dp.delta),
            "accountant": "rdp",
        }
    }


def next_release(made: int, planned: int) -> int:
    """The count after one more release; refuses to go past the plan (the noise would no longer cover
    it). Clients call it before releasing, so a server asking for extra rounds gets an error, not data."""
    if made >= planned:
        raise PrivacyBudgetError(
            f"privacy budget spent: {made} of {planned} planned releases made, refusing another"
        )
    return made + 1
