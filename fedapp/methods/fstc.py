"""FSTC (Hu et al., IJCAI 2023): the keys of `[tool.flwr.app.config.fstc]` and what client and strategy share.

Shared by the FSTC-STC / FSTC-RSTC ablations (they run with FSTC's own keys). The protocol:

- round 1, phase `init`: every client sends local k-means centres + their sizes of its initial
  representations (`init = "centres"`, the default), or the representations themselves
  (`init = "representations"`, the paper's Alg. 2 line 2: per-sample vectors leave the client); the
  server clusters them into K initial global centres C̃.
- rounds 2 .. num-rounds, phase `train`: the server sends C̃ (K x D) — in round 2 together with the
  initial clustering model, which every client starts from (Alg. 2 line 1); each client runs
  `local-iters` iterations of Alg. 3 and returns its local centres C^(μ) (K x D, Eq. 15) and their
  sizes n^(μ) (K); the server applies Eq. 16.
- the last round's reply also carries the client's model; the server averages them weighted by
  sample count (Alg. 2 line 12) and the clients are evaluated with that global model (argmax O).

Under SecAgg+ (run-config `secagg`) the server sees only sums: round 1 uses `init = "moments"` (the
clients' mean and mean square of their representations; the server draws K seeded initial centres from
them), and a training reply carries the per-cluster sums sum_i E_i and counts n_k divided by n (Eq. 16
needs only their totals) and, in the last round, the model (its n-weighted average is Alg. 2 line 12).

Under differential privacy (`dp.epsilon` > 0, clients/fstc.py) `dp-labels` says how records are labelled:
`centres` (default) by their nearest global centre in the public initial-model space, where the noisy
centre statistics already live (no local training, no model release: the global model is the initial
model plus C̃); `model` by argmax O of the final model, released with client-level noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedapp.config.keys import ConfigError, ConfigSection, config_key
from fedapp.privacy.dp import RECORD, DPConfig, DPSupport
from fedapp.privacy.secagg import CENTRES, SUM, model_modes

ENCODER_MODES = ("frozen", "fine-tune")
INIT_MODES = ("centres", "representations", "moments")
INIT_MERGE_KFED, INIT_MERGE_WEIGHTED = "kfed", "weighted"
INIT_MERGES = (INIT_MERGE_KFED, INIT_MERGE_WEIGHTED)
LOSS_SCORES, LOSS_SOFTMAX, LOSS_AUTO = "scores", "softmax", "auto"
LOSS_TARGETS = (LOSS_SCORES, LOSS_SOFTMAX)
# loss-on = auto: Eq. 14 on softmax(O) from this many clusters on, on O below. With many clusters Eq. 14
# on O is a least-squares regression of k indicator columns, which masks clusters (the final model fell
# 3.0 NMI below FSBERT k-FED on CLINC150 at k = 150, 2.6-8.9 below its start on 28 to 64 classes of the
# shared text sets, softmax(O) above O at 25 and 26; at 24 the two targets are level); fitted leaving one
# dataset out (simulation/bench/loss_on_table.py, docs/methods/fstc.md).
SOFTMAX_FROM_K = 25
HEAD_INIT_CENTRES, HEAD_INIT_RANDOM = "centres", "random"
HEAD_INITS = (HEAD_INIT_CENTRES, HEAD_INIT_RANDOM)
RESIDUAL_TARGETS = ("loss-on", *LOSS_TARGETS)
AUGMENTATIONS = ("none", "pairs")
ALIGN_CENTRES = ("batch", "local")
DP_LABELS_CENTRES, DP_LABELS_MODEL = "centres", "model"
DP_LABELS = (DP_LABELS_CENTRES, DP_LABELS_MODEL)

PHASE_INIT = "init"
PHASE_LLOYD = "lloyd"  # under SecAgg+: a Lloyd step in the initial representation space, before training
PHASE_TRAIN = "train"
FINAL_KEY = "final"  # fit config: True in the last round, where clients also send their model
CENTRES_KEY = "with-centres"  # fit config: the parameters start with the global centres C̃ (K x D)
MODEL_KEY = "with-model"  # fit config: the initial model follows in the parameters (first round of a client)
INIT_KEY = "init"  # fit config of round 1: the initialisation the server asks for (moments under SecAgg+)
SECAGG_KEY = "secagg"  # fit config: True when the reply goes through SecAgg+ (`fedapp.privacy.secagg`)


def loss_target(loss_on: str, k: int) -> str:
    """What Eq. 14 compares Q with in a run of k clusters: `loss-on`, with `auto` resolved by k."""
    if loss_on != LOSS_AUTO:
        return loss_on
    return LOSS_SOFTMAX if k >= SOFTMAX_FROM_K else LOSS_SCORES


def train_modes(align: bool, model_dtypes: Sequence[str]) -> list[str]:
    """`fedapp.privacy.secagg` kinds of a training reply: the local centres weighted by the counts that
    follow them (with alignment), the counts, then the model (last round)."""
    return ([CENTRES, SUM] if align else [SUM]) + model_modes(model_dtypes)


@dataclass(frozen=True)
class FSTCConfig(ConfigSection):
    encoder: str = config_key(
        "frozen",
        choices=ENCODER_MODES,
        doc="frozen: cached embeddings + trainable adapter (CPU); fine-tune: train the encoder (GPU)",
    )
    max_length: int = config_key(32, ge=1, doc="encoder input length in tokens (the paper's 32)")
    lam: float = config_key(
        0.01,
        name="lambda",
        ge=0.0,
        doc="weight of the alignment loss L_A in Eq. 18 (paper: 0.01 SO, 1 others)",
    )
    epsilon: float = config_key(0.1, gt=0.0, doc="entropic regularisation of the Sinkhorn OT (Eq. 2)")
    marginal: str = config_key(
        "uniform",
        choices=("uniform", "adaptive", "self-adaptive"),
        doc="pseudo-labels' cluster shares: uniform = Eq. 2's equal split (the paper's); adaptive = "
        "unbalanced OT that follows the client's own shares; self-adaptive = RSTC's learned shares with a "
        "barrier against empty clusters (imbalanced or label-skewed data)",
    )
    marginal_strength: float = config_key(
        0.01, gt=0.0, doc="adaptive marginal: KL weight tau pulling the shares toward equal (larger: closer)"
    )
    marginal_barrier: float = config_key(
        0.001, gt=0.0, doc="self-adaptive marginal: weight c of the barrier -c sum log b(1-b) (RSTC: 0.001)"
    )
    local_iters: int = config_key(100, ge=1, doc="local iterations per round (Alg. 3)")
    batch_size: int = config_key(200, ge=1, doc="local mini-batch size N (the paper's 200)")
    lr_encoder: float = config_key(5e-6, gt=0.0, doc="Adam learning rate of the encoder Phi (fine-tune mode)")
    lr_head: float = config_key(
        5e-4, gt=0.0, doc="Adam learning rate of the clustering network F and adapter"
    )
    lr_adapter: float = config_key(
        0.0, ge=0.0, doc="Adam learning rate of frozen mode's adapter; 0 = lr-head's"
    )
    adapter_hidden: int = config_key(
        384, ge=0, doc="hidden units of the residual adapter on the encoder output; 0 = no adapter"
    )
    head_hidden: int = config_key(0, ge=0, doc="hidden units of F (0: one linear layer E -> K scores)")
    dropout: float = config_key(
        0.0, ge=0.0, lt=1.0, doc="dropout on the adapter's input features and hidden units while training"
    )
    label_updates: int = config_key(
        60, ge=1, doc="Sinkhorn pseudo-label updates over the whole run (quadratic schedule, dense early)"
    )
    warmup_iters: int = config_key(
        100, ge=0, doc="local iterations trained on the initial k-means labels before the first update"
    )
    sinkhorn_iters: int = config_key(1000, ge=1, doc="at most this many Sinkhorn iterations per update")
    sinkhorn_tol: float = config_key(1e-6, gt=0.0, doc="stop Sinkhorn when row marginals are met to this")
    gum_steps: int = config_key(1, ge=1, doc="EM steps of the Gaussian-uniform mixture per local iteration")
    gum_threshold: float = config_key(
        0.5, ge=0.0, le=1.0, doc="Eq. 13: samples with r_i below this get weight 0"
    )
    loss_on: str = config_key(
        LOSS_AUTO,
        choices=(LOSS_AUTO, *LOSS_TARGETS),
        doc="what Q is compared with in Eq. 14 (and Eq. 8 unless residual-on): O (scores, the paper's), "
        f"softmax(O), or auto: softmax(O) from k = {SOFTMAX_FROM_K} on, O below (O masks clusters when "
        "there are many; softmax(O) loses 1-4 NMI with few clusters under label skew; docs/methods/fstc.md)",
    )
    head_init: str = config_key(
        HEAD_INIT_CENTRES,
        choices=HEAD_INITS,
        doc="F's start: centres = the nearest-initial-centre classifier, so argmax O starts as the start's "
        "clustering (the paper's random F lost its start with many clusters: docs/methods/fstc.md); "
        "random = the paper's (the presets')",
    )
    head_scale: float = config_key(
        10.0,
        gt=0.0,
        doc="head-init = centres: F(e) = scale (C e - |c|^2 / 2), the logits' inverse temperature",
    )
    residual_on: str = config_key(
        "loss-on",
        choices=RESIDUAL_TARGETS,
        doc="the mixture's residual (Eq. 8): Q - (what loss-on says), or Q - O, or Q - softmax(O)",
    )
    augment: str = config_key(
        "none",
        choices=AUGMENTATIONS,
        doc="pairs: L_C on SCCL's two augmented views (needs sccl-augmented/ files)",
    )
    contrastive: float = config_key(
        0.0,
        ge=0.0,
        doc="weight of SCCL's instance-wise NT-Xent between the two augmented views (augment=pairs)",
    )
    temperature: float = config_key(0.5, gt=0.0, doc="NT-Xent temperature of `contrastive` (SCCL's 0.5)")
    align_centres: str = config_key(
        "local",
        choices=ALIGN_CENTRES,
        doc="C^(mu) in L_A (Eq. 17): Eq. 15 over every local sample, or the batch's (the old default)",
    )
    init: str = config_key(
        "centres",
        choices=INIT_MODES,
        doc="centres: local k-means centres + counts (private); representations: the paper's, per-sample; "
        "moments: mean + variance, K seeded draws (a sum: the only option with secagg)",
    )
    init_local_k: int = config_key(
        0, ge=0, doc="local k-means centres per client (init=centres); 0 = K (init-merge=kfed), 2K (weighted)"
    )
    init_merge: str = config_key(
        INIT_MERGE_KFED,
        choices=INIT_MERGES,
        doc="init=centres: kfed = k-means over the union of the local centres, unweighted (FSBERT k-FED's "
        "clustering is the run's start); weighted = weighted by their sizes (the paper presets')",
    )
    secure_lloyd: int = config_key(
        5,
        ge=0,
        doc="with secagg: Lloyd steps (secure per-cluster sums in the initial representation space) that "
        "refine the moments init, as rounds of their own after it (the run has num-rounds + this rounds)",
    )
    dp_labels: str = config_key(
        DP_LABELS_CENTRES,
        choices=DP_LABELS,
        doc="under DP only: centres = label each record by its nearest global centre in the public "
        "initial-model space (no model released, no local training); model = argmax O of the final model, "
        "released as a clipped delta with client-level noise 2z (one more release)",
    )

    @property
    def dp_model_release(self) -> bool:
        """Under DP, whether the last round releases the trained model (`dp-labels = model`); the
        accountant's plan (`FSTC_DP`) has one release more then."""
        return self.dp_labels == DP_LABELS_MODEL

    def local_centres(self, k: int) -> int:
        """k' of the init round's local k-means: configured, else K as FSBERT k-FED's (2K weighted)."""
        return self.init_local_k or (k if self.init_merge == INIT_MERGE_KFED else 2 * k)

    def __post_init__(self) -> None:
        if self.head_init == HEAD_INIT_CENTRES and self.head_hidden > 0:
            raise ConfigError(
                f"run-config 'fstc.head-init'='centres' needs 'fstc.head-hidden'=0 (a linear F is the "
                f"nearest-centre classifier), got {self.head_hidden}: set fstc.head-init=random"
            )
        if self.contrastive > 0 and self.augment != "pairs":
            raise ConfigError(
                f"run-config 'fstc.contrastive'={self.contrastive} needs 'fstc.augment'='pairs' "
                "(the contrastive term compares the two augmented views of each text)"
            )


def dp_training_releases(num_rounds: int, dp: DPConfig, params: ConfigSection | None) -> int:
    """Under DP: the noisy moments, one (sums, counts) per training round, and the final model with
    `dp-labels = model` (which the plan must know: it is never guessed)."""
    if not isinstance(params, FSTCConfig):
        raise TypeError(f"FSTC's DP plan depends on fstc.dp-labels: pass its FSTCConfig, not {params!r}")
    return num_rounds + 1 if params.dp_model_release else num_rounds


FSTC_DP = DPSupport(
    RECORD,
    dp_training_releases,
    model_release=lambda params: isinstance(params, FSTCConfig) and params.dp_model_release,
)


def lloyd_rounds(secagg: bool, params: FSTCConfig) -> int:
    """Secure Lloyd steps (`PHASE_LLOYD`) a run adds after its init round, before training: under SecAgg+
    the init is K draws from the federated moments, far from the data's clusters (texts-demo: NMI 0.19
    against 1.00 plain), and a few Lloyd steps on secure sums bring them to k-means' (docs/privacy.md).
    They are rounds of their own, so training gets the plain run's num-rounds - 1 rounds."""
    return params.secure_lloyd if secagg else 0
