"""Where a node's sentence embeddings are cached (run-config `embedding-cache`): a node's own records in its
own directory, owner-only, or nowhere; registered benchmark sets in the user cache, as before. The runs
use the in-process engine and the bundled model; the user cache is a fresh folder per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from flwr.common import Context, RecordDict

from clients.textkfed import SentenceKFedClient
from fedapp.app.client_app import node_run_config
from fedapp.config.run import ConfigError, parse_run_config
from fedapp.features import embeddings
from fedapp.features.embeddings import CACHE_DIR_ENV, EmbeddingCache, default_cache_dir
from fedapp.features.texts import clear_memo, embedding_cache
from fedapp.launch.resolve import build_overrides
from simulation.predict import predict
from simulation.runner import execute
from tests.own_files import write_text_sites

SITES = 3


@pytest.fixture
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user cache, and no vectors memoised in this process by earlier tests."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "user-cache"))
    clear_memo()
    yield tmp_path / "user-cache"
    clear_memo()


def _run(out: Path, **overrides: Any) -> dict[str, Any]:
    clear_memo()  # each run embeds as a fresh process would
    base = {"method": "fsbert-kfed", "num-clients": SITES, "seed": 0, **overrides}
    summary = execute(build_overrides(base, out), engine="inprocess", quiet=True)
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    return summary


def _files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file()) if root.exists() else []


def test_each_setting_names_a_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "user"))
    node = tmp_path / "nodes" / "2"

    def place(setting: str, own_data: bool) -> EmbeddingCache:
        return embedding_cache(setting, own_data=own_data, node_dir=node, partition_id=2)

    assert place("auto", True) == EmbeddingCache(node, private=True)
    assert place("auto", False) == EmbeddingCache(default_cache_dir(), private=False)
    assert place("node", False) == EmbeddingCache(node, private=False)  # public texts keep their index
    assert place("off", True) == EmbeddingCache(None, private=True)
    assert place(str(tmp_path / "c-{partition-id}"), True) == EmbeddingCache(tmp_path / "c-2", private=True)


@pytest.mark.parametrize("value", ["off", "node", "auto", "/srv/cache", "~/cache/{partition-id}"])
def test_the_key_takes_a_mode_or_an_absolute_directory(value: str) -> None:
    assert parse_run_config({"embedding-cache": value}).embedding_cache == value


@pytest.mark.parametrize("value", ["cache", "./cache", "Off", ""])
def test_anything_else_is_refused_before_a_run(value: str) -> None:
    with pytest.raises(
        ConfigError, match="'embedding-cache' must be auto, node, off or an absolute directory"
    ):
        parse_run_config({"embedding-cache": value})


def _assert_embeds_site_1(tmp_path: Path, run: dict[str, Any], node: dict[str, Any]) -> None:
    """Node 1's client, as its ClientApp builds it, embeds every text of site-1.csv."""
    cfg = node_run_config(run, node)
    context = Context(run_id=0, node_id=2, node_config=node, state=RecordDict(), run_config=run)
    vectors = SentenceKFedClient(context, cfg).embeddings()
    assert vectors.shape[0] == len(pd.read_csv(tmp_path / "site-1.csv"))


def _site_run(tmp_path: Path, cache: str) -> dict[str, Any]:
    """FSBERT k-FED on SITES own text files (written here), each node writing under out-<partition-id>."""
    write_text_sites(tmp_path, SITES)
    return {
        "method": "fsbert-kfed",
        "dataset": f"csv:{tmp_path}/site-{{partition-id}}.csv",
        "k": 4,
        "id-column": "id",
        "node-out-dir": f"{tmp_path}/out-{{partition-id}}",
        "embedding-cache": cache,
    }


@pytest.mark.parametrize("node_setting", [None, "off", "{tmp}/site-cache-{{partition-id}}"])
def test_a_nodes_own_setting_wins(tmp_path: Path, user_cache: Path, node_setting: str | None) -> None:
    """A SuperNode's `embedding-cache` in its node config overrides the run's, as its node-out-dir does."""
    run = _site_run(tmp_path, "node")
    node: dict[str, Any] = {
        "partition-id": 1,
        "num-partitions": SITES,
        "dataset": f"csv:{tmp_path}/site-1.csv",
    }
    if node_setting is not None:
        node["embedding-cache"] = node_setting.format(tmp=tmp_path)
    _assert_embeds_site_1(tmp_path, run, node)
    written = _files(tmp_path / "out-1") + _files(tmp_path / "site-cache-1")
    expected_root = {None: tmp_path / "out-1", "off": None}.get(node_setting, tmp_path / "site-cache-1")
    if expected_root is None:
        assert written == []
    else:
        assert {path.parent for path in written} == {expected_root / "embeddings" / "own"}
        assert sorted(path.suffix for path in written) == [".json", ".lock", ".npy"]
    assert _files(user_cache) == []


def test_a_cache_folder_that_cannot_be_made_does_not_stop_a_node(tmp_path: Path, user_cache: Path) -> None:
    """A node whose cache directory cannot be written (here a file is in the way) embeds without it."""
    run = _site_run(tmp_path, f"{tmp_path}/blocked/{{partition-id}}")
    (tmp_path / "blocked").write_text("a file")
    node = {"partition-id": 1, "num-partitions": SITES, "dataset": f"csv:{tmp_path}/site-1.csv"}
    _assert_embeds_site_1(tmp_path, run, node)
    assert (tmp_path / "blocked").read_text() == "a file"
    assert _files(tmp_path / "out-1") == _files(user_cache) == []


def test_own_text_sites_cache_in_their_node_directories_and_off_writes_nothing(
    tmp_path: Path, user_cache: Path
) -> None:
    write_text_sites(tmp_path, SITES)
    keys = {"dataset": f"csv:{tmp_path}/site-{{partition-id}}.csv", "k": 4, "id-column": "id"}
    _run(tmp_path / "cached", **keys)
    for site in range(SITES):
        node = tmp_path / "cached" / "nodes" / str(site)
        folder = node / "embeddings" / "own"
        assert sorted(path.suffix for path in folder.iterdir()) == [".json", ".lock", ".npy"]
        assert oct(folder.stat().st_mode & 0o777) == oct(folder.parent.stat().st_mode & 0o777) == "0o700"
        assert {oct(path.stat().st_mode & 0o777) for path in folder.iterdir()} == {"0o600"}
    assert _files(user_cache) == []  # nothing of the sites' records outside the run
    _run(tmp_path / "off", **keys, **{"embedding-cache": "off"})
    assert not [path for path in (tmp_path / "off").rglob("*") if "embeddings" in path.parts]
    assert _files(user_cache) == []
    for site in range(SITES):  # the same vectors, so the same clusters
        cached, off = (tmp_path / run / "nodes" / str(site) / "assignments.csv" for run in ("cached", "off"))
        assert cached.read_bytes() == off.read_bytes()
    before = set(_files(tmp_path))
    clear_memo()
    predicted = tmp_path / "predicted.csv"
    predict(tmp_path / "cached", f"csv:{tmp_path}/site-0.csv", predicted)  # caches nothing unless named
    assert set(_files(tmp_path)) - before == {predicted} and _files(user_cache) == []


def test_a_registered_dataset_still_hits_the_user_cache(
    tmp_path: Path, user_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _run(tmp_path / "first", dataset="texts-demo")
    [entry] = (user_cache / "embeddings" / "texts-demo").glob("*.npy")
    assert entry.with_suffix(".idx").is_file()  # public texts keep their index: subsets are sliced
    assert not list((tmp_path / "first").rglob("embeddings"))

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a registered dataset's second run must not load the model")

    monkeypatch.setattr(embeddings, "load_sentence_model", no_model)
    second = _run(tmp_path / "second", dataset="texts-demo")
    assert second["metrics"] == first["metrics"]
