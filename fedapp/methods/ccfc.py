"""CCFC (Liu, Yan & Zhang, cluster-contrastive federated clustering): the keys of
`[tool.flwr.app.config.ccfc]` and what its client and strategy both need (phases, message keys).

Round schedule (`server-round` r, P = `pretrain-rounds`):
- r = 1, ``setup``: clients report their image shape (no arrays); the server builds the initial global
  model from the run seed (Alg. 1 line 1) without holding any data.
- 2 <= r <= P + 1, ``pretrain``: federated SimSiam (or InfoNCE, `pretrain-loss`) on two augmented views
  + lambda * model-contrastive term.
- r > P + 1, ``cluster``: CCFC proper, Eq. 1-8 (pseudo-labels from the global model and centroids).
So `num-rounds` = 1 + P + (CCFC rounds): the paper's 100 + 30 is num-rounds = 131.

Under SecAgg+ (run-config `secagg`, `fedapp.privacy.secagg`) the model (Eq. 8's FedAvg: an n-weighted
average) goes through SecAgg+; the local centroids cannot (the server's k-means needs each client's, not
their sum) and travel in the clear beside it, as do BatchNorm's integer batch counters. The setup round
carries no arrays and runs as a plain round.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key
from fedapp.privacy.dp import CLIENT, DPSupport
from fedapp.privacy.secagg import CLEAR, model_modes

BACKBONES = ("auto", "conv", "conv-small", "resnet18")

# fit config keys (server -> client)
PHASE_KEY = "phase"
WANT_CENTROIDS_KEY = "local-centroids"  # 1: reply with k local centroids after training
SECAGG_KEY = "secagg"  # True: the reply goes through SecAgg+ (model averaged, centroids in the clear)
SETUP, PRETRAIN, CLUSTER = "setup", "pretrain", "cluster"
PHASES = (SETUP, PRETRAIN, CLUSTER)
# metrics keys (client -> server) of the setup reply
SHAPE_KEYS = ("image-channels", "image-height", "image-width")


@dataclass(frozen=True)
class CCFCConfig(ConfigSection):
    pretrain_rounds: int = config_key(
        100, ge=0, doc="federated SimSiam rounds after the setup round; CCFC runs in the rounds after them"
    )
    lam: float = config_key(
        0.001,
        name="lambda",
        ge=0.0,
        doc="weight of the model-contrastive term, Eq. 4 (paper: MNIST 0.001, Fashion 1, CIFAR/STL 0.1)",
    )
    lr: float = config_key(
        1e-3, gt=0.0, doc="Adam learning rate (one optimizer per client, kept across rounds)"
    )
    phase2_lr: float = config_key(
        0.0, ge=0.0, doc="Adam learning rate of the CCFC phase (its optimizer starts fresh); 0 = lr"
    )
    batch_size: int = config_key(128, ge=2, doc="local mini-batch size")
    local_steps: int = config_key(
        0,
        ge=0,
        doc="mini-batches per round; 0 = one local epoch (the paper); N continues the epoch next round",
    )
    latent_dim: int = config_key(256, ge=2, doc="representation size z (paper: 256; 64 for Fashion-MNIST)")
    projector_hidden: int = config_key(256, ge=1, doc="projector hidden width")
    predictor_hidden: int = config_key(16, ge=1, doc="predictor bottleneck width (SimSiam)")
    backbone: str = config_key(
        "auto", choices=BACKBONES, doc="auto: conv for 28x28 gray, conv-small for 8x8, resnet18 for RGB"
    )
    pretrain_loss: str = config_key(
        "simsiam",
        choices=("simsiam", "infonce"),
        doc="pre-training loss on two augmented views: simsiam (the paper) or infonce (SimCLR, negatives "
        "from the local batch; ccfc-cpu)",
    )
    temperature: float = config_key(0.5, gt=0.0, doc="InfoNCE temperature (pretrain-loss = infonce)")
    fit_predictor: bool = config_key(
        True,
        doc="pretrain-loss = infonce: also fit the predictor h on stop-gradient views (SimSiam's D), "
        "so the CCFC phase, whose loss reaches the encoder through h, starts from a trained h "
        "(false: h learns only from the model-contrastive term)",
    )
    phase2_loss: str = config_key(
        "cluster",
        choices=("cluster", "sample"),
        doc="loss after pre-training: cluster-contrastive (CCFC) or sample: the pre-training loss goes on "
        "(the SCFC ablation)",
    )
    sample_weight: float = config_key(
        0.0,
        ge=0.0,
        doc="CCFC phase: + this weight * the pre-training loss on two augmented views, which keeps "
        "pseudo-label errors from reshaping the representation (0: Eq. 4 alone, the paper)",
    )
    federation: str = config_key(
        "fedavg",
        choices=("fedavg", "standalone"),
        doc="fedavg (CCFC) or standalone: each client trains and clusters alone (ablation; lambda unused)",
    )
    self_pairs: bool = config_key(
        True, doc="Eq. 1 counts the pair (i, i) too, as the authors' code does; false: only j != i"
    )
    centroid_model: str = config_key(
        "local",
        choices=("local", "global"),
        doc="local k-means on z of the trained local model (Alg. 1) or of the received global model "
        "(the space every assignment uses; a heterogeneity remedy)",
    )
    init_model: str = config_key(
        "",
        doc="start from this global_model.npz of an earlier run (its weights and centroids) instead of "
        "the seeded initial model; with pretrain-rounds = 0 the run goes straight to CCFC",
    )
    kmeans_samples: int = config_key(
        0, ge=0, doc="local k-means on at most this many of the client's samples (0 = all)"
    )

    @property
    def federated(self) -> bool:
        return self.federation == "fedavg"

    def lr_of(self, phase: str) -> float:
        """The Adam learning rate of a phase (`phase2-lr` overrides `lr` in the CCFC phase)."""
        return self.phase2_lr if phase == CLUSTER and self.phase2_lr > 0 else self.lr


def phase_of(server_round: int, pretrain_rounds: int) -> str:
    """The scheduled phase of a round (the strategy may hold CCFC back until it has global centroids)."""
    if server_round <= 1:
        return SETUP
    return PRETRAIN if server_round <= pretrain_rounds + 1 else CLUSTER


def secure_modes(model_dtypes: list[str], with_centroids: bool) -> list[str]:
    """`fedapp.privacy.secagg` modes of a training reply: the model averaged, local centroids in the clear."""
    return model_modes(model_dtypes) + ([CLEAR] if with_centroids else [])


# under DP one client-level release (update + centroids) per round after the setup round
CCFC_DP = DPSupport(
    CLIENT, lambda num_rounds, dp, params: max(num_rounds - 1, 1), ("the setup round's image shape",)
)
