"""Representation quality of finished CCFC runs: kNN accuracy (paper Table 3) and t-SNE (paper Fig. 4).

This is an analysis of the final global model, not part of the federated protocol: it loads the model a
run saved (`global_model.npz`), encodes the whole dataset in one place (pooling every client's samples,
which a real federation could not do) and fits a kNN classifier on the MNIST training images' representations
(the first 60,000), scoring it on the 10,000 test images, as the paper's Table 3 does. Every run is scored
on the full dataset, whatever subsample (`max-samples`) it trained on, so runs of different seeds share one
split. Raw pixels are the reference row. Representations are the L2-normalised z = f(x), so Euclidean
neighbours are cosine neighbours.

    python -m simulation.papers.ccfc.representations --run CCFC=results/ccfc-cpu --run SCFC=results/scfc \
        --tsne docs/ccfc-tsne.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.manifold import TSNE
from sklearn.neighbors import NearestNeighbors

from clients.ccfc import encode
from fedapp.config.run import parse_run_config
from fedapp.datasets import Dataset, load_dataset, resolve_data_dir
from fedapp.methods.ccfc import CCFCConfig
from fedapp.models.ccfc import build_model
from fedapp.report.records import save_figure
from strategies.ccfc import MODEL_FILE

KNN_KS = (3, 5, 7, 9, 100)
MNIST_TRAIN = 60_000  # the mnist dataset is train (60,000) then test (10,000)
PAPER_TABLE3 = {  # Table 3, percent
    "Raw pixels": {3: 97.05, 5: 96.88, 7: 96.94, 9: 96.59, 100: 94.40},
    "SCFC": {3: 98.11, 5: 98.23, 7: 98.25, 9: 98.21, 100: 97.54},
    "CCFC": {3: 98.25, 5: 98.33, 7: 98.26, 9: 98.32, 100: 97.86},
}


def load_run(run_dir: Path) -> tuple[torch.nn.Module, Dataset]:
    """The final global model of a run and the *whole* dataset it ran on (its subsample is ignored)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = parse_run_config(summary["config"])
    dataset = load_dataset(cfg.dataset, resolve_data_dir(cfg.data_dir or None), seed=cfg.seed)
    saved = np.load(run_dir / MODEL_FILE)
    model = build_model(cfg.params(CCFCConfig), tuple(summary["image_shape"]))
    model.load_state_dict(
        {name[6:]: torch.from_numpy(saved[name]) for name in saved.files if name[:6] == "state."}
    )
    return model, dataset


def train_test_split(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """MNIST's own split (first 60,000 = train); any other dataset: the last seventh is the test set."""
    n = dataset.n_samples
    cut = MNIST_TRAIN if dataset.name == "mnist" and n == 70_000 else n - n // 7
    return np.arange(cut), np.arange(cut, n)


def representations(model: torch.nn.Module, dataset: Dataset) -> np.ndarray:
    """L2-normalised z for every sample, computed on the CPU in eval mode."""
    z = encode(model, torch.from_numpy(dataset.unit_images().astype(np.float32, copy=False)))
    return torch.nn.functional.normalize(z, dim=1).numpy()


def knn_accuracy(
    features: np.ndarray, labels: np.ndarray, train: np.ndarray, test: np.ndarray
) -> dict[int, float]:
    """Test accuracy (percent) of a k-nearest-neighbour majority vote for every k in KNN_KS.

    One neighbour search for the largest k serves every k; a tied vote goes to the smallest label, as in
    scikit-learn's KNeighborsClassifier.
    """
    index = NearestNeighbors(n_neighbors=max(KNN_KS), algorithm="brute").fit(features[train])
    neighbours = labels[train][index.kneighbors(features[test], return_distance=False)]
    n_classes = int(labels.max()) + 1
    scores = {}
    for k in KNN_KS:
        votes = np.zeros((len(test), n_classes), dtype=np.int64)
        np.add.at(votes, (np.arange(len(test))[:, None], neighbours[:, :k]), 1)
        scores[k] = 100.0 * float((votes.argmax(axis=1) == labels[test]).mean())
    return scores


def tsne_plot(panels: dict[str, np.ndarray], labels: np.ndarray, out: Path, seed: int) -> None:
    """Fig. 4: one t-SNE panel per representation, coloured by the true class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), squeeze=False)
    for ax, (name, features) in zip(axes[0], panels.items(), strict=True):
        embedded = TSNE(n_components=2, init="pca", random_state=seed).fit_transform(features)
        ax.scatter(embedded[:, 0], embedded[:, 1], c=labels, cmap="tab10", s=1.5, linewidths=0)
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    save_figure(fig, out, dpi=90)


def markdown_table(scores: dict[str, dict[int, float]]) -> str:
    header = "| representation | " + " | ".join(f"k = {k}" for k in KNN_KS) + " |"
    lines = [header, "|---|" + "---|" * len(KNN_KS)]
    for name, row in scores.items():
        paper = PAPER_TABLE3.get(name.split(" ")[0], {})
        cells = [f"{row[k]:.2f}" + (f" ({paper[k]:.2f})" if k in paper else "") for k in KNN_KS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nIn brackets: the paper's Table 3 (MNIST test accuracy, %)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=DIR", help="a finished run")
    parser.add_argument("--tsne", type=Path, help="write the t-SNE figure here")
    parser.add_argument("--tsne-samples", type=int, default=3000, help="test images shown in the t-SNE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the kNN scores as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = dict(item.split("=", 1) for item in args.run)
    dataset = None
    features: dict[str, np.ndarray] = {}
    for name, run_dir in runs.items():
        model, run_dataset = load_run(Path(run_dir))
        if dataset is not None and run_dataset.name != dataset.name:
            parser.error(f"--run {name}: dataset {run_dataset.name!r}, the others ran on {dataset.name!r}")
        dataset = run_dataset
        features[name] = representations(model, dataset)
    assert dataset is not None
    features = {"Raw pixels": dataset.unit_images().reshape(dataset.n_samples, -1), **features}
    train, test = train_test_split(dataset)
    scores = {name: knn_accuracy(f, dataset.y, train, test) for name, f in features.items()}
    print(markdown_table(scores))
    if args.out:
        args.out.write_text(
            json.dumps({name: {str(k): v for k, v in row.items()} for name, row in scores.items()})
        )
    if args.tsne:
        shown = np.random.default_rng(args.seed).choice(
            test, size=min(args.tsne_samples, len(test)), replace=False
        )
        tsne_plot({name: f[shown] for name, f in features.items()}, dataset.y[shown], args.tsne, args.seed)
        print(f"wrote {args.tsne}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
