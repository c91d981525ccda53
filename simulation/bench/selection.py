"""How well k = 0 chooses k on the benchmarks whose k is known (docs/model-selection.md).

For each benchmark: the selection of `simulation.tune` over 10 IID clients (k in [2, 30]), each rule's
chosen k, the NMI of the selection's own clustering (nearest candidate centre = k-FED with k' = k-max) at
that k and at the true k, and the selection's cost. Labels are used only here, to score the choice.

    .venv/bin/python -m simulation.bench.selection [--full] [NAME ...]

`--full`: every record of the sets measured on a subsample by default (the text sets, MNIST).
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np
from sklearn.metrics import normalized_mutual_info_score

from fedapp.config.run import parse_run_config
from fedapp.maths.clustering import nearest_centre
from fedapp.maths.selection import choose_k
from simulation.tune import client_rows, tune

# name -> (method, dataset, max-samples, scaling): the text sets through FSBERT-kFED's sentence embeddings
# (a class-stratified subsample of 3,000 where embedding all texts on 2 shared CPU cores took too long)
BENCHMARKS = {
    "digits": ("kfed", "digits", 0, "none"),
    "hw": ("kfed", "hw", 0, "none"),
    "hw-zscore": ("kfed", "hw", 0, "zscore"),
    "bdgp": ("kfed", "bdgp", 0, "none"),
    "bdgp-zscore": ("kfed", "bdgp", 0, "zscore"),
    "mnist": ("kfed", "mnist", 10000, "none"),
    "agnews": ("fsbert-kfed", "agnews", 0, "none"),
    "stackoverflow": ("fsbert-kfed", "stackoverflow", 3000, "none"),
    "biomedical": ("fsbert-kfed", "biomedical", 3000, "none"),
    "20news": ("fsbert-kfed", "20news", 3000, "none"),
}
RULES = ("silhouette", "calinski_harabasz", "davies_bouldin")


def measure(name: str, clients: int = 10, seed: int = 0, full: bool = False) -> str:
    """One markdown row: true k, per rule the chosen k and its NMI, NMI at the true k, the cost."""
    method, dataset, max_samples, scaling = BENCHMARKS[name]
    max_samples = 0 if full else max_samples
    with tempfile.TemporaryDirectory() as out:
        cfg = parse_run_config(
            {
                "method": method,
                "dataset": dataset,
                "num-clients": clients,
                "seed": seed,
                "max-samples": max_samples,
                "scaling": scaling,
                "out-dir": out,
                "node-out-dir": f"{out}/nodes/{{partition-id}}",
            }
        )
        locals_, rows = client_rows(cfg)
        tuned = tune(cfg, rows)
    X, y = np.concatenate(rows), np.concatenate([local.labels for local in locals_])
    true_k = len(np.unique(y))

    def nmi(k: int) -> float:
        return 100 * normalized_mutual_info_score(y, nearest_centre(X, tuned.candidates[k]))

    cells = []
    for rule in RULES:
        k = choose_k(tuned.selection.table, rule)
        cells.append(f"{k} ({nmi(k):.1f})")
    cost = tuned.cost
    return (
        f"| {name} | {true_k} | {' | '.join(cells)} | {nmi(true_k):.1f} | {cost['extra_rounds']} | "
        f"{cost['bytes_up'] / 1e6:.2f} / {cost['bytes_down'] / 1e6:.2f} | {cost['seconds']:.1f} |"
    )


def main(args: list[str]) -> None:
    full = "--full" in args
    names = [arg for arg in args if arg != "--full"]
    print(
        "| benchmark | true k | silhouette: k (NMI) | CH: k (NMI) | DB: k (NMI) | NMI at true k "
        "| extra rounds | MB up / down | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names or list(BENCHMARKS):
        print(measure(name, full=full), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
