"""k-FED and FFCM: client maths on arrays, then whole federations on `digits` (in-process engine)."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from clients.ffcm import FFCMClient, fcm_memberships, membership_sums
from clients.kfed import local_centres
from fedapp.app.client_app import client_fn
from fedapp.app.inprocess import run_inprocess
from fedapp.app.server_app import server_fn
from fedapp.config.run import parse_run_config
from fedapp.datasets.local import load_run_dataset
from fedapp.launch.resolve import build_overrides
from fedapp.maths.clustering import nearest_centre
from fedapp.methods.ffcm import FFCMConfig
from fedapp.methods.kfed import local_restarts
from fedapp.privacy.floor import CLIENT_MIN_CLUSTER, PrivacyFloorError, merge_small_clusters
from simulation.experiments import ExperimentError, load_experiment, run_experiment
from simulation.runner import execute
from strategies.ffcm import centres_from_totals

NMI_TOLERANCE = 0.05  # acceptance: federated NMI within this of centralized k-means on the same data


def _blobs(n_per_blob: int = 40, seed: int = 0) -> np.ndarray:
    """Three well-separated 2-D blobs."""
    rng = np.random.default_rng(seed)
    means = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return np.concatenate([mean + rng.normal(size=(n_per_blob, 2)) for mean in means])


def _naive_memberships(X: np.ndarray, centres: np.ndarray, m: float) -> np.ndarray:
    """Bezdek's textbook formula, loop by loop: u_ij = 1 / sum_l (d_ij / d_il)^(2/(m-1))."""
    U = np.empty((X.shape[0], centres.shape[0]))
    for i, x in enumerate(X):
        dist = [np.linalg.norm(x - c) for c in centres]
        for j in range(centres.shape[0]):
            U[i, j] = 1.0 / sum(
                (dist[j] / dist[other]) ** (2.0 / (m - 1.0)) for other in range(centres.shape[0])
            )
    return U


def _run(tmp_path: Path, name: str, **overrides: Any) -> dict[str, Any]:
    """One in-process run on digits (10 clients, IID unless overridden); returns its summary."""
    base = {"dataset": "digits", "num-clients": 10, "seed": 0, **overrides}
    return execute(build_overrides(base, tmp_path / name), engine="inprocess", quiet=True)


# ---------------------------------------------------------------------------------------- k-FED maths
def test_local_centres_shapes_and_counts() -> None:
    X = _blobs()
    centres, counts, merged = local_centres(X, 5, seed=0)
    assert centres.shape == (5, 2) and centres.dtype == np.float64 and merged == 0
    assert counts.shape == (5,) and counts.dtype == np.int64
    assert counts.sum() == X.shape[0] and (counts > 0).all()
    np.testing.assert_array_equal(np.bincount(nearest_centre(X, centres), minlength=5), counts)


def test_local_centres_keep_the_privacy_floor_whatever_k_prime_asks() -> None:
    X = np.random.default_rng(0).normal(size=(60, 3))
    centres, counts, _ = local_centres(X, 100_000, seed=0)  # the server asks for every row as a centre
    assert len(centres) <= 60 // CLIENT_MIN_CLUSTER and (counts >= CLIENT_MIN_CLUSTER).all()
    assert counts.sum() == 60 and not (np.abs(X[:, None, :] - centres[None]).max(2) < 1e-12).any()
    centres, counts, merged = local_centres(X, 12, seed=0, floor=10)  # a node's higher floor
    assert (counts >= 10).all() and len(centres) <= 6
    with pytest.raises(PrivacyFloorError, match="fewer than the privacy floor"):
        local_centres(X[:3], 10, seed=0)


def test_a_cluster_below_the_floor_merges_into_its_nearest_neighbour() -> None:
    X = np.vstack([np.zeros((10, 2)), np.full((10, 2), 10.0), np.full((2, 2), 9.0)])  # a pair near blob 2
    labels, merged = merge_small_clusters(X, np.repeat([0, 1, 2], [10, 10, 2]), floor=5)
    assert merged == 1 and labels[-2:].tolist() == [1, 1]


def test_local_centres_are_seeded() -> None:
    X = np.random.default_rng(3).normal(size=(60, 4))
    first, again = local_centres(X, 6, seed=7), local_centres(X, 6, seed=7)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])


def test_local_restarts_key_sets_the_local_kmeans_restarts(tmp_path: Path) -> None:
    """`kfed.local-restarts` reaches the client's k-means; fewer restarts cost less and still cluster."""
    one = _run(tmp_path, "r1", method="kfed", **{"kfed.local-restarts": 1})
    ten = _run(tmp_path, "r10", method="kfed", **{"kfed.local-restarts": 10})
    auto = _run(tmp_path, "auto", method="kfed")  # 0: 10 restarts below 50,000 records a client
    assert one["config"]["kfed.local-restarts"] == 1 and ten["config"]["kfed.local-restarts"] == 10
    assert one["metrics"] != ten["metrics"] and one["metrics"]["nmi"] > 0.5
    assert auto["config"]["kfed.local-restarts"] == 0 and auto["metrics"] == ten["metrics"]


def test_auto_restarts_pay_only_on_small_clients() -> None:
    assert local_restarts(0, 1_797) == 10 and local_restarts(0, 250_000) == 1
    assert local_restarts(3, 250_000) == 3 and local_restarts(1, 100) == 1


# ----------------------------------------------------------------------------------------- FCM maths
@pytest.mark.parametrize("m", [1.1, 1.5, 2.0, 3.0])
def test_fcm_memberships_are_a_distribution_matching_bezdek(m: float) -> None:
    X = _blobs(10)
    centres = np.array([[0.5, 0.5], [5.0, 1.0], [1.0, 5.0]])
    U = fcm_memberships(X, centres, m)
    assert U.shape == (30, 3) and (U >= 0).all()
    np.testing.assert_allclose(U.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(U, _naive_memberships(X, centres, m), rtol=1e-9, atol=1e-12)


def test_a_sample_on_a_centre_belongs_to_it() -> None:
    centres = np.array([[0.0, 0.0], [3.0, 4.0], [-2.0, 7.0]])
    U = fcm_memberships(centres.copy(), centres, 2.0)
    np.testing.assert_allclose(U, np.eye(3), atol=1e-12)


@pytest.mark.parametrize("scale", [1e-100, 1e100])
@pytest.mark.parametrize("m", [1.05, 1.1, 2.0])
def test_fcm_memberships_are_stable_at_extreme_scales(scale: float, m: float) -> None:
    # at m = 1.1, d^(-2/(m-1)) = d^-20 under- or overflows long before d does: log space must cope
    X, centres = _blobs(10) * scale, np.array([[0.5, 0.5], [5.0, 1.0], [1.0, 5.0]]) * scale
    U = fcm_memberships(X, centres, m)
    assert np.isfinite(U).all() and (U >= 0).all()
    np.testing.assert_allclose(U.sum(1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(U.argmax(1), nearest_centre(X, centres))


@pytest.mark.parametrize("m", [1.1, 2.0])
def test_membership_sums_match_a_naive_loop(m: float) -> None:
    X = _blobs(15)
    centres = np.array([[1.0, 0.0], [5.0, 0.5], [0.0, 5.0]])
    U = fcm_memberships(X, centres, m)
    sums, mass = np.zeros_like(centres), np.zeros(3)
    for i in range(X.shape[0]):
        for j in range(3):
            sums[j] += U[i, j] ** m * X[i]
            mass[j] += U[i, j] ** m
    got_sums, got_mass = membership_sums(X, centres, m)
    np.testing.assert_allclose(got_sums, sums, rtol=1e-12)
    np.testing.assert_allclose(got_mass, mass, rtol=1e-12)


def test_federated_sums_equal_the_pooled_fcm_step() -> None:
    X, m = _blobs(50, seed=4), 1.1
    centres = np.array([[1.0, 1.0], [5.0, -1.0], [-1.0, 5.0]])
    parts = np.split(np.random.default_rng(0).permutation(X.shape[0]), [20, 90])  # uneven clients
    replies = [membership_sums(X[idx], centres, m) for idx in parts]
    pooled_sums, pooled_mass = membership_sums(X, centres, m)
    np.testing.assert_allclose(sum(s for s, _ in replies), pooled_sums, rtol=1e-12)
    np.testing.assert_allclose(sum(w for _, w in replies), pooled_mass, rtol=1e-12)
    federated = centres_from_totals(sum(s for s, _ in replies), sum(w for _, w in replies))
    np.testing.assert_allclose(federated, pooled_sums / pooled_mass[:, None], rtol=1e-12)


def test_ffcm_clients_with_one_local_iteration_give_the_pooled_sums() -> None:
    cfg = parse_run_config({"method": "ffcm", "dataset": "digits", "num-clients": 3})
    pooled = load_run_dataset(cfg).features
    centres = pooled[[0, 100, 200, 300, 400, 500, 600, 700, 800, 900]]
    fuzziness = cfg.params(FFCMConfig).fuzziness
    config = {"phase": "update", "fuzziness": fuzziness, "local-iters": 1, "server-round": 2}
    sums, mass, examples = 0.0, 0.0, 0
    for pid in range(3):
        node = {"partition-id": pid, "num-partitions": 3}
        context = Context(run_id=0, node_id=pid + 1, node_config=node, state=RecordDict(), run_config={})
        (client_sums, client_mass), n, metrics = FFCMClient(context, cfg).fit([centres], config)
        assert metrics["partition-id"] == pid and metrics["k"] == 10
        sums, mass, examples = sums + client_sums, mass + client_mass, examples + n
    assert examples == pooled.shape[0]
    pooled_sums, pooled_mass = membership_sums(pooled, centres, fuzziness)
    np.testing.assert_allclose(sums, pooled_sums, rtol=1e-9)
    np.testing.assert_allclose(mass, pooled_mass, rtol=1e-9)


def test_ffcm_rounds_are_centralized_fcm_steps(tmp_path: Path) -> None:
    """Rounds 2 and 3 of a federation move the centres exactly as two FCM steps on the pooled data."""
    overrides = build_overrides(
        {"method": "ffcm", "dataset": "digits", "num-clients": 4, "ffcm.delta": 0.0}, tmp_path
    )
    initial, _ = run_inprocess(server_fn, client_fn, {**overrides, "num-rounds": 1}, 4)
    final, _ = run_inprocess(server_fn, client_fn, {**overrides, "num-rounds": 3}, 4)
    pooled = load_run_dataset(parse_run_config(overrides)).features
    centres = initial.centres
    for _ in range(2):
        sums, mass = membership_sums(pooled, centres, final.params.fuzziness)
        centres = sums / mass[:, None]
    np.testing.assert_allclose(final.centres, centres, rtol=1e-9, atol=1e-12)
    assert len(final.shifts) == 2


# ------------------------------------------------------------------------------- in-process federations
@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Centralized k-means, k-FED and FFCM (default config, up to 50 rounds) on digits, 10 IID clients."""
    root = tmp_path_factory.mktemp("digits")
    return {
        "kmeans": _run(root, "kmeans", method="kmeans"),
        "kfed": _run(root, "kfed", method="kfed"),
        "ffcm": _run(root, "ffcm", method="ffcm", **{"num-rounds": 50}),
    }


@pytest.mark.parametrize("method", ["kfed", "ffcm"])
def test_acceptance_nmi_close_to_centralized_kmeans(
    digits_runs: dict[str, dict[str, Any]], method: str
) -> None:
    centralized = digits_runs["kmeans"]["metrics"]["nmi"]
    federated = digits_runs[method]["metrics"]["nmi"]
    assert abs(federated - centralized) <= NMI_TOLERANCE, (
        f"{method} NMI {federated:.4f} vs k-means {centralized:.4f}"
    )


def test_run_summaries_describe_the_run(digits_runs: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    kfed, ffcm = digits_runs["kfed"], digits_runs["ffcm"]
    assert kfed["rounds"] == 1 and kfed["stop_reason"] == "one-shot"
    assert kfed["num_clients"] == 10 and kfed["k"] == 10
    assert ffcm["config"]["ffcm.fuzziness"] == 1.1
    assert 1 < ffcm["rounds"] <= 50
    assert len(ffcm["centre_shift_per_round"]) == ffcm["rounds"] - 1
    if ffcm["rounds"] < 50:  # converged early: the last shift met the threshold
        assert ffcm["centre_shift_per_round"][-1] <= ffcm["config"]["ffcm.delta"]
    for summary in (kfed, ffcm):
        assert summary["comm_bytes"]["up"] > 0 and summary["comm_bytes"]["down"] >= 0
        assert summary["comm_bytes"]["eval_up"] > 0
    assert digits_runs["kmeans"]["comm_bytes"]["total_mb"] == 0.0


@pytest.mark.parametrize(("method", "rounds"), [("kfed", 1), ("ffcm", 50)])
def test_same_seed_same_metrics(
    digits_runs: dict[str, dict[str, Any]], tmp_path: Path, method: str, rounds: int
) -> None:
    again = _run(tmp_path, method, method=method, **{"num-rounds": rounds})
    assert again["metrics"] == digits_runs[method]["metrics"]
    assert again["comm_bytes"]["up"] == digits_runs[method]["comm_bytes"]["up"]
    assert again["rounds"] == digits_runs[method]["rounds"]


@pytest.mark.parametrize(("method", "num_clients"), [("kfed", 3), ("kfed", 17), ("ffcm", 5)])
def test_other_client_counts(tmp_path: Path, method: str, num_clients: int) -> None:
    summary = _run(tmp_path, method, method=method, **{"num-clients": num_clients, "num-rounds": 5})
    assert summary["num_clients"] == num_clients
    assert summary["metrics"]["nmi"] > 0.6
    rounds = json.loads((tmp_path / method / "rounds.json").read_text())
    assert rounds[-1]["evaluated"] == 1797  # every sample is labelled by exactly one client


@pytest.mark.parametrize("method", ["kfed", "ffcm"])
def test_p_heterogeneous_partition(tmp_path: Path, method: str) -> None:
    summary = _run(tmp_path, method, method=method, partition="p-hetero", p=0.8, **{"num-rounds": 5})
    assert summary["config"]["partition"] == "p-hetero" and summary["config"]["p"] == 0.8
    assert summary["metrics"]["nmi"] > 0.5
    rounds = json.loads((tmp_path / method / "rounds.json").read_text())
    assert rounds[-1]["evaluated"] == 10 * (1797 // 10)  # p-hetero leaves N mod clients samples unused


def test_experiment_file_runs_every_seed_and_writes_a_table(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(
        '[experiment]\nname = "tiny"\nengine = "inprocess"\nseeds = [0, 1]\nmetrics = ["nmi"]\n'
        '[defaults]\ndataset = "digits"\nnum-clients = 3\n'
        '[[runs]]\nlabel = "k-FED"\nmethod = "kfed"\npaper = { nmi = 0.7 }\n'
    )
    messages: list[str] = []
    results = run_experiment(load_experiment(spec), tmp_path / "out", progress=messages.append)
    assert [s["seed"] for s in results["k-FED"]] == [0, 1] and len(messages) == 2
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| k-FED |" in table and "NMI (paper)" in table and "70.00" in table
    assert json.loads((tmp_path / "out" / "results.json").read_text()).keys() == {"k-FED"}
    assert (tmp_path / "out" / "k-FED-s1" / "summary.json").exists()


def test_a_methods_own_defaults_reach_only_its_runs(tmp_path: Path) -> None:
    """`[defaults.fstc]` pins FSTC's keys in a file whose other rows are baselines without them."""
    spec = tmp_path / "mixed.toml"
    spec.write_text(
        '[experiment]\nname = "mixed"\n[defaults]\ndataset = "texts-demo"\n'
        '[defaults.fstc]\ninit-merge = "weighted"\nlambda = 0.5\n'
        '[[runs]]\nlabel = "kfed"\nmethod = "fsbert-kfed"\n'
        '[[runs]]\nlabel = "fstc"\nmethod = "fstc"\nfstc.lambda = 2.0\n'
        '[[runs]]\nlabel = "stc"\nmethod = "fstc-stc"\n'
    )
    runs = {run.label: run.overrides for run in load_experiment(spec).runs}
    assert not any(key.startswith("fstc.") for key in runs["kfed"])
    assert runs["fstc"]["fstc.init-merge"] == "weighted" and runs["fstc"]["fstc.lambda"] == 2.0  # row wins
    assert runs["stc"]["fstc.init-merge"] == "weighted" and runs["stc"]["fstc.lambda"] == 0.5


SIMULATION_DIR = Path(__file__).resolve().parents[1] / "simulation"
SHIPPED_EXPERIMENTS = sorted(path for path in SIMULATION_DIR.rglob("*.toml") if "presets" not in path.parts)


@pytest.mark.parametrize("path", SHIPPED_EXPERIMENTS, ids=lambda path: str(path.relative_to(SIMULATION_DIR)))
def test_every_shipped_experiment_file_validates(path: Path) -> None:
    """A sweep of hour-long runs must not fail on a typo in its last row: every file we ship loads."""
    experiment = load_experiment(path)
    assert experiment.runs and len({spec.label for spec in experiment.runs}) == len(experiment.runs)


def test_experiment_resume_reuses_finished_runs_and_only_selects_rows(tmp_path: Path) -> None:
    spec = tmp_path / "two.toml"
    spec.write_text(
        '[experiment]\nname = "two"\nengine = "inprocess"\nseeds = [0]\nmetrics = ["nmi"]\n'
        '[defaults]\ndataset = "digits"\nnum-clients = 3\n'
        '[[runs]]\nlabel = "a"\nmethod = "kfed"\n[[runs]]\nlabel = "b"\nmethod = "kfed"\nkfed.local-k = 12\n'
    )
    experiment, out = load_experiment(spec), tmp_path / "out"
    first: list[str] = []
    run_experiment(experiment, out, resume=True, only={"a"}, progress=first.append)
    assert len(first) == 1 and "reused" not in first[0] and not (out / "b-s0").exists()
    again: list[str] = []
    results = run_experiment(experiment, out, resume=True, progress=again.append)
    assert "reused" in again[0] and "reused" not in again[1]  # row a is reused, row b runs
    assert results["b"][0]["config"]["kfed.local-k"] == 12
    with pytest.raises(ExperimentError, match="'c'"):
        run_experiment(experiment, out, resume=True, only={"c"})
    # a sweep run a label at a time ends with one whole table: finished rows stay in it
    third: list[str] = []
    results = run_experiment(experiment, out, resume=True, only={"b"}, progress=third.append)
    assert list(results) == ["a", "b"] and len(third) == 1 and "reused" in third[0]
    assert json.loads((out / "results.json").read_text()).keys() == {"a", "b"}
    assert "| a |" in (out / "table.md").read_text()
    # a run made before a key existed (or its default changed) is not today's configuration: rerun
    path = out / "a-s0" / "summary.json"
    stale = json.loads(path.read_text())
    del stale["config"]["kfed.local-k"]
    path.write_text(json.dumps(stale))
    fourth: list[str] = []
    results = run_experiment(experiment, out, resume=True, only={"b"}, progress=fourth.append)
    assert list(results) == ["b"]  # row a is no longer finished under today's configuration
    run_experiment(experiment, out, resume=True, only={"a"}, progress=fourth.append)
    assert "reused" not in fourth[-1]


def test_small_kmeans_runs_on_one_thread_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pools start at two threads here, whatever the environment says (scripts/test.sh runs the suite
    with one), so the single thread seen is the code's limit."""
    from sklearn.cluster import KMeans, _kmeans
    from threadpoolctl import threadpool_info, threadpool_limits

    from fedapp.maths import clustering

    seen: list[int] = []
    lloyd = _kmeans._kmeans_single_lloyd

    def spy(*args: object, n_threads: int, **kwargs: object) -> object:
        blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        seen.extend([n_threads, max(blas, default=1)])
        return lloyd(*args, n_threads=n_threads, **kwargs)

    X = np.random.default_rng(0).normal(size=(300, 8))
    with threadpool_limits(limits=2):
        before = [p["num_threads"] for p in threadpool_info()]
        assert max(before) == 2
        monkeypatch.setattr(_kmeans, "_kmeans_single_lloyd", spy)
        centres, labels = clustering.kmeans(X, 4, seed=3)
        assert seen == [1, 1] * 10  # every restart: scikit-learn's OpenMP loops and OpenBLAS alike
        assert [p["num_threads"] for p in threadpool_info()] == before  # the limit is lifted afterwards
    monkeypatch.setattr(_kmeans, "_kmeans_single_lloyd", lloyd)
    reference = KMeans(n_clusters=4, n_init=10, random_state=3).fit(X)
    np.testing.assert_array_equal(labels, reference.labels_)
    np.testing.assert_allclose(centres, reference.cluster_centers_, rtol=1e-12, atol=1e-12)


def test_kmeans_without_scikit_learns_private_kernels_fits_the_same_through_its_estimator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kmeans` runs scikit-learn's Lloyd kernel directly; a scikit-learn that moved it gets the estimator."""
    from sklearn.cluster import KMeans, _k_means_common

    from fedapp.maths.clustering import kmeans

    fits: list[KMeans] = []
    fit = KMeans.fit
    monkeypatch.setattr(KMeans, "fit", lambda self, *a, **kw: fits.append(self) or fit(self, *a, **kw))

    X = np.random.default_rng(4).normal(size=(200, 6))
    weights = np.random.default_rng(5).integers(1, 9, 200).astype(np.float64)
    direct = kmeans(X, 7, 2, sample_weight=weights, n_init=4)
    monkeypatch.delattr(_k_means_common, "_is_same_clustering")  # the estimator holds its own reference
    assert not fits
    estimator = kmeans(X, 7, 2, sample_weight=weights, n_init=4)
    assert len(fits) == 1
    for a, b in zip(direct, estimator, strict=True):
        np.testing.assert_array_equal(a, b)


def test_kmeans_refuses_what_scikit_learns_estimator_refuses() -> None:
    """Running scikit-learn's kernels directly keeps its estimator's refusals: a NaN or infinite record or
    weight, a weight count that is not the record count (a NaN would otherwise spread to every centre)."""
    from fedapp.maths.clustering import kmeans

    X = np.random.default_rng(0).normal(size=(50, 3))
    for bad in (np.nan, np.inf):
        broken = X.copy()
        broken[7, 1] = bad
        with pytest.raises(ValueError, match="NaN or infinity"):
            kmeans(broken, 3, 0)
        with pytest.raises(ValueError, match="NaN or infinity"):
            kmeans(X, 3, 0, sample_weight=np.where(np.arange(50) == 3, bad, 1.0))
    with pytest.raises(ValueError, match="one weight a record, got \\(49,\\) for 50 records"):
        kmeans(X, 3, 0, sample_weight=np.ones(49))


def test_a_thread_limit_taken_before_scikit_learn_loads_still_limits_it() -> None:
    """A chunked distance can take the first thread limit before anything imports scikit-learn, whose
    OpenMP runtime and SciPy's OpenBLAS load later; the limit must still reach them (a fresh process)."""
    import os
    import subprocess
    import sys

    script = (
        "import numpy as np\n"
        "from fedapp.maths.clustering import nearest_centre\n"
        "from fedapp.maths.threads import one_blas_thread, one_openmp_thread\n"
        "nearest_centre(np.zeros((4, 2)), np.ones((2, 2)))\n"
        "import sklearn.cluster\n"
        "from threadpoolctl import threadpool_info\n"
        "from sklearn.utils._openmp_helpers import _openmp_effective_n_threads\n"
        "with one_openmp_thread(), one_blas_thread():\n"
        "    print(_openmp_effective_n_threads(), max(p['num_threads'] for p in threadpool_info()))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"], out.stdout


@pytest.mark.parametrize(
    ("n", "d", "k", "n_init", "weighted", "duplicates"),
    [
        (40, 2, 1, 1, False, False),
        (40, 2, 40, 3, True, False),
        (300, 8, 12, 10, True, True),
        (600, 64, 30, 3, True, False),
        (250, 384, 20, 3, False, True),
        (900, 10, 57, 1, True, False),
        (6000, 4, 8, 3, False, False),  # restarts seeded two, then one, at a time (`SEED_BATCH_CELLS`)
    ],
)
def test_kmeans_seeding_fits_what_scikit_learns_kmeans_plus_plus_fits(
    n: int, d: int, k: int, n_init: int, weighted: bool, duplicates: bool
) -> None:
    """Our k-means++ seeding is scikit-learn's, to the last bit: every selection table, every method's
    local and server clustering stays as measured with `init="k-means++"`."""
    import warnings

    from sklearn.cluster import KMeans

    from fedapp.maths.clustering import kmeans
    from fedapp.maths.threads import one_blas_thread, one_openmp_thread

    rng = np.random.default_rng(n + d + k)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10.0, size=d)
    if duplicates:
        X[: n // 3] = X[0]
    weights = rng.integers(1, 60, n).astype(np.float64) if weighted else None
    for seed in (0, 7):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fewer distinct points than k with the duplicates
            centres, labels = kmeans(X, k, seed, sample_weight=weights, n_init=n_init)
            with one_openmp_thread(), one_blas_thread():  # as `kmeans` runs a fit this small
                reference = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(
                    X, sample_weight=weights
                )
        np.testing.assert_array_equal(centres, reference.cluster_centers_)
        np.testing.assert_array_equal(labels, reference.labels_)
