"""gFedNTM Sec. 4.2 on 20 Newsgroups: 5 clients by newsgroup family, federated vs non-collaborative vs
centralized ProdLDA. Needs ../shared/data (or $FEDAPP_DATA_DIR).

    python -m simulation.papers.gfedntm.newsgroups --out results/gfedntm-20news [--epochs 20] [--topics 20]

- federated: the real strategy and clients (in-process engine), dataset `20news-families`, partition
  by-group; the vocabulary is the consensus (max-features on the merged document frequencies);
- non-collaborative: client l trains on its own documents (same vocabulary, same epochs);
- centralized: one model on the pooled documents, batch `batch-size`.
Metrics for every model, on the union corpus: NPMI of the top-10 words (document co-occurrence counts,
which the federation sums over clients), topic diversity of the top-25 words, and coverage = Eq. 7's
AMWMD between client l's own (non-collaborative) topics and the evaluated model's topics, with word
vectors from the bundled sentence encoder (lower = client l's topics are better covered), averaged over
the clients (for a client's model: over the other clients).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import scipy.sparse
import torch

from fedapp.config.run import parse_run_config
from fedapp.datasets import load_dataset, resolve_data_dir
from fedapp.datasets.partition import partition_indices
from fedapp.features.bow import count_matrix
from fedapp.features.embeddings import embed_texts
from fedapp.launch.resolve import build_overrides
from fedapp.maths.gfedntm import Corpus, build_model, fit_centralized, make_optimizer, top_words
from fedapp.methods.gfedntm import DIVERSITY_TOP_WORDS, NPMI_TOP_WORDS, GFedNTMConfig
from fedapp.metrics.topics import average_minimum_wmd, npmi_from_cooccurrence, topic_diversity
from simulation.runner import execute

DATASET = "20news-families"
CLIENTS = 5


def overrides(args: argparse.Namespace) -> dict:
    return {
        "method": "gfedntm",
        "dataset": DATASET,
        "num-clients": CLIENTS,
        "partition": "by-group",
        "seed": args.seed,
        "device": "cpu",
        "eval-every": 100_000,
        "num-rounds": 100_000,  # the epochs stop it; the strategy logs the rounds it needs
        "gfedntm.topics": args.topics,
        "gfedntm.epochs": args.epochs,
        "gfedntm.max-features": args.vocabulary,
        "gfedntm.min-df": 5,
        "gfedntm.max-df": 0.5,
    }


def npmi(top: np.ndarray, present: scipy.sparse.csr_matrix) -> float:
    cooccurrence = np.stack([(present[:, words].T @ present[:, words]).toarray() for words in top])
    return float(npmi_from_cooccurrence(cooccurrence, present.shape[0]).mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulation.papers.gfedntm.newsgroups", description=__doc__
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--vocabulary", type=int, default=2000, help="max-features of the consensus")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    args.out.mkdir(parents=True, exist_ok=True)
    run = overrides(args)
    started = time.perf_counter()
    summary = execute(build_overrides(run, args.out / "federated"), "inprocess", quiet=True, overwrite=True)
    federated_seconds = time.perf_counter() - started
    cfg = parse_run_config({**run, "out-dir": str(args.out)})
    params = cfg.params(GFedNTMConfig)
    data = load_dataset(DATASET, resolve_data_dir())
    terms = summary["vocabulary"]
    counts = count_matrix(data.texts, terms)
    present = (counts > 0).astype(np.int64).tocsr()
    parts = partition_indices(data.y, CLIENTS, "by-group", seed=args.seed)
    models: dict[str, np.ndarray] = {"federated": np.asarray(summary["top_word_indices"])}

    def trained_top(rows: np.ndarray, seed: int) -> np.ndarray:
        model = build_model(params, len(terms), 0, seed, torch.device("cpu"))
        optimizer = make_optimizer(list(model.parameters()), params.optimizer, params.lr, params.betas)
        fit_centralized(
            model,
            Corpus(counts[rows]),
            batch_size=params.batch_size,
            epochs=params.epochs,
            optimizer=optimizer,
            seed=seed,
            log_every=100_000,
        )
        return top_words(model.topic_word().double().numpy(), DIVERSITY_TOP_WORDS)

    timings = {"federated": federated_seconds}
    started = time.perf_counter()
    models["centralized"] = trained_top(np.arange(data.n_samples), args.seed)
    timings["centralized"] = time.perf_counter() - started
    for client, rows in enumerate(parts):
        started = time.perf_counter()
        models[f"client {client} ({data.class_names[client]})"] = trained_top(rows, args.seed + client + 1)
        timings[f"client {client}"] = time.perf_counter() - started
    word_vectors = embed_texts(terms, cfg.embedding_model, dataset=f"{DATASET}-vocabulary", device="cpu")
    own = [name for name in models if name.startswith("client")]
    table = {}
    for name, top in models.items():
        top10 = top[:, :NPMI_TOP_WORDS]
        coverage = [average_minimum_wmd(models[o][:, :NPMI_TOP_WORDS], top10, word_vectors) for o in own]
        table[name] = {
            "npmi": npmi(top10, present),
            "td": topic_diversity(top[:, :DIVERSITY_TOP_WORDS]),
            "amwmd_per_client": coverage,
            # a client's own topics are trivially covered by its own model: average over the others
            "amwmd_mean": float(np.mean([c for o, c in zip(own, coverage, strict=True) if o != name])),
            "top_words": [[terms[j] for j in row[:NPMI_TOP_WORDS]] for row in top],
        }
    result = {
        "config": run,
        "timings_s": timings,
        "models": table,
        "federated_summary_metrics": summary["metrics"],
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    for name, row in table.items():
        print(f"{name:32s} npmi {row['npmi']:.4f} td {row['td']:.3f} amwmd {row['amwmd_mean']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
