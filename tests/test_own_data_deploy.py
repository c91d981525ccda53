"""Own data on a real loopback deployment: SuperNodes each reading only its own CSV (no labels), each
writing its records' clusters; the server's model reproduces a node's assignments with `predict`; a node
whose file lacks the text column is named in the run's status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedapp.datasets import load_dataset
from fedapp.report.assignments import read_assignments
from simulation.predict import predict

ROOT = Path(__file__).resolve().parents[1]
SITES = 2  # text sites (each SuperNode embeds its own texts); the test adds one whose file lacks the column
pytestmark = [pytest.mark.e2e, pytest.mark.sequential, pytest.mark.usefixtures("text_embedding_cache")]


def _deploy(out: Path, method: str, node_data: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "deploy/run_local.py", "--method", method, "--node-data", node_data]
    command += ["--clients", str(SITES), "--rounds", "2", "--set", "id-column=id", *extra, "--out", str(out)]
    # a later --clients wins (argparse)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)


def _text_sites(root: Path) -> None:
    texts = load_dataset("texts-demo").texts
    assert texts is not None
    for site, rows in enumerate(np.array_split(np.arange(len(texts)), SITES)):
        pd.DataFrame({"id": [f"t{i}" for i in rows], "text": [texts[i] for i in rows]}).to_csv(
            root / f"site-{site}.csv", index=False
        )


def _vector_sites(root: Path) -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 6, (3, 5))
    for site in range(SITES):
        rows = centres[rng.integers(0, 3, 50)] + rng.normal(0, 1, (50, 5))
        frame = pd.DataFrame(rows, columns=[f"v{j}" for j in range(5)])
        frame.insert(0, "id", [f"{site}:{i}" for i in range(50)])
        frame.to_csv(root / f"site-{site}.csv", index=False)


def _check_sites(tmp_path: Path, out: Path, sites: int) -> None:
    """Each of the first `sites` SuperNodes wrote its own records' clusters and a page of its own; the
    server's model reproduces site 0's assignments with `predict`."""
    every_id = {}
    for site in range(sites):
        ids, _, _ = read_assignments(out / "nodes" / str(site) / "assignments.csv")
        assert ids == pd.read_csv(tmp_path / f"site-{site}.csv", dtype=str)["id"].tolist()
        every_id[site] = ids
    assert (out / "model" / "model.json").is_file()
    assert "On the wire, per message kind" in (out / "report.html").read_text()
    for site in range(sites):  # each SuperNode's own page: its records, none of another's
        page = (out / "nodes" / str(site) / "report.html").read_text()
        assert any(f">{i}<" in page for i in every_id[site])
        assert not any(f">{i}<" in page for other in set(every_id) - {site} for i in every_id[other])
    predicted = tmp_path / "predicted.csv"
    predict(out, f"csv:{tmp_path}/site-0.csv", predicted)
    ids, clusters, scores = read_assignments(predicted)
    node_ids, node_clusters, node_scores = read_assignments(out / "nodes" / "0" / "assignments.csv")
    assert ids == node_ids and (clusters == node_clusters).all()
    # texts are embedded in float32, here and in the node's process with another thread count (a sum in
    # another order): a score may differ in its 7th digit (seen: 0.73732828 vs 0.73732821)
    np.testing.assert_allclose(scores, node_scores, rtol=1e-5)


def test_each_supernode_reads_its_own_texts_and_a_node_whose_file_lacks_the_text_column_is_named(
    tmp_path: Path,
) -> None:
    """2 text sites and a third whose file has no `text` column: the third is named in the run's status
    (degraded, exit code 3) and writes nothing; the other two carry on and each writes its clusters."""
    _text_sites(tmp_path)
    frame = pd.read_csv(tmp_path / "site-0.csv").rename(columns={"text": "body"})
    frame["id"] = "x" + frame["id"]
    frame.to_csv(tmp_path / f"site-{SITES}.csv", index=False)
    out = tmp_path / "run"
    node_data = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    result = _deploy(out, "fsbert-kfed", node_data, "--set", "k=3", "--clients", str(SITES + 1))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "degraded", summary["status_reason"] + result.stdout[-3000:]
    assert result.returncode == 3
    assert any("no text column 'text'" in message for message in summary["failure_messages"])
    assert not (out / "nodes" / str(SITES) / "assignments.csv").exists()
    _check_sites(tmp_path, out, SITES)
    free = summary["report"]["label_free"]
    assert free["calinski_harabasz"] > 0 and free["davies_bouldin"] > 0 and "acc" not in summary["metrics"]


@pytest.mark.slow  # the own-data deployment above, with numeric columns and k-FED
def test_each_supernode_reads_its_own_vectors_and_writes_its_assignments(tmp_path: Path) -> None:
    _vector_sites(tmp_path)
    out = tmp_path / "run"
    result = _deploy(out, "kfed", f"csv:{tmp_path}/site-{{partition-id}}.csv", "--set", "k=3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _check_sites(tmp_path, out, SITES)
