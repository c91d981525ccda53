"""CCFC client (Liu, Yan & Zhang, Alg. 1 lines 5-14): losses, pseudo-labels, local k-means, one local round.

The maths comes first as plain torch functions; `CCFCClient` at the end is the Flower glue. Per round a
client receives the global model w^g (and, from the last pre-training round on, the k global centroids),
replaces its weights with w^g, trains one local epoch (or `local-steps` batches) with Adam whose moments
persist in `context.state`, and returns its weights (+ its k local centroids when the server asks).

What leaves the client is the uplink's (`fedapp.privacy.uplink`): plain, SecAgg+ (the model averaged
securely, the centroids in the clear) or, under differential privacy (`dp.epsilon` > 0), one client-level
Gaussian release per round: the model delta w^l - w^g (parameters and BatchNorm running statistics) is
clipped to `dp.model-clip`, the local centroids (rows of norm <= 1, scaled by model-clip / sqrt(k): the
cosine assignment and the server's k-means do not change under one common scale) are a second part
clipped alike, and both get N(0, (z * model-clip * sqrt(2))^2). The step counter goes back as received
and the example count is 1 (the server averages with equal weights: a client's size is private too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from flwr.common import Array, ArrayRecord, NDArrays, Scalar
from torch import nn
from torch.nn.functional import cosine_similarity, normalize, one_hot

from clients.base import ClusteringClient
from fedapp.datasets.augment import ViewAugmenter, contrastive_augmenter
from fedapp.maths.clustering import kmeans
from fedapp.maths.losses import info_nce_loss  # the sample-level term; tests import it from here
from fedapp.methods.ccfc import (
    CLUSTER,
    PHASE_KEY,
    PRETRAIN,
    SETUP,
    SHAPE_KEYS,
    WANT_CENTROIDS_KEY,
    CCFCConfig,
)
from fedapp.models.ccfc import build_model
from fedapp.neural.glue import (
    FINGERPRINT_KEY,
    client_rngs,
    load_state_arrays,
    resolve_device,
    restore_module,
    restore_optimizer,
    save_module,
    save_optimizer,
    set_deterministic,
    state_arrays,
    state_schema,
)
from fedapp.neural.training import BatchCursor, TrainStats, train_steps
from fedapp.privacy.dp import clip_rows, released_arrays
from fedapp.privacy.floor import CLIENT_MIN_CLUSTER, capped_clusters, merge_small_clusters
from fedapp.report.stages import Assignment

ENCODE_BATCH = 512  # inference batch: memory only, results do not depend on it


# ----------------------------------------------------------------------------------------- losses
def negative_cosine(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-cos(p, stopgrad(t)), averaged over the batch: SimSiam's D and the model-contrastive R (Eq. 5)."""
    return -cosine_similarity(prediction, target.detach(), dim=-1).mean()


def simsiam_loss(p1: torch.Tensor, z1: torch.Tensor, p2: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Symmetric SimSiam loss of two views, D(p1, z2)/2 + D(p2, z1)/2 (pre-training; SCFC)."""
    return 0.5 * negative_cosine(p1, z2) + 0.5 * negative_cosine(p2, z1)


def model_contrastive_loss(p_local: torch.Tensor, p_global: torch.Tensor) -> torch.Tensor:
    """Eq. 5: R = -cos(p^l, p^g) with the global model's prediction p^g fixed (Eq. 6-7)."""
    return negative_cosine(p_local, p_global)


def cluster_contrastive_loss(
    p: torch.Tensor, z: torch.Tensor, labels: torch.Tensor, *, self_pairs: bool = True
) -> torch.Tensor:
    """Eq. 1-2: mean over pairs (i, j) of one pseudo-cluster of -cos(p_i, stopgrad(z_j)), averaged over
    the clusters with more than one sample in the batch.

    Gradients reach the model only through p (the predictor path); z is a constant. `self_pairs` also
    counts j = i, as the authors' code does (Eq. 1 has j != i). A batch in which every cluster is a
    singleton has no pair: the loss is then 0 with a zero gradient (the authors' code divides by zero).
    """
    p_unit = normalize(p, dim=1)
    z_unit = normalize(z.detach(), dim=1)
    similarity = p_unit @ z_unit.T  # (B, B): cos(p_i, z_j)
    _, cluster_of, sizes = torch.unique(labels, return_inverse=True, return_counts=True)
    members = one_hot(cluster_of, len(sizes)).to(similarity.dtype)  # (B, C)
    pair_sums = ((members.T @ similarity) * members.T).sum(dim=1)  # sum over i, j in cluster c
    pair_counts = sizes.to(similarity.dtype) ** 2
    if not self_pairs:
        pair_sums = pair_sums - members.T @ similarity.diagonal()
        pair_counts = pair_counts - sizes
    valid = sizes > 1
    if not valid.any():
        return p.sum() * 0.0
    return -(pair_sums[valid] / pair_counts[valid]).mean()


def cosine_assign(z: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Eq. 3 as the authors' code solves it: the centroid of largest cosine similarity to each z."""
    return (normalize(z, dim=1) @ normalize(centroids.to(z), dim=1).T).argmax(dim=1)


# ------------------------------------------------------------------------------ representations
@torch.no_grad()
def encode(model: nn.Module, images: torch.Tensor, batch_size: int = ENCODE_BATCH) -> torch.Tensor:
    """z = f(x) for every image, in eval mode (BatchNorm running statistics), on the images' device."""
    model.eval()
    return torch.cat([model.encode(images[i : i + batch_size]) for i in range(0, len(images), batch_size)])


def local_centroids(z: torch.Tensor, k: int, seed: int, floor: int = CLIENT_MIN_CLUSTER) -> np.ndarray:
    """Alg. 1 line 11: k-means (k) on the L2-normalised local representations, as float32 (k, d).

    The privacy floor (`fedapp.privacy.floor`): a cluster of fewer than `floor` records is merged into its
    nearest neighbour and both send the merged group's mean, so every centroid averages >= floor records
    and the server still gets k of them."""
    unit = normalize(z, dim=1).cpu().numpy()
    if unit.shape[0] < k:
        raise ValueError(f"local k-means needs at least k={k} samples, this client has {unit.shape[0]}")
    capped_clusters(1, unit.shape[0], floor)  # fewer records than the floor: nothing may be sent
    centres, labels = kmeans(unit, k, seed)
    merged_labels, merged = merge_small_clusters(unit, labels, floor)
    if merged:  # every centroid becomes the mean of its (merged) group
        for cluster in np.unique(labels):
            target = merged_labels[labels == cluster][0]
            centres[cluster] = unit[merged_labels == target].mean(0)
    return centres.astype(np.float32)


# ------------------------------------------------------------------------------------ objectives
@dataclass
class SampleContrastiveObjective:
    """Pre-training (and SCFC's second phase): a sample-contrastive loss on two augmented views,
    SimSiam (the paper) or InfoNCE (`temperature` set), + lambda * R (Eq. 5)."""

    augmenter: ViewAugmenter
    generator: torch.Generator
    reference: nn.Module | None  # the frozen global model; None: no model-contrastive term
    lam: float
    temperature: float | None = None  # None: SimSiam; a float: InfoNCE at this temperature
    fit_predictor: bool = False  # InfoNCE: also fit h on stop-gradient views (h alone learns from it)

    def __call__(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        view1, view2 = self.augmenter.two_views(images, self.generator)
        z1, p1 = model(view1)
        z2, p2 = model(view2)
        terms: dict[str, torch.Tensor] = {}
        if self.temperature is None:
            terms["sample"] = simsiam_loss(p1, z1, p2, z2)
        else:
            terms["sample"] = info_nce_loss(z1, z2, self.temperature)
            if self.fit_predictor:  # InfoNCE never uses h; the CCFC phase trains through it
                h = model.predictor
                terms["predictor"] = simsiam_loss(h(z1.detach()), z1, h(z2.detach()), z2)
        terms["loss"] = sum(terms.values())
        if self.reference is None or self.lam == 0:
            return terms
        with torch.no_grad():
            _, q1 = self.reference(view1)
            _, q2 = self.reference(view2)
        terms["model"] = 0.5 * model_contrastive_loss(p1, q1) + 0.5 * model_contrastive_loss(p2, q2)
        terms["loss"] = terms["loss"] + self.lam * terms["model"]
        return terms


@dataclass
class ClusterObjective:
    """Eq. 4: cluster-contrastive loss on pseudo-labels (Eq. 3 under the reference model) + lambda * R,
    optionally + `sample_weight` * a sample-contrastive loss on two augmented views (`sample`)."""

    reference: nn.Module  # the frozen global model (standalone: the client's own model at round start)
    centroids: torch.Tensor  # (k, d) global centroids
    lam: float
    self_pairs: bool
    sample: SampleContrastiveObjective | None = None  # its own lambda is 0: R is counted here once
    sample_weight: float = 0.0

    def __call__(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        z, p = model(images)
        with torch.no_grad():
            z_ref, p_ref = self.reference(images)
        labels = cosine_assign(z_ref, self.centroids)
        cluster = cluster_contrastive_loss(p, z, labels, self_pairs=self.self_pairs)
        model_term = model_contrastive_loss(p, p_ref)
        terms = {"loss": cluster + self.lam * model_term, "cluster": cluster, "model": model_term}
        if self.sample is not None and self.sample_weight > 0:
            sample = self.sample(model, images)["sample"]
            terms["loss"] = terms["loss"] + self.sample_weight * sample
            terms["sample"] = sample
        return terms


Objective = Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]


def train_local(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    objective: Objective,
    images: torch.Tensor,
    batches: Iterator[np.ndarray],
    steps: int,
    desc: str,
) -> TrainStats:
    """Alg. 1 line 10: minimise `objective` over `steps` mini-batches of `images` (indices from `batches`)."""

    def loss_fn(indices: np.ndarray) -> dict[str, torch.Tensor]:
        return objective(model, images[torch.from_numpy(indices).to(images.device)])

    return train_steps(
        model, optimizer, loss_fn, batches, steps=steps, desc=desc, log_every=max(1, steps // 4)
    )


def frozen_copy(model: nn.Module, like: nn.Module) -> nn.Module:
    """`like` (a fresh module of the same class) holding `model`'s state, in eval mode, without gradients."""
    like.load_state_dict(model.state_dict())
    return like.eval().requires_grad_(False)


# ----------------------------------------------------------------------------------- Flower glue
OWN_MODEL_KEY = "ccfc.own-model"  # standalone: the client's model, which never leaves it
OWN_CENTROIDS_KEY = "ccfc.own-centroids"  # standalone: its local centroids (pseudo-labels, evaluation)
CURSOR_KEY, RNG_KEY = "ccfc.cursor", "ccfc.rng"


def optimizer_key(phase: str) -> str:
    return f"ccfc.adam-{phase}"


class CCFCClient(ClusteringClient):
    """Setup: report the image shape. Pre-train / cluster: load w^g, train, return w^l (+ centroids)."""

    def __init__(self, context, cfg) -> None:  # noqa: ANN001 - same signature as every client
        super().__init__(context, cfg)
        self.params = cfg.params(CCFCConfig)
        self.image_shape = tuple(int(s) for s in self.data.dataset.image_shape or ())
        if len(self.image_shape) != 3:
            raise ValueError(f"CCFC needs an image dataset, '{cfg.dataset}' has no images")

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        phase = str(config.get(PHASE_KEY))
        metrics = self.identity_metrics()
        if phase == SETUP:
            return (
                [],
                self.data.n_samples,
                {**metrics, **dict(zip(SHAPE_KEYS, self.image_shape, strict=True))},
            )
        if phase not in (PRETRAIN, CLUSTER):
            raise ValueError(f"unknown CCFC phase {phase!r} in the fit config")
        want_centroids = bool(config.get(WANT_CENTROIDS_KEY, 0))
        state = self.context.state
        device = self._device()
        model, centroids = self._starting_point(parameters)
        reference = frozen_copy(model, build_model(self.params, self.image_shape))
        if centroids is None and phase == CLUSTER and not self.params.federated:
            centroids = self._own_centroids(model)  # sat out the round that computed them
        model.to(device)
        reference.to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.params.lr_of(phase))
        if phase == CLUSTER and optimizer_key(PRETRAIN) in state:
            del state[optimizer_key(PRETRAIN)]  # a fresh Adam for the second phase, as the authors' code
        restore_optimizer(state, optimizer_key(phase), optimizer)
        images = self._images(device)
        cursor = BatchCursor.resume(
            state,
            CURSOR_KEY,
            n_samples=self.data.n_samples,
            batch_size=min(self.params.batch_size, self.data.n_samples),
            seed=self.seed,
            drop_last=True,  # as SimSiam; a 1-sample batch cannot pass BatchNorm in train mode
        )
        steps = self.params.local_steps or cursor.steps_left_in_epoch
        with client_rngs(state, RNG_KEY, self.seed) as rngs:
            objective = self._objective(phase, reference, centroids, rngs.torch, device)
            desc = f"client {self.partition_id} {phase} round {config.get('server-round')}"
            stats = train_local(model, optimizer, objective, images, cursor.take(steps), steps, desc)
            encoder = model if self.params.centroid_model == "local" else reference
            new_centroids = self._local_centroids(encoder, images, rngs.numpy) if want_centroids else None
        save_optimizer(state, optimizer_key(phase), optimizer)
        cursor.save(state, CURSOR_KEY)
        metrics.update(stats.metrics())
        if not self.params.federated:
            save_module(state, OWN_MODEL_KEY, model)
            if new_centroids is not None:
                state[OWN_CENTROIDS_KEY] = ArrayRecord({"centroids": Array(new_centroids)})
            return [], self.data.n_samples, metrics
        schema = state_schema(model)
        metrics[FINGERPRINT_KEY] = schema.fingerprint
        local = state_arrays(model)
        extra = [] if new_centroids is None else [new_centroids]
        if extra and self.uplink.private:  # a second part of the client-level release (module docstring)
            extra = [clip_rows(new_centroids, 1.0) * (self.cfg.dp.model_clip / np.sqrt(self.k))]
        # Eq. 8's model is an average (SecAgg+ can hide it); the centroids are not a sum: in the clear
        parameter_names = {name for name, _ in model.named_parameters()}
        return self.uplink.send_update(
            lambda: (list(parameters[: len(schema)]), released_arrays(schema.names, local, parameter_names)),
            local,
            self.data.n_samples,
            metrics,
            extra=extra,
            extra_dtypes=[np.dtype(np.float32)] * len(extra),
        )

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        """Eq. 3 under the global model and centroids (standalone: the client's own)."""
        z, centroids = self._encoded(parameters)
        return cosine_assign(z, centroids).cpu().numpy()

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """Eq. 3's label; score = cosine similarity to that centroid; metric space = f's output z."""
        z, centroids = self._encoded(parameters)
        similarity = normalize(z, dim=1) @ normalize(centroids.to(z), dim=1).T
        best, labels = similarity.max(dim=1)
        return Assignment(
            labels.cpu().numpy(), best.double().cpu().numpy(), "similarity", z.double().cpu().numpy()
        )

    def _encoded(self, parameters: NDArrays) -> tuple[torch.Tensor, torch.Tensor]:
        """(z of every local image, the centroids) under the global model (standalone: the client's own)."""
        model, centroids = self._starting_point(parameters)
        if centroids is None and not self.params.federated:
            centroids = self._own_centroids(model)
        if centroids is None:
            raise ValueError("evaluation needs centroids; the server sent none")
        device = self._device()
        return encode(model.to(device), self._images(device)), centroids.to(device)

    # ---------------------------------------------------------------------------------- helpers
    def _images(self, device: torch.device) -> torch.Tensor:
        """The local images as float32 N x C x H x W in [0, 1] on `device` (digits are stored as float64)."""
        return torch.from_numpy(self.data.images().astype(np.float32, copy=False)).to(device)

    def _device(self) -> torch.device:
        set_deterministic(self.cfg.deterministic)
        return resolve_device(self.cfg.device)

    def _starting_point(self, parameters: NDArrays) -> tuple[nn.Module, torch.Tensor | None]:
        """(w^l = w^g, the global centroids): Alg. 1 lines 6-7.

        Standalone clients start from their own model and centroids (w^g only seeds the first round).
        """
        model = build_model(self.params, self.image_shape)
        n_state = len(state_schema(model))
        if self.params.federated or not restore_module(self.context.state, OWN_MODEL_KEY, model):
            load_state_arrays(model, parameters[:n_state], sender="server")
        if self.params.federated:
            extra = parameters[n_state:]
            centroids = torch.from_numpy(np.asarray(extra[0], dtype=np.float32)) if extra else None
        elif OWN_CENTROIDS_KEY in self.context.state:
            centroids = torch.from_numpy(self.context.state[OWN_CENTROIDS_KEY]["centroids"].numpy())
        else:
            centroids = None
        if centroids is not None and centroids.shape != (self.k, self.params.latent_dim):
            raise ValueError(
                f"centroids of shape {tuple(centroids.shape)}, expected ({self.k}, {self.params.latent_dim})"
            )
        return model, centroids

    def _objective(
        self,
        phase: str,
        reference: nn.Module,
        centroids: torch.Tensor | None,
        generator: torch.Generator,
        device: torch.device,
    ) -> Objective:
        lam = self.params.lam if self.params.federated else 0.0  # standalone: no global model to anchor to

        def sample_objective(lam: float, fit: bool) -> SampleContrastiveObjective:
            augmenter = contrastive_augmenter(self.image_shape[0])
            infonce = self.params.pretrain_loss == "infonce"
            temperature = self.params.temperature if infonce else None
            return SampleContrastiveObjective(augmenter, generator, reference, lam, temperature, fit)

        if phase == PRETRAIN or self.params.phase2_loss == "sample":
            return sample_objective(lam, self.params.fit_predictor)
        if centroids is None:
            raise ValueError("the CCFC phase needs global centroids; the server sent none")
        weight = self.params.sample_weight
        return ClusterObjective(
            reference,
            centroids.to(device),
            lam,
            self.params.self_pairs,
            sample=sample_objective(0.0, False) if weight > 0 else None,  # Eq. 1 trains h here
            sample_weight=weight,
        )

    def _own_centroids(self, model: nn.Module) -> torch.Tensor:
        """A standalone client that missed the round that computed its centroids computes them now."""
        images = self._images(self._device())
        with client_rngs(self.context.state, RNG_KEY, self.seed) as rngs:
            centroids = self._local_centroids(model.to(images.device), images, rngs.numpy)
        self.context.state[OWN_CENTROIDS_KEY] = ArrayRecord({"centroids": Array(centroids)})
        return torch.from_numpy(centroids)

    def _local_centroids(
        self, model: nn.Module, images: torch.Tensor, rng: np.random.Generator
    ) -> np.ndarray:
        limit = self.params.kmeans_samples
        if limit and limit < len(images):
            chosen = np.sort(rng.choice(len(images), size=limit, replace=False))
            images = images[torch.from_numpy(chosen).to(images.device)]
        return local_centroids(encode(model, images), self.k, int(rng.integers(2**31)), self.floor)
