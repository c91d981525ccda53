"""FSTC end to end on the embedded `texts-demo` set (no ../shared/data): in-process federations with the
bundled all-MiniLM-L6-v2 (embeddings cached in a temporary folder), both encoder modes, dropout, and the
client's state across rounds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from clients.fstc import FSTCClient
from fedapp.config.run import parse_run_config
from fedapp.launch.resolve import build_overrides
from fedapp.maths.fstc import initial_centres
from fedapp.methods.fstc import FSTCConfig
from fedapp.models.fstc import fstc_model
from fedapp.neural.glue import state_arrays, state_schema
from simulation.runner import execute

QUICK = {"fstc.local-iters": 20, "fstc.batch-size": 50, "fstc.warmup-iters": 10, "fstc.label-updates": 4}


pytestmark = pytest.mark.usefixtures("text_embedding_cache")


def _run(tmp_path: Path, name: str, **overrides: Any) -> dict[str, Any]:
    base = {"method": "fstc", "dataset": "texts-demo", "num-clients": 2, "num-rounds": 3, "seed": 0, **QUICK}
    base.update(overrides)
    return execute(build_overrides(base, tmp_path / name), engine="inprocess", quiet=True)


def test_fstc_runs_end_to_end_and_clusters_the_demo_topics(tmp_path: Path) -> None:
    summary = _run(tmp_path, "fstc", **{"num-rounds": 4})
    assert summary["stop_reason"] == "final model averaged"
    assert summary["rounds"] == 4 and summary["k"] == 4
    assert summary["metrics"]["acc"] >= 0.9 and summary["metrics"]["nmi"] >= 0.8
    per_round = summary["fstc"]["train_per_round"]
    assert [row["round"] for row in per_round] == [2, 3, 4]
    assert all(row["train-steps"] == QUICK["fstc.local-iters"] for row in per_round)
    rounds = json.loads((tmp_path / "fstc" / "rounds.json").read_text())
    assert [row["round"] for row in rounds] == [4]  # only the averaged global model is evaluated
    # what crossed the wire: round 2 down = C̃ + initial model, later rounds C̃ only (K x D float64)
    per_round_bytes = summary["comm_bytes"]["per_round"]
    assert per_round_bytes["2"]["down"] > 10 * per_round_bytes["3"]["down"]


def test_same_seed_same_result(tmp_path: Path) -> None:
    first, again = _run(tmp_path, "a", **{"num-rounds": 2}), _run(tmp_path, "b", **{"num-rounds": 2})
    assert first["metrics"] == again["metrics"]
    untimed = [
        [
            {key: value for key, value in row.items() if key != "train-seconds"}
            for row in run["fstc"]["train_per_round"]
        ]
        for run in (first, again)
    ]
    assert untimed[0] == untimed[1]


def test_the_mixture_runs_on_one_blas_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBLAS threads on the N x K mixture made a contended 2-core run 2.2x slower
    (fedapp/maths/threads.py). Every mixture fit runs inside the client's `one_blas_thread` block, on one
    BLAS thread (the block's own effect is tested in a fresh process with two threads in
    tests/test_kfed_ffcm.py: scripts/test.sh runs the suite with one)."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    from threadpoolctl import threadpool_info

    import clients.fstc
    from fedapp.maths.fstc import GaussianUniformMixture

    seen: list[tuple[int, int]] = []
    fit, limit, inside = GaussianUniformMixture.fit_responsibilities, clients.fstc.one_blas_thread, [0]

    @contextmanager
    def counted() -> Iterator[None]:
        with limit():
            inside[0] += 1
            try:
                yield
            finally:
                inside[0] -= 1

    def spy(self: GaussianUniformMixture, *args: Any, **kwargs: Any) -> np.ndarray:
        threads = max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=1)
        seen.append((inside[0], threads))
        return fit(self, *args, **kwargs)

    before = {p["filepath"]: p["num_threads"] for p in threadpool_info()}
    monkeypatch.setattr(GaussianUniformMixture, "fit_responsibilities", spy)
    monkeypatch.setattr(clients.fstc, "one_blas_thread", counted)
    _run(tmp_path, "threads", **{"num-rounds": 2})
    assert seen and all(blocks >= 1 and threads == 1 for blocks, threads in seen), seen
    after = {p["filepath"]: p["num_threads"] for p in threadpool_info()}
    assert {path: after[path] for path in before} == before  # lifted after each client call (the run
    # may load another pool: torch's OpenMP when this test runs first)


@pytest.mark.parametrize("method", ["fstc-stc", "fstc-rstc"])
def test_ablations_run_and_send_no_centres_while_training(tmp_path: Path, method: str) -> None:
    summary = _run(tmp_path, method, method=method, **{"num-rounds": 4})
    assert summary["metrics"]["acc"] >= 0.8
    per_round_bytes = summary["comm_bytes"]["per_round"]
    assert per_round_bytes["3"]["down"] < 1000  # configs only: no C̃ after the first training round


def test_dropout_half_the_clients_still_completes(tmp_path: Path) -> None:
    summary = _run(tmp_path, "dropout", **{"num-clients": 4, "num-rounds": 4, "dropout-rate": 0.5})
    assert summary["stop_reason"] == "final model averaged" and summary["metrics"]["acc"] > 0.5
    sat_out = [record["dropped"] for record in summary["participation"].values()]
    assert all(len(dropped) == 2 for dropped in sat_out)


@pytest.mark.parametrize("centres", ["local", "batch"])
def test_alignment_on_local_or_batch_centres(tmp_path: Path, centres: str) -> None:
    summary = _run(tmp_path, centres, **{"num-rounds": 4, "fstc.align-centres": centres, "fstc.lambda": 1.0})
    assert summary["status"] == "converged" and summary["config"]["fstc.align-centres"] == centres
    assert summary["metrics"]["acc"] >= 0.9
    alignment = [row["train-alignment"] for row in summary["fstc"]["train_per_round"]]
    assert all(math.isfinite(value) and value >= 0 for value in alignment)


def test_init_with_representations_is_an_option(tmp_path: Path) -> None:
    summary = _run(tmp_path, "reps", **{"fstc.init": "representations", "num-rounds": 2})
    assert summary["fstc"]["init"] == "representations"
    # 2 clients x 200 texts x 384 float32 went up in round 1
    assert summary["comm_bytes"]["per_round"]["1"]["up"] >= 400 * 384 * 4


def test_fine_tune_mode_trains_the_encoder_on_tiny_inputs() -> None:
    """One client, fine-tune mode: Φ's weights move (Adam 5e-6) and travel in the final reply."""
    cfg = parse_run_config(
        {
            "method": "fstc",
            "dataset": "texts-demo",
            "num-clients": 10,
            "num-rounds": 2,
            "fstc.encoder": "fine-tune",
            "fstc.adapter-hidden": 0,
            "fstc.local-iters": 3,
            "fstc.batch-size": 8,
            "fstc.warmup-iters": 1,
            "fstc.lr-encoder": 1e-3,  # large enough to see a change after 3 steps
        }
    )
    context = Context(0, 1, {"partition-id": 0, "num-partitions": 10}, RecordDict(), dict(cfg.to_dict()))
    centres, counts = FSTCClient(context, cfg).fit([], {"phase": "init"})[0]
    model = fstc_model(cfg.params(FSTCConfig), 4, None, cfg.embedding_model)
    initial = state_arrays(model)
    global_centres = initial_centres([centres], [counts], 4, seed=0)
    config = {"phase": "train", "with-centres": True, "with-model": True, "final": True}
    reply, n, metrics = FSTCClient(context, cfg).fit([global_centres, *initial], config)
    assert n == 40 and metrics["train-steps"] == 3 and np.isfinite(metrics["train-loss"])
    trained = reply[2:]
    assert len(trained) == len(initial)
    names = state_schema(model).names
    moved = {name for name, a, b in zip(names, initial, trained, strict=True) if not np.array_equal(a, b)}
    assert any(name.startswith("encoder.") for name in moved) and any(
        name.startswith("head.") for name in moved
    )


def test_pretokenized_batches_equal_tokenizing_each_batch() -> None:
    """Fine-tune mode tokenizes every text once: a batch cut from it (and one pass over stacked views)
    gives what tokenizing the batch alone and one pass per view give."""
    import torch

    from clients.fstc import LocalInputs
    from fedapp.features.embeddings import DEFAULT_MODEL

    params = parse_run_config(
        {"method": "fstc", "dataset": "texts-demo", "fstc.encoder": "fine-tune", "fstc.adapter-hidden": 0}
    )
    model = fstc_model(params.params(FSTCConfig), 3, None, DEFAULT_MODEL).eval()
    texts = ["short", "a somewhat longer title about python lists", "sql join", "x " * 60, "git rebase"]
    views = [texts, [t.upper() for t in texts], [t + " please" for t in texts]]
    inputs = LocalInputs(views, torch.device("cpu"))
    inputs.tokenize(model.encoder)
    indices = np.array([2, 0, 4])
    alone = model.encoder.tokenize([texts[i] for i in indices])
    cut = inputs.batch(indices)
    padded = inputs.tokens.features["input_ids"].shape[1]
    assert cut["input_ids"].shape[1] < padded  # trimmed to the batch's longest text
    for name in ("input_ids", "attention_mask"):
        assert torch.equal(cut[name], alone[name])
    with torch.no_grad():
        joint_e, joint_o = model(inputs.joint_batch(indices, [0, 1, 2]))
        per_view = [model([views[v][i] for i in indices]) for v in range(3)]
    assert torch.allclose(joint_e, torch.cat([e for e, _ in per_view]), atol=1e-5)
    assert torch.allclose(joint_o, torch.cat([o for _, o in per_view]), atol=1e-5)


def test_client_keeps_alg3_state_between_rounds(tmp_path: Path) -> None:
    """Two training rounds through a rebuilt client: the iteration count and Q survive in context.state."""
    cfg = parse_run_config(
        {"method": "fstc", "dataset": "texts-demo", "num-clients": 2, "num-rounds": 3, **QUICK}
    )
    context = Context(0, 1, {"partition-id": 0, "num-partitions": 2}, RecordDict(), dict(cfg.to_dict()))
    client = FSTCClient(context, cfg)
    centres, counts = client.fit([], {"phase": "init"})[0]
    assert counts.sum() == client.data.n_samples and centres.shape[0] == counts.shape[0]
    global_centres = initial_centres([centres], [counts], 4, seed=0)  # the server's part
    model = fstc_model(cfg.params(FSTCConfig), 4, centres.shape[1], cfg.embedding_model)
    first = {"phase": "train", "with-centres": True, "with-model": True, "final": False}
    reply, n, metrics = FSTCClient(context, cfg).fit([global_centres, *state_arrays(model)], first)
    assert metrics["step"] == QUICK["fstc.local-iters"] and reply[1].sum() == n
    later = {"phase": "train", "with-centres": True, "with-model": False, "final": True}
    reply, n, metrics = FSTCClient(context, cfg).fit([reply[0]], later)
    assert metrics["step"] == 2 * QUICK["fstc.local-iters"]
    assert len(reply) == 2 + len(state_arrays(model))
    assert np.isfinite(reply[0]).all()


def test_the_runner_gives_fstc_its_41_rounds_unless_told(tmp_path: Path) -> None:
    base = {"method": "fstc", "dataset": "texts-demo"}
    assert build_overrides(base, tmp_path)["num-rounds"] == 41  # 1 initialisation + the paper's 40
    assert build_overrides({**base, "num-rounds": 3}, tmp_path)["num-rounds"] == 3
    assert build_overrides({"method": "kfed", "dataset": "digits"}, tmp_path).get("num-rounds") is None


def test_frozen_reference_trains_and_reports_both_clusterings(capsys: pytest.CaptureFixture[str]) -> None:
    """The centralized ceiling of frozen mode runs on the demo topics and keeps them apart."""
    from simulation.papers.fstc.frozen_reference import main

    assert (
        main(["--dataset", "texts-demo", "--steps", "40", "--update-every", "20", "--batch-size", "32"]) == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("k-means of the embeddings: ACC")
    assert lines[-1].startswith("step 40 (")
    final_acc = float(lines[-1].split("argmax O ACC ")[1].split()[0])
    assert final_acc >= 80.0  # four well-separated generated topics


def test_neighbour_purity_equals_a_brute_force_count() -> None:
    from simulation.papers.fstc.frozen_reference import neighbour_purity

    rng = np.random.default_rng(3)
    points = rng.normal(size=(70, 5))
    labels = rng.integers(0, 3, size=70)
    unit = points / np.linalg.norm(points, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    order = np.argsort(-similarity, axis=1, kind="stable")
    expected = {n: float((labels[order[:, :n]] == labels[:, None]).mean()) for n in (1, 4)}
    got = neighbour_purity(points, labels, [1, 4], block=16)  # several blocks, one partial
    assert got == pytest.approx(expected, abs=1e-12)


def test_frozen_reference_prints_neighbour_purity(capsys: pytest.CaptureFixture[str]) -> None:
    from simulation.papers.fstc.frozen_reference import main

    assert main(["--dataset", "texts-demo", "--purity", "5", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("-NN")[0] for line in lines] == ["1", "5"]
    assert float(lines[0].split(": ")[1].split()[0]) >= 90.0  # four well-separated generated topics


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "texts-demo", "--purity", "400"], "needs more than 400 texts"),
        (["--dataset", "digits"], "has no texts"),
        (["--dataset", "texts-demo", "--views", "pairs"], "no augmented views"),
        (["--dataset", "texts-demo", "--batch-size", "100000"], "exceeds the 400 texts"),
        (["--steps", "0"], "must be >= 1"),
    ],
)
def test_frozen_reference_rejects_bad_input_in_one_line(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from simulation.papers.fstc.frozen_reference import main

    monkeypatch.setenv("FEDAPP_DATA_DIR", str(tmp_path))  # a data directory exists even without ../shared

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 2 and message in error


def test_tsne_figure_is_drawn_from_both_federations(tmp_path: Path) -> None:
    from simulation.papers.fstc.tsne import main as tsne_main

    out = tmp_path / "tsne.png"
    tsne_main(
        ["--dataset", "texts-demo", "--clients", "2", "--rounds", "2", "--sample", "60"] + ["--out", str(out)]
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_tsne_rejects_bad_input_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from simulation.papers.fstc.tsne import main as tsne_main

    with pytest.raises(SystemExit) as stop:
        tsne_main(["--dataset", "texts-demo", "--sample", "100000"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("exceeds the 400 texts of texts-demo")
