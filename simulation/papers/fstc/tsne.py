"""FSTC paper Fig. 2: t-SNE of the representations under FTF-IDF, FSBERT, FSCCL and FSTC.

    python -m simulation.papers.fstc.tsne --dataset stackoverflow --out docs/fstc-tsne.png

FTF-IDF and FSBERT are the clients' input features (TF-IDF over the merged vocabulary, the sentence
embeddings); FSCCL and FSTC are the global models' representations E after training (in-process
federations of `--clients` clients and `--rounds` rounds, the presets' other settings). The plot is an
analysis on the simulation host: it embeds a seeded sample of the pooled texts, coloured by the true
class, which no federated party ever does.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedapp.app.client_app import client_fn
from fedapp.app.inprocess import run_inprocess
from fedapp.app.server_app import server_fn
from fedapp.config.run import parse_run_config
from fedapp.datasets.local import load_run_dataset
from fedapp.features.bow import (
    count_matrix,
    document_frequencies,
    idf_weights,
    select_vocabulary,
    tfidf_matrix,
)
from fedapp.features.texts import dataset_embeddings
from fedapp.launch.presets import apply_preset, available_presets
from fedapp.launch.resolve import build_overrides
from fedapp.methods.fsccl import FSCCLConfig
from fedapp.methods.fstc import FSTCConfig
from fedapp.models.fsccl import SCCLModel
from fedapp.models.fstc import fstc_model
from fedapp.neural.glue import load_state_arrays
from fedapp.report.records import save_figure
from simulation.runner import flower_log_to_file


def trained_global_model(method: str, dataset: str, clients: int, rounds: int, seed: int) -> list[np.ndarray]:
    """Run one in-process federation and return the strategy's final global model arrays."""
    preset = f"fstc-{dataset}" if method == "fstc" else None  # the paper's λ for the dataset, where set
    if preset not in available_presets():
        preset = None
    base = apply_preset(preset, {"method": method, "dataset": dataset, "num-clients": clients, "seed": seed})
    base["num-rounds"] = rounds
    with tempfile.TemporaryDirectory() as out:
        overrides = build_overrides(base, Path(out))
        with flower_log_to_file(Path(out) / "flower.log", quiet=True):
            strategy, _ = run_inprocess(server_fn, client_fn, overrides, clients)
    if strategy.global_model is None:
        raise RuntimeError(f"{method}: the federation produced no global model")
    return strategy.global_model


@torch.no_grad()
def representations(
    method: str, arrays: list[np.ndarray], embeddings: np.ndarray, cfg: Any, k: int
) -> np.ndarray:
    x = torch.as_tensor(embeddings)
    if method == "fstc":
        model = fstc_model(cfg.params(FSTCConfig), k, embeddings.shape[1], cfg.embedding_model)
        load_state_arrays(model, arrays)
        return model.eval()(x)[0].numpy()
    params = cfg.params(FSCCLConfig)
    model = SCCLModel(embeddings.shape[1], k, adapter_hidden=params.adapter_hidden, alpha=params.alpha)
    load_state_arrays(model, arrays)
    return model.eval()(x).numpy()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="stackoverflow")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sample", type=int, default=2000, help="points shown (seeded, stratified by nothing)"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/fstc-tsne.png"))
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE

    if args.clients < 1 or args.rounds < 2 or args.sample < 2:
        parser.error("--clients must be >= 1, --rounds >= 2 (one init round + training), --sample >= 2")
    panels: dict[str, np.ndarray] = {}
    try:  # unknown dataset, missing or corrupt files: one line, no traceback
        cfg = parse_run_config({"method": "fstc", "dataset": args.dataset, "seed": args.seed})
        data = load_run_dataset(cfg)
    except ValueError as exc:  # ConfigError and DatasetError are ValueErrors
        parser.error(str(exc))
    if data.texts is None:
        parser.error(f"dataset {args.dataset!r} has no texts (FSTC's Fig. 2 needs a text dataset)")
    if args.sample > data.n_samples:
        parser.error(f"--sample {args.sample} exceeds the {data.n_samples} texts of {args.dataset}")
    rows = np.sort(np.random.default_rng(args.seed).choice(data.n_samples, args.sample, replace=False))
    texts = [data.texts[i] for i in rows]
    frequencies = document_frequencies(data.texts)
    vocabulary = select_vocabulary(frequencies, min_df=2, max_features=2000)
    tfidf = tfidf_matrix(count_matrix(texts, vocabulary), idf_weights(frequencies, vocabulary))
    panels["FTF-IDF"] = np.asarray(tfidf.todense())
    embeddings = dataset_embeddings(data, cfg.embedding_model, cfg.params(FSTCConfig).max_length, cfg.device)
    panels["FSBERT (MiniLM)"] = embeddings[rows]
    for method, title in (("fsccl", "FSCCL"), ("fstc", "FSTC")):
        method_cfg = parse_run_config({"method": method, "dataset": args.dataset, "seed": args.seed})
        arrays = trained_global_model(method, args.dataset, args.clients, args.rounds, args.seed)
        panels[title] = representations(method, arrays, embeddings[rows], method_cfg, data.n_classes)

    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    for axis, (title, points) in zip(axes, panels.items(), strict=True):
        flat = TSNE(n_components=2, random_state=args.seed, init="pca").fit_transform(points)
        axis.scatter(flat[:, 0], flat[:, 1], c=data.y[rows], cmap="tab20", s=3)
        axis.set_title(title)
        axis.set_xticks([])
        axis.set_yticks([])
    figure.suptitle(f"t-SNE of representations, {args.dataset} ({args.sample} texts, colour = true class)")
    save_figure(figure, args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
