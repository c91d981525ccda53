"""FSTC's local loop on one client, variant by variant: which start of F and which Eq. 14 keep the start's
clustering with many clusters (docs/methods/fstc.md, "Many clusters").

One client of a 4-client IID split, frozen all-MiniLM-L6-v2 embeddings, K = the classes, the run's label
schedule (`label_update_steps` over 4,000 iterations), Alg. 3 without the alignment term (whose λ = 0.01
is small): the initial labels are the nearest of K k-means centres of the client's own embeddings (the
federation's C̃ in a run), then Sinkhorn pseudo-labels Q from the scores O (Eq. 2-7), the Gaussian-uniform
mixture's weights (Eq. 8-13) and Eq. 14 with Adam. Every 250 iterations: the clusters argmax O uses and
its NMI (labels only score).

    python -m simulation.papers.fstc.local_loop clinc150 --iters 2500
    python -m simulation.papers.fstc.local_loop stackoverflow --variant head=random,loss=scores,gum=1

A variant is `head=random|proto<scale>,loss=scores|softmax,gum=0|1[,eps=E]`; the default list is the
paper's F and Eq. 14 (random, scores), without the mixture, F started at the centres with either Eq. 14,
and the defaults (proto10, softmax, mixture on).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch
from sklearn.metrics import normalized_mutual_info_score

from fedapp.config.run import parse_run_config
from fedapp.maths.clustering import kmeans
from fedapp.maths.fstc import (
    GaussianUniformMixture,
    label_update_steps,
    pseudo_labels,
    robust_weights,
    weighted_mse,
)
from fedapp.models.fstc import ClusteringNetwork, ResidualAdapter

VARIANTS = (
    "head=random,loss=scores,gum=1",
    "head=random,loss=scores,gum=0",
    "head=proto1,loss=scores,gum=1",
    "head=proto10,loss=softmax,gum=0",
    "head=proto10,loss=softmax,gum=1",
)
RUN_ITERS, LABEL_UPDATES, WARMUP, BATCH, LR = 4000, 60, 100, 200, 5e-4


def client_rows(dataset: str, clients: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Client 0's sentence embeddings and labels, as FSTC's frozen mode reads them."""
    from simulation.tune import client_rows as rows_of

    with tempfile.TemporaryDirectory() as out:
        cfg = parse_run_config(
            {
                "method": "fsbert-kfed",
                "dataset": dataset,
                "num-clients": clients,
                "seed": seed,
                "out-dir": out,
                "node-out-dir": f"{out}/nodes/{{partition-id}}",
            }
        )
        locals_, rows = rows_of(cfg)
    return np.asarray(rows[0], dtype=np.float32), np.asarray(locals_[0].labels)


def run(X: np.ndarray, y: np.ndarray, variant: str, iters: int, seed: int = 0) -> dict[str, object]:
    options = dict(part.split("=") for part in variant.split(","))
    head_init, loss_on = options.get("head", "random"), options.get("loss", "scores")
    use_mixture, epsilon = options.get("gum", "1") == "1", float(options.get("eps", 0.1))
    k = len(np.unique(y))
    centres, _ = kmeans(X, k, seed, n_init=3)
    rows = torch.as_tensor(X)
    torch.manual_seed(seed)
    adapter, head = ResidualAdapter(X.shape[1], X.shape[1]), ClusteringNetwork(X.shape[1], k)
    if head_init.startswith("proto"):
        head.start_at(centres, float(head_init[5:] or 1))
    optimizer = torch.optim.Adam([*head.parameters(), *adapter.parameters()], lr=LR)

    def compared(scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores, 1) if loss_on == "softmax" else scores

    with torch.no_grad():
        scores = head(adapter(rows))
    nearest = torch.cdist(rows, torch.as_tensor(centres, dtype=torch.float32)).argmin(1)
    targets = torch.nn.functional.one_hot(nearest, k).float()
    start = 100 * normalized_mutual_info_score(y, nearest.numpy())
    memory, dual, mixture = compared(scores).clone(), None, None
    schedule = set(label_update_steps(RUN_ITERS, LABEL_UPDATES, WARMUP))
    rng, started, log = np.random.default_rng(seed), time.perf_counter(), []
    for step in range(iters):
        if step in schedule:
            with torch.no_grad():
                scores = head(adapter(rows))
            targets, result = pseudo_labels(scores, epsilon, init_log_v=dual)
            dual, targets, memory = result.log_v, targets.float(), compared(scores).clone()
            if use_mixture:
                mixture = GaussianUniformMixture().fit((targets - memory).numpy(), reset=True)
        weights = torch.ones(len(targets))
        if mixture is not None:
            r = mixture.fit_responsibilities((targets - memory).numpy())
            weights = torch.as_tensor(robust_weights(r), dtype=torch.float32)
        batch = torch.as_tensor(rng.choice(len(targets), BATCH, replace=False))
        out = compared(head(adapter(rows[batch])))
        memory[batch] = out.detach()
        loss = weighted_mse(targets[batch], out, weights[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % 250 == 0:
            with torch.no_grad():
                labels = head(adapter(rows)).argmax(1).numpy()
            log.append(
                {
                    "step": step + 1,
                    "clusters_used": int(len(np.unique(labels))),
                    "nmi": round(100 * normalized_mutual_info_score(y, labels), 2),
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
    return {"variant": variant, "k": k, "start_nmi": round(start, 2), "log": log}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulation.papers.fstc.local_loop")
    parser.add_argument("dataset")
    parser.add_argument("--variant", action="append", help="repeatable; default: the five of VARIANTS")
    parser.add_argument("--iters", type=int, default=2500)
    args = parser.parse_args(argv)
    X, y = client_rows(args.dataset)
    for variant in args.variant or VARIANTS:
        result = run(X, y, variant, args.iters)
        last = result["log"][-1] if result["log"] else {}  # type: ignore[index]
        print(json.dumps({**result, "log": None, "last": last}), flush=True)


if __name__ == "__main__":
    main()
