"""Differential privacy: clipping, the Gaussian mechanism and an RDP accountant, for every method that
supports it (its `MethodSpec.dp`, a `DPSupport`; a run's schedule is `fedapp.privacy.plan.DPPlan`).

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
z whose *planned* schedule spends at most the target epsilon; `epsilon_spent` reports what ran. The
plan includes the final report's releases when it is noised (`dp.report = noise`, `report_releases`).

**Client-level releases (model updates: CCFC, gFedNTM, FSTC's final model).** An update computed by
training on all of a client's records has no bounded per-record sensitivity, so it is clipped as a whole
(`clipped_release`: each part to L2 norm <= `model-clip`) and noised with std z * model-clip per part:
adding or removing the client's whole contribution moves the release by at most that, so the guarantee
is per *client* (`UNITS`). FSTC's final model (only with `fstc.dp-labels = model`) is released once with
multiplier 2z: any two clipped updates differ by at most 2 * model-clip, so for one record of that client
the release is again a Gaussian release of multiplier z and the record-level schedule (`planned_releases`)
counts it. With `fstc.dp-labels = centres` (the default) FSTC releases no model; its plan is one release
fewer, so callers pass `model_release` for FSTC (the schedule depends on it; other methods ignore it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import MetricRecord, RecordDict

from fedapp.config.keys import ConfigSection, config_key

RECORD, CLIENT = "record", "client"  # the unit one epsilon protects: one record, or one client's whole data
# the evaluation messages are not covered for any method (docs/privacy.md)
EVALUATION_NOT_COVERED = (
    "evaluation rounds: contingency tables (with labels) or cluster sizes (without), sent exactly",
)
RUNNING_STATISTICS = ("running_mean", "running_var")  # BatchNorm buffers computed from the data
RELEASES_KEY = "dp-releases"  # fit metrics: how many noisy releases this client has made in this run
STATE_KEY = "fedapp.dp"  # context.state: the client's own count of its releases


REPORT_NOISE, REPORT_WITHHOLD = "noise", "withhold"
REPORT_MODES = (REPORT_NOISE, REPORT_WITHHOLD)
REPORT_RELEASES = 2  # final report under `dp.report = noise`: (sizes, sums), then (distance sums, silhouette)


class PrivacyBudgetError(RuntimeError):
    """A client was asked for more releases than the planned schedule its noise was calibrated for."""


@dataclass(frozen=True)
class DPConfig(ConfigSection):
    """The keys of `[tool.flwr.app.config.dp]` (`--set dp.epsilon=2`)."""

    epsilon: float = config_key(
        0.0,
        ge=0.0,
        doc="differential privacy: total epsilon per record, or per client (ccfc, gfedntm); 0 = off",
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
    model_clip: float = config_key(
        1.0,
        gt=0.0,
        doc="differential privacy: L2 norm a model update (CCFC delta, gFedNTM gradient, FSTC's final "
        "model delta) is clipped to",
    )
    report: str = config_key(
        "withhold",
        choices=REPORT_MODES,
        doc="final report under DP: withhold = only the local assignments; noise = noisy cluster sizes, "
        "sums and distance sums (2 more releases in the plan, so more noise; record-level methods only)",
    )
    noise_seed: int = config_key(
        -1,
        ge=-1,
        doc="differential privacy: -1 = noise from OS entropy; >= 0 = seeded noise, so a DP run repeats "
        "(experiments only: whoever knows the seed, e.g. the server, can remove the noise)",
    )

    @property
    def enabled(self) -> bool:
        return self.epsilon > 0


@dataclass(frozen=True)
class DPSupport:
    """How a method runs under differential privacy, declared on its `MethodSpec.dp`.

    `training_releases(num_rounds, dp, params)`: the noisy releases one client makes in a full run's
    training (the schedule the noise is calibrated for; `params` is the method's own config section).
    `model_release(params)`: the last round also releases the trained model with client-level noise 2z
    (FSTC with `fstc.dp-labels = model`), which summary.json accounts on its own. `not_covered`: what the
    method still sends unnoised under DP."""

    unit: str
    training_releases: Callable[[int, DPConfig, ConfigSection | None], int]
    not_covered: tuple[str, ...] = ()
    model_release: Callable[[ConfigSection | None], bool] = lambda params: False

    def __post_init__(self) -> None:
        if self.unit not in (RECORD, CLIENT):
            raise ValueError(f"DP unit {self.unit!r}, expected {RECORD!r} or {CLIENT!r}")


# ------------------------------------------------------------------------------------ mechanism
def clip_rows(X: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled down to L2 norm <= `clip` (rows already inside the ball are unchanged)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def sum_count_sensitivity(clip: float) -> float:
    """L2 sensitivity of (per-cluster sums, per-cluster counts) of clipped records (module docstring)."""
    return math.sqrt(clip**2 + 1.0)


def distance_sensitivity(clip: float) -> float:
    """L2 sensitivity of the report's (per-cluster distance sums, squared distance sums, silhouette sum)
    of clipped records around means inside the clip ball: one record adds d <= 2 clip to one distance
    sum, d^2 <= 4 clip^2 to one squared sum and s in [-1, 1] to the silhouette sum."""
    return math.sqrt((2 * clip) ** 2 + (2 * clip) ** 4 + 1.0)


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


def clip_joint(arrays: list[np.ndarray], clip: float) -> tuple[list[np.ndarray], float]:
    """The arrays scaled together to L2 norm <= `clip` (one vector), and their norm before clipping."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    norm = math.sqrt(sum(float(np.square(a).sum()) for a in arrays))
    factor = min(1.0, clip / max(norm, 1e-300))
    return [a * factor for a in arrays], norm


def clipped_release(
    parts: list[list[np.ndarray]], clip: float, noise_multiplier: float, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """One client-level Gaussian release: each part clipped jointly to L2 norm <= `clip`, then
    N(0, (z * clip * sqrt(parts))^2) on every coordinate (the L2 sensitivity of all parts together is
    clip * sqrt(parts) when the client's contribution is added or removed)."""
    sensitivity = clip * math.sqrt(len(parts))
    return [
        gaussian_mechanism(clip_joint(part, clip)[0], sensitivity, noise_multiplier, rng) for part in parts
    ]


def released_arrays(names: list[str], arrays: list[np.ndarray], parameters: set[str]) -> list[bool]:
    """Which of a model's arrays a DP update carries: float parameters and BatchNorm running statistics
    (both computed from the data); other buffers (step counters, fixed priors) go back as received."""
    return [
        np.issubdtype(a.dtype, np.floating) and (name in parameters or name.endswith(RUNNING_STATISTICS))
        for name, a in zip(names, arrays, strict=True)
    ]


def private_update(
    received: list[np.ndarray],
    local: list[np.ndarray],
    released: list[bool],
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    extra: list[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A client-level release of a model update: `received` plus the clipped, noised delta
    (local - received) on the `released` arrays, the others as received, in `local`'s dtypes; `extra`
    (e.g. CCFC's scaled centroids) is a second part of the same release. For a gradient, pass zeros as
    `received`. Returns (the state to send, the noisy extra part)."""
    pairs = list(zip(received, local, released, strict=True))
    delta = [np.asarray(new, np.float64) - np.asarray(old, np.float64) for old, new, keep in pairs if keep]
    noisy = clipped_release([delta, *([extra] if extra else [])], clip, noise_multiplier, rng)
    updates = iter(noisy[0])
    state = [
        (np.asarray(old, np.float64) + next(updates)).astype(new.dtype) if keep else np.array(old, copy=True)
        for old, new, keep in pairs
    ]
    return state, noisy[1] if extra else []


def floor_variances(names: list[str], arrays: list[np.ndarray], floor: float = 1e-3) -> list[np.ndarray]:
    """Noisy averaged BatchNorm variances may be <= 0: post-processing keeps them >= `floor`."""
    return [
        np.maximum(a, floor).astype(a.dtype) if n.endswith("running_var") else a
        for n, a in zip(names, arrays, strict=True)
    ]


def secret_rng(
    dp: DPConfig | None = None, partition: int = 0, release: int = 0, stream: int = 0
) -> np.random.Generator:
    """The noise generator of one release: fresh OS entropy, since noise derived from the run's seed (which
    the server knows) could be subtracted. With `dp.noise-seed` >= 0 (experiments that must repeat) it is
    seeded from that seed, the client, the release and the stream within the release instead."""
    if dp is None or dp.noise_seed < 0:
        return np.random.default_rng()
    return np.random.default_rng([dp.noise_seed, max(partition, 0), release, stream])


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


def count_releases(state: RecordDict, planned: int, new: int = 1) -> int:
    """A client's running count of its releases in `context.state`, after `new` more (`next_release`)."""
    made = int(state[STATE_KEY]["releases"]) if STATE_KEY in state else 0
    for _ in range(new):
        made = next_release(made, planned)
    state[STATE_KEY] = MetricRecord({"releases": made})
    return made


def next_release(made: int, planned: int) -> int:
    """The count after one more release; refuses to go past the plan (the noise would no longer cover
    it). Clients call it before releasing, so a server asking for extra rounds gets an error, not data."""
    if made >= planned:
        raise PrivacyBudgetError(
            f"privacy budget spent: {made} of {planned} planned releases made, refusing another"
        )
    return made + 1
