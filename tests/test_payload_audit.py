"""Payload audit: every message of a short run of every method, checked for per-sample arrays.

Raw samples and labels never leave a client. A method whose registry entry declares no `per_sample`
payloads must never send an array with a dimension equal to a client's sample count (or the dataset's);
methods that do by design (CeFMC's H_v^(0) and labels, FedCMv's partial distances) must declare it.
Evaluation replies are contingency tables (cluster x class counts): their size is checked too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, parameters_to_ndarrays

import fedapp.app.inprocess as inprocess
from fedapp.config.run import parse_run_config
from fedapp.datasets.local import load_run_dataset, local_partition
from fedapp.launch.resolve import build_overrides
from fedapp.methods import METHODS
from fedapp.report.stages import (
    DISTANCES_KEY,
    REPORT_KEY,
    SIZES_KEY,
    STAGE_ASSIGN,
    SUMS_KEY,
    TERMS_KEY,
    decode_cluster_sums,
    decode_distance_sums,
)
from fedapp.wire import decode_array, decode_counts
from simulation.runner import execute

# A short, cheap run per federated method (add one for every new method: the test fails without it).
# Sizes are chosen so that no model dimension equals a client's sample count by accident.
FSTC_QUICK = {"fstc.local-iters": 5, "fstc.batch-size": 50, "fstc.warmup-iters": 2, "fstc.label-updates": 2}
AUDIT_RUNS: dict[str, dict[str, Any]] = {
    "kfed": {"dataset": "digits", "num-clients": 7},
    "ffcm": {"dataset": "digits", "num-clients": 7, "num-rounds": 3},
    "cefmc": {"dataset": "digits-mv", "num-rounds": 3},
    "cefmc-h": {"dataset": "digits-mv", "num-rounds": 3},
    "fedcmv": {"dataset": "digits-mv", "num-rounds": 3},
    "fedfcmv": {"dataset": "digits-mv", "num-rounds": 3},
    "gfedntm": {
        "dataset": "synthetic-lda-tiny",
        "num-clients": 5,
        "partition": "by-group",
        "num-rounds": 4,
        "gfedntm.topics": 7,
        "gfedntm.batch-size": 16,
    },
    "bench-echo": {"dataset": "digits", "num-clients": 7, "num-rounds": 2},
    "ccfc": {
        "dataset": "digits",
        "num-clients": 5,
        "num-rounds": 4,
        "ccfc.pretrain-rounds": 1,
        "ccfc.batch-size": 64,
        "ccfc.local-steps": 2,
        "ccfc.latent-dim": 16,
        "ccfc.projector-hidden": 16,
        "ccfc.kmeans-samples": 200,
    },
    **{
        method: {"dataset": "texts-demo", "num-clients": 3, "num-rounds": 3, **FSTC_QUICK}
        for method in ("fstc", "fstc-rstc", "fstc-stc")
    },
    "fsccl": {"dataset": "texts-demo", "num-clients": 3, "num-rounds": 3, "fsccl.local-iters": 5},
    **{method: {"dataset": "texts-demo", "num-clients": 3} for method in ("fbow", "ftfidf", "fsbert-kfed")},
}


DECODERS = {
    SIZES_KEY: lambda blob: [decode_array(blob).shape],
    SUMS_KEY: lambda blob: [decode_cluster_sums(blob).counts.shape, decode_cluster_sums(blob).sums.shape],
    DISTANCES_KEY: lambda blob: [decode_distance_sums(blob).distance_sums.shape],
    TERMS_KEY: lambda blob: [(len(json.loads(blob)),)],
}


class _Recorder:
    """Collects the shapes of every array crossing the wire, per direction."""

    def __init__(self) -> None:
        self.shapes: list[tuple[str, str, tuple[int, ...]]] = []  # (direction, what, shape)
        self.uploaded_rows: list[tuple[str, np.ndarray]] = []  # every uploaded float64 matrix

    def arrays(self, direction: str, what: str, parameters: Any) -> None:
        for array in parameters_to_ndarrays(parameters):
            self.shapes.append((direction, what, array.shape))
            if direction == "up" and array.ndim == 2 and array.dtype == np.float64:  # centres, not weights
                self.uploaded_rows.append((what, array.astype(np.float64)))

    def metrics(self, direction: str, what: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key == "table" and isinstance(value, bytes):
                self.shapes.append((direction, f"{what} table", decode_counts(value).shape))
            elif key in DECODERS and isinstance(value, bytes):  # the final report's aggregates
                for shape in DECODERS[key](value):
                    self.shapes.append((direction, f"{what} {key}", shape))
            elif isinstance(value, bytes | list):
                self.shapes.append((direction, f"{what} {key}", (len(value),)))


def _record_spaces(cfg: Any) -> list[np.ndarray]:
    """Every client's records as vectors: features, or the sentence embeddings of its texts."""
    from fedapp.features.texts import dataset_embeddings

    spaces = []
    for pid in range(cfg.num_clients):
        local = local_partition(cfg, pid, cfg.num_clients)
        if local.dataset.features is not None:
            spaces.append(np.asarray(local.features, dtype=np.float64))
        elif local.dataset.texts is not None:
            vectors = dataset_embeddings(local.dataset, cfg.embedding_model, None)[local.indices]
            spaces.append(np.asarray(vectors, dtype=np.float64))
    return spaces


def raw_rows_uploaded(cfg: Any, uploads: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """(what, rows) of every uploaded matrix some of whose rows equal a client's record (to 1e-9)."""
    found = []
    for space in _record_spaces(cfg):
        for what, matrix in uploads:
            if matrix.shape[1] != space.shape[1]:
                continue
            gap = np.abs(matrix[:, None, :] - space[None, :, :]).max(axis=2)
            equal = matrix[(gap < 1e-9).any(axis=1)]
            if len(equal):
                found.append((what, equal))
    return found


def _recording_proxy(recorder: _Recorder) -> type:
    class RecordingProxy(inprocess.InProcessClientProxy):
        def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
            recorder.arrays("down", "fit", ins.parameters)
            res = super().fit(ins, timeout, group_id)
            recorder.arrays("up", "fit", res.parameters)
            recorder.metrics("up", "fit", res.metrics)
            return res

        def evaluate(self, ins: EvaluateIns, timeout: float | None, group_id: int | None) -> EvaluateRes:
            what = f"report {ins.config[REPORT_KEY]}" if REPORT_KEY in ins.config else "evaluate"
            recorder.arrays("down", what, ins.parameters)
            res = super().evaluate(ins, timeout, group_id)
            recorder.metrics("up", what, res.metrics)
            return res

    return RecordingProxy


def test_every_federated_method_has_an_audit_run() -> None:
    federated = {name for name, spec in METHODS.items() if spec.federated}
    assert federated <= set(AUDIT_RUNS), f"add an AUDIT_RUNS entry for {sorted(federated - set(AUDIT_RUNS))}"


@pytest.mark.usefixtures("text_embedding_cache")
@pytest.mark.parametrize("method", sorted(AUDIT_RUNS))
def test_no_per_sample_array_crosses_the_wire_unless_declared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(inprocess, "InProcessClientProxy", _recording_proxy(recorder))
    overrides = build_overrides({"method": method, "seed": 0, **AUDIT_RUNS[method]}, tmp_path)
    summary = execute(overrides, engine="inprocess", quiet=True)
    assert summary["status"] in ("completed", "converged") and recorder.shapes
    cfg = parse_run_config(overrides)
    n_total = load_run_dataset(cfg).n_samples
    sample_counts = {n_total}
    if not METHODS[method].vertical:
        sample_counts |= {
            local_partition(cfg, pid, cfg.num_clients).n_samples for pid in range(cfg.num_clients)
        }
    per_sample = [(d, what, shape) for d, what, shape in recorder.shapes if set(shape) & sample_counts]
    if METHODS[method].per_sample:
        assert per_sample, f"{method} declares per-sample payloads but none was seen"
    else:
        assert not per_sample, f"{method} sent per-sample arrays: {per_sample[:5]}"
    for direction, what, shape in recorder.shapes:  # evaluation sends counts, never labels
        if what in ("evaluate table", f"report {STAGE_ASSIGN} table"):
            assert direction == "up" and len(shape) == 2 and np.prod(shape) <= 100 * 100
    # the final report ran, and what it sent up were per-cluster aggregates: each node's assignments stay
    # on the node (every array above was checked against the clients' sample counts)
    reported = {
        what for direction, what, _ in recorder.shapes if direction == "up" and what.startswith("report")
    }
    assert f"report {STAGE_ASSIGN} {SIZES_KEY}" in reported, sorted(reported)
    for direction, what, shape in recorder.shapes:
        if what.startswith("report") and direction == "up":
            assert shape[0] == summary["k"] or what.endswith("table"), (what, shape)
    if not METHODS[method].per_sample:  # the privacy floor: no uploaded centre is one of a client's records
        for what, rows in raw_rows_uploaded(cfg, recorder.uploaded_rows):
            pytest.fail(f"{method}: {what} uploaded {len(rows)} raw record(s)")
    for node in range(cfg.num_clients):
        assignments = tmp_path / "nodes" / str(node) / "assignments.csv"
        assert assignments.is_file() and not any(p.name == "assignments.csv" for p in tmp_path.glob("*.csv"))


@pytest.mark.parametrize("local_k", [3, 60, 100_000])
@pytest.mark.parametrize("floor", [1, 5, 40])
def test_no_run_config_makes_k_fed_upload_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_k: int, floor: int
) -> None:
    """Whoever writes the run config (the server) cannot lower the clients' floor below 5: with
    kfed.local-k up to 100,000 every uploaded centre averages at least max(5, floor) records."""
    recorder = _Recorder()
    monkeypatch.setattr(inprocess, "InProcessClientProxy", _recording_proxy(recorder))
    settings = {"kfed.local-k": local_k, "min-cluster-size": floor}
    overrides = build_overrides(
        {"method": "kfed", "dataset": "digits", "num-clients": 7, **settings}, tmp_path
    )
    summary = execute(overrides, engine="inprocess", quiet=True)
    assert summary["status"] == "converged"
    assert raw_rows_uploaded(parse_run_config(overrides), recorder.uploaded_rows) == []
    counts = [shape for direction, what, shape in recorder.shapes if direction == "up" and what == "fit"]
    assert all(rows <= 1797 // 7 // max(5, floor) + 1 for rows, *_ in counts[::2])  # k' <= n // floor
