"""`select = best` (`fedapp.report.keep`): the one-message scatter (SSB, SSW, Calinski–Harabasz) from summable
statistics equals scikit-learn's, the rule keeps the trained model unless it is clearly worse and is not
fooled by a model that empties clusters, and end to end an FSTC run
whose training is forced to wreck the clustering keeps (and saves, and `predict`s with) its start, while
`select = final` keeps the last model and sends no scoring message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import calinski_harabasz_score

from fedapp.config.run import parse_run_config
from fedapp.launch.resolve import build_overrides
from fedapp.report.keep import (
    COLLAPSE_FRACTION,
    KEEP_MARGIN,
    CandidateSums,
    calinski_harabasz,
    candidate_sums,
    choose,
    decode_candidate_sums,
    encode_candidate_sums,
    merge_candidate_sums,
    scatter,
)
from fedapp.report.model_store import read_model
from fedapp.wire import ReplyError
from simulation.predict import predict
from simulation.runner import execute
from strategies.ffcm import FFCMStrategy
from tests.own_files import write_text_sites
from tests.run_checks import assert_ran_through

K = 4


def _blobs(seed: int, n: int = 300, dim: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K, n)
    return rng.normal(size=(K, dim))[labels] * 4 + rng.normal(size=(n, dim)), labels


# ------------------------------------------------------------------------------------------- maths
def test_ch_from_split_sums_equals_scikit_learn() -> None:
    x, good = _blobs(0)
    bad = np.random.default_rng(1).integers(0, K, len(x))
    halves = [
        candidate_sums(x[rows], [good[rows], bad[rows]], K, floor=1)
        for rows in np.array_split(np.arange(len(x)), 2)
    ]
    merged = merge_candidate_sums(halves)
    for i, labels in enumerate((good, bad)):
        ours = calinski_harabasz(merged.counts[i], merged.sums[i], merged.squared_norms[i])
        assert ours == pytest.approx(calinski_harabasz_score(x, labels), rel=1e-9)
        spread = scatter(merged.counts[i], merged.sums[i], merged.squared_norms[i])
        within = sum(((x[labels == c] - x[labels == c].mean(0)) ** 2).sum() for c in range(K))
        assert spread.within == pytest.approx(within, rel=1e-9)
        assert spread.between == pytest.approx(((x - x.mean(0)) ** 2).sum() - within, rel=1e-9)
    one = calinski_harabasz(np.array([300, 0, 0, 0]), merged.sums[0], np.ones(K))
    assert one is None  # one cluster: none


def test_records_of_clusters_below_the_floor_sit_out() -> None:
    x, labels = _blobs(2, n=50)
    labels[:3] = K  # a fifth cluster of 3 records
    sums = candidate_sums(x, [labels, labels], K + 1, floor=5)
    assert sums.counts[0, K] == 0 and sums.counts[0].sum() == 47
    np.testing.assert_allclose(sums.squared_norms[0].sum(), (x[3:] ** 2).sum())
    assert sums.squared_norms[0, K] == 0.0


def test_the_rule_keeps_the_trained_model_unless_it_is_clearly_worse() -> None:
    x, good = _blobs(3)
    noisy = good.copy()
    noisy[:3] = (noisy[:3] + 1) % K  # a little worse
    random = np.random.default_rng(4).integers(0, K, len(x))
    little = choose(candidate_sums(x, [good, noisy], K, floor=1), "final")
    ratio = little.scores["final"] / little.scores["start"]  # type: ignore[operator]
    sums = candidate_sums(x, [good, noisy], K, floor=1)
    assert choose(sums, "best", margin=1.01 - ratio).kept == "final"  # within the margin: trained kept
    assert choose(sums, "best", margin=0.99 - ratio).kept == "start"
    wrecked = candidate_sums(x, [good, random], K, floor=1)
    choice = choose(wrecked, "best")
    assert choice.kept == "start" and choice.degraded and "below the start's" in choice.why
    assert choice.scores["final"] < (1 - KEEP_MARGIN) * choice.scores["start"]  # type: ignore[operator]
    assert choose(wrecked, "final").kept == "final"  # the paper's last model, scores still reported
    collapsed = candidate_sums(x, [good, np.zeros_like(good)], K, floor=1)
    assert choose(collapsed, "best").kept == "start" and choose(collapsed, "best").clusters_used["final"] == 1


def test_a_model_that_empties_clusters_is_not_rewarded_for_it() -> None:
    """Two far-apart groups of four close clusters each: the start finds the eight, the 'trained' model
    the two groups. Calinski-Harabasz prefers the two (its SSB is divided by clusters used - 1); SSB/SSW
    at the same k does not, and the collapse guard alone keeps the start too."""
    rng = np.random.default_rng(7)
    groups = np.array([[0.0, 0.0], [60.0, 0.0]])
    offsets = np.array([[0.0, 0.0], [2.5, 0.0], [0.0, 2.5], [2.5, 2.5]])
    centres = np.array([g + o for g in groups for o in offsets])
    eight = np.repeat(np.arange(8), 50)
    x = centres[eight] + rng.normal(size=(400, 2))
    two = eight // 4
    sums = candidate_sums(x, [eight, two], 8, floor=1)
    ch = {name: s.calinski_harabasz for name, s in choose(sums, "final").scatter.items()}
    assert ch["final"] > ch["start"]  # the old criterion would have kept the collapsed model
    choice = choose(sums, "best")
    assert choice.kept == "start" and choice.clusters_used == {"start": 8, "final": 2}
    assert "under 0.5 of the start's 8" in choice.why
    ratio_only = choose(sums, "best", collapse=0.0)  # without the guard: SSB/SSW alone keeps the start
    assert ratio_only.kept == "start" and ratio_only.scores["final"] < ratio_only.scores["start"]  # type: ignore[operator]
    assert COLLAPSE_FRACTION == 0.5


def test_the_wire_form_round_trips_and_refuses_nonsense() -> None:
    x, labels = _blobs(5, n=40)
    sums = candidate_sums(x, [labels, labels], K, floor=1)
    back = decode_candidate_sums(encode_candidate_sums(sums))
    np.testing.assert_array_equal(back.counts, sums.counts)
    np.testing.assert_allclose(back.sums, sums.sums)
    with pytest.raises(ReplyError):
        decode_candidate_sums(b"not an archive")
    with pytest.raises(ReplyError):
        CandidateSums(np.zeros((3, K), np.int64), np.zeros((3, K, 2)), np.zeros((3, K)))
    with pytest.raises(ReplyError):
        CandidateSums(np.zeros((2, K), np.int64), np.zeros((2, K, 2)), np.zeros(2))
    with pytest.raises(ReplyError):
        CandidateSums(np.zeros((2, K), np.int64), np.full((2, K, 2), np.nan), np.zeros((2, K)))
    other = candidate_sums(x[:, :2], [labels, labels], K, floor=1)
    with pytest.raises(ReplyError, match="different shapes"):
        merge_candidate_sums([sums, other])


# ------------------------------------------------------------------------------------- end to end
SITES, ROUNDS = 2, 3
# training forced to wreck the clustering: an adapter and head learning rate 10^4 times the default
WRECKING = {"fstc.lr-adapter": 5.0, "fstc.lr-head": 5.0, "fstc.local-iters": 50}


def _run(out: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    execute(build_overrides({"seed": 0, "method": "fstc", **overrides}, out), engine="inprocess", quiet=True)
    summary = json.loads((out / "summary.json").read_text())
    assert_ran_through(summary, exit_code=None)
    return summary


def test_fstc_keeps_its_start_when_training_wrecks_it(tmp_path: Path, text_embedding_cache: None) -> None:
    sites = write_text_sites(tmp_path, SITES)
    out = tmp_path / "run"
    keys = {
        "dataset": f"csv:{sites}/site-{{partition-id}}.csv",
        "id-column": "id",
        "num-clients": SITES,
        "num-rounds": ROUNDS,
        "k": K,
        **WRECKING,
    }
    summary = _run(out, keys)
    select = summary["report"]["select"]
    assert select["kept"] == "start" and select["clusters_used"]["start"] == K
    assert select["scores"]["final"] is None or select["scores"]["final"] < select["scores"]["start"]
    assert any("kept the starting clustering" in w and "fsbert-kfed" in w for w in summary["warnings"])
    assert sum(1 for size in summary["report"]["cluster_sizes"] if size > 0) == K  # the report used the start
    saved = read_model(out)
    assert saved.info["kept"] == "start" and saved.info["assign_config"] == {"labels-by": "centres"}
    # `predict` applies the kept start: the node's own assignments again
    predicted = tmp_path / "predicted.csv"
    predict(out, f"csv:{sites}/site-0.csv", predicted)
    assert predicted.read_bytes() == (out / "nodes" / "0" / "assignments.csv").read_bytes()


def test_fstcs_start_is_fsbert_kfeds_clustering(tmp_path: Path, text_embedding_cache: None) -> None:
    """The start `select = best` falls back on is the one-shot private baseline itself (K local centres a
    client, unweighted k-means over their union), so keeping it can never trail FSBERT k-FED; the paper
    presets' `init-merge = weighted` start sends 2K a client."""
    common = {"dataset": "texts-demo", "num-clients": SITES, "seed": 0}
    kfed = _run(tmp_path / "fsbert-kfed", {**common, "method": "fsbert-kfed"})["metrics"]
    runs = {
        merge: _run(tmp_path / f"fstc-{merge}", {**common, "num-rounds": 2, "fstc.init-merge": merge})
        for merge in ("kfed", "weighted")
    }
    start = runs["kfed"]["report"]["select"]["labelled"]["start"]
    for metric in ("acc", "nmi", "ari"):
        assert start[metric] == pytest.approx(kfed[metric], abs=1e-9)
    init_upload = {merge: run["comm_bytes"]["per_round"]["1"]["up"] for merge, run in runs.items()}
    assert init_upload["weighted"] > 1.5 * init_upload["kfed"]  # 2K centres a client against K


def test_select_final_keeps_the_last_model_and_scores_nothing(
    tmp_path: Path, text_embedding_cache: None
) -> None:
    summary = _run(
        tmp_path / "run",
        {"dataset": "texts-demo", "num-clients": SITES, "num-rounds": ROUNDS, "select": "final", **WRECKING},
    )
    assert summary["report"]["select"] == {"kept": "final", "why": "select = final"}
    assert not any("kept the starting" in w for w in summary["warnings"])
    assert summary["metrics"]["nmi"] < 0.5  # the wrecked model is what the run reports


def test_ffcm_scores_both_candidates_on_labelled_data(tmp_path: Path) -> None:
    summary = _run(
        tmp_path / "run", {"method": "ffcm", "dataset": "digits", "num-clients": 4, "num-rounds": 4}
    )
    select = summary["report"]["select"]
    assert select["kept"] in ("start", "final")
    assert set(select["labelled"]) == {"start", "final"}
    kept = select["labelled"][select["kept"]]
    assert summary["metrics"]["nmi"] == pytest.approx(kept["nmi"])
    assert all(score > 0 for score in select["scores"].values())


@pytest.mark.parametrize(("init", "method"), [("local-centres", "kfed"), ("moments", "")])
def test_ffcms_kept_start_names_kfed_only_for_the_merged_local_centres(
    tmp_path: Path, init: str, method: str
) -> None:
    """A kept start's warning names the one-shot method it amounts to: k-FED's scheme for the merged local
    centres; the moments init (seeded draws, always under SecAgg+) amounts to none."""
    keys = {"method": "ffcm", "dataset": "digits", "out-dir": str(tmp_path), "k": 3, "ffcm.init": init}
    strategy = FFCMStrategy(parse_run_config(keys))
    strategy.initial_centres = np.zeros((3, 4))
    start = strategy.start_candidate()
    assert start is not None and start.method == method


def test_select_table_fits_the_margin_without_the_setting_it_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three settings: a collapse (SSB/SSW 0.80 of the start's), a gain at 0.97, a gain at 0.995. Left
    out, the gain at 0.97 gets the margin fitted on the other two (the smallest that keeps the 0.995
    gain and drops the collapse: 0.005 -> it keeps its start, losing its lead); the table says so."""
    from simulation.bench.select_table import main

    def run(name: str, ratio: float, nmi_start: float, nmi_final: float, used_final: int = 10) -> None:
        select = {
            "scatter": {
                "start": {"ssb": 100.0, "ssw": 100.0, "n": 500, "clusters_used": 10},
                "final": {"ssb": 100.0 * ratio, "ssw": 100.0, "n": 500, "clusters_used": used_final},
            },
            "labelled": {"start": {"nmi": nmi_start}, "final": {"nmi": nmi_final}},
        }
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps({"report": {"select": select}}))

    run("collapse-s0", 0.80, 0.70, 0.50)
    run("gain-a-s0", 0.97, 0.60, 0.63)
    run("gain-b-s0", 0.995, 0.50, 0.52)
    run("fewer-s0", 1.20, 0.60, 0.40, used_final=4)  # under half the clusters: never kept
    (tmp_path / "kfed" / "gain-a-s0").mkdir(parents=True)
    (tmp_path / "kfed" / "gain-a-s0" / "summary.json").write_text(json.dumps({"metrics": {"nmi": 0.61}}))
    assert (
        main([*(str(p) for p in sorted((tmp_path / "runs").iterdir())), "--baseline", str(tmp_path / "kfed")])
        == 0
    )
    rows = {
        line.split(" | ")[0][2:]: line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ")
    }
    assert rows["gain-a-s0"].endswith("| 0.005 | start | +0.00 | -1.00 |")
    assert rows["collapse-s0"].split(" | ")[6] == "start" and rows["gain-b-s0"].split(" | ")[6] == "final"
    assert rows["fewer-s0"].split(" | ")[6] == "start"


def test_loss_on_table_fits_the_k_threshold_without_the_dataset_it_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three datasets: O better at k = 4, softmax(O) better at k = 20 and at k = 150. Left out, k = 150 is
    served by the threshold the other two fit (k >= 20: softmax, no loss); k = 20 by the one k = 4 and
    k = 150 fit (k >= 150: O there, losing its 5-point lead on the final and the kept model)."""
    from simulation.bench.loss_on_table import main

    def run(target: str, name: str, dataset: str, k: int, nmi_final: float) -> None:
        select = {
            "scatter": {
                "start": {"ssb": 100.0, "ssw": 100.0, "n": 500, "clusters_used": k},
                "final": {"ssb": 100.0, "ssw": 100.0, "n": 500, "clusters_used": k},  # final kept
            },
            "labelled": {"start": {"nmi": 0.40}, "final": {"nmi": nmi_final}},
        }
        summary = {"dataset": dataset, "k": k, "report": {"select": select}, "fstc": {"site_skew": 0.1}}
        (tmp_path / target / name).mkdir(parents=True)
        (tmp_path / target / name / "summary.json").write_text(json.dumps(summary))

    for name, dataset, k, (o, soft) in (
        ("few-s0", "agnews", 4, (0.60, 0.50)),
        ("mid-s0", "stackoverflow", 20, (0.50, 0.55)),
        ("many-s0", "clinc150", 150, (0.80, 0.85)),
    ):
        run("scores", name, dataset, k, o)
        run("softmax", name, dataset, k, soft)
    assert main([str(tmp_path / "scores"), str(tmp_path / "softmax"), "--runs"]) == 0
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ")
    }
    assert rows["clinc150"][5:8] == ["k ≥ 20", "softmax", "0.00"]
    assert rows["stackoverflow"][5:8] == ["k ≥ 150", "scores", "10.00"]
    assert rows["agnews"][6:8] == ["scores", "0.00"]
    assert rows["mid-s0"][2:5] == ["0.100", "50.00 / 55.00", "50.00 / 55.00 |"]

    # a published row whose runs are gone (means over its 2 pairs): O far better at k = 64 moves the
    # threshold fitted without CLINC150 to never, so k = 150 gets O and loses its lead
    earlier = tmp_path / "earlier.json"
    row = {"final_gain": -15.0, "kept_gain": 0.0, "loss_scores": 0.0, "loss_softmax": 15.0}
    earlier.write_text(json.dumps({"rows": [{"dataset": "mixed", "k": 64, "pairs": 2, **row}]}))
    assert main([str(tmp_path / "scores"), str(tmp_path / "softmax"), "--earlier", str(earlier)]) == 0
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ")
    }
    assert rows["clinc150"][5:8] == ["never", "scores", "10.00"]
    assert rows["mixed"][1:8] == ["64", "2", "-15.00", "+0.00", "k ≥ 20", "softmax", "15.00"]
    # a published row of a dataset and k whose runs are on disk is replaced by them, not counted twice
    stale = {"dataset": "clinc150", "k": 150, "pairs": 9, **row}
    earlier.write_text(json.dumps({"rows": [stale]}))
    assert main([str(tmp_path / "scores"), str(tmp_path / "softmax"), "--earlier", str(earlier)]) == 0
    out = capsys.readouterr().out
    assert "| clinc150 | 150 | 1 | +5.00 |" in out and "| clinc150 | 150 | 9 |" not in out


def test_the_published_loss_on_rows_fit_the_codes_softmax_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`simulation/bench/loss_on_earlier.json` holds every published pair of the `loss-on` table (their runs
    need ../shared/data and hours); the threshold they fit is the one the code uses."""
    from fedapp.methods.fstc import SOFTMAX_FROM_K
    from simulation.bench.loss_on_table import fit, main, read_earlier

    published = Path(__file__).parents[1] / "simulation" / "bench" / "loss_on_earlier.json"
    rows = read_earlier(published)
    assert {row.k for row in rows if row.dataset == "texts"} >= {24, 25, 26, 28}
    assert fit(rows) == SOFTMAX_FROM_K
    # without any run on disk the command prints the published table and its fit
    gone = tmp_path / "gone"
    assert main([str(gone / "scores"), str(gone / "softmax"), "--earlier", str(published)]) == 0
    out = capsys.readouterr().out
    assert "| texts | 25 | 4 | +2.28 |" in out and f"fitted on all 6 datasets: k ≥ {SOFTMAX_FROM_K}" in out
    assert main([str(gone / "scores"), str(gone / "softmax")]) == 2  # nothing at all: refused


def test_keep_criteria_scores_a_clustering_as_its_federated_messages_would() -> None:
    """`simulation.bench.keep_criteria.criteria`: per node only its clusters at or above the floor count;
    SSB / SSW and the simplified silhouette around the pooled means of what counts equal a direct
    computation on those records."""
    from sklearn.neighbors import NearestNeighbors

    from simulation.bench.keep_criteria import Pair, criteria

    rng = np.random.default_rng(0)
    space = np.concatenate([rng.normal(size=(60, 3)) + 4 * c for c in range(3)])
    labels = np.repeat(np.arange(3), 60)
    ids = rng.permutation(180)
    nodes = [np.stack([ids[:90], labels[ids[:90]]], axis=1), np.stack([ids[90:], labels[ids[90:]]], axis=1)]
    nodes[1][:3, 1] = 3  # three records of node 1 in a cluster of its own: under the floor of 5
    values, used = criteria(space, nodes, 4, 5)
    kept = np.concatenate([nodes[0], nodes[1][3:]])
    x, y = space[kept[:, 0]], kept[:, 1]
    means = np.stack([x[y == c].mean(0) for c in range(3)])
    distances = np.linalg.norm(x[:, None, :] - means[None], axis=2)
    a = distances[np.arange(len(y)), y]
    distances[np.arange(len(y)), y] = np.inf
    b = distances.min(1)
    assert used == 3
    assert values["simplified_silhouette"] == pytest.approx(np.mean((b - a) / np.maximum(a, b)), rel=1e-12)
    chs = calinski_harabasz_score(x, y)
    assert values["ssb_ssw"] == pytest.approx(chs * 2 / (len(y) - 3), rel=1e-9)
    # the neighbours' agreement beyond chance: each node's records among its own 10 nearest, a record in
    # a cluster under the floor on its node asks no question (it may still be a neighbour)
    agree = expected = pairs = 0.0
    for table in nodes:
        own, labels_here = space[table[:, 0]], table[:, 1]
        near = NearestNeighbors(n_neighbors=11).fit(own).kneighbors(own, return_distance=False)[:, 1:]
        sizes = np.bincount(labels_here)
        asks = sizes[labels_here] >= 5
        agree += (labels_here[near[asks]] == labels_here[asks, None]).sum()
        expected += 10 * (sizes[labels_here[asks]] / len(labels_here)).sum()
        pairs += 10 * asks.sum()
    assert values["neighbour_kappa"] == pytest.approx((agree - expected) / (pairs - expected), rel=1e-12)
    nmi = {"fk": 50.0, "f2k": 55.0}
    pair = Pair("s-s0", "s", nmi, {"fk": 4, "f2k": 4}, {"c": {"fk": 0.10, "f2k": 0.098}})
    assert pair.kept("c", 0.0) == "fk" and pair.kept("c", 0.03) == "f2k"
    fewer = Pair("s-s0", "s", nmi, {"fk": 4, "f2k": 1}, {"c": {"fk": 0.1, "f2k": 0.2}})
    assert fewer.kept("c", 0.0) == "fk"  # under half the clusters: never kept


def test_neighbour_agreement_counts_each_querys_nearest_records_in_its_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every query's `neighbours` nearest other records (scikit-learn's NearestNeighbors finds the same),
    in chunks of any size; a query in a cluster under the floor sits out; chance is each cluster's share;
    clean clusters reach kappa 1, labels drawn at random about 0."""
    from sklearn.neighbors import NearestNeighbors

    from fedapp.maths import chunks
    from simulation.bench.keep_criteria import NeighbourAgreement, neighbour_agreement

    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(100, 4)) + 8 * c for c in range(3)])
    truth = np.repeat(np.arange(3), 100)
    noise = rng.integers(0, 3, X.shape[0])
    small = truth.copy()
    small[:3] = 3  # a cluster of three records: under a floor of 5
    nearest = NearestNeighbors(n_neighbors=6).fit(X).kneighbors(X, return_distance=False)[:, 1:]
    whole = neighbour_agreement(X, [truth, noise, small], 4, 5, seed=0, neighbours=5, queries=300)
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 37)  # many uneven chunks of reference records
    assert neighbour_agreement(X, [truth, noise, small], 4, 5, seed=0, neighbours=5, queries=300) == whole
    assert whole[0] == NeighbourAgreement(1500.0, pytest.approx(500.0), 1500)
    assert whole[0].kappa == pytest.approx(1.0)
    assert whole[1].agree == (noise[nearest] == noise[:, None]).sum()
    assert abs(whole[1].kappa) < 0.1  # type: ignore[arg-type]
    assert whole[2].pairs == 5 * 297  # the three under the floor sit out as queries
    sampled = neighbour_agreement(X, [noise], 3, 1, seed=1, neighbours=5, queries=50)[0]
    assert (
        sampled.pairs == 250
        and sampled == neighbour_agreement(X, [noise], 3, 1, seed=1, neighbours=5, queries=50)[0]
    )
    assert (sampled + whole[1]).pairs == 1750


def test_composite_texts_take_an_equal_sample_of_the_first_classes_of_each_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--classes N` keeps the first N classes of every set named, `per_class` seeded texts each, labelled
    "<set>:<class>", whitespace collapsed; `--classes N M` N of the first set and M of the second, the
    longer cut's texts without its last class (the 25-class file is the 26-class one less a class); a
    class too small to sample is refused, and so is a count of classes for each set that misses one."""
    from types import SimpleNamespace

    from simulation.bench import composite_texts

    def fake(name: str) -> SimpleNamespace:
        y = np.repeat(np.arange(5), 4)
        return SimpleNamespace(n_classes=5, y=y, texts=[f"{name}  text\n{i}" for i in range(len(y))])

    monkeypatch.setattr(composite_texts, "load_dataset", fake)
    found = composite_texts.rows(3, seed=0, sets=("agnews", "biomedical"), classes=(2, 2))
    labels = [label for _, label in found]
    assert labels == ["agnews:0"] * 3 + ["agnews:1"] * 3 + ["biomedical:0"] * 3 + ["biomedical:1"] * 3
    assert all("  " not in text and "\n" not in text for text, _ in found)
    assert found == composite_texts.rows(3, seed=0, sets=("agnews", "biomedical"), classes=(2, 2))
    assert composite_texts.rows(3, seed=0, sets=("agnews", "biomedical"), classes=(2, 1)) == found[:9]
    assert len(composite_texts.rows(3, seed=0, sets=("agnews",))) == 15  # every class by default
    with pytest.raises(ValueError, match="fewer than 5"):
        composite_texts.rows(5, seed=0, sets=("agnews",))
    with pytest.raises(SystemExit):
        composite_texts.main(["unused.csv", "--sets", "agnews", "biomedical", "--classes", "1", "2", "3"])
    assert "one a set (2), got 3" in capsys.readouterr().err
    # CLINC150 only when named: its first intents, a real set between 20 and 150 clusters
    assert "clinc150" not in composite_texts.SETS
    assert [label for _, label in composite_texts.rows(2, seed=0, sets=("clinc150",), classes=(2,))] == [
        "clinc150:0"
    ] * 2 + ["clinc150:1"] * 2
    out = tmp_path / "clinc150-intents2.csv"
    assert composite_texts.main([str(out), "--per-class", "2", "--sets", "clinc150", "--classes", "2"]) == 0
    assert out.read_text().count("clinc150:") == 4


def test_a_file_cut_from_clinc150_is_clinc150_in_the_loss_on_fit() -> None:
    """Left out together: CLINC150's intents, its domains and a file of its first intents (they share
    texts); a composite of the other sets is one dataset by its file's stem without digits."""
    from simulation.bench.loss_on_table import _dataset

    assert _dataset({"dataset": "csv:results/composite/clinc150-intents30.csv"}) == "clinc150"
    assert _dataset({"dataset": "clinc150-domains"}) == _dataset({"dataset": "clinc150"}) == "clinc150"
    assert _dataset({"dataset": "csv:results/composite/texts64.csv"}) == "texts"
