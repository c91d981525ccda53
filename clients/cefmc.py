"""CeFMC client-side maths (Liu et al., "Communication-Efficient Federated Multi-view Clustering").

Client v holds view X_v (N x D_v) of all N samples. It keeps an orthonormal representation H_v (N x k),
its pseudo-labels y_v and its centroid matrix C_v (k x k, fixed to the server's first segment C̄_v^(0),
Eq. 24). Every function here is plain NumPy: the linear kernel K_v = X_v X_vᵀ (Eq. 10) is never formed,
every product with it is evaluated as X_v (X_vᵀ H_v), and one-hot matrices Y_v, Y are replaced by label
vectors and row gathers (Sec. IV-D), so one round costs O(k D_v N + k² N) time and O(k N) extra memory.
"""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar

from clients.base import VerticalClient
from fedapp.wire import label_dtype


def _polar_factor(M: np.ndarray) -> np.ndarray:
    """U Vᵀ from the thin SVD of M: the orthonormal H maximising Tr(Hᵀ M) (Alg. 1, lines 4-5)."""
    U, _, Vt = np.linalg.svd(M, full_matrices=False)
    return U @ Vt


def _flip_signs(U: np.ndarray) -> np.ndarray:
    """Make each column's largest-magnitude entry positive, so the SVD's sign ambiguity is deterministic."""
    pivots = U[np.argmax(np.abs(U), axis=0), np.arange(U.shape[1])]
    return U * np.where(pivots < 0, -1.0, 1.0)


def _leading_left_singular_vectors(X: np.ndarray, k: int) -> np.ndarray:
    """The numerically non-zero ones among the top-k left singular vectors of X, never forming X Xᵀ.

    For D <= N the D x D Gram matrix XᵀX gives the top right singular vectors W_k in O(N D²); a thin SVD
    of the N x k matrix X W_k (a Rayleigh-Ritz step) then returns left singular vectors that are
    orthonormal to machine precision, which eigenvector rescaling X W_k / σ alone would not guarantee.
    For D > N the thin SVD of X itself is used (its N x N factor is no larger than X).
    """
    n_samples, n_features = X.shape
    if n_features <= n_samples:
        eigenvalues, eigenvectors = np.linalg.eigh(X.T @ X)
        top = np.argsort(eigenvalues)[::-1][:k]
        U, singular_values, _ = np.linalg.svd(X @ eigenvectors[:, top], full_matrices=False)
    else:
        U, singular_values, _ = np.linalg.svd(X, full_matrices=False)
        U, singular_values = U[:, :k], singular_values[:k]
    if singular_values.size == 0 or singular_values[0] == 0.0:
        return U[:, :0]
    tolerance = singular_values[0] * max(n_samples, n_features) * np.finfo(np.float64).eps
    return _flip_signs(U[:, singular_values > tolerance])


PADDINGS = ("zero", "random")


def init_embedding(
    X_v: np.ndarray, k: int, seed: int | np.random.Generator | None = 0, *, pad: str = "zero"
) -> np.ndarray:
    """H_v^(0): the top-k left singular vectors of X_v (Eq. 20), the maximiser of Eq. 13.

    When X_v has rank r < k (HW's 6-d view at k = 10, a 64-d view at k = 100) there are only r singular
    vectors, and the paper does not say what fills the other k - r columns:

    - ``pad="zero"`` leaves them zero, so they add nothing to the k-means of Eq. 21 and stay zero in every
      later step (see `update_embedding`); a view then weighs in with its rank. With k = 100 and three
      64-d views, random padding made 36 of each view's 100 columns noise, and CeFMC fell 20-30 ACC below
      k-means on the concatenated views (docs/methods/cefmc.md, "More clusters than a view has
      dimensions").
    - ``pad="random"`` (the earlier behaviour) completes H_v to N x k orthonormal columns with a seeded
      Gaussian block projected off the first r and orthonormalised twice, so H_vᵀ H_v = I_k (Eq. 12).

    `seed` only matters for ``pad="random"`` with r < k.
    """
    if pad not in PADDINGS:
        raise ValueError(f"pad must be one of {PADDINGS}, got {pad!r}")
    X = np.asarray(X_v, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X_v must be a 2-d array (samples x features), got shape {X.shape}")
    n_samples = X.shape[0]
    if not 1 <= k <= n_samples:
        raise ValueError(f"k must be in [1, n_samples={n_samples}], got {k}")
    H = _leading_left_singular_vectors(X, k)
    if H.shape[1] == k:
        return H
    if pad == "zero":
        return np.hstack([H, np.zeros((n_samples, k - H.shape[1]))])
    block = np.random.default_rng(seed).standard_normal((n_samples, k - H.shape[1]))
    for _ in range(2):  # "twice is enough": a second projection removes the round-off of the first
        block -= H @ (H.T @ block)
        block, _ = np.linalg.qr(block)
    return np.hstack([H, block])


def active_columns(H_v: np.ndarray) -> np.ndarray:
    """Which columns of H_v carry a singular direction (the rest are `pad="zero"` padding)."""
    return np.any(np.asarray(H_v) != 0.0, axis=0)


def update_embedding(
    X_v: np.ndarray,
    H_v: np.ndarray,
    y_v: np.ndarray,
    C_v: np.ndarray,
    *,
    lam: float,
    mm_factor: float = 2.0,
    n_iter: int = 1,
) -> np.ndarray:
    """H_v-subproblem (Eq. 25) by Alg. 1: repeat H_v = polar(mm_factor X_v X_vᵀ H_v + λ Y_v C_v).

    Eq. 25, Tr(H_vᵀ X_v X_vᵀ H_v) + λ Tr(H_vᵀ Y_v C_v), is convex in H_v, so linearising it at the current
    H_v (gradient 2 X_v X_vᵀ H_v + λ Y_v C_v) and maximising the linear term on the Stiefel manifold never
    lowers it: `mm_factor=2.0` is that minorize-maximize step. `mm_factor=1.0` is the paper's literal
    Alg. 1 line 3, which is the same step for 2λ instead of λ and can lower the Eq. 19 objective.
    X_v X_vᵀ H_v is computed as X_v (X_vᵀ H_v) and Y_v C_v as the row gather C_v[y_v] (Sec. IV-D).
    The result satisfies H_vᵀ H_v = I_k to machine precision; with zero padding the step runs on the
    columns that carry a singular direction only and zero columns stay zero (H_vᵀ H_v = I_r ⊕ 0).
    CeFMC-H reuses this step with (y_v, C_v, λ) replaced by (y, C̄_v, β), because its Y-term is
    β Tr(H_vᵀ Y C̄_v).
    """
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")
    if mm_factor < 0:
        raise ValueError(f"mm_factor must be >= 0, got {mm_factor}")
    X = np.asarray(X_v, dtype=np.float64)
    anchor = lam * np.asarray(C_v, dtype=np.float64)[np.asarray(y_v)]  # λ Y_v C_v
    H = np.asarray(H_v, dtype=np.float64)
    active = active_columns(H)
    if active.all():
        for _ in range(n_iter):
            H = _polar_factor(mm_factor * (X @ (X.T @ H)) + anchor)  # Alg. 1, line 3; never X Xᵀ
        return H
    # Zero padding (`init_embedding(pad="zero")`): H_v lives on its r real columns, the rest stay zero.
    H_active, anchor = H[:, active], anchor[:, active]
    for _ in range(n_iter):
        H_active = _polar_factor(mm_factor * (X @ (X.T @ H_active)) + anchor)
    H = np.zeros_like(H)
    H[:, active] = H_active
    return H


def update_view_labels(
    H_v: np.ndarray, C_v: np.ndarray, y: np.ndarray, C_bar_v: np.ndarray, *, lam: float, beta: float
) -> np.ndarray:
    """Y_v-subproblem: y_v(i) = argmax_j S(i, j) (Eq. 29) with S = λ H_v C_vᵀ + β Y C̄_v C_vᵀ (Eq. 28).

    Eq. 28 in the paper drops λ and β, i.e. assumes λ = β (then the argmax is the same); keeping them makes
    the step exact for λ ≠ β too. Y C̄_v C_vᵀ is a row gather of the k x k matrix C̄_v C_vᵀ by the consensus
    labels y, so no N x k one-hot product is formed. Returns int64 labels in [0, k).
    """
    C_v = np.asarray(C_v, dtype=np.float64)
    scores = lam * (np.asarray(H_v, dtype=np.float64) @ C_v.T)
    scores += beta * (np.asarray(C_bar_v, dtype=np.float64) @ C_v.T)[np.asarray(y)]
    return np.argmax(scores, axis=1).astype(np.int64)


def kernel_alignment(X_v: np.ndarray, H_v: np.ndarray) -> float:
    """Tr(H_vᵀ X_v X_vᵀ H_v) = ||X_vᵀ H_v||_F², the representation-generation term of Eq. 13/30."""
    projected = np.asarray(X_v, dtype=np.float64).T @ np.asarray(H_v, dtype=np.float64)
    return float(np.einsum("ij,ij->", projected, projected))


def view_objective(
    X_v: np.ndarray, H_v: np.ndarray, y_v: np.ndarray, C_v: np.ndarray, *, lam: float
) -> float:
    """obj_v = Tr(H_vᵀ X_v X_vᵀ H_v) + λ Tr(H_vᵀ Y_v C_v) (Eq. 30); the trace is Σ_i <H_v[i], C_v[y_v(i)]>."""
    gathered = np.asarray(C_v, dtype=np.float64)[np.asarray(y_v)]
    return kernel_alignment(X_v, H_v) + lam * float(np.einsum("ij,ij->", H_v, gathered))


def client_round(
    X_v: np.ndarray,
    H_v: np.ndarray,
    y_v: np.ndarray,
    C_v: np.ndarray,
    y: np.ndarray,
    C_bar_v: np.ndarray,
    *,
    lam: float,
    beta: float,
    mm_factor: float = 2.0,
    n_iter: int = 1,
) -> tuple[np.ndarray, np.ndarray, float]:
    """One CeFMC client round (Alg. 2, client lines 9-11): H_v by Alg. 1, y_v by Eq. 29, obj_v by Eq. 30.

    Inputs are the client's state (H_v, y_v, fixed C_v) and the server's last message (y, C̄_v); returns
    the new (H_v, y_v) to keep and obj_v, which is sent with y_v.
    """
    H_v = update_embedding(X_v, H_v, y_v, C_v, lam=lam, mm_factor=mm_factor, n_iter=n_iter)
    y_v = update_view_labels(H_v, C_v, y, C_bar_v, lam=lam, beta=beta)
    return H_v, y_v, view_objective(X_v, H_v, y_v, C_v, lam=lam)


def client_round_full_representation(
    X_v: np.ndarray,
    H_v: np.ndarray,
    y: np.ndarray,
    C_bar_v: np.ndarray,
    *,
    beta: float,
    mm_factor: float = 2.0,
    n_iter: int = 1,
) -> tuple[np.ndarray, float]:
    """One CeFMC-H client round (ablation, Sec. V-E): H_v by Alg. 1, then obj_v = Tr(H_vᵀ X_v X_vᵀ H_v).

    CeFMC-H sends H_v itself, so H_c = [H_1, ..., H_V] and the approximation term of Eq. 19 vanishes; the
    only H_v-dependent terms are Tr(H_vᵀ K_v H_v) + β Tr(H_vᵀ Y C̄_v). Returns (H_v, obj_v), both sent.
    """
    H_v = update_embedding(X_v, H_v, y, C_bar_v, lam=beta, mm_factor=mm_factor, n_iter=n_iter)
    return H_v, kernel_alignment(X_v, H_v)


# ------------------------------------------------------------------------------------------ Flower glue
class CeFMCClient(VerticalClient):
    """Client v of CeFMC / CeFMC-H: holds view v; keeps H_v, y_v and C_v in `context.state` across rounds.

    Wire (Alg. 2): init — H_v^(0) (N x k float64) up; rounds — y_v (N labels, smallest unsigned int
    type) + obj_v up (CeFMC-H: H_v instead of y_v). Down: y (N labels) + this view's C̄_v (k x k).
    """

    full_representation = False  # CeFMC-H sends H_v every round

    def fit_view(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        X = self.data.features
        if config["phase"] == "init":
            rng = np.random.default_rng([self.cfg.seed, self.partition_id])
            H = init_embedding(X, self.k, rng, pad=str(config.get("pad", "zero")))
            self.keep_state("cefmc", {"H": H})
            return [H], self.data.n_samples, self.identity_metrics()
        y = np.asarray(parameters[0]).astype(np.int64)
        C_bar = np.asarray(parameters[1], dtype=np.float64)
        state = self.state_arrays("cefmc")
        if "H" not in state:
            raise RuntimeError("CeFMC client has no H_v: the initialisation round did not reach this client")
        lam, beta = float(config["lambda"]), float(config["beta"])
        options = {"mm_factor": float(config["mm-factor"]), "n_iter": int(config["h-iters"])}
        if self.full_representation:
            H, objective = client_round_full_representation(X, state["H"], y, C_bar, beta=beta, **options)
            self.keep_state("cefmc", {"H": H})
            return [H], self.data.n_samples, {**self.identity_metrics(), "objective": objective}
        # Eq. 24: C_v is fixed to the first C̄_v received, y_v starts from y^(0)
        C_v = state.get("C_v", C_bar)
        y_v = state.get("y_v", y)
        H, y_v, objective = client_round(X, state["H"], y_v, C_v, y, C_bar, lam=lam, beta=beta, **options)
        self.keep_state("cefmc", {"H": H, "y_v": y_v, "C_v": C_v})
        labels = y_v.astype(label_dtype(self.k))
        return [labels], self.data.n_samples, {**self.identity_metrics(), "objective": objective}


class CeFMCHClient(CeFMCClient):
    full_representation = True
