"""Centralized references: the same metrics and output files as a federated run, on pooled data.

These never run under Flower (pooling raw data is exactly what federation avoids); they exist so that
every results table shows the centralized number computed by the same code on the same samples.
"""

from __future__ import annotations

import time
from pathlib import Path

from fedapp.config.run import RunConfig
from fedapp.datasets.local import load_run_dataset
from fedapp.maths.clustering import kmeans
from fedapp.metrics.contingency import clustering_metrics, contingency_table
from fedapp.report.records import write_run_outputs

KMEANS_N_INIT = 10


def run_centralized(cfg: RunConfig) -> dict:
    """Centralized k-means (k-means++, 10 restarts, seeded) on the dataset's vector features.

    Texts are clustered by their sentence embeddings (`embedding-model`; `fsbert` truncates at its
    `max-length`), the FSTC paper's FSBERT row.
    """
    started = time.perf_counter()
    data = load_run_dataset(cfg)
    features = data.features
    if features is None and data.texts is not None:
        from fedapp.features.texts import dataset_embeddings, embedding_cache

        max_length = getattr(cfg.method_config, "max_length", None)
        # one pooled "node": `node` caches own data in the run's own folder
        cache = embedding_cache(
            cfg.embedding_cache, own_data=cfg.own_data, node_dir=Path(cfg.out_dir), partition_id=0
        )
        features = dataset_embeddings(data, cfg.embedding_model, max_length, cfg.device, cache)
    if features is None:
        raise ValueError(f"dataset '{cfg.dataset}' has no vector features for centralized k-means")
    k = cfg.k or data.n_classes
    _, labels = kmeans(features, k, cfg.seed, n_init=KMEANS_N_INIT)
    metrics = clustering_metrics(contingency_table(labels, data.y, k, data.n_classes))
    summary = {
        "method": cfg.method,
        "dataset": cfg.dataset,
        "num_clients": 1,
        "rounds": 1,
        "seed": cfg.seed,
        "k": k,
        "metrics": metrics,
        "comm_bytes": {"up": 0, "down": 0, "total_mb": 0.0, "eval_up": 0, "eval_down": 0, "per_round": {}},
        "wall_seconds": time.perf_counter() - started,
        "status": "completed",
        "status_reason": "centralized reference",
        "stop_reason": "centralized",
        "config": cfg.to_dict(),
    }
    write_run_outputs(Path(cfg.out_dir), summary, [{"round": 1, "metrics": metrics}])
    return summary
