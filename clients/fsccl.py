"""FSCCL client: SCCL's local training (Zhang et al., NAACL 2021) on frozen sentence embeddings, under FedAvg.

Maths (plain functions): `instance_contrastive_loss` (SCCL's instance-CL, NT-Xent over the two views of
a batch; in `fedapp.maths.losses`, FSTC uses it too), `dec_targets` and `clustering_kl` (DEC's target
distribution and KL objective). The client trains the global model it is sent for `local-iters`
iterations and returns it; round 1 sends local k-means centres as FSTC's clients do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.common import Context, NDArrays, Scalar

from clients.base import ClusteringClient
from fedapp.config.run import RunConfig
from fedapp.datasets.augmented_texts import AUGMENTED_FILES
from fedapp.features.texts import local_augmented_embeddings, local_embeddings
from fedapp.maths.fstc import local_kmeans_summary
from fedapp.maths.losses import instance_contrastive_loss
from fedapp.methods.fsccl import FSCCLConfig
from fedapp.methods.fstc import PHASE_INIT
from fedapp.models.fsccl import SCCLModel
from fedapp.neural.glue import (
    FINGERPRINT_KEY,
    client_rngs,
    load_state_arrays,
    resolve_device,
    restore_optimizer,
    save_optimizer,
    state_arrays,
    state_schema,
)
from fedapp.neural.training import BatchCursor, train_steps
from fedapp.report.stages import Assignment

STATE_OPTIMIZER, STATE_CURSOR, STATE_RNG = "fsccl.optimizer", "fsccl.cursor", "fsccl.rng"
EVAL_BATCH = 4096


def dec_targets(q: torch.Tensor) -> torch.Tensor:
    """DEC Eq. 3: p_ik ∝ q_ik² / Σ_i q_ik (sharpened, frequency-normalised); no gradient flows into it."""
    weight = q.detach() ** 2 / q.detach().sum(0)
    return weight / weight.sum(1, keepdim=True)


def clustering_kl(q: torch.Tensor) -> torch.Tensor:
    """DEC Eq. 2: KL(P ‖ Q), averaged over the batch."""
    p = dec_targets(q)
    return (p * (torch.log(p.clamp_min(1e-12)) - torch.log(q.clamp_min(1e-12)))).sum(1).mean()


class FSCCLClient(ClusteringClient):
    """Round 1: local k-means centres; later rounds: SCCL steps on the global model, which goes back up."""

    def __init__(self, context: Context, cfg: RunConfig) -> None:
        super().__init__(context, cfg)
        self.params = cfg.params(FSCCLConfig)
        self.device = resolve_device(cfg.device)

    def views(self) -> list[torch.Tensor]:
        """Original embeddings, plus the two augmented views' embeddings when SCCL's pairs are used.

        All times `scale`: on unit-norm embeddings every squared distance is at most 4, so DEC's Student's t
        (α = 1) is nearly flat over 20 clusters; SCCL's mean-pooled distilbert embeddings are not unit-norm.
        """
        p, cfg = self.params, self.cfg
        cache = self.embedding_cache()
        views = [local_embeddings(self.data, cfg.embedding_model, p.max_length, cfg.device, cache)]
        if self.augmentation() == "pairs":
            views += local_augmented_embeddings(
                self.data, cfg.data_dir, cfg.embedding_model, p.max_length, cfg.device, cache
            )
        scale = self.params.scale  # one factor for every view, the k-means start and prediction alike
        return [torch.as_tensor(np.asarray(v, dtype=np.float32), device=self.device) * scale for v in views]

    def augmentation(self) -> str:
        if self.params.augment != "auto":
            return self.params.augment
        return "pairs" if self.data.dataset.name in AUGMENTED_FILES else "dropout"

    def build_model(self, dim: int) -> SCCLModel:
        return SCCLModel(dim, self.k, adapter_hidden=self.params.adapter_hidden, alpha=self.params.alpha).to(
            self.device
        )

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> tuple[NDArrays, int, dict[str, Scalar]]:
        views = self.views()
        if config.get("phase") == PHASE_INIT:  # the adapter starts as the identity: E = the embeddings
            summary = local_kmeans_summary(
                views[0].cpu().numpy(), self.params.init_local_k or 2 * self.k, self.seed, self.floor
            )
            return summary, self.data.n_samples, self.identity_metrics()
        state = self.context.state
        model = self.build_model(views[0].shape[1])
        load_state_arrays(model, list(parameters), sender="server")
        optimizer = torch.optim.Adam(model.parameters(), lr=self.params.lr)
        restore_optimizer(state, STATE_OPTIMIZER, optimizer)
        n = views[0].shape[0]
        cursor = BatchCursor.resume(
            state, STATE_CURSOR, n_samples=n, batch_size=min(self.params.batch_size, n), seed=self.seed
        )
        pairs = len(views) == 3

        def loss_fn(indices: np.ndarray) -> dict[str, Any]:
            index = torch.as_tensor(indices, device=self.device)
            originals = views[0][index]
            if pairs:
                first, second = views[1][index], views[2][index]
            else:
                drop = torch.nn.functional.dropout
                first, second = drop(originals, self.params.dropout), drop(originals, self.params.dropout)
            contrastive = instance_contrastive_loss(
                model.contrast(model(first)), model.contrast(model(second)), self.params.temperature
            )
            clustering = clustering_kl(model.soft_assign(model(originals)))
            return {
                "loss": contrastive + self.params.eta * clustering,
                "contrastive": contrastive.detach(),
                "clustering": clustering.detach(),
            }

        with client_rngs(state, STATE_RNG, self.seed):
            stats = train_steps(
                model,
                optimizer,
                loss_fn,
                cursor.take(self.params.local_iters),
                steps=self.params.local_iters,
                desc=f"client {self.partition_id}",
                log_every=max(self.params.local_iters // 4, 1),
            )
        save_optimizer(state, STATE_OPTIMIZER, optimizer)
        cursor.save(state, STATE_CURSOR)
        metrics = {
            **self.identity_metrics(),
            **stats.metrics(),
            FINGERPRINT_KEY: state_schema(model).fingerprint,
        }
        return state_arrays(model), self.data.n_samples, metrics

    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        return self.assign(parameters, config).labels

    @torch.no_grad()
    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """argmax of DEC's soft assignment q; score = that q; metric space = the adapter's output."""
        embeddings = self.views()[0]
        model = self.build_model(embeddings.shape[1])
        load_state_arrays(model, list(parameters), sender="server")
        model.eval()
        batches = [
            embeddings[start : start + EVAL_BATCH] for start in range(0, embeddings.shape[0], EVAL_BATCH)
        ]
        representations = torch.cat([model(batch) for batch in batches])
        q = torch.cat([model.soft_assign(model(batch)) for batch in batches])
        labels = q.argmax(1)
        return Assignment(
            labels.cpu().numpy(),
            q.gather(1, labels[:, None])[:, 0].double().cpu().numpy(),
            "probability",
            representations.double().cpu().numpy(),
        )
