"""gFedNTM (Calvo-Bartolomé & Arenas-García 2023): its keys and what its client and strategy share.

Imported by the method registry, so it imports no torch (the model builder lives in `fedapp.maths.gfedntm`).

Protocol (`phase` in every FitIns config):
- `vocabulary` (round 1): the client sends its terms and their document frequencies (`DocumentFrequencies`
  wire form) and its document count as `num_examples`.
- `train` (every later round, one synchronised step): the server sends the global model state
  (parameters and BatchNorm buffers) and, in the first train round only, the merged vocabulary. Config:
  `step` (the global step of the first batch), `steps-per-epoch` S, `local-steps`. The client replies
  with the gradient of its next mini-batch's mean loss (`exchange = gradient`) or its locally stepped
  parameters (`exchange = parameters`), then its BatchNorm buffers, and `num_examples` = documents used.
- evaluation (`phase = cooccurrence`): the server sends the top words of every topic; the client returns
  per-topic document co-occurrence counts of those words (for NPMI), never a document.

Under SecAgg+ (run-config `secagg`, `fedapp.privacy.secagg`) the vocabulary takes two rounds: `terms` (in
the clear, not a sum: which terms occur at the client, no counts) and `vocabulary` (the server sends the
union; the client's document frequencies over it, divided by n, go through SecAgg+, so the server learns
only their totals). Training replies (gradients or parameters, float buffers) are n-weighted averages
already; integer buffers (`num_batches_tracked`) travel in the clear.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigError, ConfigSection, config_key
from fedapp.privacy.dp import CLIENT, DPSupport

PHASE_TERMS = "terms"  # under SecAgg+ only: the term lists, before their frequencies go through SecAgg+
PHASE_VOCABULARY = "vocabulary"
SECAGG_KEY = "secagg"  # fit config: True when the reply goes through SecAgg+
PHASE_TRAIN = "train"
PHASE_COOCCURRENCE = "cooccurrence"
MODELS = ("prodlda", "combinedtm")
EXCHANGES = ("gradient", "parameters")
PRECISIONS = ("float32", "float64")
COOCCURRENCE_KEY = "cooccurrence"  # evaluate metrics: np.save bytes of a K x T x T int64 array
BOW_CONTEXT_DIM = 384  # width of CombinedTM's stand-in document embedding on bag-of-words corpora
NPMI_TOP_WORDS = 10
DIVERSITY_TOP_WORDS = 25


@dataclass(frozen=True)
class GFedNTMConfig(ConfigSection):
    model: str = config_key(
        "prodlda", choices=MODELS, doc="prodlda, or combinedtm (adds SBERT document embeddings)"
    )
    topics: int = config_key(50, ge=2, doc="number of topics K")
    hidden: str = config_key("100,100", doc="encoder hidden layer sizes, comma-separated")
    activation: str = config_key("softplus", choices=("softplus", "relu"), doc="encoder activation")
    model_dropout: float = config_key(0.2, ge=0.0, lt=1.0, doc="dropout in the encoder and on theta")
    learn_priors: bool = config_key(True, doc="learn the prior's mean and variance (ProdLDA default)")
    batch_size: int = config_key(
        64, ge=2, doc="mini-batch of the largest client; others get n_l / S documents"
    )
    epochs: int = config_key(100, ge=1, doc="stop after this many epochs over the union corpus")
    max_steps: int = config_key(
        0, ge=0, doc="> 0: stop after this many global steps (also capped by num-rounds - 1)"
    )
    optimizer: str = config_key(
        "adam", choices=("adam", "sgd"), doc="server optimizer: adam or plain SGD (Eq. 3)"
    )
    lr: float = config_key(2e-3, gt=0.0, doc="learning rate (ProdLDA default 2e-3)")
    beta1: float = config_key(0.99, ge=0.0, lt=1.0, doc="Adam beta1 (ProdLDA's momentum 0.99)")
    beta2: float = config_key(0.99, ge=0.0, lt=1.0, doc="Adam beta2 (0.99 in ProdLDA / CTM)")
    exchange: str = config_key(
        "gradient", choices=EXCHANGES, doc="gradient (paper, exact) or parameters (per-batch averaging)"
    )
    local_steps: int = config_key(
        1, ge=1, doc="local steps per round; > 1 needs exchange=parameters (not exact)"
    )
    min_df: int = config_key(1, ge=1, doc="keep terms in at least this many documents of the union")
    max_df: float = config_key(1.0, gt=0.0, le=1.0, doc="keep terms in at most this fraction of documents")
    max_features: int = config_key(
        0, ge=0, doc="> 0: keep the most frequent terms (merged document frequency)"
    )
    theta_samples: int = config_key(20, ge=1, doc="posterior samples averaged for document-topic proportions")
    precision: str = config_key(
        "float32", choices=PRECISIONS, doc="weights and messages; float64 for exactness checks (see README)"
    )

    def __post_init__(self) -> None:
        if self.local_steps > 1 and self.exchange != "parameters":
            raise ConfigError(
                f"run-config 'gfedntm.local-steps'={self.local_steps} needs 'gfedntm.exchange'='parameters' "
                "(several local steps exchange parameters, FedAvg-like)"
            )
        hidden_sizes(self.hidden)  # fail early on a malformed list

    @property
    def betas(self) -> tuple[float, float]:
        return self.beta1, self.beta2


def hidden_sizes(text: str) -> tuple[int, ...]:
    """ "100,100" -> (100, 100); a clear error for anything else."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ConfigError(
            f"run-config 'gfedntm.hidden' must list positive integers like '100,100', got {text!r}"
        )
    return sizes


# under DP one client-level release (the update) per round after the vocabulary round, which is not covered
GFEDNTM_DP = DPSupport(
    CLIENT,
    lambda num_rounds, dp, params: max(num_rounds - 1, 1),
    (
        "round 1 vocabulary: each client's term list and exact document frequencies",
        "the number of documents per client (batch sizes, the update's weight)",
    ),
)
