"""A user's own files, without labels, one per node: every method family end to end (in-process engine),
the records' clusters written on every node, label-free metrics equal to scikit-learn's on the pooled
data, the saved model and `predict`, vertical parties aligned by keyed id hashes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score

from fedapp.app.client_app import client_fn
from fedapp.app.inprocess import run_inprocess
from fedapp.app.server_app import server_fn
from fedapp.datasets import load_dataset
from fedapp.launch.resolve import build_overrides
from fedapp.metrics.contingency import clustering_metrics, contingency_table
from fedapp.report.assignments import read_assignments
from simulation.__main__ import main
from simulation.predict import predict
from simulation.runner import execute, flower_log_to_file
from tests.own_files import write_text_sites
from tests.synthetic_images import class_images

SITES = 3


def _run(out: Path, **overrides: Any) -> dict[str, Any]:
    base = {"num-clients": SITES, "seed": 0, **overrides}
    return execute(build_overrides(base, out), engine="inprocess", quiet=True)


def _vector_sites(root: Path, dim: int = 4) -> list[pd.DataFrame]:
    """Three sites of id + numeric columns, three well separated blobs, no labels."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 6, (3, dim))
    frames = []
    for site in range(SITES):
        n = 40 + 10 * site
        rows = centres[rng.integers(0, 3, n)] + rng.normal(0, 1, (n, dim))
        frame = pd.DataFrame(rows, columns=[f"x{j}" for j in range(dim)])
        frame.insert(0, "id", [f"{site}-{i:03d}" for i in range(n)])
        frame.to_csv(root / f"site-{site}.csv", index=False)
        frames.append(frame)
    return frames


def _assignments(out: Path, site: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    return read_assignments(out / "nodes" / str(site) / "assignments.csv")


@pytest.mark.parametrize("method", ["kfed", "ffcm"])
def test_vector_sites_without_labels_get_assignments_metrics_and_a_model(tmp_path: Path, method: str) -> None:
    frames = _vector_sites(tmp_path)
    out = tmp_path / method
    spec = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    summary = _run(out, method=method, dataset=spec, k=3, **{"id-column": "id", "num-rounds": 4})
    assert summary["status"] in ("completed", "converged")
    labels, rows = [], []
    for site, frame in enumerate(frames):
        ids, clusters, scores = _assignments(out, site)
        assert ids == frame["id"].tolist()  # one row per record, ids written back unchanged
        assert np.isfinite(scores).all()
        labels.append(clusters)
        rows.append(frame[[f"x{j}" for j in range(4)]].to_numpy())
    pooled, pooled_labels = np.vstack(rows), np.concatenate(labels)
    free = summary["report"]["label_free"]
    assert free["calinski_harabasz"] == pytest.approx(
        calinski_harabasz_score(pooled, pooled_labels), rel=1e-9
    )
    assert free["davies_bouldin"] == pytest.approx(davies_bouldin_score(pooled, pooled_labels), rel=1e-9)
    assert summary["metrics"]["calinski_harabasz"] == free["calinski_harabasz"]
    assert summary["report"]["cluster_sizes"] == np.bincount(pooled_labels, minlength=3).tolist()
    assert "acc" not in summary["metrics"]  # no labels, no label metrics
    info = json.loads((out / "model" / "model.json").read_text())
    assert info["method"] == method and info["k"] == 3 and info["weights"] == "model.npz"
    assert info["score"]["kind"] == {"kfed": "distance", "ffcm": "membership"}[method]
    # predict on site 0's file reproduces site 0's assignments exactly
    predicted = tmp_path / "predicted.csv"
    assert predict(out, f"csv:{tmp_path}/site-0.csv", predicted) == len(frames[0])
    assert predicted.read_bytes() == (out / "nodes" / "0" / "assignments.csv").read_bytes()


def test_the_node_out_dir_key_moves_the_assignments(tmp_path: Path) -> None:
    _vector_sites(tmp_path)
    spec = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    target = tmp_path / "elsewhere" / "site{partition-id}"
    _run(tmp_path / "run", method="kfed", dataset=spec, k=3, **{"node-out-dir": str(target)})
    for site in range(SITES):
        ids, _, _ = read_assignments(tmp_path / "elsewhere" / f"site{site}" / "assignments.csv")
        assert ids[0] == f"{site}-000"  # no id-column: the table's `id` column


def test_a_single_own_file_is_partitioned_like_a_benchmark(tmp_path: Path) -> None:
    frames = _vector_sites(tmp_path)
    summary = _run(tmp_path / "one", method="kfed", dataset=f"csv:{tmp_path}/site-2.csv", k=3)
    written = sum(len(_assignments(tmp_path / "one", site)[0]) for site in range(SITES))
    assert written == len(frames[2]) and summary["report"]["assigned_rows"] == {"0": 20, "1": 20, "2": 20}


@pytest.fixture
def text_sites(tmp_path: Path, text_embedding_cache: None) -> Path:
    """texts-demo split over three sites as id,text CSVs (no labels)."""
    return write_text_sites(tmp_path, SITES)


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("fsbert-kfed", {}),
        ("fstc", {"num-rounds": 3, "fstc.local-iters": 10, "fstc.batch-size": 40, "fstc.warmup-iters": 5}),
    ],
)
def test_text_sites_without_labels_get_assignments_keywords_and_predict(
    text_sites: Path, method: str, extra: dict[str, Any]
) -> None:
    out = text_sites / method
    spec = f"csv:{text_sites}/site-{{partition-id}}.csv"
    summary = _run(out, method=method, dataset=spec, k=4, **{"id-column": "id", **extra})
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    for site in range(SITES):
        ids, clusters, scores = _assignments(out, site)
        assert ids == pd.read_csv(text_sites / f"site-{site}.csv", dtype=str)["id"].tolist()
        assert set(clusters.tolist()) <= set(range(4)) and np.isfinite(scores).all()
    keywords = summary["report"]["keywords"]
    assert len(keywords) == 4 and sum(len(words) for words in keywords) > 0
    assert summary["report"]["label_free"]["simplified_silhouette"] is not None
    predicted = text_sites / f"{method}-predicted.csv"
    predict(out, f"csv:{text_sites}/site-0.csv", predicted)
    assert predicted.read_bytes() == (out / "nodes" / "0" / "assignments.csv").read_bytes()


def test_gfedntm_on_text_sites_reports_topic_words_and_document_topics(text_sites: Path) -> None:
    out = text_sites / "gfedntm"
    spec = f"csv:{text_sites}/site-{{partition-id}}.csv"
    overrides = {
        "id-column": "id",
        "num-rounds": 6,
        "device": "cpu",
        "gfedntm.topics": 4,
        "gfedntm.batch-size": 20,
        "gfedntm.epochs": 1,
    }
    summary = _run(out, method="gfedntm", dataset=spec, **overrides)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    info = json.loads((out / "model" / "model.json").read_text())
    assert len(info["topic_words"]) == 4 and all(words for words in info["topic_words"])
    assert info["weights"] == "model.npz"  # the vocabulary travels with the weights
    ids, topics, probability = _assignments(out, 1)
    assert (
        len(ids) == len(pd.read_csv(text_sites / "site-1.csv"))
        and ((probability > 0) & (probability <= 1)).all()
    )
    predicted = text_sites / "topics.csv"
    predict(out, f"csv:{text_sites}/site-1.csv", predicted)
    assert predicted.read_bytes() == (out / "nodes" / "1" / "assignments.csv").read_bytes()


def test_ccfc_on_image_folders_one_clustering_round(tmp_path: Path) -> None:
    labels = np.arange(60) % 4
    images = class_images(labels, (1, 8, 8), seed=0)
    for site in range(SITES):
        folder = tmp_path / f"site-{site}"
        folder.mkdir()
        for i in range(site, 60, SITES):
            Image.fromarray(images[i, 0]).save(folder / f"img{i:02d}.png")
    out = tmp_path / "ccfc"
    overrides = {
        "num-rounds": 3,
        "ccfc.pretrain-rounds": 1,
        "ccfc.batch-size": 10,
        "ccfc.kmeans-samples": 20,
        "device": "cpu",
    }
    summary = _run(out, method="ccfc", dataset=f"images:{tmp_path}/site-{{partition-id}}", k=4, **overrides)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    ids, clusters, similarity = _assignments(out, 0)
    assert ids == [f"img{i:02d}.png" for i in range(0, 60, SITES)]
    assert ((similarity >= -1) & (similarity <= 1)).all()
    assert (out / "model" / "model.safetensors").is_file()
    predicted = tmp_path / "images.csv"
    predict(out, f"images:{tmp_path}/site-0", predicted)
    assert predicted.read_bytes() == (out / "nodes" / "0" / "assignments.csv").read_bytes()


def test_cefmc_aligns_shuffled_id_keyed_views_by_keyed_hash(tmp_path: Path) -> None:
    digits = load_dataset("digits-mv", max_samples=300)
    assert digits.views is not None
    rng = np.random.default_rng(0)
    ids = [f"patient-{i:04d}" for i in range(digits.n_samples)]
    kept = {0: np.arange(300), 1: np.arange(5, 300), 2: np.arange(0, 290)}  # parties lack a few records
    for party, view in enumerate(digits.views[:3]):
        rows = rng.permutation(kept[party])
        frame = pd.DataFrame(view[rows], columns=[f"f{j}" for j in range(view.shape[1])])
        frame.insert(0, "pid", [ids[i] for i in rows])
        frame.to_csv(tmp_path / f"view-{party}.csv", index=False)
    out = tmp_path / "cefmc"
    overrides = {"id-column": "pid", "id-key": "shared secret", "num-rounds": 6}
    summary = _run(
        out, method="cefmc", dataset=f"csv:{tmp_path}/view-{{partition-id}}.csv", k=10, **overrides
    )
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    assert summary["alignment"] == {
        "0": {"rows": 300, "left_out": 15},
        "1": {"rows": 295, "left_out": 10},
        "2": {"rows": 290, "left_out": 5},
    }
    per_party = [_assignments(out, party) for party in range(3)]
    shared_ids = sorted(per_party[0][0])
    assert len(shared_ids) == 285 and all(sorted(p[0]) == shared_ids for p in per_party)
    labels_by_id = [dict(zip(p[0], p[1].tolist(), strict=True)) for p in per_party]
    assert labels_by_id[0] == labels_by_id[1] == labels_by_id[2]  # one consensus, the same records
    truth = {ids[i]: int(y) for i, y in enumerate(digits.y)}  # held back from the parties: scored here
    table = contingency_table(per_party[0][1], np.array([truth[i] for i in per_party[0][0]]), 10, 10)
    assert clustering_metrics(table)["nmi"] > 0.5
    assert summary["report"]["label_free"]["calinski_harabasz"] > 0
    assert (
        summary["report"]["label_free"]["davies_bouldin"] is None
    )  # needs per-record distances across parties
    info = json.loads((out / "model" / "model.json").read_text())
    assert info["transductive"] and info["weights"] is None
    with pytest.raises(ValueError, match="transductive"):
        predict(out, f"csv:{tmp_path}/view-0.csv", tmp_path / "no.csv")


def test_parties_that_share_no_ids_are_refused_before_the_run_and_stopped_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    for party in range(2):
        frame = pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "c"])
        frame.insert(0, "pid", [f"{'x' if party else 'y'}{i}" for i in range(30)])  # disjoint ids
        frame.to_csv(tmp_path / f"view-{party}.csv", index=False)
    spec = f"csv:{tmp_path}/view-{{partition-id}}.csv"
    flags = [
        "--method",
        "cefmc",
        "--dataset",
        spec,
        "--clients",
        "2",
        "--set",
        "k=3",
        "--set",
        "id-column=pid",
    ]
    err = _refused(tmp_path, capsys, *flags)  # the files are local: the check before the run sees it
    assert "share only 0 record ids (party 0: 30 ids, party 1: 30 ids)" in err
    # in a deployment the nodes' own id-keys can make equal ids unequal hashes: the alignment round stops
    base = {"method": "cefmc", "dataset": spec, "k": 3, "num-clients": 2, "id-column": "pid"}
    run = build_overrides(base, tmp_path / "run")
    with flower_log_to_file(tmp_path / "flower.log", quiet=True):
        run_inprocess(server_fn, client_fn, run, 2)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "share only 0 record ids (party 0: 30 ids, party 1: 30 ids)" in summary["status_reason"]


# ------------------------------------------------------------------------------------------ bad data
def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["run", "--engine", "inprocess", "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "summary.json").exists()
    return err


def _kfed_on(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    spec = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    return _refused(
        tmp_path, capsys, "--method", "kfed", "--dataset", spec, "--clients", "3", "--set", "k=3", *extra
    )


def test_bad_data_is_refused_before_anything_starts_naming_client_and_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frames = _vector_sites(tmp_path)
    site1 = tmp_path / "site-1.csv"
    site1.unlink()
    assert "client 1" in (err := _kfed_on(tmp_path, capsys)) and "site-1.csv" in err  # missing file
    site1.write_text("")
    assert "client 1" in (err := _kfed_on(tmp_path, capsys)) and "site-1.csv" in err  # empty file
    frames[1].head(2).to_csv(site1, index=False)
    assert "fewer than k=3" in _kfed_on(tmp_path, capsys)  # fewer rows than k
    bad = frames[1].astype({"x2": object})
    bad.loc[7, "x2"] = "n/a"
    bad.to_csv(site1, index=False)
    err = _kfed_on(tmp_path, capsys, "--set", "feature-columns=x0,x1,x2,x3")
    assert "client 1" in err and "x2" in err  # a non-numeric feature, named by column
    nan = frames[1].copy()
    nan.loc[3, "x1"] = np.inf
    nan.to_csv(site1, index=False)
    assert "x1" in (err := _kfed_on(tmp_path, capsys)) and "client 1" in err  # infinite feature
    frames[1].drop(columns=["x3"]).to_csv(site1, index=False)
    assert "client 1" in (err := _kfed_on(tmp_path, capsys)) and "same feature columns" in err  # other width
    frames[1].to_csv(site1, index=False)
    err = _kfed_on(tmp_path, capsys, "--set", "feature-columns=x0,x9")
    assert "x9" in err  # a missing column


def test_bad_text_and_image_files_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for site in range(SITES):
        pd.DataFrame({"id": ["a", "b", "c", "d"], "body": ["x y", "y z", "z w", "w x"]}).to_csv(
            tmp_path / f"site-{site}.csv", index=False
        )
    spec = f"csv:{tmp_path}/site-{{partition-id}}.csv"
    err = _refused(tmp_path, capsys, "--method", "fstc", "--dataset", spec, "--clients", "3", "--set", "k=2")
    assert "text column 'text'" in err and "site-0.csv" in err  # the text column is missing
    (tmp_path / "site-2.csv").write_bytes(b"id,body\n1,caf\xe9 au lait\n2,ok\n3,fine\n")
    err = _refused(
        tmp_path, capsys, "--method", "fsbert-kfed", "--dataset", spec, "--clients", "3",
        "--set", "k=2", "--set", "text-column=body",
    )  # fmt: skip
    assert "client 2" in err and "site-2.csv" in err and "not UTF-8" in err and "line 2" in err
    folder = tmp_path / "images-0"
    folder.mkdir()
    for i in range(4):
        Image.fromarray(np.full((8, 8), 40 * i, np.uint8)).save(folder / f"{i}.png")
    (folder / "broken.png").write_bytes(b"not a png")
    err = _refused(
        tmp_path, capsys, "--method", "kfed", "--dataset", f"images:{tmp_path}/images-{{partition-id}}",
        "--clients", "1", "--set", "k=2",
    )  # fmt: skip
    assert "broken.png" in err


def test_the_client_app_merges_a_nodes_settings_into_one_run_config() -> None:
    """A node's settings reach its clients through the one config the ClientApp builds: its own file and
    columns win, its floor can raise the run's but never lower it, and the run's dataset stays known."""
    from fedapp.app.client_app import node_run_config
    from fedapp.datasets.local import owns_file
    from fedapp.privacy.floor import PrivacyFloorError

    run = {"method": "kfed", "dataset": "csv:/data/site-{partition-id}.csv", "min-cluster-size": 8}
    node = {"partition-id": 1, "num-partitions": 3, "dataset": "csv:/here/site-1.csv", "id-column": "key"}
    cfg = node_run_config(run, {**node, "node-out-dir": "/here/out", "min-cluster-size": 20})
    assert (cfg.dataset, cfg.id_column, cfg.node_out_dir) == ("csv:/here/site-1.csv", "key", "/here/out")
    assert cfg.node.own_file and owns_file(cfg) and cfg.node.run_dataset == run["dataset"]
    assert cfg.min_cluster_size == 20  # the node's floor holds against the run's
    raised = node_run_config({**run, "min-cluster-size": 50}, {**node, "min-cluster-size": 20})
    assert raised.min_cluster_size == 50  # the run config may raise it
    assert node_run_config({**run, "min-cluster-size": 1}, node).min_cluster_size == 5  # the client's default
    shared = node_run_config({"method": "kfed", "dataset": "digits"}, {"partition-id": 0})
    assert not shared.node.own_file and not owns_file(shared)
    with pytest.raises(PrivacyFloorError, match="not an integer"):
        node_run_config(run, {**node, "min-cluster-size": "many"})
