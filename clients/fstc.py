"""FSTC client (Hu et al., IJCAI 2023): the robust short-text clustering module and its Flower glue.

The maths are plain functions on tensors and arrays, usable without Flower:
- `label_update_steps` — when pseudo-labels are recomputed (Alg. 3 line 2),
- `sinkhorn_log_plan` / `pseudo_labels` — Alg. 1 (Eq. 2-7), in the log domain,
- `GaussianUniformMixture` — the robust weights' model (Eq. 8-12) and `robust_weights` (Eq. 13),
- `weighted_mse` (Eq. 14), `cluster_centres` (Eq. 15), `alignment_loss` (Eq. 17).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
import torch
from flwr.common import Array, ArrayRecord, ConfigRecord, Context, NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.clustering import kmeans
from fedapp.config import RunConfig
from fedapp.losses import info_nce_loss
from fedapp.methods.fstc import CENTRES_KEY, FINAL_KEY, MODEL_KEY, PHASE_INIT, FSTCConfig
from fedapp.models.fstc import FSTCModel, SentenceEncoder, TokenizedTexts, fstc_model
from fedapp.report import Assignment
from fedapp.text_features import local_augmented_embeddings, local_augmented_texts, local_embeddings
from fedapp.threads import one_blas_thread
from fedapp.torch_glue import (
    FINGERPRINT_KEY,
    ClientStateError,
    client_rngs,
    load_state_arrays,
    resolve_device,
    restore_module,
    restore_optimizer,
    save_module,
    save_optimizer,
    state_arrays,
    state_schema,
)
from fedapp.training import BatchCursor, TrainStats, train_steps


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
) -> SinkhornResult:
    """Entropic OT of Eq. 2 with cost M = -log P, a = 1_N, b = (N/K) 1_K, solved in the log domain.

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
    while iterations < max_iters:
        row_terms = torch.logsumexp(log_kernel + log_v[None, :], dim=1)  # log (𝒦v)_i
        if iterations > 0:  # rows of the current plan sum to u_i (𝒦v)_i: check them for free
            error = float(((log_u + row_terms).exp() - 1.0).abs().max())
            if error <= tol:
                break
        iterations += 1
        log_u = log_a - row_terms  # Eq. 5
        log_v = log_b - torch.logsumexp(log_kernel + log_u[:, None], dim=0)  # Eq. 6
    else:
        row_terms = torch.logsumexp(log_kernel + log_v[None, :], dim=1)
        error = float(((log_u + row_terms).exp() - 1.0).abs().max())
    return SinkhornResult(log_u[:, None] + log_kernel + log_v[None, :], iterations, error, log_v)  # Eq. 4


def pseudo_labels(
    scores: torch.Tensor,
    epsilon: float,
    *,
    max_iters: int = 1000,
    tol: float = 1e-6,
    init_log_v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, SinkhornResult]:
    """Alg. 1: P = softmax(O), ξ from the OT of Eq. 2, then Q_ik = ξ_ik² / Σ_k' ξ_ik'² (Eq. 7).

    Squaring in the log domain is a row softmax of 2 log ξ, finite for any finite scores.
    """
    log_probs = torch.log_softmax(scores.double(), dim=1)
    result = sinkhorn_log_plan(log_probs, epsilon, max_iters=max_iters, tol=tol, init_log_v=init_log_v)
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
        self.covariance_ = (inlier[:, None] * delta).T @ delta + self.ridge * np.eye(k)  # Eq. 10
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


# ------------------------------------------------------------------------------- local training
class LocalInputs:
    """A client's samples as the model takes them: embedding rows (frozen) or texts (fine-tune).

    `views[0]` is the original text; with augmented pairs `views[1]` and `views[2]` are its two
    augmented versions, row-aligned.
    """

    def __init__(self, views: Sequence[np.ndarray] | Sequence[list[str]], device: torch.device) -> None:
        self.views = list(views)
        self.device = device
        self.n = len(self.views[0])
        if any(len(view) != self.n for view in self.views):
            raise ValueError(f"views of unequal lengths {[len(v) for v in self.views]}")
        self.tensors = [
            torch.as_tensor(np.asarray(view, dtype=np.float32), device=device)
            if isinstance(view, np.ndarray)
            else None
            for view in self.views
        ]
        self.tokens: TokenizedTexts | None = None

    def tokenize(self, encoder: SentenceEncoder) -> None:
        """Fine-tune mode: tokenize every view's texts once (view v's sample i is row v * n + i)."""
        self.tokens = encoder.tokenized([text for view in self.views for text in view])

    def batch(self, indices: np.ndarray, view: int = 0) -> torch.Tensor | list[str] | dict[str, Any]:
        tensor = self.tensors[view]
        if tensor is not None:
            return tensor[torch.as_tensor(indices, device=self.device)]
        if self.tokens is not None:
            return self.tokens.rows(np.asarray(indices) + view * self.n)
        texts = self.views[view]
        return [texts[i] for i in indices]

    def joint_batch(self, indices: np.ndarray, views: Sequence[int]) -> dict[str, Any]:
        """The samples `indices` of each of `views`, stacked view after view: one encoder input."""
        if self.tokens is None:
            raise ValueError("joint batches are cut from tokenized texts: call tokenize() first")
        return self.tokens.rows(np.concatenate([np.asarray(indices) + v * self.n for v in views]))


@torch.no_grad()
def forward_all(model: FSTCModel, inputs: LocalInputs, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(E, O) of every local sample in eval mode, in batches (the Q updates and Eq. 15 need them all)."""
    was_training = model.training
    model.eval()
    parts = [
        model(inputs.batch(np.arange(start, min(start + batch_size, inputs.n))))
        for start in range(0, inputs.n, batch_size)
    ]
    model.train(was_training)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


@dataclass
class Progress:
    """What a client carries from round to round besides its model and optimizer (Alg. 3's state)."""

    step: int  # local iterations done so far, over the whole run (the schedule counts these)
    targets: torch.Tensor  # Q (n x K)
    memory: torch.Tensor  # the latest O (or softmax O) of every sample, for the mixture (n x K)
    gum: GaussianUniformMixture | None  # None until the first pseudo-label update (r = 1 before)
    dual: torch.Tensor | None = None  # log v of the last Sinkhorn solve (warm start)
    centres: LocalCentres | None = None  # align-centres = local: Eq. 15 over all samples (not kept)


@dataclass
class LocalUpdate:
    """The settings of Alg. 3 a client runs with (from `FSTCConfig` and the method variant)."""

    k: int
    epsilon: float
    lam: float
    robust: bool
    align: bool
    loss_on: str
    residual_on: str
    schedule: frozenset[int]
    sinkhorn_iters: int
    sinkhorn_tol: float
    gum_steps: int
    gum_threshold: float
    eval_batch: int
    align_centres: str  # "local" or "batch" (FSTCConfig.align_centres)
    contrastive: float = 0.0  # weight of SCCL's NT-Xent between the two augmented views
    temperature: float = 0.5

    def output(self, scores: torch.Tensor) -> torch.Tensor:
        """What Q is compared with in Eq. 14: O itself, or softmax(O) (`loss-on`)."""
        return compared_output(scores, self.loss_on)

    def mixture_output(self, scores: torch.Tensor) -> torch.Tensor:
        """What the mixture's residual δ = Q - (this) uses (Eq. 8; `residual-on`, default Eq. 14's)."""
        if self.residual_on == "loss-on":
            return self.output(scores)
        return compared_output(scores, self.residual_on)

    def refresh_labels(self, model: FSTCModel, inputs: LocalInputs, progress: Progress) -> dict[str, float]:
        """Alg. 1 over all local samples; the mixture restarts on the new pseudo-labels."""
        representations, scores = forward_all(model, inputs, self.eval_batch)
        targets, result = pseudo_labels(
            scores,
            self.epsilon,
            max_iters=self.sinkhorn_iters,
            tol=self.sinkhorn_tol,
            init_log_v=progress.dual,
        )
        progress.dual = result.log_v
        progress.targets = targets.float()
        progress.memory = self.mixture_output(scores).float()
        if progress.centres is not None:  # the labels changed: regroup every sample
            progress.centres = LocalCentres(representations, progress.targets.argmax(1), self.k)
        if self.robust:
            progress.gum = GaussianUniformMixture(steps=self.gum_steps).fit(
                (progress.targets - progress.memory).cpu().numpy(), reset=True
            )
        return {"sinkhorn-iters": float(result.iterations), "sinkhorn-error": result.marginal_error}

    def sample_weights(self, progress: Progress) -> torch.Tensor:
        """Eq. 9-13 on every local sample: EM steps from the previous parameters, then w (1 without GUM)."""
        if not self.robust or progress.gum is None:
            return torch.ones(progress.targets.shape[0], device=progress.targets.device)
        r = progress.gum.fit_responsibilities((progress.targets - progress.memory).cpu().numpy())
        return torch.as_tensor(
            robust_weights(r, self.gum_threshold), dtype=torch.float32, device=progress.targets.device
        )

    def loss(
        self,
        model: FSTCModel,
        inputs: LocalInputs,
        indices: np.ndarray,
        progress: Progress,
        weights: torch.Tensor,
        global_centres: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """Eq. 18 on one batch: L_C (Eq. 14, averaged over the augmented views if any) + λ L_A (Eq. 17).

        With `contrastive` > 0 (augmented pairs only) SCCL's instance-wise NT-Xent between the two
        views' representations is added: the paper's "same augmentation strategy as SCCL".
        """
        index = torch.as_tensor(indices, device=progress.targets.device)
        targets, batch_weights = progress.targets[index], weights[index]
        views = list(range(1, len(inputs.views))) if len(inputs.views) > 1 else [0]
        if inputs.tokens is not None and views != [0]:
            # fine-tune mode: one pass of Φ over the batch and its views (a GPU step is launch-bound)
            joint_representations, joint_scores = model(inputs.joint_batch(indices, [0, *views]))
            size = len(indices)
            parts = list(zip(joint_representations.split(size), joint_scores.split(size), strict=True))
            (representations, scores), view_outputs = parts[0], parts[1:]
        else:
            representations, scores = model(inputs.batch(indices, 0))
            view_outputs = [
                (representations, scores) if view == 0 else model(inputs.batch(indices, view))
                for view in views
            ]
        progress.memory[index] = self.mixture_output(scores.detach()).float()
        clustering = torch.stack(
            [weighted_mse(targets, self.output(view), batch_weights) for _, view in view_outputs]
        ).mean()
        terms = {
            "loss": clustering,
            "clustering": clustering.detach(),
            "kept": (batch_weights > 0).float().mean(),
        }
        if self.contrastive > 0 and len(view_outputs) == 2:
            (first, _), (second, _) = view_outputs
            instance = info_nce_loss(first, second, self.temperature)
            terms["loss"] = terms["loss"] + self.contrastive * instance
            terms["contrastive"] = instance.detach()
        if self.align and global_centres is not None and self.lam > 0:
            if progress.centres is not None:  # Eq. 15 over every local sample
                centres, counts = progress.centres.centres(representations, index)
                progress.centres.update(representations, index)  # values only: the graph keeps the old
            else:  # the batch's own centres
                centres, counts = cluster_centres(representations, targets.argmax(1), self.k)
            aligned = alignment_loss(centres, global_centres, counts)
            terms["loss"] = terms["loss"] + self.lam * aligned
            terms["alignment"] = aligned.detach()
        return terms

    def run(
        self,
        model: FSTCModel,
        optimizer: torch.optim.Optimizer,
        inputs: LocalInputs,
        progress: Progress,
        cursor: BatchCursor,
        steps: int,
        global_centres: torch.Tensor | None,
        desc: str,
    ) -> tuple[TrainStats, dict[str, float]]:
        """Alg. 3 lines 1-8 for `steps` local iterations (Q updates on the schedule)."""
        updates: dict[str, float] = {}
        if self.align and global_centres is not None and self.lam > 0 and self.align_centres == "local":
            representations, _ = forward_all(model, inputs, self.eval_batch)
            progress.centres = LocalCentres(representations, progress.targets.argmax(1), self.k)

        def batches() -> Iterator[tuple[np.ndarray, torch.Tensor]]:
            for indices in cursor.take(steps):
                if progress.step in self.schedule:
                    updates.update(self.refresh_labels(model, inputs, progress))
                    updates["label-updates"] = updates.get("label-updates", 0.0) + 1.0
                weights = self.sample_weights(progress)
                progress.step += 1
                yield indices, weights

        def loss_fn(batch: tuple[np.ndarray, torch.Tensor]) -> dict[str, torch.Tensor]:
            return self.loss(model, inputs, batch[0], progress, batch[1], global_centres)

        stats = train_steps(
            model, optimizer, loss_fn, batches(), steps=steps, desc=desc, log_every=max(steps // 4, 1)
        )
        return stats, updates


# ----------------------------------------------------------------------------------- Flower glue
def local_kmeans_summary(representations: np.ndarray, k_local: int, seed: int) -> NDArrays:
    """The private initialisation's message: k' local k-means centres (float64) and their sizes (int64)."""
    k_local = min(k_local, representations.shape[0])
    centres, labels = kmeans(representations, k_local, seed)
    return [centres, np.bincount(labels, minlength=k_local).astype(np.int64)]


STATE_MODEL, STATE_OPTIMIZER, STATE_CURSOR, STATE_RNG = (
    "fstc.model",
    "fstc.optimizer",
    "fstc.cursor",
    "fstc.rng",
)
STATE_ARRAYS, STATE_SCALARS = "fstc.progress-arrays", "fstc.progress"
FROZEN_EVAL_BATCH = 4096


class FSTCClient(ClusteringClient):
    """FSTC: pseudo-labels (Alg. 1) + robust weights (Eq. 8-13) + centre alignment with the server.

    Round 1 sends local k-means centres and their sizes (or, with `init = representations`, the
    representations); each training round runs Alg. 3 and sends C^(μ) and n^(μ); the last round also
    sends the model. Everything that must survive rounds (model, Adam, batch cursor, random streams,
    Q, the latest O, the mixture's parameters, the iteration count) stays in `context.state`.
    """

    robust = True  # Eq. 8-13 (FSTC-STC: every pseudo-label weighs 1)
    align = True  # Eq. 15-17 with the server (FSTC-STC / FSTC-RSTC: no centres cross the wire)

    def __init__(self, context: Context, cfg: RunConfig) -> None:
        super().__init__(context, cfg)
        self.params = cfg.params(FSTCConfig)
        self.device = resolve_device(cfg.device)
        frozen = self.params.encoder == "frozen"
        self.update = LocalUpdate(
            k=self.k,
            epsilon=self.params.epsilon,
            lam=self.params.lam,
            robust=self.robust,
            align=self.align,
            loss_on=self.params.loss_on,
            residual_on=self.params.residual_on,
            schedule=frozenset(
                label_update_steps(
                    max(cfg.num_rounds - 1, 1) * self.params.local_iters,
                    self.params.label_updates,
                    self.params.warmup_iters,
                )
            ),
            sinkhorn_iters=self.params.sinkhorn_iters,
            sinkhorn_tol=self.params.sinkhorn_tol,
            gum_steps=self.params.gum_steps,
            gum_threshold=self.params.gum_threshold,
            eval_batch=FROZEN_EVAL_BATCH if frozen else self.params.batch_size,
            align_centres=self.params.align_centres,
            contrastive=self.params.contrastive,
            temperature=self.params.temperature,
        )

    # ------------------------------------------------------------------------------ inputs, model
    def local_inputs(self, *, augmented: bool) -> LocalInputs:
        """The original texts' inputs, plus the two augmented views when `augment = pairs` and asked."""
        p, cfg = self.params, self.cfg
        pairs = augmented and p.augment == "pairs"
        if p.encoder == "frozen":
            views: list[Any] = [local_embeddings(self.data, cfg.embedding_model, p.max_length, cfg.device)]
            if pairs:
                views += local_augmented_embeddings(
                    self.data, cfg.data_dir, cfg.embedding_model, p.max_length, cfg.device
                )
        else:
            views = [self.data.texts]
            if pairs:
                views += local_augmented_texts(self.data, cfg.data_dir)
        return LocalInputs(views, self.device)

    def build_model(self, inputs: LocalInputs) -> FSTCModel:
        """The local model; in fine-tune mode also tokenizes `inputs` once with its encoder."""
        dim = inputs.views[0].shape[1] if isinstance(inputs.views[0], np.ndarray) else None
        model = fstc_model(self.params, self.k, dim, self.cfg.embedding_model, self.cfg.device).to(
            self.device
        )
        if model.encoder is not None:
            inputs.tokenize(model.encoder)
        return model

    # ------------------------------------------------------------------------------------- fit
    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        with one_blas_thread():  # the mixture's N x K products: threads cost more than they save
            if config.get("phase") == PHASE_INIT:
                return self.initial_reply(), self.data.n_samples, self.identity_metrics()
            return self.train_round(list(parameters), config)

    def initial_reply(self) -> NDArrays:
        """Alg. 2 line 2: what the server clusters into the initial global centres."""
        inputs = self.local_inputs(augmented=False)
        representations = (
            forward_all(self.build_model(inputs), inputs, self.update.eval_batch)[0].cpu().numpy()
        )
        if self.params.init == "representations":  # the paper's: per-sample vectors leave the client
            return [representations.astype(np.float32)]
        return local_kmeans_summary(representations, self.params.init_local_k or 2 * self.k, self.seed)

    def train_round(
        self, arrays: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        state = self.context.state
        global_centres = arrays.pop(0) if config.get(CENTRES_KEY) else None
        if global_centres is not None and global_centres.shape[0] != self.k:
            raise ValueError(f"server sent {global_centres.shape[0]} centres, this client has k={self.k}")
        inputs = self.local_inputs(augmented=True)
        model = self.build_model(inputs)  # before client_rngs: building draws from the global RNG
        first = bool(config.get(MODEL_KEY))
        if first:
            load_state_arrays(model, arrays, sender="server")
        elif not restore_module(state, STATE_MODEL, model):
            raise ClientStateError("no local model yet and the server sent none (protocol error)")
        optimizer = self.optimizer(model)
        if not first:
            restore_optimizer(state, STATE_OPTIMIZER, optimizer)
        centres_tensor = (
            None
            if global_centres is None
            else torch.as_tensor(global_centres, dtype=torch.float32, device=self.device)
        )
        progress = self.initial_progress(model, inputs, centres_tensor) if first else self.restore_progress()
        cursor = BatchCursor.resume(
            state,
            STATE_CURSOR,
            n_samples=inputs.n,
            batch_size=min(self.params.batch_size, inputs.n),
            seed=self.seed,
        )
        with client_rngs(state, STATE_RNG, self.seed):
            stats, updates = self.update.run(
                model,
                optimizer,
                inputs,
                progress,
                cursor,
                self.params.local_iters,
                centres_tensor,
                f"client {self.partition_id}",
            )
        representations, _ = forward_all(model, inputs, self.update.eval_batch)
        centres, counts = cluster_centres(representations, progress.targets.argmax(1), self.k)  # Eq. 15
        save_module(state, STATE_MODEL, model)
        save_optimizer(state, STATE_OPTIMIZER, optimizer)
        cursor.save(state, STATE_CURSOR)
        self.keep_progress(progress)
        reply = [counts.cpu().numpy().astype(np.int64)]
        if self.align:
            reply.insert(0, centres.cpu().double().numpy())
        metrics: dict[str, Scalar] = {
            **self.identity_metrics(),
            **stats.metrics(),
            **updates,
            "step": progress.step,
        }
        if config.get(FINAL_KEY):
            reply += state_arrays(model)
            metrics[FINGERPRINT_KEY] = state_schema(model).fingerprint
        return reply, self.data.n_samples, metrics

    def optimizer(self, model: FSTCModel) -> torch.optim.Optimizer:
        """Adam with the paper's two learning rates: Φ's encoder and the rest (adapter and F)."""
        groups = [
            {"params": list(model.head.parameters()), "lr": self.params.lr_head},
            {"params": list(model.adapter.parameters()), "lr": self.params.lr_adapter or self.params.lr_head},
        ]
        if model.encoder is not None:
            groups.append({"params": list(model.encoder.parameters()), "lr": self.params.lr_encoder})
        return torch.optim.Adam(groups)

    # --------------------------------------------------------------------------- Alg. 3's state
    def initial_progress(
        self, model: FSTCModel, inputs: LocalInputs, global_centres: torch.Tensor | None
    ) -> Progress:
        """Alg. 2 lines 2 and 5: Q = the (one-hot) nearest initial global centre, r = 1."""
        if global_centres is None:
            raise ClientStateError("the first training round needs the initial global centres")
        representations, scores = forward_all(model, inputs, self.update.eval_batch)
        nearest = torch.cdist(representations, global_centres).argmin(1)
        targets = torch.nn.functional.one_hot(nearest, self.k).float()
        return Progress(0, targets, self.update.mixture_output(scores).float(), None)

    def keep_progress(self, progress: Progress) -> None:
        arrays = {"targets": progress.targets.cpu().numpy(), "memory": progress.memory.cpu().numpy()}
        scalars: dict[str, Scalar] = {"step": progress.step, "gum": progress.gum is not None}
        if progress.dual is not None:
            arrays["sinkhorn-dual"] = progress.dual.cpu().numpy()
        if progress.gum is not None:
            arrays["gum-covariance"] = progress.gum.covariance_
            scalars.update({"gum-prior": progress.gum.prior_, "gum-log-gamma": progress.gum.log_gamma_})
        self.context.state[STATE_ARRAYS] = ArrayRecord(
            {name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()}
        )
        self.context.state[STATE_SCALARS] = ConfigRecord(scalars)

    def restore_progress(self) -> Progress:
        arrays = {name: array.numpy() for name, array in self.context.state[STATE_ARRAYS].items()}
        scalars = self.context.state[STATE_SCALARS]
        gum = None
        if scalars["gum"]:
            gum = GaussianUniformMixture(
                steps=self.params.gum_steps,
                prior_=float(scalars["gum-prior"]),
                covariance_=arrays["gum-covariance"],
                log_gamma_=float(scalars["gum-log-gamma"]),
            )
        targets, memory = (
            torch.as_tensor(arrays[name], device=self.device) for name in ("targets", "memory")
        )
        dual = torch.as_tensor(arrays["sinkhorn-dual"]) if "sinkhorn-dual" in arrays else None
        return Progress(int(scalars["step"]), targets, memory, gum, dual)

    # ------------------------------------------------------------------------------ evaluation
    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        """Clusters = argmax O of the global model (Sec. 4)."""
        return self.assign(parameters, config).labels

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """argmax O; score = softmax(O) of that cluster; metric space = the representations E."""
        inputs = self.local_inputs(augmented=False)
        model = self.build_model(inputs)
        load_state_arrays(model, list(parameters), sender="server")
        with torch.no_grad():
            representations, scores = forward_all(model, inputs, self.update.eval_batch)
        labels = scores.argmax(1)
        probability = torch.softmax(scores.double(), dim=1).gather(1, labels[:, None])[:, 0]
        return Assignment(
            labels.cpu().numpy(),
            probability.cpu().numpy(),
            "probability",
            representations.double().cpu().numpy(),
        )


class FSTCRSTCClient(FSTCClient):
    """FSTC-RSTC ablation: pseudo-labels + robust weights, no centre aggregation (final averaging only)."""

    align = False


class FSTCSTCClient(FSTCClient):
    """FSTC-STC ablation: pseudo-labels only (every weight 1, no centre aggregation)."""

    robust = False
    align = False
