"""FSTC maths on small arrays: schedule, Sinkhorn pseudo-labels, Gaussian-uniform mixture, losses."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from clients.fstc import LabellingState, LocalInputs, LocalUpdate
from fedapp.config.keys import ConfigError
from fedapp.maths.fstc import (
    GaussianUniformMixture,
    LocalCentres,
    alignment_loss,
    cluster_centres,
    label_update_steps,
    pseudo_labels,
    relocate_empty,
    robust_weights,
    sinkhorn_log_plan,
    weighted_mse,
)
from fedapp.maths.losses import instance_contrastive_loss
from fedapp.methods.fstc import SOFTMAX_FROM_K, FSTCConfig, loss_target
from fedapp.models.fstc import FSTCModel


def _dense_sinkhorn(probs: np.ndarray, epsilon: float, iters: int = 5000) -> np.ndarray:
    """Textbook Sinkhorn-Knopp (Cuturi 2013, Eq. 4-6) in the probability domain, for small inputs."""
    n, k = probs.shape
    kernel = probs ** (1.0 / epsilon)
    a, b = np.ones(n), np.full(k, n / k)
    v = np.ones(k)
    for _ in range(iters):
        u = a / (kernel @ v)
        v = b / (kernel.T @ u)
    return u[:, None] * kernel * v[None, :]


# ------------------------------------------------------------------------------------- schedule
def test_schedule_is_dense_early_and_starts_after_warmup() -> None:
    steps = label_update_steps(4000, 40, 100)
    assert steps[0] == 100 and steps[-1] < 4000
    assert steps == sorted(set(steps))
    gaps = np.diff(steps)
    assert gaps[:5].mean() < gaps[-5:].mean()  # dense early, sparse late
    assert label_update_steps(50, 10, 100) == []  # warm-up longer than the run: never updated


def test_schedule_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="updates"):
        label_update_steps(100, 0, 0)


# ------------------------------------------------------------------------------------ Sinkhorn
@pytest.mark.parametrize("n, k", [(12, 3), (40, 4), (60, 7)])
def test_sinkhorn_marginals_and_dense_reference(n: int, k: int) -> None:
    rng = np.random.default_rng(n * k)
    probs = rng.dirichlet(np.ones(k) * 2.0, size=n)
    epsilon = 0.5  # mild, so that the dense reference does not underflow
    result = sinkhorn_log_plan(torch.tensor(np.log(probs)), epsilon, max_iters=5000, tol=1e-10)
    plan = result.log_plan.exp().numpy()
    np.testing.assert_allclose(plan.sum(1), np.ones(n), atol=1e-6)  # a = 1_N
    np.testing.assert_allclose(plan.sum(0), np.full(k, n / k), atol=1e-6)  # b = N/K 1_K
    np.testing.assert_allclose(plan, _dense_sinkhorn(probs, epsilon), atol=1e-8)


def test_sinkhorn_at_the_papers_epsilon_meets_marginals_to_1e6() -> None:
    rng = np.random.default_rng(1)
    scores = torch.tensor(rng.normal(scale=3.0, size=(500, 20)))
    result = sinkhorn_log_plan(torch.log_softmax(scores, 1), 0.1, max_iters=5000, tol=1e-7)
    plan = result.log_plan.exp()
    assert result.marginal_error <= 1e-7
    assert float((plan.sum(1) - 1).abs().max()) <= 1e-6
    assert float((plan.sum(0) - 25.0).abs().max()) <= 1e-6 * 25


@pytest.mark.parametrize("k", [4, 20, 152])
def test_pseudo_labels_finite_on_extreme_logits(k: int) -> None:
    n = 20_000 if k == 4 else 2_000
    rng = np.random.default_rng(k)
    scores = torch.tensor(rng.normal(size=(n, k)) * 1e4)  # saturated softmax: P has exact zeros in float64
    scores[:, 0] += 1e6  # and every sample wants cluster 0
    q, result = pseudo_labels(scores, 0.1, max_iters=300)
    assert torch.isfinite(q).all() and torch.isfinite(result.log_plan).all()
    np.testing.assert_allclose(q.sum(1).numpy(), 1.0, atol=1e-9)
    counts = np.bincount(q.argmax(1).numpy(), minlength=k)
    assert counts.max() < n  # the equal-partition constraint spreads samples despite the preference


def test_pseudo_labels_square_and_renormalise_the_plan() -> None:
    rng = np.random.default_rng(0)
    scores = torch.tensor(rng.normal(size=(30, 3)))
    q, result = pseudo_labels(scores, 0.1, tol=1e-10)
    plan = result.log_plan.exp()
    expected = plan**2 / (plan**2).sum(1, keepdim=True)  # Eq. 7
    torch.testing.assert_close(q, expected, atol=1e-12, rtol=0)


def test_pseudo_labels_keep_the_models_argmax_when_it_is_balanced() -> None:
    labels = np.repeat(np.arange(4), 10)
    scores = torch.tensor(np.eye(4)[labels] * 5.0)
    q, _ = pseudo_labels(scores, 0.1)
    np.testing.assert_array_equal(q.argmax(1).numpy(), labels)


def test_sinkhorn_rejects_non_finite_input() -> None:
    with pytest.raises(ValueError, match="finite"):
        sinkhorn_log_plan(torch.tensor([[0.0, -math.inf]]), 0.1)


# ------------------------------------------------------------------- Gaussian-uniform mixture
def _noisy_pseudo_labels(n: int, k: int, noisy_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Residuals Q - O: clean samples' Q matches O up to small noise; noisy ones point elsewhere."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(k, size=n)
    outputs = np.eye(k)[labels] + rng.normal(scale=0.05, size=(n, k))
    noisy = rng.random(n) < noisy_fraction
    wrong = (labels + rng.integers(1, k, size=n)) % k
    targets = np.eye(k)[np.where(noisy, wrong, labels)]
    return targets - outputs, noisy


@pytest.mark.parametrize("k, noisy_fraction", [(4, 0.3), (20, 0.2), (20, 0.5)])
def test_gum_separates_clean_from_noisy_pseudo_labels(k: int, noisy_fraction: float) -> None:
    residuals, noisy = _noisy_pseudo_labels(2000, k, noisy_fraction, seed=k)
    gum = GaussianUniformMixture(steps=10).fit(residuals)
    r = gum.responsibilities(residuals)
    assert roc_auc_score(~noisy, r) >= 0.9
    assert abs(gum.prior_ - (1 - noisy_fraction)) < 0.1  # π estimates the clean fraction
    weights = robust_weights(r)
    assert weights[noisy].mean() < 0.2 and (weights[~noisy] > 0).mean() > 0.8


def test_gum_continues_from_its_previous_parameters() -> None:
    residuals, _ = _noisy_pseudo_labels(500, 5, 0.3, seed=1)
    once = GaussianUniformMixture(steps=4).fit(residuals)
    twice = GaussianUniformMixture(steps=2).fit(residuals)
    twice.fit(residuals)
    np.testing.assert_allclose(twice.covariance_, once.covariance_, rtol=1e-10)
    other, _ = _noisy_pseudo_labels(500, 5, 0.1, seed=2)
    continued = GaussianUniformMixture(steps=1).fit(residuals).fit(other)
    fresh = GaussianUniformMixture(steps=1).fit(residuals).fit(other, reset=True)
    np.testing.assert_allclose(fresh.covariance_, GaussianUniformMixture(steps=1).fit(other).covariance_)
    assert not np.allclose(continued.covariance_, fresh.covariance_)  # the old parameters mattered


def test_gum_rejects_nan_and_unfitted_use() -> None:
    with pytest.raises(ValueError, match="not fitted"):
        GaussianUniformMixture().responsibilities(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        GaussianUniformMixture().fit(np.array([[0.0, np.nan], [1.0, 0.0]]))


def test_gum_survives_152_clusters() -> None:
    residuals, noisy = _noisy_pseudo_labels(3000, 152, 0.3, seed=3)
    r = GaussianUniformMixture(steps=5).fit(residuals).responsibilities(residuals)
    assert np.isfinite(r).all() and roc_auc_score(~noisy, r) >= 0.9


def test_robust_weights_threshold() -> None:
    np.testing.assert_array_equal(robust_weights(np.array([0.2, 0.5, 0.9])), [0.0, 0.5, 0.9])


# ------------------------------------------------------------------------------------- losses
def test_weighted_mse_is_eq14_and_zero_for_an_all_discarded_batch() -> None:
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    outputs = torch.tensor([[0.5, 0.5], [0.0, 0.0]], requires_grad=True)
    weights = torch.tensor([1.0, 3.0])
    loss = weighted_mse(targets, outputs, weights)
    assert float(loss) == pytest.approx((1.0 * 0.5 + 3.0 * 1.0) / 4.0)
    zero = weighted_mse(targets, outputs, torch.zeros(2))
    zero.backward()
    assert float(zero) == 0.0 and torch.equal(outputs.grad, torch.zeros(2, 2))


def test_cluster_centres_and_alignment_skip_empty_clusters() -> None:
    reps = torch.tensor([[0.0, 0.0], [2.0, 0.0], [5.0, 5.0]], requires_grad=True)
    centres, counts = cluster_centres(reps, torch.tensor([0, 0, 2]), 3)  # cluster 1 is empty
    torch.testing.assert_close(centres, torch.tensor([[1.0, 0.0], [0.0, 0.0], [5.0, 5.0]]))
    torch.testing.assert_close(counts, torch.tensor([2.0, 0.0, 1.0]))
    target = torch.tensor([[1.0, 1.0], [9.0, 9.0], [5.0, 4.0]])
    loss = alignment_loss(centres, target, counts)
    assert float(loss) == pytest.approx(1.0 + 1.0)  # the empty cluster's (9, 9) does not count
    loss.backward()
    assert reps.grad is not None and torch.isfinite(reps.grad).all()


def test_local_centres_are_eq15_over_every_sample_with_gradients_through_the_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(30, 4, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 3, (30,), generator=generator)
    tracker = LocalCentres(features, labels, 3)
    index = torch.tensor([1, 7, 8, 20])
    batch = (features[index] + 0.5).requires_grad_(True)  # the batch rows have moved since last seen
    centres, counts = tracker.centres(batch, index)
    moved = features.clone()
    moved[index] = batch.detach()
    expected, expected_counts = cluster_centres(moved, labels, 3)
    torch.testing.assert_close(centres, expected)
    torch.testing.assert_close(counts, expected_counts)
    centres.sum().backward()  # d C_k / d e_i = 1 / n_k for a batch row i of cluster k, nothing else
    per_row = 1.0 / expected_counts[labels[index]]
    torch.testing.assert_close(batch.grad, per_row[:, None].expand(-1, 4).contiguous())
    tracker.update(batch, index)  # later batches see the new rows; the sums stay exact
    again, _ = tracker.centres(moved[[3]], torch.tensor([3]))
    torch.testing.assert_close(again, expected)
    # one cluster: its centre is the mean of every sample, whichever rows the batch holds
    spread = LocalCentres(features, torch.zeros(30, dtype=torch.long), 1)
    assert torch.allclose(spread.centres(features[:5], torch.arange(5))[0], features.mean(0, keepdim=True))


def test_sinkhorn_warm_start_reaches_the_same_plan_in_fewer_iterations() -> None:
    rng = np.random.default_rng(5)
    scores = torch.tensor(rng.normal(scale=2.0, size=(400, 10)))
    cold = sinkhorn_log_plan(torch.log_softmax(scores, 1), 0.1, tol=1e-9, max_iters=5000)
    nudged = scores + torch.tensor(rng.normal(scale=0.05, size=(400, 10)))  # the model moved a little
    fresh = sinkhorn_log_plan(torch.log_softmax(nudged, 1), 0.1, tol=1e-9, max_iters=5000)
    warm = sinkhorn_log_plan(
        torch.log_softmax(nudged, 1), 0.1, tol=1e-9, max_iters=5000, init_log_v=cold.log_v
    )
    assert warm.iterations < fresh.iterations
    np.testing.assert_allclose(warm.log_plan.exp().numpy(), fresh.log_plan.exp().numpy(), atol=1e-7)


def _update(**overrides: object) -> LocalUpdate:
    settings: dict[str, object] = dict(
        epsilon=0.1,
        lam=0.0,
        loss_on="scores",
        residual_on="loss-on",
        sinkhorn_iters=100,
        sinkhorn_tol=1e-6,
        gum_steps=1,
        gum_threshold=0.5,
        align_centres="local",
        augment="pairs",  # the contrastive term needs it; the loss reads the views it is given
    )
    settings.update(overrides)
    params = FSTCConfig(**settings)  # type: ignore[arg-type]
    return LocalUpdate(params, k=3, robust=False, align=False, schedule=frozenset(), eval_batch=64)


def test_contrastive_term_is_sccl_nt_xent_between_the_two_views() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    views = [rng.normal(size=(40, 8)).astype(np.float32) for _ in range(3)]
    inputs = LocalInputs(views, torch.device("cpu"))
    model = FSTCModel(8, 3, adapter_hidden=8, head_hidden=0)
    targets = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, 3, 40)), 3).float()
    progress = LabellingState(0, targets, torch.zeros(40, 3), None)
    weights = torch.ones(40)
    indices = np.arange(10, 30)
    plain = _update().loss(model, inputs, indices, progress, weights, None)
    mixed = _update(contrastive=0.7, temperature=0.3).loss(model, inputs, indices, progress, weights, None)
    assert "contrastive" not in plain
    rep1, rep2 = (model(torch.as_tensor(views[j][indices]))[0] for j in (1, 2))
    expected = instance_contrastive_loss(
        torch.nn.functional.normalize(rep1, dim=1), torch.nn.functional.normalize(rep2, dim=1), 0.3
    )
    assert float(mixed["contrastive"]) == pytest.approx(float(expected), rel=1e-6)
    assert float(mixed["loss"]) == pytest.approx(float(plain["loss"]) + 0.7 * float(expected), rel=1e-6)
    mixed["loss"].backward()  # the term trains the adapter
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.adapter.parameters())


def test_contrastive_needs_augmented_pairs() -> None:
    with pytest.raises(ConfigError, match="fstc.contrastive.*fstc.augment"):
        FSTCConfig(contrastive=1.0)
    assert FSTCConfig(contrastive=1.0, augment="pairs").contrastive == 1.0


@pytest.mark.parametrize(
    ("loss_on", "residual_on", "mixture_sees"),
    [
        ("scores", "loss-on", "scores"),
        ("softmax", "loss-on", "softmax"),
        ("scores", "softmax", "softmax"),
        ("softmax", "scores", "scores"),
    ],
)
def test_the_mixture_residual_can_differ_from_the_loss_target(
    loss_on: str, residual_on: str, mixture_sees: str
) -> None:
    """`residual-on` sets what Eq. 8 subtracts from Q (kept in `memory`); Eq. 14 still follows `loss-on`."""
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    inputs = LocalInputs([rng.normal(size=(30, 6)).astype(np.float32)], torch.device("cpu"))
    model = FSTCModel(6, 3, adapter_hidden=6, head_hidden=0)
    targets = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, 3, 30)), 3).float()
    progress = LabellingState(0, targets, torch.zeros(30, 3), None)
    update = _update(loss_on=loss_on, residual_on=residual_on)
    indices = np.arange(5, 25)
    terms = update.loss(model, inputs, indices, progress, torch.ones(30), None)
    scores = model(torch.as_tensor(inputs.views[0][indices]))[1].detach()
    seen = scores if mixture_sees == "scores" else torch.softmax(scores, 1)
    torch.testing.assert_close(progress.memory[indices], seen)
    assert float(progress.memory[:5].abs().sum()) == 0.0  # only the batch's rows are refreshed
    compared = scores if loss_on == "scores" else torch.softmax(scores, 1)
    expected = ((targets[indices] - compared) ** 2).sum(1).mean()
    assert float(terms["clustering"]) == pytest.approx(float(expected), rel=1e-5)


def test_loss_on_auto_takes_softmax_from_many_clusters_on() -> None:
    """`loss-on = auto`: Eq. 14 on O below `SOFTMAX_FROM_K` clusters, on softmax(O) from it on; the
    explicit targets are not resolved by k."""
    assert loss_target("auto", SOFTMAX_FROM_K - 1) == "scores"
    assert loss_target("auto", SOFTMAX_FROM_K) == "softmax"
    assert loss_target("scores", 10 * SOFTMAX_FROM_K) == "scores" and loss_target("softmax", 2) == "softmax"
    scores = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_update(loss_on="auto").output(scores), scores)  # k = 3
    many = dataclasses.replace(_update(loss_on="auto"), k=SOFTMAX_FROM_K)
    torch.testing.assert_close(many.output(scores), torch.softmax(scores, 1))
    torch.testing.assert_close(many.mixture_output(scores), torch.softmax(scores, 1))  # residual follows


def test_relocate_empty_moves_empty_clusters_beside_the_largest_so_lloyd_splits_it() -> None:
    """Two blobs, three centres, one far from both (empty): moved beside the larger blob, the next Lloyd step
    splits that blob and every cluster holds records; nothing moves when none is empty (or all are)."""
    rng = np.random.default_rng(0)
    data = np.concatenate([rng.normal(0.0, 0.1, (60, 2)) + [5.0, 0.0], rng.normal(0.0, 0.1, (20, 2))])
    centres = np.array([[5.0, 0.0], [0.0, 0.0], [-40.0, 40.0]])
    counts = np.array([60.0, 20.0, 0.0])
    moved, n_moved = relocate_empty(centres, counts, seed=1)
    assert n_moved == 1 and np.array_equal(moved[:2], centres[:2])
    assert 0 < np.linalg.norm(moved[2] - centres[0]) <= 1e-3 * np.linalg.norm(centres[0]) + 1e-12
    nearest = np.argmin(((data[:, None] - moved[None]) ** 2).sum(-1), axis=1)
    sizes = np.bincount(nearest, minlength=3)
    assert sizes[1] == 20 and sizes[0] > 0 and sizes[2] > 0  # the large blob split, the small one kept
    same, none = relocate_empty(centres, np.array([60.0, 20.0, 3.0]), seed=1)
    assert none == 0 and same is centres
    assert relocate_empty(centres, np.zeros(3), seed=1)[1] == 0  # nothing to split
    again, _ = relocate_empty(centres, counts, seed=1)
    np.testing.assert_array_equal(again, moved)  # seeded


@pytest.mark.parametrize("scale", [5.0, 200.0])
def test_sinkhorn_matches_the_plain_log_domain_iteration(scale: float) -> None:
    """The matrix-vector Sinkhorn gives the former logsumexp iteration's plan: on confident scores (5)
    by its fast path, on scores whose potentials leave float64's range (200) by its exact fallback."""
    from simulation.bench.sinkhorn import head_scores, reference_log_plan

    log_probs = head_scores(600, 40, scale)
    reference, iterations = reference_log_plan(log_probs, 0.1, max_iters=300)
    result = sinkhorn_log_plan(log_probs, 0.1, max_iters=300)
    assert result.iterations == iterations
    assert torch.allclose(result.log_plan, reference, rtol=0.0, atol=1e-8)
