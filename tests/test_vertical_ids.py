"""Vertical methods on parties' own id-keyed files: the alignment round is the shared glue's, so every
vertical method runs on them and clusters the records exactly as on the same views without ids."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedapp.datasets import load_dataset
from fedapp.launch.resolve import build_overrides
from fedapp.privacy.alignment import hash_ids, run_key
from fedapp.report.assignments import read_assignments
from simulation.runner import execute
from strategies.cefmc import CeFMCStrategy
from strategies.fedcmv import FedCMvStrategy, FedFCMvStrategy
from strategies.vertical import VerticalStrategy

ID_KEY = "shared secret"
RECORDS = 240


def write_views(root: Path) -> list[str]:
    """digits-mv's three views twice: `ids/view-<v>.csv`, keyed by `pid` and shuffled differently per
    party, and `plain/view-<v>.csv` without ids. Parties align by keyed hashes of their ids — row numbers
    in the plain files — so the plain rows are written in the order that makes both runs see the records
    in the same order. Returns the record behind each plain row."""
    digits = load_dataset("digits-mv", max_samples=RECORDS)
    assert digits.views is not None
    ids = np.array([f"patient-{i:04d}" for i in range(RECORDS)])
    key = run_key(ID_KEY, "")
    by_id_hash = np.argsort(hash_ids(list(ids), key))  # the id-keyed run's record order
    by_row_hash = np.argsort(hash_ids([str(row) for row in range(RECORDS)], key))  # the plain run's rows
    plain_rows = np.empty(RECORDS, dtype=np.int64)
    plain_rows[by_row_hash] = by_id_hash  # plain row by_row_hash[i] holds record by_id_hash[i]
    rng = np.random.default_rng(3)
    for folder in ("ids", "plain"):
        (root / folder).mkdir()
    for party, view in enumerate(digits.views[:3]):
        columns = [f"f{j}" for j in range(view.shape[1])]
        shuffled = rng.permutation(RECORDS)
        frame = pd.DataFrame(view[shuffled], columns=columns)
        frame.insert(0, "pid", ids[shuffled])
        frame.to_csv(root / "ids" / f"view-{party}.csv", index=False)
        plain = pd.DataFrame(view[plain_rows], columns=columns)
        plain.to_csv(root / "plain" / f"view-{party}.csv", index=False)
    return list(ids[plain_rows])


def _labels_by_record(out: Path, party: int) -> dict[str, int]:
    ids, clusters, _ = read_assignments(out / "nodes" / str(party) / "assignments.csv")
    return dict(zip(ids, clusters.tolist(), strict=True))


@pytest.mark.parametrize("method", ["fedcmv", "fedfcmv", "cefmc"])
def test_id_keyed_views_cluster_as_the_same_views_without_ids(tmp_path: Path, method: str) -> None:
    order = write_views(tmp_path)
    runs = {}
    for folder, extra in (("ids", {"id-column": "pid"}), ("plain", {})):
        base = {
            "method": method,
            "dataset": f"csv:{tmp_path}/{folder}/view-{{partition-id}}.csv",
            "num-clients": 3,
            "num-rounds": 6,
            "k": 10,
            "seed": 0,
            "id-key": ID_KEY,
            **extra,
        }
        summary = execute(build_overrides(base, tmp_path / f"out-{folder}"), engine="inprocess", quiet=True)
        assert summary["status"] in ("completed", "converged"), summary["status_reason"]
        runs[folder] = tmp_path / f"out-{folder}"
    plain = _labels_by_record(runs["plain"], 0)  # by row number
    expected = {record: plain[str(row)] for row, record in enumerate(order)}
    for party in range(3):
        assert _labels_by_record(runs["ids"], party) == expected
    assert len(set(expected.values())) > 1


@pytest.mark.parametrize("strategy", [FedCMvStrategy, FedFCMvStrategy, CeFMCStrategy])
def test_vertical_methods_check_only_their_own_replies(strategy: type[VerticalStrategy]) -> None:
    """The alignment round's hashes go through the glue's `check_reply`; a method checks its own replies
    in `check_view_reply`, so none may override `check_reply` (the cause of FedCMv's UFuncTypeError)."""
    owners = [cls for cls in inspect.getmro(strategy) if "check_reply" in vars(cls)]
    assert owners[0] is VerticalStrategy
