"""FSTC client (Hu et al., IJCAI 2023): Alg. 3's local training loop and its Flower glue.

The maths it runs (Sinkhorn pseudo-labels Eq. 2-7, the Gaussian-uniform mixture Eq. 8-13, the losses
Eq. 14-17, the label-update schedule) are framework-free functions in `fedapp.maths.fstc`. Here:
`LocalInputs` (a client's samples as the model takes them), `forward_all`, `LabellingState` (what
Alg. 3 carries between iterations and rounds), `LocalUpdate` (the loop) and the `NumPyClient`s.

What leaves the client is the uplink's (`fedapp.privacy.uplink`: plain, SecAgg+ sums, DP releases); the
choice that is FSTC's own is where its statistics live under differential privacy (`dp.epsilon` > 0):
nothing the locally trained model computes leaves the client unclipped and unnoised. The statistics are
taken in the *public* representation space
of the initial model (built from the run seed, as the server builds it): the locally trained model
depends on every record, so statistics of its representations would have no per-record sensitivity.
Round 1 sends noisy (sum E, sum E*E, count) of the clipped initial representations (the moments init);
each training round assigns every clipped representation to its nearest global centre (public: earlier
noisy releases) and sends noisy per-cluster sums and counts (`centre_statistics`): the global centres
are a DP Lloyd's k-means in that public space. `fstc.dp-labels` says how records are labelled:
- `centres` (default): by their nearest global centre in that same space (clipped public representations).
  No model is released, and nothing local training would produce is released or used, so local training
  is skipped altogether (`train_round`); the global model is the public initial model + C̃.
- `model`: argmax O of the final model. The last round's model goes out as the initial model plus a
  clipped, noised delta (`fedapp.privacy.dp.clipped_release`, multiplier 2z: client-level on its own, a z
  release for one record): that noise swamps the trained head, hence not the default.
The privacy floor's withholding is off (the noise covers small clusters) and the reply's example count is
0 (a record count is private).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.common import Array, ArrayRecord, ConfigRecord, Context, NDArrays, RecordDict, Scalar

from clients.base import ClusteringClient
from fedapp.config.run import RunConfig
from fedapp.features.texts import local_augmented_embeddings, local_augmented_texts, local_embeddings
from fedapp.maths.clustering import nearest_centre
from fedapp.maths.fstc import (
    GaussianUniformMixture,
    LocalCentres,
    alignment_loss,
    cluster_centres,
    compared_output,
    label_update_steps,
    local_kmeans_summary,
    pseudo_labels,
    robust_weights,
    weighted_mse,
    withhold_small_clusters,
)
from fedapp.maths.losses import info_nce_loss
from fedapp.maths.threads import one_blas_thread
from fedapp.methods.fstc import (
    CENTRES_KEY,
    FINAL_KEY,
    INIT_KEY,
    MODEL_KEY,
    PHASE_INIT,
    PHASE_LLOYD,
    FSTCConfig,
    loss_target,
    train_modes,
)
from fedapp.metrics.label_free import cluster_sums
from fedapp.models.fstc import FSTCModel, SentenceEncoder, TokenizedTexts, fstc_model
from fedapp.neural.glue import (
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
from fedapp.neural.training import BatchCursor, TrainStats, train_steps
from fedapp.privacy.dp import (
    clip_rows,
    clipped_release,
    sum_count_sensitivity,
)
from fedapp.privacy.floor import WITHHELD_KEY
from fedapp.privacy.secagg import CLEAR, SUM
from fedapp.privacy.uplink import Reply
from fedapp.report.keep import BY_CENTRES, LABELS_BY_KEY
from fedapp.report.stages import Assignment, nearest_with_distance


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


STATE_ARRAYS, STATE_SCALARS = "fstc.progress-arrays", "fstc.progress"  # context.state keys


@dataclass
class LabellingState:
    """Alg. 3's pseudo-labelling state: what a client carries between rounds besides model and optimizer."""

    step: int  # local iterations done so far, over the whole run (the schedule counts these)
    targets: torch.Tensor  # Q (n x K)
    memory: torch.Tensor  # the latest O (or softmax O) of every sample, for the mixture (n x K)
    gum: GaussianUniformMixture | None  # None until the first pseudo-label update (r = 1 before)
    dual: torch.Tensor | None = None  # log v of the last Sinkhorn solve (warm start)
    centres: LocalCentres | None = None  # align-centres = local: Eq. 15 over all samples (not kept)

    def save(self, state: RecordDict) -> None:
        """Keep it in `context.state` for the client's next round (the client object is rebuilt)."""
        arrays = {"targets": self.targets.cpu().numpy(), "memory": self.memory.cpu().numpy()}
        scalars: dict[str, Scalar] = {"step": self.step, "gum": self.gum is not None}
        if self.dual is not None:
            arrays["sinkhorn-dual"] = self.dual.cpu().numpy()
        if self.gum is not None:
            arrays["gum-covariance"] = self.gum.covariance_
            scalars.update({"gum-prior": self.gum.prior_, "gum-log-gamma": self.gum.log_gamma_})
        kept = {name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()}
        state[STATE_ARRAYS] = ArrayRecord(kept)
        state[STATE_SCALARS] = ConfigRecord(scalars)

    @classmethod
    def restore(cls, state: RecordDict, gum_steps: int, device: torch.device) -> LabellingState:
        """The state `save` kept (the mixture with `gum_steps` EM steps, Q and O on `device`)."""
        arrays = {name: array.numpy() for name, array in state[STATE_ARRAYS].items()}
        scalars = state[STATE_SCALARS]
        gum = None
        if scalars["gum"]:
            gum = GaussianUniformMixture(
                steps=gum_steps,
                prior_=float(scalars["gum-prior"]),
                covariance_=arrays["gum-covariance"],
                log_gamma_=float(scalars["gum-log-gamma"]),
            )
        targets, memory = (torch.as_tensor(arrays[name], device=device) for name in ("targets", "memory"))
        dual = torch.as_tensor(arrays["sinkhorn-dual"]) if "sinkhorn-dual" in arrays else None
        return cls(int(scalars["step"]), targets, memory, gum, dual)


@dataclass
class LocalUpdate:
    """Alg. 3 as a client runs it: the method's keys, and what the client and the variant add to them."""

    params: FSTCConfig
    k: int
    robust: bool  # Eq. 8-13 (False: every pseudo-label weighs 1, FSTC-STC)
    align: bool  # Eq. 15-17 with the server's centres
    schedule: frozenset[int]  # local iterations (over the whole run) before which Q is recomputed
    eval_batch: int  # batch size of the passes over every local sample

    def output(self, scores: torch.Tensor) -> torch.Tensor:
        """What Q is compared with in Eq. 14: O itself, or softmax(O) (`loss-on`, `auto` by k)."""
        return compared_output(scores, loss_target(self.params.loss_on, self.k))

    def mixture_output(self, scores: torch.Tensor) -> torch.Tensor:
        """What the mixture's residual δ = Q - (this) uses (Eq. 8; `residual-on`, default Eq. 14's)."""
        if self.params.residual_on == "loss-on":
            return self.output(scores)
        return compared_output(scores, self.params.residual_on)

    def refresh_labels(
        self, model: FSTCModel, inputs: LocalInputs, labelling: LabellingState
    ) -> dict[str, float]:
        """Alg. 1 over all local samples; the mixture restarts on the new pseudo-labels."""
        representations, scores = forward_all(model, inputs, self.eval_batch)
        targets, result = pseudo_labels(
            scores,
            self.params.epsilon,
            max_iters=self.params.sinkhorn_iters,
            tol=self.params.sinkhorn_tol,
            init_log_v=labelling.dual,
            marginal_strength=self.params.marginal_strength if self.params.marginal == "adaptive" else None,
            marginal_barrier=(
                self.params.marginal_barrier if self.params.marginal == "self-adaptive" else None
            ),
        )
        labelling.dual = result.log_v
        labelling.targets = targets.float()
        labelling.memory = self.mixture_output(scores).float()
        if labelling.centres is not None:  # the labels changed: regroup every sample
            labelling.centres = LocalCentres(representations, labelling.targets.argmax(1), self.k)
        if self.robust:
            labelling.gum = GaussianUniformMixture(steps=self.params.gum_steps).fit(
                (labelling.targets - labelling.memory).cpu().numpy(), reset=True
            )
        return {"sinkhorn-iters": float(result.iterations), "sinkhorn-error": result.marginal_error}

    def sample_weights(self, labelling: LabellingState) -> torch.Tensor:
        """Eq. 9-13 on every local sample: EM steps from the previous parameters, then w (1 without GUM)."""
        if not self.robust or labelling.gum is None:
            return torch.ones(labelling.targets.shape[0], device=labelling.targets.device)
        r = labelling.gum.fit_responsibilities((labelling.targets - labelling.memory).cpu().numpy())
        return torch.as_tensor(
            robust_weights(r, self.params.gum_threshold), dtype=torch.float32, device=labelling.targets.device
        )

    def loss(
        self,
        model: FSTCModel,
        inputs: LocalInputs,
        indices: np.ndarray,
        labelling: LabellingState,
        weights: torch.Tensor,
        global_centres: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """Eq. 18 on one batch: L_C (Eq. 14, averaged over the augmented views if any) + λ L_A (Eq. 17).

        With `contrastive` > 0 (augmented pairs only) SCCL's instance-wise NT-Xent between the two
        views' representations is added: the paper's "same augmentation strategy as SCCL".
        """
        index = torch.as_tensor(indices, device=labelling.targets.device)
        targets, batch_weights = labelling.targets[index], weights[index]
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
        labelling.memory[index] = self.mixture_output(scores.detach()).float()
        clustering = torch.stack(
            [weighted_mse(targets, self.output(view), batch_weights) for _, view in view_outputs]
        ).mean()
        terms = {
            "loss": clustering,
            "clustering": clustering.detach(),
            "kept": (batch_weights > 0).float().mean(),
        }
        if self.params.contrastive > 0 and len(view_outputs) == 2:
            (first, _), (second, _) = view_outputs
            instance = info_nce_loss(first, second, self.params.temperature)
            terms["loss"] = terms["loss"] + self.params.contrastive * instance
            terms["contrastive"] = instance.detach()
        if self.align and global_centres is not None and self.params.lam > 0:
            if labelling.centres is not None:  # Eq. 15 over every local sample
                centres, counts = labelling.centres.centres(representations, index)
                labelling.centres.update(representations, index)  # values only: the graph keeps the old
            else:  # the batch's own centres
                centres, counts = cluster_centres(representations, targets.argmax(1), self.k)
            aligned = alignment_loss(centres, global_centres, counts)
            terms["loss"] = terms["loss"] + self.params.lam * aligned
            terms["alignment"] = aligned.detach()
        return terms

    def run(
        self,
        model: FSTCModel,
        optimizer: torch.optim.Optimizer,
        inputs: LocalInputs,
        labelling: LabellingState,
        cursor: BatchCursor,
        steps: int,
        global_centres: torch.Tensor | None,
        desc: str,
    ) -> tuple[TrainStats, dict[str, float]]:
        """Alg. 3 lines 1-8 for `steps` local iterations (Q updates on the schedule)."""
        updates: dict[str, float] = {}
        if (
            self.align
            and global_centres is not None
            and self.params.lam > 0
            and self.params.align_centres == "local"
        ):
            representations, _ = forward_all(model, inputs, self.eval_batch)
            labelling.centres = LocalCentres(representations, labelling.targets.argmax(1), self.k)

        def batches() -> Iterator[tuple[np.ndarray, torch.Tensor]]:
            for indices in cursor.take(steps):
                if labelling.step in self.schedule:
                    updates.update(self.refresh_labels(model, inputs, labelling))
                    updates["label-updates"] = updates.get("label-updates", 0.0) + 1.0
                weights = self.sample_weights(labelling)
                labelling.step += 1
                yield indices, weights

        def loss_fn(batch: tuple[np.ndarray, torch.Tensor]) -> dict[str, torch.Tensor]:
            return self.loss(model, inputs, batch[0], labelling, batch[1], global_centres)

        stats = train_steps(
            model, optimizer, loss_fn, batches(), steps=steps, desc=desc, log_every=max(steps // 4, 1)
        )
        return stats, updates


# --------------------------------------------------------------------------- differential privacy
def centre_statistics(values: np.ndarray, global_centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums and counts of the records nearest each global centre (Eq. 16's inputs where only
    sums may leave: a secure Lloyd step, DP in the public space). Under DP each clipped record counts
    once, for one centre, so it moves (sums, counts) by at most sqrt(clip^2 + 1)."""
    stats = cluster_sums(values, nearest_centre(values, global_centres), global_centres.shape[0])
    return stats.sums, stats.counts.astype(np.float64)


def private_model(
    trained: list[np.ndarray], initial: list[np.ndarray], clip: float, z: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """The initial model plus the clipped, noised delta (Alg. 2 line 12's input under DP), in the model's
    dtypes. FSTC's model has float tensors only."""
    delta = [
        np.asarray(t, np.float64) - np.asarray(i, np.float64) for t, i in zip(trained, initial, strict=True)
    ]
    (noisy,) = clipped_release([delta], clip, z, rng)
    return [(i + d).astype(i.dtype) for i, d in zip(initial, noisy, strict=True)]


# ----------------------------------------------------------------------------------- Flower glue
STATE_MODEL, STATE_OPTIMIZER, STATE_CURSOR, STATE_RNG = (
    "fstc.model",
    "fstc.optimizer",
    "fstc.cursor",
    "fstc.rng",
)
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
            params=self.params,
            k=self.k,
            robust=self.robust,
            align=self.align,
            schedule=frozenset(
                label_update_steps(
                    max(cfg.num_rounds - 1, 1) * self.params.local_iters,
                    self.params.label_updates,
                    self.params.warmup_iters,
                )
            ),
            eval_batch=FROZEN_EVAL_BATCH if frozen else self.params.batch_size,
        )

    # ------------------------------------------------------------------------------ inputs, model
    def local_inputs(self, *, augmented: bool) -> LocalInputs:
        """The original texts' inputs, plus the two augmented views when `augment = pairs` and asked."""
        p, cfg = self.params, self.cfg
        pairs = augmented and p.augment == "pairs"
        if p.encoder == "frozen":
            cache = self.embedding_cache()
            views: list[Any] = [
                local_embeddings(self.data, cfg.embedding_model, p.max_length, cfg.device, cache)
            ]
            if pairs:
                views += local_augmented_embeddings(
                    self.data, cfg.data_dir, cfg.embedding_model, p.max_length, cfg.device, cache
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
    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> Reply:
        with one_blas_thread():  # the mixture's N x K products: threads cost more than they save
            if config.get("phase") == PHASE_INIT:
                return self.initial_reply(str(config.get(INIT_KEY, self.params.init)))
            if config.get("phase") == PHASE_LLOYD:
                return self.lloyd_reply(parameters[0])
            return self.train_round(list(parameters), config)

    def initial_reply(self, init: str) -> Reply:
        """Alg. 2 line 2: what the server clusters into (or, for moments, draws) the initial centres."""
        inputs, identity = self.local_inputs(augmented=False), self.identity_metrics()
        if self.uplink.private:  # FSTC under DP: the moments of the clipped public representations
            return self.uplink.send_moments(self.public_representations(inputs)[0], identity)
        representations = (
            forward_all(self.build_model(inputs), inputs, self.update.eval_batch)[0].cpu().numpy()
        )
        if init == "moments":  # per-sample means: their n-weighted average is the federation's
            return self.uplink.send_moments(representations, identity)
        if init == "representations":  # the paper's: per-sample vectors leave the client
            arrays = [representations.astype(np.float32)]
        else:
            k_local = self.params.local_centres(self.k)
            arrays = local_kmeans_summary(representations, k_local, self.seed, self.floor)
        return self.uplink.send(arrays, [CLEAR] * len(arrays), self.data.n_samples, identity)

    def lloyd_reply(self, global_centres: np.ndarray) -> Reply:
        """A secure Lloyd step on the moments init (`fedapp.methods.fstc.lloyd_rounds`): every record's
        initial representation to its nearest global centre, per-cluster sums and counts (a cluster below
        the privacy floor withheld) as SecAgg+ sums."""
        if global_centres.ndim != 2 or global_centres.shape[0] != self.k:
            raise ValueError(
                f"server sent centres of shape {global_centres.shape}, this client has k={self.k}"
            )
        inputs = self.local_inputs(augmented=False)
        values = (
            forward_all(self.build_model(inputs), inputs, self.update.eval_batch)[0].cpu().double().numpy()
        )
        sums, counts = (torch.from_numpy(a) for a in centre_statistics(values, global_centres))
        sums, counts, withheld = withhold_small_clusters(sums, counts, self.uplink.floor)  # privacy floor
        metrics = {**self.identity_metrics(), WITHHELD_KEY: withheld}
        arrays = [sums.numpy(), counts.numpy().astype(np.int64)]
        return self.uplink.send(arrays, [SUM, SUM], self.data.n_samples, metrics)

    # ------------------------------------------------------------------ differential privacy
    def public_model(self, inputs: LocalInputs) -> FSTCModel:
        """The initial model as the server builds it from the run seed: a function of no record."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed)
            return self.build_model(inputs)

    def public_representations(self, inputs: LocalInputs) -> tuple[np.ndarray, list[np.ndarray]]:
        """(E of every record under the public initial model, clipped to dp.clip; that model's arrays)."""
        model = self.public_model(inputs)
        representations = forward_all(model, inputs, self.update.eval_batch)[0].cpu().double().numpy()
        return clip_rows(representations, self.cfg.dp.clip), state_arrays(model)

    @property
    def centre_labels(self) -> bool:
        """Under DP with `dp-labels = centres`: records are labelled by the nearest global centre in the
        public space, no model is released and no local training runs."""
        return self.uplink.private and not self.params.dp_model_release

    def private_reply(
        self,
        model: FSTCModel | None,
        inputs: LocalInputs,
        global_centres: np.ndarray | None,
        metrics: dict[str, Scalar],
        final: bool,
    ) -> Reply:
        """A training round's reply under DP: noisy centre statistics in the public space (+ the last
        round's noisy model with `dp-labels = model`; `model` is None with `centres`, which releases none)."""
        if global_centres is None:
            raise ClientStateError("under DP every training round needs the global centres")
        values, initial = self.public_representations(inputs)
        with_model = final and model is not None
        release = self.uplink.release(2 if with_model else 1)
        sums, counts = centre_statistics(values, global_centres)
        reply = release.gaussian([sums, counts], sum_count_sensitivity(self.cfg.dp.clip))
        sent: dict[str, Scalar] = {**self.identity_metrics(), **release.metrics}
        if with_model:
            assert model is not None
            z, clip = release.noise_multiplier, self.cfg.dp.model_clip
            reply += private_model(state_arrays(model), initial, clip, 2 * z, release.rng(1))
            sent[FINGERPRINT_KEY] = state_schema(model).fingerprint
        return reply, 0, {**sent, **metrics}

    def train_round(self, arrays: NDArrays, config: dict[str, Scalar]) -> Reply:
        state = self.context.state
        global_centres = arrays.pop(0) if config.get(CENTRES_KEY) else None
        if global_centres is not None and global_centres.shape[0] != self.k:
            raise ValueError(f"server sent {global_centres.shape[0]} centres, this client has k={self.k}")
        if self.centre_labels:  # nothing local training would produce is released or used: none runs
            return self.private_reply(None, self.local_inputs(augmented=False), global_centres, {}, False)
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
        labelling = (
            self.initial_labelling(model, inputs, centres_tensor)
            if first
            else LabellingState.restore(state, self.params.gum_steps, self.device)
        )
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
                labelling,
                cursor,
                self.params.local_iters,
                centres_tensor,
                f"client {self.partition_id}",
            )
        save_module(state, STATE_MODEL, model)
        save_optimizer(state, STATE_OPTIMIZER, optimizer)
        cursor.save(state, STATE_CURSOR)
        labelling.save(state)
        progress = {**stats.metrics(), **updates, "step": labelling.step}
        final = bool(config.get(FINAL_KEY))
        if self.uplink.private:  # FSTC under DP: statistics in the public space, not the trained model's
            return self.private_reply(model, inputs, global_centres, progress, final)
        representations, _ = forward_all(model, inputs, self.update.eval_batch)
        centres, counts = cluster_centres(representations, labelling.targets.argmax(1), self.k)  # Eq. 15
        centres, counts, withheld = withhold_small_clusters(centres, counts, self.floor)  # privacy floor
        reply = [counts.cpu().numpy().astype(np.int64)]
        if self.align:
            reply.insert(0, centres.cpu().double().numpy())
        metrics: dict[str, Scalar] = {**self.identity_metrics(), **progress, WITHHELD_KEY: withheld}
        model_arrays: NDArrays = []
        if final:
            model_arrays = state_arrays(model)
            metrics[FINGERPRINT_KEY] = state_schema(model).fingerprint
        modes = train_modes(self.align, [str(a.dtype) for a in model_arrays])
        return self.uplink.send(reply + model_arrays, modes, self.data.n_samples, metrics)

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
    def initial_labelling(
        self, model: FSTCModel, inputs: LocalInputs, global_centres: torch.Tensor | None
    ) -> LabellingState:
        """Alg. 2 lines 2 and 5: Q = the (one-hot) nearest initial global centre, r = 1."""
        if global_centres is None:
            raise ClientStateError("the first training round needs the initial global centres")
        representations, scores = forward_all(model, inputs, self.update.eval_batch)
        nearest = torch.cdist(representations, global_centres).argmin(1)
        targets = torch.nn.functional.one_hot(nearest, self.k).float()
        return LabellingState(0, targets, self.update.mixture_output(scores).float(), None)

    # ------------------------------------------------------------------------------ evaluation
    def predict(self, parameters: NDArrays, config: dict[str, Scalar]) -> np.ndarray:
        """Clusters = argmax O of the global model (Sec. 4); under DP with `dp-labels = centres` the
        nearest global centre in the public space."""
        return self.assign(parameters, config).labels

    def assign(self, parameters: NDArrays, config: dict[str, Scalar]) -> Assignment:
        """argmax O; score = softmax(O) of that cluster; metric space = the representations E."""
        if self.centre_labels or config.get(LABELS_BY_KEY) == BY_CENTRES:
            return self.assign_by_centres(list(parameters))
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

    def assign_by_centres(self, parameters: NDArrays) -> Assignment:
        """The global model is [C̃, *the initial model] under DP with `dp-labels = centres`, and when
        `select = best` kept the starting clustering: each record goes to its nearest centre in the space
        the centres were computed in (its initial representation, clipped to dp.clip under DP); score =
        the distance to it; metric space = that space."""
        if not parameters:
            raise ValueError("a nearest-centre model starts with the centres (array 0)")
        centres, model_arrays = np.asarray(parameters[0], np.float64), list(parameters[1:])
        if centres.ndim != 2 or centres.shape[0] != self.k:
            raise ValueError(f"global centres of shape {centres.shape}, this client has k={self.k}")
        inputs = self.local_inputs(augmented=False)
        model = self.build_model(inputs)
        load_state_arrays(model, model_arrays, sender="server")
        representations = forward_all(model, inputs, self.update.eval_batch)[0].cpu().double().numpy()
        space = clip_rows(representations, self.cfg.dp.clip) if self.uplink.private else representations
        labels, distances = nearest_with_distance(space, centres)
        return Assignment(labels, distances, "distance", space)


class FSTCRSTCClient(FSTCClient):
    """FSTC-RSTC ablation: pseudo-labels + robust weights, no centre aggregation (final averaging only)."""

    align = False


class FSTCSTCClient(FSTCClient):
    """FSTC-STC ablation: pseudo-labels only (every weight 1, no centre aggregation)."""

    robust = False
    align = False
