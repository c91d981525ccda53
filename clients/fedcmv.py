"""FedCMv / FedFCMv client-side maths: vertical federated c-means and fuzzy c-means (Bárcena et al. 2024).

Client v holds view X_v of all N samples and its own segment C_v (k x D_v) of the k global centroids;
the full centroid is the concatenation [C_1, ..., C_V], so the squared distance of sample i to centroid j
is Σ_v ||X_v[i] - C_v[j]||². Each round the client sends its N x k partial distances and, given the
server's hard labels (FedCMv) or fuzzy memberships (FedFCMv), recomputes its segment on its own.
"""

from __future__ import annotations

import numpy as np
from flwr.common import NDArrays, Scalar
from scipy import sparse

from clients.base import VerticalClient
from fedapp.methods.fedcmv import choose_initial_samples


def init_centroids(X_v: np.ndarray, sample_indices: np.ndarray) -> np.ndarray:
    """Initial segment: the rows of X_v at the k sample indices the server drew (same rows on every client).

    Every client copying the same samples makes the initial global centroids k actual data points, the
    vertical analogue of Forgy initialisation, without any feature leaving a client.
    """
    return np.array(np.asarray(X_v, dtype=np.float64)[np.asarray(sample_indices)])


def squared_distances(X_v: np.ndarray, C_v: np.ndarray) -> np.ndarray:
    """Partial distances ||X_v[i] - C_v[j]||² (N x k), the message FedCMv/FedFCMv clients send each round."""
    X = np.asarray(X_v, dtype=np.float64)
    C = np.asarray(C_v, dtype=np.float64)
    distances = np.einsum("ij,ij->i", X, X)[:, None] - 2.0 * (X @ C.T) + np.einsum("ij,ij->i", C, C)[None, :]
    return np.maximum(distances, 0.0)  # the expansion can dip below zero by round-off


def update_centroids_hard(X_v: np.ndarray, labels: np.ndarray, C_v: np.ndarray) -> np.ndarray:
    """c-means centroid step on this view: C_v[j] = mean of X_v[i] with labels[i] = j (Lloyd's M-step).

    A cluster left without samples keeps its previous segment (scikit-learn would relocate it to a far
    sample, which in the vertical setting needs an extra exchange).
    """
    X = np.asarray(X_v, dtype=np.float64)
    labels = np.asarray(labels)
    k, n_samples = C_v.shape[0], X.shape[0]
    one_hot_t = sparse.csr_matrix((np.ones(n_samples), (labels, np.arange(n_samples))), shape=(k, n_samples))
    sums = np.asarray(one_hot_t @ X)
    counts = np.bincount(labels, minlength=k)
    return np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], C_v)


def update_centroids_fuzzy(X_v: np.ndarray, memberships: np.ndarray, fuzzifier: float = 2.0) -> np.ndarray:
    """Fuzzy c-means centroid step on this view: C_v[j] = Σ_i u_ij^m X_v[i] / Σ_i u_ij^m (Bezdek 1981)."""
    weights = np.asarray(memberships, dtype=np.float64) ** fuzzifier
    totals = weights.sum(axis=0)
    if np.any(totals <= 0):
        raise ValueError("every cluster needs a positive total membership to define its centroid")
    return (weights.T @ np.asarray(X_v, dtype=np.float64)) / totals[:, None]


# ------------------------------------------------------------------------------------------ Flower glue
class FedCMvClient(VerticalClient):
    """Client v of FedCMv (hard) / FedFCMv (fuzzy): keeps its centroid segment C_v in `context.state`.

    Wire: up — the N x k partial squared distances to its segment (by design of this baseline: per-sample
    information leaves the client); down — the server's labels (FedCMv) or N x k memberships (FedFCMv).
    Initial segment: the rows of k sample indices drawn from the run seed, the same on every client, so
    the server's choice needs no message.
    """

    def fit_view(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        X = self.data.features
        if config["phase"] == "init":
            C_v = init_centroids(X, choose_initial_samples(self.data.n_samples, self.k, self.cfg.seed))
        else:
            state = self.state_arrays("fedcmv")
            if "C_v" not in state:
                raise RuntimeError("FedCMv client has no centroid segment: it missed the first round")
            assignment = np.asarray(parameters[0])
            if assignment.ndim == 2:
                C_v = update_centroids_fuzzy(X, assignment, float(config["fuzziness"]))
            else:
                C_v = update_centroids_hard(X, assignment.astype(np.int64), state["C_v"])
        self.keep_state("fedcmv", {"C_v": C_v})
        return [squared_distances(X, C_v)], self.data.n_samples, self.identity_metrics()
