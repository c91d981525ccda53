"""`python -m simulation predict`: assign new records with a saved model, locally, no federation.

The saved weights (`OUT/model/`, see `fedapp.report.model_store`) are handed to the method's own client code,
as
in the final report of the run that made them, over the records of one file: run on a node's own file,
the result equals that node's `assignments.csv`. Transductive methods (vertical: the model is the
training rows' consensus labels) have nothing to apply to new records and say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.common import Context, RecordDict

from fedapp.app.client_app import node_run_config
from fedapp.app.preflight import check_out_dir
from fedapp.config.run import ConfigError
from fedapp.datasets import Dataset, DatasetError, dataset_info, has_placeholder, is_source_spec
from fedapp.datasets.local import load_run_dataset
from fedapp.launch.resolve import absolute_spec
from fedapp.methods import load_class, method_spec
from fedapp.report.assignments import write_assignments
from fedapp.report.model_store import SavedModel, read_model

# Keys of the saved run that must not carry over to one local file
LOCAL_KEYS = {"num-clients": 1, "partition": "iid", "max-samples": 0, "dropout-rate": 0.0, "resume": False}


def predict(model_dir: Path, dataset: str, out: Path, overrides: Mapping[str, Any] | None = None) -> int:
    """Write `out` (id, cluster, score) for every record of `dataset`; returns the number of records."""
    saved = read_model(model_dir)
    spec = method_spec(saved.method)
    if spec.vertical or saved.arrays is None:
        raise ConfigError(
            f"method '{saved.method}' is transductive: its model is the consensus labels of the records it "
            "was trained on, so there is nothing to apply to new records (rerun the federation with them)"
        )
    if not is_source_spec(dataset) or has_placeholder(dataset):
        raise ConfigError(
            f"--dataset must be one file (csv:, tsv:, jsonl:, parquet:, npy:, npz:, images:), got {dataset!r}"
        )
    dataset = absolute_spec(dataset)
    run_config = {
        **saved.config,
        **LOCAL_KEYS,
        "dataset": dataset,
        "k": int(saved.info["k"]),
        **(overrides or {}),
    }
    # predict writes its --out file only: no embeddings unless this command names a directory (the saved
    # run's directory may be a node's path on another machine, or another site's)
    chosen = (overrides or {}).get("embedding-cache", "off")
    run_config["embedding-cache"] = "off" if chosen in ("auto", "node") else chosen
    node_config = {"partition-id": 0, "num-partitions": 1, "dataset": run_config["dataset"]}  # read whole
    cfg = node_run_config(run_config, node_config)
    data = load_run_dataset(cfg)  # a bad file fails here, in one line, before any model is built
    check_same_kind(saved, data)
    check_feature_width(saved, data)
    check_out_dir(out.parent if str(out.parent) else Path("."))
    context = Context(run_id=0, node_id=0, node_config=node_config, state=RecordDict(), run_config=run_config)
    client = load_class(spec.client)(context, cfg)  # type: ignore[arg-type]
    # a run that kept its starting clustering (`select = best`) says how to apply it
    assignment = client.assign(list(saved.arrays), dict(saved.info.get("assign_config") or {}))
    write_assignments(out, client.data.ids, assignment.labels, assignment.scores)
    return len(assignment.labels)


# kinds of records one model can label: images only as images; vectors and a multi-view set's
# concatenated views alike (a horizontal method read the views as one row); texts and bag-of-words alike
KIND_FAMILIES = ({"images"}, {"vectors", "multiview"}, {"texts", "bow"})


def trained_kind(saved: SavedModel) -> str | None:
    """The kind of records the model was trained on, from its saved config alone (its files may be on
    other machines): a registered dataset's kind, else the spec's; None where a table could be either."""
    dataset = str(saved.config.get("dataset", ""))
    if not is_source_spec(dataset):
        try:
            return dataset_info(dataset).kind
        except DatasetError:
            return None
    if dataset.startswith("images:"):
        return "images"
    if dataset.startswith(("npy:", "npz:")):
        return "vectors"
    modalities = set(method_spec(saved.method).modalities)
    return "texts" if modalities == {"texts"} else "vectors" if "texts" not in modalities else None


def check_same_kind(saved: SavedModel, data: Dataset) -> None:
    """A model labels records of the kind it was trained on: an images model given vectors of the same
    width would label them without a word, by pixels that are not pixels."""
    trained = trained_kind(saved)
    if trained is None or any({trained, data.kind} <= family for family in KIND_FAMILIES):
        return
    raise ConfigError(
        f"{data.name} gives {data.kind}, the model was trained on {trained} "
        f"({saved.config.get('dataset')}): predict needs records of the same kind"
    )


def check_feature_width(saved: SavedModel, data: Dataset) -> None:
    """A model of centres in feature space (k-FED, FFCM) needs rows as wide as its centres; one line
    naming both widths instead of NumPy's matmul error."""
    if "vectors" not in method_spec(saved.method).modalities or not saved.arrays:
        return
    centres, features = saved.arrays[0], data.features
    if centres.ndim != 2 or features is None or features.shape[1] == centres.shape[1]:
        return
    shape = f" (images {'x'.join(map(str, data.image_shape))})" if data.image_shape else ""
    raise ConfigError(
        f"{data.name} has {features.shape[1]} features per record{shape}, the model's centres have "
        f"{centres.shape[1]} ({saved.config.get('dataset')}): predict needs the same feature columns"
    )
