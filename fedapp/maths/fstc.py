"""FSTC's maths (Hu et al., IJCAI 2023), framework-free: plain functions and small estimators on tensors
and arrays, used by the FSTC client and strategy (and FSCCL's initialisation) and tested on their own.

- `label_update_steps` — when pseudo-labels are recomputed (Alg. 3 line 2),
- `sinkhorn_log_plan` / `pseudo_labels` — Alg. 1 (Eq. 2-7), in the log domain,
- `GaussianUniformMixture` — the robust weights' model (Eq. 8-12) and `robust_weights` (Eq. 13),
- `weighted_mse` (Eq. 14), `cluster_centres` / `LocalCentres` (Eq. 15), `alignment_loss` (Eq. 17),
- `local_kmeans_summary` (a client's private initialisation message), `initial_centres` (Alg. 2 lines 2-4)
  and `aggregate_centres` (Eq. 16) — the global centres C̃.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

import numpy as np
import scipy.linalg
import torch

from fedapp.maths.clustering import gaussian_centres, kmeans, nearest_centre, weighted_centre_sums
from fedapp.privacy.floor import CLIENT_MIN_CLUSTER, floored_kmeans

# a count total below half a record is empty: exact counts are integers, SecAgg+'s totals are off by rounding
EMPTY_TOTAL = 0.5


# ------------------------------------------------------------------------------------- schedule
def label_update_steps(total_steps: int, updates: int, warmup: int) -> list[int]:
    """Local iterations (counted over the whole run) before which Q is recomputed (Alg. 3 line 2).

    The paper spreads the updates "in a logarithmic distribution" after Asano et al. (SeLa), whose code
    uses a quadratic spacing: update j of M happens at warmup + (T - warmup) * (j / M)^2, dense early
    (the pseudo-labels move most while the model is young) and sparse late. Before `warmup` the model
    fits the initial k-means labels, so the first update already sees a trained F.
    """
    if total_steps < 1 or updates < 1 or warmup < 0:
        raise ValueError(
            f"need total_steps >= 1, updates >= 1, warmup >= 0; got {total_steps}, {updates}, {warmup}"
        )
    if warmup >= total_steps:
        return []
    span = total_steps - warmup
    return sorted({warmup + int(span * (j / updates) ** 2) for j in range(updates)})


# ------------------------------------------------------------------------------------ Sinkhorn
SHARE_STEP = 0.1  # damping of the self-adaptive shares' update (see `sinkhorn_log_plan`)


class SinkhornOptions(TypedDict, total=False):
    """The optional settings of `sinkhorn_log_plan` (see there), which `pseudo_labels` passes on."""

    max_iters: int
    tol: float
    init_log_v: torch.Tensor | None
    marginal_strength: float | None
    marginal_barrier: float | None


@dataclass(frozen=True)
class SinkhornResult:
    """log ξ of the transport plan (N x K), the iterations used, the largest row-marginal error, and
    log v (K), which warm-starts the next solve (the duals move little between label updates)."""

    log_plan: torch.Tensor
    iterations: int
    marginal_error: float
    log_v: torch.Tensor


def sinkhorn_log_plan(
    log_probs: torch.Tensor,
    epsilon: float,
    *,
    max_iters: int = 1000,
    tol: float = 1e-6,
    init_log_v: torch.Tensor | None = None,
    marginal_strength: float | None = None,
    marginal_barrier: float | None = None,
) -> SinkhornResult:
    """Entropic OT of Eq. 2 with cost M = -log P, a = 1_N, b = (N/K) 1_K, solved in the log domain.

    `marginal_strength` τ (None: the paper's exact column marginal b) relaxes the column constraint to a
    KL penalty τ·KL(Qᵀ1 ‖ b) (unbalanced OT, Chizat et al. 2018): the v-update becomes
    v = (b ⊘ 𝒦ᵀu)^(τ/(τ+ε)), so the clusters' shares follow the data's instead of being forced equal
    (small τ: the predictions' own shares; τ → ∞: Eq. 2). This is `fstc.marginal = adaptive`.

    `marginal_barrier` c (None: off) is RSTC's self-adaptive transport (`fstc.marginal = self-adaptive`):
    the shares b are a variable too, penalised by -c Σ_k [log b_k + log(1 - b_k)], a barrier that keeps
    every cluster non-empty while the shares follow the data. After each v-update, b solves the
    stationarity condition ε log v_k - h = c (1/b_k - 1/(1 - b_k)) with h such that Σ b = 1
    (`self_adaptive_shares`). RSTC's defaults give c = reg2 / log_alpha = 0.1 / 100. RSTC jumps to the
    new shares every iteration, which oscillates (rows off by 0.1-1 after 1000 iterations on skewed
    scores); a geometric step of `SHARE_STEP` toward them converges to the same shares, rows met to 1e-9.

    Eq. 4-6 iterate u = a ⊘ 𝒦v, v = b ⊘ 𝒦ᵀu with 𝒦 = exp(-M/ε) = P^(1/ε); with ε = 0.1 that is P^10,
    which underflows for any confident prediction, so we iterate log u and log v with logsumexp instead.
    The column marginals hold exactly after each v-update; iteration stops once every row sum is within
    `tol` of 1 (relative to a_i = 1), or after `max_iters` (then `marginal_error` says how far off the
    rows are). Runs in float64 on `log_probs`' device.
    """
    if log_probs.ndim != 2 or log_probs.shape[0] < 1 or log_probs.shape[1] < 1:
        raise ValueError(f"log_probs must be N x K with N, K >= 1, got shape {tuple(log_probs.shape)}")
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    log_kernel = log_probs.double() / epsilon  # log 𝒦 = -M / ε
    if not torch.isfinite(log_kernel).all():
        raise ValueError("log_probs must be finite (use log_softmax of finite scores)")
    n, k = log_kernel.shape
    log_a = torch.zeros(n, dtype=torch.float64, device=log_kernel.device)
    log_b = torch.full((k,), math.log(n / k), dtype=torch.float64, device=log_kernel.device)
    log_u = torch.zeros(n, dtype=torch.float64, device=log_kernel.device)
    log_v = torch.zeros(k, dtype=torch.float64, device=log_kernel.device)
    if init_log_v is not None and init_log_v.shape == (k,) and torch.isfinite(init_log_v).all():
        log_v = init_log_v.to(log_kernel.device, torch.float64)  # Alg. 1 line 4 allows any start
    error = math.inf
    iterations = 0
    exponent = 1.0 if marginal_strength is None else marginal_strength / (marginal_strength + epsilon)
    if marginal_strength is not None and marginal_barrier is not None:
        raise ValueError("marginal_strength and marginal_barrier are two different marginals: pass one")
    kernel = _StabilisedKernel(log_kernel)
    while iterations < max_iters:
        row_terms = kernel.row_terms(log_v)  # log (𝒦v)_i
        if iterations > 0:  # rows of the current plan sum to u_i (𝒦v)_i: check them for free
            error = float(((log_u + row_terms).exp() - 1.0).abs().max())
            if error <= tol:
                break
        iterations += 1
        log_u = log_a - row_terms  # Eq. 5
        log_v = exponent * (log_b - kernel.column_terms(log_u))  # Eq. 6
        if marginal_barrier is not None:  # a damped step toward RSTC's shares; the next v-update meets them
            target = torch.log(self_adaptive_shares(epsilon * log_v, marginal_barrier))
            log_b = (1 - SHARE_STEP) * log_b + SHARE_STEP * (target + math.log(n))
            log_b = log_b - torch.logsumexp(log_b, dim=0) + math.log(n)
    else:
        row_terms = kernel.row_terms(log_v)
        error = float(((log_u + row_terms).exp() - 1.0).abs().max())
    return SinkhornResult(log_u[:, None] + log_kernel + log_v[None, :], iterations, error, log_v)  # Eq. 4


class _StabilisedKernel:
    """The two log-sum-exps of a Sinkhorn iteration as matrix-vector products (Schmitzer 2019's
    stabilisation with fixed offsets): log Σ_j exp(L_ij + v_j) = m_i + max v + log Σ_j e^(L_ij - m_i)
    e^(v_j - max v), with e^(L - m) (m: each row's max of L) computed once instead of N x K exponentials
    per iteration; columns likewise. Where a sum comes within `TINY` of underflow (the potentials have
    moved too far from the offsets for float64) that step is the exact logsumexp: the two agree to
    float64 rounding, ~10 times faster for the N x 150 plans of many clusters."""

    TINY = 1e-280

    def __init__(self, log_kernel: torch.Tensor) -> None:
        self.log_kernel = log_kernel
        self.row_max = log_kernel.max(dim=1).values
        self.column_max = log_kernel.max(dim=0).values
        self.rows = torch.exp(log_kernel - self.row_max[:, None])
        self.columns = torch.exp(log_kernel - self.column_max[None, :])

    def row_terms(self, log_v: torch.Tensor) -> torch.Tensor:
        """log Σ_j exp(L_ij + v_j) for every row i."""
        top = log_v.max()
        sums = self.rows @ torch.exp(log_v - top)
        if not bool((sums > self.TINY).all()):
            return torch.logsumexp(self.log_kernel + log_v[None, :], dim=1)
        return self.row_max + top + torch.log(sums)

    def column_terms(self, log_u: torch.Tensor) -> torch.Tensor:
        """log Σ_i exp(L_ij + u_i) for every column j."""
        top = log_u.max()
        sums = torch.exp(log_u - top) @ self.columns
        if not bool((sums > self.TINY).all()):
            return torch.logsumexp(self.log_kernel + log_u[:, None], dim=0)
        return self.column_max + top + torch.log(sums)


def self_adaptive_shares(potentials: torch.Tensor, barrier: float, *, iters: int = 100) -> torch.Tensor:
    """RSTC's share update: b_k(h) with c (1/b - 1/(1-b)) = g_k - h and h chosen so that Σ b = 1.

    For t = g - h the root in (0, 1) is b = 2c / (t + 2c + sqrt(t² + 4c²)) (the quadratic's stable
    form, 1/2 at t = 0); it increases with h, so h is found by bisection (RSTC uses Newton steps).
    """
    if not barrier > 0:
        raise ValueError(f"the marginal barrier must be > 0, got {barrier}")

    def shares(h: torch.Tensor) -> torch.Tensor:
        t = potentials - h
        return 2 * barrier / (t + 2 * barrier + torch.sqrt(t * t + 4 * barrier * barrier))

    k = potentials.shape[0]
    # Σ b < 1 below lo and > 1 above hi: every b_k <= 1/k at h = min g - c k, >= 1/k at h = max g + c k
    lo = potentials.min() - barrier * (k + 2)
    hi = potentials.max() + barrier * (k + 2)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if shares(mid).sum() > 1:
            hi = mid
        else:
            lo = mid
    b = shares((lo + hi) / 2)
    return b / b.sum()


def pseudo_labels(
    scores: torch.Tensor, epsilon: float, **options: Unpack[SinkhornOptions]
) -> tuple[torch.Tensor, SinkhornResult]:
    """Alg. 1: P = softmax(O), ξ from the OT of Eq. 2, then Q_ik = ξ_ik² / Σ_k' ξ_ik'² (Eq. 7).

    `options` go to `sinkhorn_log_plan` unchanged (its defaults apply). Squaring in the log domain is a
    row softmax of 2 log ξ, finite for any finite scores.
    """
    log_probs = torch.log_softmax(scores.double(), dim=1)
    result = sinkhorn_log_plan(log_probs, epsilon, **options)
    return torch.softmax(2.0 * result.log_plan, dim=1).to(scores.dtype), result


# ------------------------------------------------------------------- Gaussian-uniform mixture
@dataclass
class GaussianUniformMixture:
    """Eq. 8: δ_i = Q_i - O_i is Gaussian N(0, Σ) for a correct pseudo-label, uniform for a wrong one.

    `fit` runs `steps` EM iterations (E-step Eq. 9, M-step Eq. 10-12), continuing from the parameters
    of the previous call (the model changes a little between local iterations) unless `reset`.
    Eq. 10 is normalised by Σ_i r_i (a covariance, as in DeepGUM), and `ridge` keeps Σ invertible
    (with softmax targets δ sums to zero over k, so Σ is singular). The uniform's density γ is kept as
    log γ = -Σ_k log(2 sqrt(3 (C2_k - C1_k²))) (Eq. 12), which for K = 152 would overflow as a product.
    First fit: one M-step from a hard split — the half with the smallest ‖δ_i‖ as inliers — because from
    r = 1 (Alg. 2 line 5) the uniform has no mass to estimate its box from and EM collapses.
    """

    steps: int = 1
    ridge: float = 1e-6
    min_prior: float = 1e-4
    prior_: float | None = None
    covariance_: np.ndarray | None = None
    log_gamma_: float | None = None

    def fit(self, residuals: np.ndarray, *, reset: bool = False) -> GaussianUniformMixture:
        self.fit_responsibilities(residuals, reset=reset)
        return self

    def fit_responsibilities(self, residuals: np.ndarray, *, reset: bool = False) -> np.ndarray:
        """`steps` EM iterations; returns r of the last E-step (Alg. 3 lines 3-7 use it for w)."""
        delta = _residuals(residuals)
        k = delta.shape[1]
        if reset or self.covariance_ is None or self.covariance_.shape != (k, k):
            norms = (delta**2).sum(1)
            inlier = (norms <= np.median(norms)).astype(np.float64)
            self._maximise(delta, inlier, 1.0 - inlier)
        r = np.ones(delta.shape[0])
        for _ in range(self.steps):
            log_odds = self.log_odds(delta)
            r = _expit(log_odds)
            self._maximise(delta, r, _expit(-log_odds))
        return r

    def responsibilities(self, residuals: np.ndarray) -> np.ndarray:
        """Eq. 9: posterior probability r_i that pseudo-label i is correct."""
        return _expit(self.log_odds(residuals))

    def log_odds(self, residuals: np.ndarray) -> np.ndarray:
        """log π N(δ_i; 0, Σ) - log (1 - π) γ: Eq. 9 before the logistic, exact where r rounds to 0 or 1."""
        if self.covariance_ is None or self.prior_ is None or self.log_gamma_ is None:
            raise ValueError("GaussianUniformMixture is not fitted")
        delta = _residuals(residuals)
        k = delta.shape[1]
        chol = np.linalg.cholesky(self.covariance_)
        whitened = scipy.linalg.solve_triangular(chol, delta.T, lower=True)  # L⁻¹ δ, without Σ⁻¹
        log_det = 2.0 * np.log(np.diag(chol)).sum()
        log_gauss = -0.5 * ((whitened**2).sum(0) + log_det + k * math.log(2 * math.pi))
        return math.log(self.prior_) + log_gauss - math.log(1.0 - self.prior_) - self.log_gamma_

    def _maximise(self, delta: np.ndarray, r: np.ndarray, not_r: np.ndarray) -> None:
        """Eq. 10-12 given r and 1 - r (passed separately: 1 - r loses everything once r rounds to 1)."""
        k = delta.shape[1]
        inlier = r / max(r.sum(), 1e-300)
        scaled = np.sqrt(inlier)[:, None] * delta  # Σ_i r_i δ_i δ_iᵀ as SᵀS: one symmetric product (BLAS
        self.covariance_ = scaled.T @ scaled + self.ridge * np.eye(k)  # syrk), 2-3x a general one; Eq. 10
        self.prior_ = float(np.clip(r.mean(), self.min_prior, 1.0 - self.min_prior))  # Eq. 11
        # (1 - r_i) / (1 - π) averages to 1 when π = mean r; normalising by the actual sum keeps that
        # when π is clipped or 1 - r underflows, so C1, C2 stay the outliers' moments
        outlier = not_r / max(not_r.mean(), 1e-300)
        c1 = (outlier[:, None] * delta).mean(0)
        c2 = (outlier[:, None] * delta**2).mean(0)
        spread = np.maximum(3.0 * (c2 - c1**2), 1e-24)
        self.log_gamma_ = float(-np.log(2.0 * np.sqrt(spread)).sum())  # Eq. 12


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -700.0, 700.0)))


def _residuals(residuals: np.ndarray) -> np.ndarray:
    delta = np.asarray(residuals, dtype=np.float64)
    if delta.ndim != 2 or delta.shape[0] < 2:
        raise ValueError(f"residuals must be N x K with N >= 2, got shape {delta.shape}")
    if not np.isfinite(delta).all():
        raise ValueError("residuals contain NaN or infinite values")
    return delta


def robust_weights(r: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Eq. 13: w_i = r_i if r_i >= threshold else 0 (discard likely-wrong pseudo-labels, Gu et al.)."""
    r = np.asarray(r, dtype=np.float64)
    return np.where(r >= threshold, r, 0.0)


# ------------------------------------------------------------------------------------- losses
def weighted_mse(targets: torch.Tensor, outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Eq. 14: L_C = Σ_i w_i ‖Q_i - O_i‖² / Σ_i w_i (0 when every weight in the batch is 0)."""
    per_sample = ((targets - outputs) ** 2).sum(dim=1)
    total = weights.sum()
    if float(total) <= 0.0:
        return per_sample.sum() * 0.0  # keeps the graph (and a zero gradient) for an all-discarded batch
    return (weights * per_sample).sum() / total


def cluster_centres(
    representations: torch.Tensor, labels: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 15: C_k = mean of the representations whose pseudo-label argmax is k; (centres, counts).

    Differentiable in `representations`; an empty cluster gets a zero row and count 0.
    """
    one_hot = torch.nn.functional.one_hot(labels.long(), k).to(representations.dtype)
    counts = one_hot.sum(0)
    sums = one_hot.T @ representations
    return sums / counts.clamp_min(1.0)[:, None], counts


class LocalCentres:
    """Eq. 15 over every local sample while training: C_k = mean of the representations labelled k.

    The batch's own rows carry gradients; the other rows are the latest representation of each sample
    (refreshed when the sample was last in a batch). Why not the batch's centres: E‖batch mean − C̃_k‖²
    = ‖C_k − C̃_k‖² + tr(Σ_k) / n_k, so aligning batch centres also rewards shrinking every cluster to a
    point, which locks in the current pseudo-labels (measured on AgNews, README FSTC).
    """

    def __init__(self, representations: torch.Tensor, labels: torch.Tensor, k: int) -> None:
        self.features = representations.detach().clone()
        self.labels = labels.long()
        self.k = k
        one_hot = torch.nn.functional.one_hot(self.labels, k).to(self.features.dtype)
        self.sums = one_hot.T @ self.features
        self.counts = one_hot.sum(0)

    def centres(
        self, representations: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(K x D centres differentiable in the batch rows `representations` of samples `index`, counts)."""
        one_hot = torch.nn.functional.one_hot(self.labels[index], self.k).to(representations.dtype)
        sums = self.sums - one_hot.T @ self.features[index] + one_hot.T @ representations
        return sums / self.counts.clamp_min(1.0)[:, None], self.counts

    def update(self, representations: torch.Tensor, index: torch.Tensor) -> None:
        """After a step: the batch rows' new representations replace their old ones in the sums."""
        one_hot = torch.nn.functional.one_hot(self.labels[index], self.k).to(self.features.dtype)
        fresh = representations.detach()
        self.sums += one_hot.T @ (fresh - self.features[index])
        self.features[index] = fresh


def alignment_loss(local: torch.Tensor, global_centres: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Eq. 17: L_A = ‖C^(μ) - C̃‖² over the clusters this client's batch holds (empty ones have no C_k)."""
    present = (counts > 0).to(local.dtype)
    return (present[:, None] * (local - global_centres) ** 2).sum()


def compared_output(scores: torch.Tensor, target: str) -> torch.Tensor:
    """The scores O themselves (`scores`) or softmax(O) (`softmax`): what Q is held against."""
    return scores if target == "scores" else torch.softmax(scores, dim=1)


# ----------------------------------------------------------------------------- global centres
def local_kmeans_summary(
    representations: np.ndarray, k_local: int, seed: int, floor: int = CLIENT_MIN_CLUSTER
) -> list[np.ndarray]:
    """The private initialisation's message: k' local k-means centres (float64) and their sizes (int64),
    k' <= n // floor and every cluster of at least `floor` records (the privacy floor,
    `fedapp.privacy.floor`)."""
    centres, counts, _ = floored_kmeans(representations, k_local, seed, floor)
    return [centres, counts]


def withhold_small_clusters(
    centres: torch.Tensor, counts: torch.Tensor, floor: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Eq. 15's centres and counts as they may leave the client: a cluster of fewer than `floor`
    pseudo-labelled records is sent as empty (zero centre, count 0), which Eq. 16 then ignores."""
    small = (counts > 0) & (counts < floor)
    return centres.masked_fill(small[:, None], 0.0), counts.masked_fill(small, 0), int(small.sum())


def initial_centres(
    points: Sequence[np.ndarray], weights: Sequence[np.ndarray] | None, k: int, seed: int
) -> np.ndarray:
    """Alg. 2 lines 2-4: k-means over the clients' local centres (weighted by their sizes) or representations.

    With local centres, the weighted k-means stands in for clustering the representations themselves;
    its centres are what Eq. 15-16 give for the resulting partition, so they also serve as the initial C̃.
    With fewer points than k (many clusters on few clients: the privacy floor caps each client's k' at
    n // floor), every point is a centre and the k - n others are seeded draws from the points' weighted
    mean and variance (`padded_centres`); the strategy says so in the run's warnings.
    """
    union = np.concatenate([np.asarray(p, dtype=np.float64) for p in points])
    sample_weight = None if weights is None else np.concatenate(weights).astype(np.float64)
    if union.shape[0] < k:
        return padded_centres(union, sample_weight, k, seed)
    centres, _ = kmeans(union, k, seed, sample_weight=sample_weight)
    return centres


SITE_SKEW_WARNING = 0.15  # mean site skew above which sites hold different topics (docs/methods/fstc.md)


def site_skew(
    points: Sequence[np.ndarray], weights: Sequence[np.ndarray], centres: np.ndarray
) -> list[float]:
    """Per client, how far its records' spread over the K initial clusters is from the federation's: the
    total variation distance between its shares (each local centre's size counted at its nearest initial
    centre) and the pooled shares. About 0.02-0.04 on IID clients, balanced or long-tailed; 0.3 and more
    when sites hold different topics (label skew), where FSTC can fall far below FSBERT k-FED."""
    k = centres.shape[0]
    counts = [
        np.bincount(nearest_centre(np.asarray(p, dtype=np.float64), centres), weights=w, minlength=k)
        for p, w in zip(points, weights, strict=True)
    ]
    pooled = np.sum(counts, axis=0) / max(float(np.sum(counts)), 1e-12)
    return [0.5 * float(np.abs(c / max(c.sum(), 1e-12) - pooled).sum()) for c in counts]


def padded_centres(points: np.ndarray, weights: np.ndarray | None, k: int, seed: int) -> np.ndarray:
    """The n < k points and k - n seeded draws from N(weighted mean, weighted variance) per dimension."""
    if points.shape[0] == 0:
        raise ValueError(f"no points for k={k} initial centres")
    w = np.ones(points.shape[0]) if weights is None else np.maximum(weights, 0.0) + 1e-12
    mean = np.average(points, axis=0, weights=w)
    std = np.sqrt(np.average((points - mean) ** 2, axis=0, weights=w))
    extra = gaussian_centres(mean, std, k - points.shape[0], [seed, k, points.shape[0]])
    return np.vstack([points, extra])


def centres_from_totals(
    weighted: np.ndarray, total: np.ndarray, previous: np.ndarray, min_total: float = EMPTY_TOTAL
) -> np.ndarray:
    """Eq. 16 from the federation's totals: C̃_k = Σ_μ n_k^(μ) C_k^(μ) / Σ_η n_k^(η) = `weighted` / `total`;
    a cluster with fewer than `min_total` records in total (none, for exact counts) keeps its previous C̃_k."""
    held = total >= min_total
    return np.where(held[:, None], weighted / np.maximum(total, 1.0)[:, None], previous)


def relocate_empty(
    centres: np.ndarray, counts: np.ndarray, seed: int, min_total: float = EMPTY_TOTAL, scale: float = 1e-3
) -> tuple[np.ndarray, int]:
    """(centres, how many moved): a Lloyd step's empty clusters (total count below `min_total`) move next to
    the currently largest one (its centre plus a seeded perturbation of `scale` times its norm), so the next
    step splits that cluster in two instead of keeping a centre no record is near (k-means' usual repair);
    each move halves the count it is charged against, so several empties spread over the largest clusters."""
    empty = np.flatnonzero(counts < min_total)
    if empty.size == 0 or empty.size == counts.size:
        return centres, 0
    rng = np.random.default_rng(seed)
    moved, load = centres.copy(), counts.astype(np.float64).copy()
    for cluster in empty:
        largest = int(np.argmax(load))
        direction = rng.normal(size=centres.shape[1])
        step = (
            scale
            * max(float(np.linalg.norm(centres[largest])), 1e-12)
            / max(np.linalg.norm(direction), 1e-12)
        )
        moved[cluster] = centres[largest] + step * direction
        load[largest] /= 2.0
        load[cluster] = load[largest]
    return moved, int(empty.size)


def aggregate_centres(
    centres: Sequence[np.ndarray], counts: Sequence[np.ndarray], previous: np.ndarray
) -> np.ndarray:
    """Eq. 16 over the clients' local centres C^(μ) and sizes n^(μ); a cluster no client holds keeps its
    previous C̃_k."""
    return centres_from_totals(*weighted_centre_sums(centres, counts), previous)
