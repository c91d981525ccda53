"""How far the frozen encoder can go without federation: a centralized reference for FSTC's frozen mode.

    python -m simulation.papers.fstc.frozen_reference --dataset stackoverflow
    python -m simulation.papers.fstc.frozen_reference --dataset stackoverflow --views pairs --info-nce 1
    python -m simulation.papers.fstc.frozen_reference --dataset stackoverflow --purity 1 5 10

One model on the pooled embeddings (no clients, no robust weights, no centre alignment): the frozen-mode
model of FSTC (residual adapter + linear F, F started as the nearest-k-means-centre classifier), trained
with cross-entropy on Sinkhorn pseudo-labels (Alg. 1, ε = 0.1, Q = ξ² / row-sum) recomputed every
`--update-every` steps. `--views pairs` trains on SCCL's two augmented views (labels from the original
texts), `--info-nce W` adds W x SimCLR's NT-Xent between the two views' representations. It prints ACC /
NMI of argmax O and of k-means on the representations. It is an analysis on the simulation host (it pools
every client's embeddings); it bounds what the federated runs can reach with this encoder.

`--purity N ...` prints instead the N-nearest-neighbour label purity of the embeddings (cosine): the share
of each text's N nearest other texts that carry its class. A clustering that only reshapes this
geometry rarely beats 1-NN purity, so it says how much class structure the frozen encoder holds.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
import torch
from torch.nn.functional import cross_entropy

from fedapp.datasets.registry import load_dataset
from fedapp.features.texts import dataset_augmented_embeddings, dataset_embeddings
from fedapp.maths.clustering import kmeans
from fedapp.maths.fstc import pseudo_labels
from fedapp.maths.losses import info_nce_loss
from fedapp.metrics.contingency import clustering_metrics, contingency_table
from fedapp.models.fstc import ResidualAdapter

MODEL = "all-MiniLM-L6-v2"
MAX_LENGTH = 32


def scores(labels: np.ndarray, truth: np.ndarray, k: int, n_classes: int) -> str:
    metrics = clustering_metrics(contingency_table(labels, truth, k, n_classes))
    return f"ACC {100 * metrics['acc']:.2f} NMI {100 * metrics['nmi']:.2f}"


def neighbour_purity(
    embeddings: np.ndarray, labels: np.ndarray, sizes: list[int], block: int = 2048
) -> dict[int, float]:
    """Share of each row's n nearest other rows (cosine similarity) with its label, for each n in `sizes`.

    Blockwise, so 20,000 x 20,000 similarities never sit in memory at once; ties are broken by index.
    """
    if max(sizes) >= len(embeddings):
        raise ValueError(f"--purity {max(sizes)} needs more than {len(embeddings)} texts")
    unit = torch.nn.functional.normalize(torch.as_tensor(embeddings, dtype=torch.float32), dim=1)
    truth = torch.as_tensor(np.array(labels))  # a copy: dataset label arrays may be read-only
    hits = dict.fromkeys(sizes, 0)
    for start in range(0, len(unit), block):
        rows = torch.arange(start, min(start + block, len(unit)))
        similarity = unit[rows] @ unit.T
        similarity[torch.arange(len(rows)), rows] = -math.inf  # a text is not its own neighbour
        nearest = similarity.topk(max(sizes), dim=1).indices
        same = truth[nearest] == truth[rows][:, None]
        for n in sizes:
            hits[n] += int(same[:, :n].sum())
    return {n: hits[n] / (n * len(unit)) for n in sizes}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="stackoverflow")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--views", choices=("original", "pairs"), default="original")
    parser.add_argument("--info-nce", type=float, default=0.0, help="weight of NT-Xent between the views")
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--steps", type=positive_int, default=2000)
    parser.add_argument(
        "--update-every", type=positive_int, default=200, help="steps between pseudo-label updates"
    )
    parser.add_argument("--batch-size", type=positive_int, default=200)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--purity", type=positive_int, nargs="+", metavar="N", help="print N-NN label purity and stop"
    )
    return parser


def _embeddings(args: argparse.Namespace) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dataset, its embeddings and the two views trained on (both the embeddings unless pairs);
    ValueError (DatasetError, EmbeddingError) names what is missing."""
    data = load_dataset(args.dataset, args.data_dir)
    embeddings = torch.from_numpy(np.array(dataset_embeddings(data, MODEL, MAX_LENGTH, "cpu")))
    if args.views != "pairs":
        return data, embeddings, embeddings, embeddings
    pair = dataset_augmented_embeddings(data, str(args.data_dir or ""), MODEL, MAX_LENGTH, "cpu")
    view1, view2 = (torch.from_numpy(np.array(view)) for view in pair)
    return data, embeddings, view1, view2


def _train(
    args: argparse.Namespace,
    embeddings: torch.Tensor,
    views: tuple[torch.Tensor, torch.Tensor],
    truth: np.ndarray,
    k: int,
) -> None:
    """Adapter + F from the nearest-centre classifier, cross-entropy on Sinkhorn pseudo-labels; prints
    argmax O and k-means of the representations every 1,000 steps and at the end."""
    rng = np.random.default_rng(args.seed)
    centres, initial = kmeans(embeddings.numpy(), k, seed=args.seed)
    print(f"k-means of the embeddings: {scores(initial, truth, k, k)}", flush=True)
    adapter = ResidualAdapter(embeddings.shape[1], embeddings.shape[1])
    head = torch.nn.Linear(embeddings.shape[1], k)
    with torch.no_grad():  # argmax O = the nearest initial centre
        c = torch.from_numpy(centres).float()
        head.weight.copy_(2 * c)
        head.bias.copy_(-(c * c).sum(1))
    optimizer = torch.optim.Adam([*adapter.parameters(), *head.parameters()], lr=args.lr)
    targets = torch.nn.functional.one_hot(torch.from_numpy(initial), k).float()
    started = time.time()
    for step in range(1, args.steps + 1):
        batch = torch.from_numpy(rng.choice(len(embeddings), args.batch_size, replace=False))
        e1, e2 = adapter(views[0][batch]), adapter(views[1][batch])
        loss = cross_entropy(head(e1), targets[batch]) + cross_entropy(head(e2), targets[batch])
        if args.info_nce > 0:
            loss = loss + args.info_nce * info_nce_loss(e1, e2, args.temperature)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        update = step % args.update_every == 0 or step == args.steps
        report = step % 1000 == 0 or step == args.steps
        if update or report:  # one forward pass over all samples serves both
            adapter.eval()
            with torch.no_grad():
                representations = adapter(embeddings)
                outputs = head(representations)
            adapter.train()
        if update:
            targets, _ = pseudo_labels(outputs, args.epsilon)
        if report:
            _, km_labels = kmeans(representations.numpy(), k, seed=args.seed, n_init=3)
            print(
                f"step {step} ({time.time() - started:.0f} s): argmax O "
                f"{scores(outputs.argmax(1).numpy(), truth, k, k)}; k-means of E "
                f"{scores(km_labels, truth, k, k)}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    try:  # unknown dataset, missing files, no texts, no augmented views: one line, no traceback
        data, embeddings, view1, view2 = _embeddings(args)
    except ValueError as exc:  # DatasetError and EmbeddingError are ValueErrors
        parser.error(str(exc))
    if args.batch_size > len(embeddings):
        parser.error(f"--batch-size {args.batch_size} exceeds the {len(embeddings)} texts of {args.dataset}")
    truth = np.asarray(data.y)
    if args.purity:
        try:
            purity = neighbour_purity(embeddings.numpy(), truth, sorted(set(args.purity)))
        except ValueError as exc:
            parser.error(str(exc))
        for n, share in purity.items():
            print(f"{n}-NN label purity of the embeddings: {100 * share:.2f} %", flush=True)
        return 0
    _train(args, embeddings, (view1, view2), truth, data.n_classes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
