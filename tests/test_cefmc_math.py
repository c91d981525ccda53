"""CeFMC maths (clients/cefmc.py, strategies/cefmc.py) and the reference driver, without Flower."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from threadpoolctl import threadpool_limits

from clients import cefmc as client
from fedapp.datasets.preprocessing import SCALINGS, scale_view
from simulation.papers.cefmc.reference import run_cefmc, run_cefmc_h, run_reference
from strategies import cefmc as server
from strategies.vertical import has_converged

ORTHONORMAL_TOL = 1e-8


@pytest.fixture(autouse=True)
def _single_threaded_blas():
    """These problems are tiny: on a shared machine BLAS/OpenMP thread spin-waits cost more than the maths."""
    with threadpool_limits(limits=1):
        yield


def _multiview(n_samples: int = 300, dims: tuple[int, ...] = (12, 7, 3), k: int = 4, seed: int = 0):
    """Gaussian clusters seen through several views; the 3-d view has fewer features than k."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, k, n_samples)
    views = [rng.normal(size=(k, d))[truth] + 1.5 * rng.normal(size=(n_samples, d)) for d in dims]
    return views, truth


def _assert_orthonormal(H: np.ndarray) -> None:
    np.testing.assert_allclose(H.T @ H, np.eye(H.shape[1]), atol=ORTHONORMAL_TOL, rtol=0)


def _one_hot(labels: np.ndarray, k: int) -> np.ndarray:
    return np.eye(k)[labels]


def _assert_non_decreasing(objectives: list[float]) -> None:
    steps = np.diff(objectives)
    assert np.all(steps >= -1e-10 * np.abs(objectives[1:])), f"objective went down: {objectives}"


# --------------------------------------------------------------------------- client maths


@pytest.mark.parametrize("how", SCALINGS)
def test_scale_view_is_a_local_copy(how):
    X = np.arange(12.0).reshape(4, 3)
    X[:, 2] = 5.0  # a constant feature must not produce NaNs
    X.setflags(write=False)
    scaled = scale_view(X, how)
    assert scaled.dtype == np.float64 and np.all(np.isfinite(scaled))
    if how == "zscore":
        np.testing.assert_allclose(scaled.mean(axis=0), 0.0, atol=1e-12)
    if how == "minmax":
        assert scaled.min() >= 0.0 and scaled.max() <= 1.0
    if how == "l2":
        np.testing.assert_allclose(np.linalg.norm(scaled, axis=1), 1.0)
    with pytest.raises(ValueError, match="scaling"):
        scale_view(X, "whiten")


def test_init_embedding_is_the_top_left_singular_subspace():
    (X, *_), _ = _multiview()
    H = client.init_embedding(X, 4)
    _assert_orthonormal(H)
    U = np.linalg.svd(X, full_matrices=False)[0][:, :4]
    np.testing.assert_allclose(H @ H.T, U @ U.T, atol=1e-10)


def test_init_embedding_completes_a_view_with_fewer_features_than_k():
    views, _ = _multiview()
    X = views[2]  # 3 features, k = 6
    H = client.init_embedding(X, 6, seed=1, pad="random")
    _assert_orthonormal(H)
    U = np.linalg.svd(X, full_matrices=False)[0]
    np.testing.assert_allclose(H[:, :3] @ H[:, :3].T, U @ U.T, atol=1e-10)  # data columns first
    np.testing.assert_allclose(U.T @ H[:, 3:], 0.0, atol=ORTHONORMAL_TOL)  # completion is off the data
    np.testing.assert_array_equal(H, client.init_embedding(X, 6, seed=1, pad="random"))  # seeded
    assert not np.allclose(H[:, 3:], client.init_embedding(X, 6, seed=2, pad="random")[:, 3:])


def test_update_embedding_is_orthonormal_and_ascends_eq25():
    views, truth = _multiview()
    X, k, lam = views[0], 4, 5.0
    C_v = server.orthogonalise_centroids(np.random.default_rng(0).normal(size=(k, k)))
    H = client.init_embedding(X, k)

    def eq25(H_v):
        return client.view_objective(X, H_v, truth, C_v, lam=lam)

    for _ in range(5):
        updated = client.update_embedding(X, H, truth, C_v, lam=lam, mm_factor=2.0)
        _assert_orthonormal(updated)
        assert eq25(updated) >= eq25(H) - 1e-10 * abs(eq25(H))
        H = updated


def test_index_operations_equal_the_papers_dense_formulas():
    """Eq. 17, 28, 30, 31, 33 and 35 written with one-hot matrices and X Xᵀ equal the gather versions."""
    views, _ = _multiview(n_samples=60, dims=(5, 4), k=3)
    k, lam, beta = 3, 0.7, 1.3
    rng = np.random.default_rng(3)
    H_views = [client.init_embedding(X, k) for X in views]
    y0, C = server.initialise_consensus(H_views, k, seed=0)
    C_views = server.split_centroids(C, 2)
    y_views = [rng.integers(0, k, 60) for _ in views]
    y = rng.integers(0, k, 60)
    C_new = server.orthogonalise_centroids(rng.normal(size=(k, 2 * k)))
    C_bars = server.split_centroids(C_new, 2)
    H_c = np.hstack([_one_hot(y_v, k) @ C_v for y_v, C_v in zip(y_views, C_views, strict=True)])  # Eq. 17
    for X, H, y_v, C_v, C_bar in zip(views, H_views, y_views, C_views, C_bars, strict=True):
        S = lam * H @ C_v.T + beta * _one_hot(y, k) @ C_bar @ C_v.T  # Eq. 28
        np.testing.assert_array_equal(
            client.update_view_labels(H, C_v, y, C_bar, lam=lam, beta=beta), S.argmax(1)
        )
        dense_obj = np.trace(H.T @ X @ X.T @ H) + lam * np.trace(H.T @ _one_hot(y_v, k) @ C_v)  # Eq. 30
        assert client.view_objective(X, H, y_v, C_v, lam=lam) == pytest.approx(dense_obj, rel=1e-12)
    Q = H_c @ C_new.T  # Eq. 31
    np.testing.assert_array_equal(server.update_consensus_labels(y_views, C_views, C_new), Q.argmax(1))
    P = H_c.T @ _one_hot(y, k)  # Eq. 33
    C_opt = server.update_consensus_centroids(y_views, C_views, y)
    assert np.trace(C_opt @ P) == pytest.approx(np.linalg.svd(P, compute_uv=False).sum(), rel=1e-12)
    dense_integration = np.trace(H_c.T @ _one_hot(y, k) @ C_new)  # Eq. 35's first term
    assert server.label_integration(y_views, C_views, y, C_new) == pytest.approx(dense_integration, rel=1e-12)


def test_alg1_never_forms_an_n_by_n_matrix():
    """With N = 100,000 an N x N float64 matrix would need 80 GB; the whole client step must stay small."""
    n_samples, k = 100_000, 4
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_samples, 6))
    C_v = server.orthogonalise_centroids(rng.normal(size=(k, k)))
    labels = rng.integers(0, k, n_samples)
    tracemalloc.start()
    try:
        H = client.init_embedding(X, k)
        H, y_v, obj_v = client.client_round(X, H, labels, C_v, labels, C_v, lam=1.0, beta=1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * n_samples * k * 8, (
        f"peak {peak / 1e6:.0f} MB for N x k = {n_samples * k * 8 / 1e6:.1f} MB"
    )
    _assert_orthonormal(H)
    assert np.isfinite(obj_v) and y_v.shape == (n_samples,)


def test_view_labels_are_a_valid_label_vector():
    views, _ = _multiview()
    k = 4
    H = client.init_embedding(views[0], k)
    C_v = server.orthogonalise_centroids(np.random.default_rng(1).normal(size=(k, k)))
    y = np.random.default_rng(2).integers(0, k, len(H)).astype(np.int32)  # as received over the wire
    y_v = client.update_view_labels(H, C_v, y, C_v, lam=1.0, beta=1.0)
    assert y_v.shape == (len(H),) and y_v.dtype == np.int64
    assert y_v.min() >= 0 and y_v.max() < k


# --------------------------------------------------------------------------- server maths


def test_initialisation_gives_orthonormal_centroids_and_segments():
    views, _ = _multiview()
    k = 4
    y0, C0 = server.initialise_consensus([client.init_embedding(X, k) for X in views], k, seed=0)
    np.testing.assert_allclose(C0 @ C0.T, np.eye(k), atol=ORTHONORMAL_TOL)  # Eq. 22
    segments = server.split_centroids(C0, len(views))
    assert [s.shape for s in segments] == [(k, k)] * len(views)
    np.testing.assert_array_equal(np.hstack(segments), C0)
    assert y0.shape == (300,) and set(np.unique(y0)) <= set(range(k))


def test_server_rejects_labels_out_of_range():
    C_views = server.split_centroids(np.eye(2, 4), 2)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        server.update_consensus_centroids([np.array([0, 2]), np.array([0, 1])], C_views, np.array([0, 1]))


def test_stop_rule_is_the_relative_objective_change():
    assert not has_converged(None, 5.0, delta=1.0)  # nothing to compare with in round 1
    assert has_converged(100.0, 100.00001, delta=1e-6)
    assert not has_converged(100.0, 101.0, delta=1e-3)
    assert has_converged(101.0, 100.0, delta=1e-2)


# --------------------------------------------------------------------------- whole runs


@pytest.mark.parametrize("pad", client.PADDINGS)
@pytest.mark.parametrize(("lam", "beta"), [(1.0, 1.0), (1.0, 2.0**-5), (2.0**5, 2.0**-5)])
def test_rounds_never_lower_the_objective_and_keep_h_orthonormal(lam, beta, pad):
    """Alg. 2 written out round by round, checking H_vᵀ H_v = I (on the real columns) after every update."""
    views, _ = _multiview()
    k = 4  # the 3-d view is padded
    H_views = [client.init_embedding(X, k, seed=v, pad=pad) for v, X in enumerate(views)]
    y, C = server.initialise_consensus(H_views, k, seed=0)
    C_views = server.split_centroids(C, len(views))
    initial, y_views, objectives = y, [y] * len(views), []
    for _ in range(12):
        C_bars = server.split_centroids(C, len(views))
        view_objectives = []
        for v, X in enumerate(views):
            H_views[v], y_views[v], obj_v = client.client_round(
                X, H_views[v], y_views[v], C_views[v], y, C_bars[v], lam=lam, beta=beta
            )
            real = client.active_columns(H_views[v])
            assert real.sum() == (min(k, X.shape[1]) if pad == "zero" else k)
            _assert_orthonormal(H_views[v][:, real])
            view_objectives.append(obj_v)
        y, C, objective = server.server_round(y_views, view_objectives, C_views, C, beta=beta)
        np.testing.assert_allclose(C @ C.T, np.eye(k), atol=ORTHONORMAL_TOL)
        objectives.append(objective)
    _assert_non_decreasing(objectives)
    if beta < lam:  # with a weak consensus pull the labels do move, so the check above is not vacuous
        assert np.any(y != initial)


def test_cefmc_h_never_lowers_its_objective():
    views, _ = _multiview()
    run = run_cefmc_h(views, 4, lam=1.0, delta=0.0, max_rounds=12)
    _assert_non_decreasing(run.objectives)


def test_reference_run_counts_the_papers_messages():
    """Per client kN + (t+1)k² + t float64 and (2t+1)N int32, Sec. IV-E's count for Alg. 2's messages.

    (Sec. IV-E writes (k+1)N floats; the messages of Alg. 2 carry kN of them, H_v^(0).)
    """
    views, _ = _multiview()
    n_samples, k, n_views = 300, 4, 3
    run = run_cefmc(views, k, lam=1.0, delta=None, max_rounds=3)
    t = run.n_rounds
    assert t == 3
    floats = k * n_samples + (t + 1) * k * k + t
    labels = (2 * t + 1) * n_samples
    assert run.total_bytes == n_views * (8 * floats + 4 * labels)
    assert run.bytes_up[0] == n_views * 8 * k * n_samples


def _load_hw() -> tuple[list[np.ndarray], np.ndarray]:
    """HW through the project's loader when it is there, else straight from the .mat file; skip if absent."""
    try:
        from fedapp.datasets import load_dataset

        dataset = load_dataset("hw")
        return [np.asarray(v) for v in dataset.views], np.asarray(dataset.y)
    except (ImportError, AttributeError, ValueError, OSError):
        pass
    data_dir = Path(
        os.environ.get("FEDAPP_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    path = data_dir / "hw" / "Handwritten.mat"
    if not path.is_file():
        pytest.skip(f"HW data not found at {path}")
    from scipy.io import loadmat

    mat = loadmat(path)
    return [np.asarray(v, dtype=np.float64) for v in mat["X"].ravel()], mat["y"].ravel().astype(np.int64) - 1


@pytest.mark.shared_data
def test_hw_objective_non_decreasing_and_accurate():
    views, truth = _load_hw()
    run = run_reference("cefmc", views, 10, lam=1.0, delta=0.0, max_rounds=4, n_init=3, seed=0)
    _assert_non_decreasing(run.objectives)
    counts = np.zeros((10, 10))
    np.add.at(counts, (run.labels, truth), 1)
    rows, cols = linear_sum_assignment(-counts)
    assert counts[rows, cols].sum() / len(truth) > 0.90
