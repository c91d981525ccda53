"""FSCCL: SCCL's losses on small tensors, then a federation on `texts-demo`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.fsccl import clustering_kl, dec_targets, instance_contrastive_loss
from fedapp.launch.resolve import build_overrides
from simulation.runner import execute


def test_instance_contrastive_loss_matches_the_textbook_nt_xent() -> None:
    torch.manual_seed(0)
    z1 = torch.nn.functional.normalize(torch.randn(5, 8), dim=1)
    z2 = torch.nn.functional.normalize(torch.randn(5, 8), dim=1)
    z, t = torch.cat([z1, z2]), 0.5
    total = 0.0
    for i in range(10):
        pair = (i + 5) % 10
        others = sum(math.exp(float(z[i] @ z[j]) / t) for j in range(10) if j != i)
        total += -math.log(math.exp(float(z[i] @ z[pair]) / t) / others)
    assert float(instance_contrastive_loss(z1, z2, t)) == pytest.approx(total / 10, rel=1e-5)
    assert float(instance_contrastive_loss(z1, z1, 0.05)) < float(instance_contrastive_loss(z1, z2, 0.05))


def test_dec_targets_sharpen_and_the_kl_vanishes_at_one_hot() -> None:
    q = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]])
    p = dec_targets(q)
    torch.testing.assert_close(p.sum(1), torch.ones(3))
    assert p[0, 0] > q[0, 0] and p[1, 1] > q[1, 1]  # confident assignments get more confident
    assert float(clustering_kl(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.usefixtures("text_embedding_cache")
def test_fsccl_federation_on_demo_texts(tmp_path: Path) -> None:
    overrides = {
        "method": "fsccl",
        "dataset": "texts-demo",
        "num-clients": 2,
        "num-rounds": 3,
        "fsccl.local-iters": 10,
        "fsccl.batch-size": 50,
        "dropout-rate": 0.5,
    }
    summary = execute(build_overrides(overrides, tmp_path / "fsccl"), engine="inprocess", quiet=True)
    assert summary["metrics"]["acc"] >= 0.9
    assert [row["round"] for row in summary["fsccl"]["train_per_round"]] == [2, 3]
    select = summary["report"]["select"]  # `select = best` scored round 1's model against the last
    assert select["kept"] in ("start", "final") and set(select["scores"]) == {"start", "final"}


@pytest.mark.usefixtures("text_embedding_cache")
def test_scale_multiplies_the_embeddings_and_the_initial_centres() -> None:
    """`fsccl.scale` stretches the geometry DEC's Student's t sees; k-means on it scales alike."""
    from flwr.common import Context, RecordDict

    from clients.fsccl import FSCCLClient
    from fedapp.config.run import parse_run_config

    def client(scale: float) -> FSCCLClient:
        cfg = parse_run_config(
            {"method": "fsccl", "dataset": "texts-demo", "num-clients": 2, "fsccl.scale": scale}
        )
        partition = {"partition-id": 0, "num-partitions": 2}
        return FSCCLClient(Context(0, 1, partition, RecordDict(), dict(cfg.to_dict())), cfg)

    plain, stretched = client(1.0), client(4.0)
    torch.testing.assert_close(stretched.views()[0], 4.0 * plain.views()[0])
    (centres, counts), (scaled, scaled_counts) = (c.fit([], {"phase": "init"})[0] for c in (plain, stretched))
    assert (counts == scaled_counts).all()
    np.testing.assert_allclose(scaled, 4.0 * centres, rtol=1e-4, atol=1e-5)
