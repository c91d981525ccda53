"""FSCCL (the FSTC paper's FedAvg + SCCL baseline): the keys of `[tool.flwr.app.config.fsccl]`.

SCCL (Zhang et al., NAACL 2021) trains an instance-wise contrastive loss on two augmented views and
DEC's clustering objective (Student's t soft assignments to K learnable centres, KL to the sharpened
target distribution). FSCCL averages the whole local model every round (FedAvg). Here the encoder is
frozen (cached sentence embeddings, a residual adapter trained on top, as FSTC's frozen mode). The
protocol: round 1 as FSTC (local k-means centres up; the server clusters them into the initial
centres of the model it then broadcasts); every later round the server sends the global model and
each client returns its locally trained model, averaged by sample count.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.config.keys import ConfigSection, config_key

AUGMENTATIONS = ("auto", "pairs", "dropout")


@dataclass(frozen=True)
class FSCCLConfig(ConfigSection):
    local_iters: int = config_key(100, ge=1, doc="local iterations per round")
    batch_size: int = config_key(200, ge=2, doc="local mini-batch size")
    lr: float = config_key(5e-4, gt=0.0, doc="Adam learning rate of the adapter, heads and centres")
    eta: float = config_key(10.0, ge=0.0, doc="weight of the clustering (KL) loss (SCCL's eta)")
    temperature: float = config_key(0.5, gt=0.0, doc="temperature of the instance-wise contrastive loss")
    alpha: float = config_key(1.0, gt=0.0, doc="degrees of freedom of the Student's t soft assignment")
    adapter_hidden: int = config_key(384, ge=0, doc="hidden units of the residual adapter; 0 = none")
    scale: float = config_key(
        6.0,
        gt=0.0,
        doc="multiply the unit-norm embeddings by this (SCCL pools without normalising; MiniLM: 5.96)",
    )
    max_length: int = config_key(32, ge=1, doc="encoder input length in tokens")
    augment: str = config_key(
        "auto",
        choices=AUGMENTATIONS,
        doc="pairs: SCCL augmented texts; dropout: feature dropout of the embeddings; auto: pairs if any",
    )
    dropout: float = config_key(0.1, ge=0.0, lt=1.0, doc="feature dropout rate of the dropout views")
    init_local_k: int = config_key(0, ge=0, doc="local k-means centres per client in round 1; 0 = 2K")
