"""Tests for the sentence-embedding cache: hits, misses, corruption, atomic writes, locks, model loading.

Most tests replace the model loader by a counting fake (hash-seeded vectors), so they run in
milliseconds and can see whether the model was loaded at all; one test encodes with the bundled model.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from logging import WARNING
from pathlib import Path

import numpy as np
import pytest

from fedapp.features import embeddings
from fedapp.features.embeddings import (
    CACHE_DIR_ENV,
    DEFAULT_MODEL,
    EmbeddingCache,
    EmbeddingError,
    default_cache_dir,
    embed_texts,
    load_sentence_model,
)

TEXTS = ["how to sort a list in python", "oracle join two tables", "svn revert a commit", ""]
PROJECT = Path(__file__).resolve().parents[1]


class FakeModel:
    """Deterministic vectors seeded by each text (so rows depend on their text only), counting calls."""

    dim = 8

    def __init__(self, delay: float = 0.0) -> None:
        self.encoded: list[str] = []
        self.delay = delay

    def encode(self, texts, *, batch_size, show_progress_bar, convert_to_numpy, normalize_embeddings):
        time.sleep(self.delay)
        self.encoded.extend(texts)
        rows = [
            np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")).normal(
                size=self.dim
            )
            for t in texts
        ]
        vectors = np.asarray(rows, dtype=np.float32)
        if normalize_embeddings:
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors


class Loader:
    """Stands in for `load_sentence_model`: records every load and hands out fresh fake models."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple] = []
        self.models: list[FakeModel] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, name, device, max_seq_length):
        with self.lock:
            self.calls.append((name, device, max_seq_length))
            self.models.append(FakeModel(self.delay))
            return self.models[-1]


@pytest.fixture
def loader(monkeypatch: pytest.MonkeyPatch) -> Loader:
    fake = Loader()
    monkeypatch.setattr(embeddings, "load_sentence_model", fake)
    return fake


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    records: list[tuple[int, str]] = []
    monkeypatch.setattr(
        embeddings, "log", lambda level, message, *args: records.append((level, message % args))
    )
    return records


def _warnings(records: list[tuple[int, str]]) -> list[str]:
    return [message for level, message in records if level >= 30]


def _entry(cache: Path, dataset: str = "unnamed") -> tuple[Path, Path]:
    [array_path] = (cache / "embeddings" / dataset).glob("*.npy")
    return array_path, array_path.with_suffix(".json")


def _embed(texts, cache: Path, **options) -> np.ndarray:
    return embed_texts(texts, cache_dir=cache, device="cpu", show_progress=False, **options)


# --------------------------------------------------------------------------- hits and misses


def test_second_call_hits_the_cache_without_loading_the_model(loader: Loader, tmp_path: Path) -> None:
    first = _embed(TEXTS, tmp_path, dataset="so")
    assert first.shape == (4, FakeModel.dim) and first.dtype == np.float32
    assert len(loader.calls) == 1 and loader.models[0].encoded.count(TEXTS[0]) == 1
    second = _embed(TEXTS, tmp_path, dataset="so")
    assert len(loader.calls) == 1
    np.testing.assert_array_equal(first, second)
    array_path, meta_path = _entry(tmp_path, "so")
    meta = json.loads(meta_path.read_text())
    assert meta["n_texts"] == 4 and meta["dim"] == FakeModel.dim and meta["dataset"] == "so"


def test_rows_follow_the_input_order_despite_length_sorted_batches(loader: Loader, tmp_path: Path) -> None:
    texts = [f"text {'x' * (i * 7 % 11)} {i}" for i in range(25)]
    batched = _embed(texts, tmp_path / "a", batch_size=4)
    one_by_one = np.vstack([_embed([t], tmp_path / "b") for t in texts])
    np.testing.assert_array_equal(batched, one_by_one)


@pytest.mark.parametrize(
    "change",
    [
        {"texts": [*TEXTS[:3], "svn revert a commit!"]},
        {"max_seq_length": 32},
        {"normalize": True},
        {"dataset": "other"},
    ],
    ids=["changed-text", "max-seq-length", "normalize", "dataset"],
)
def test_anything_that_changes_the_vectors_misses(loader: Loader, tmp_path: Path, change: dict) -> None:
    _embed(TEXTS, tmp_path)
    options = dict(change)
    _embed(options.pop("texts", TEXTS), tmp_path, **options)
    assert len(loader.calls) == 2


@pytest.mark.parametrize(
    "subset", [list(reversed(TEXTS)), TEXTS[1:3], [TEXTS[2]] * 3], ids=["reordered", "fewer", "repeated"]
)
def test_a_subset_of_a_cached_entry_is_sliced_out_of_it(loader: Loader, tmp_path: Path, subset: list) -> None:
    full = _embed(TEXTS, tmp_path, dataset="so")
    sliced = _embed(subset, tmp_path, dataset="so")
    assert len(loader.calls) == 1  # no second model load, no encoding
    np.testing.assert_array_equal(sliced, full[[TEXTS.index(t) for t in subset]])
    metas = [json.loads(p.read_text()) for p in (tmp_path / "embeddings" / "so").glob("*.json")]
    assert sorted(bool(m.get("sliced_from")) for m in metas) == [False, True]
    np.testing.assert_array_equal(_embed(subset, tmp_path, dataset="so"), sliced)  # now a hit of its own


def test_a_corrupt_superset_is_not_sliced(loader: Loader, tmp_path: Path) -> None:
    full = _embed(TEXTS, tmp_path, dataset="so")
    array_path, _ = _entry(tmp_path, "so")
    np.save(array_path, full + 1.0)  # the sidecar's SHA-256 no longer matches
    _embed(TEXTS[:2], tmp_path, dataset="so")
    assert len(loader.calls) == 2  # encoded afresh


def test_batch_size_and_device_do_not_change_the_key(loader: Loader, tmp_path: Path) -> None:
    _embed(TEXTS, tmp_path, batch_size=2)
    embed_texts(TEXTS, cache_dir=tmp_path, batch_size=3, device="auto", show_progress=False)
    assert len(loader.calls) == 1


def test_bundled_aliases_share_an_entry_and_another_model_misses(loader: Loader, tmp_path: Path) -> None:
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    _embed(TEXTS, tmp_path / "cache", model="")
    _embed(TEXTS, tmp_path / "cache", model=DEFAULT_MODEL)
    assert len(loader.calls) == 1
    _embed(TEXTS, tmp_path / "cache", model=str(model_dir))
    assert len(loader.calls) == 2 and loader.calls[1][0] == str(model_dir)
    # Overwriting the model's files (e.g. a fine-tuned checkpoint saved in place) invalidates its entries.
    (model_dir / "config.json").write_text('{"changed": true}')
    _embed(TEXTS, tmp_path / "cache", model=str(model_dir))
    assert len(loader.calls) == 3


def test_cache_location_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == (tmp_path / "xdg" / "fedapp").resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == (tmp_path / "home" / ".cache" / "fedapp").resolve()
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert default_cache_dir() == (tmp_path / "mine").resolve()


# ---------------------------------------------------------------------- what a cache holds, who reads it


def _tree(root: Path) -> list[Path]:
    return sorted(path.relative_to(root) for path in root.rglob("*"))


def test_a_private_cache_keeps_only_what_a_hit_needs(loader: Loader, tmp_path: Path) -> None:
    """Own records: no per-text digests, no dataset name (an own file's name is its path), still a hit."""
    cache = EmbeddingCache(tmp_path / "node", private=True)
    source = "csv:/srv/clinic/notes-{partition-id}.csv"
    first = embed_texts(TEXTS, dataset=source, cache=cache, device="cpu", show_progress=False)
    names = [str(path) for path in _tree(tmp_path / "node")]
    assert all(name.startswith("embeddings") for name in names) and not any("clinic" in n for n in names)
    assert not list((tmp_path / "node").rglob("*.idx"))
    array_path, meta_path = _entry(tmp_path / "node", "own")
    meta = json.loads(meta_path.read_text())
    assert "dataset" not in meta and "clinic" not in meta_path.read_text()
    assert set(meta) == {
        "format", "model", "model_fingerprint", "max_seq_length", "normalize", "n_texts", "texts_sha256",
        "dim", "dtype", "array_sha256", "device", "batch_size", "seconds",
    }  # fmt: skip
    again = embed_texts(TEXTS, dataset=source, cache=cache, device="cpu", show_progress=False)
    assert len(loader.calls) == 1
    np.testing.assert_array_equal(first, again)
    subset = embed_texts(TEXTS[:2], cache=cache, device="cpu", show_progress=False)
    assert len(loader.calls) == 2  # no digests to slice by: a subset is encoded
    np.testing.assert_allclose(subset, first[:2])


def test_cache_folders_and_files_are_owner_only_whatever_the_umask(loader: Loader, tmp_path: Path) -> None:
    old = tmp_path / "old" / "embeddings"
    old.mkdir(parents=True, mode=0o755)
    os.chmod(old, 0o755)  # as an earlier version left it
    previous = os.umask(0)
    try:
        _embed(TEXTS, tmp_path / "fresh", dataset="so")  # a shared cache: array, sidecar, index, lock
        _embed(TEXTS, tmp_path / "old", dataset="so")
    finally:
        os.umask(previous)
    for root in (tmp_path / "fresh", tmp_path / "old"):
        folders = [root / "embeddings", root / "embeddings" / "so"]
        assert [oct(path.stat().st_mode & 0o777) for path in folders] == ["0o700", "0o700"]
        files = sorted((root / "embeddings" / "so").iterdir())
        assert {path.suffix for path in files} == {".npy", ".json", ".idx", ".lock"}
        assert {oct(path.stat().st_mode & 0o777) for path in files} == {"0o600"}


def test_an_absent_directory_means_nothing_on_disk(
    loader: Loader, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for variable in (CACHE_DIR_ENV, "XDG_CACHE_HOME", "HOME"):
        monkeypatch.setenv(variable, str(tmp_path))
    off = EmbeddingCache(None, private=True)
    vectors = embed_texts(TEXTS, dataset="so", cache=off, device="cpu", show_progress=False)
    embed_texts(TEXTS, dataset="so", cache=off, device="cpu", show_progress=False)
    assert _tree(tmp_path) == [] and len(loader.calls) == 2  # nothing written, nothing read back
    np.testing.assert_array_equal(vectors, _embed(TEXTS, tmp_path / "on", dataset="so"))


def test_a_cache_that_cannot_be_written_warns_once_and_embeds_without_it(
    loader: Loader, logged: list[tuple[int, str]], tmp_path: Path
) -> None:
    """A root that is a file (no folder can be made in it: as a read-only folder for a non-root user, a
    full disk) must not stop a run: one warning per process, then every call encodes."""
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    for private in (True, False):
        cache = EmbeddingCache(blocked, private=private)
        first = embed_texts(TEXTS, dataset="so", cache=cache, device="cpu", show_progress=False)
        second = embed_texts(TEXTS, dataset="so", cache=cache, device="cpu", show_progress=False)
        np.testing.assert_array_equal(first, second)
    assert len(loader.calls) == 4 and blocked.read_text() == "not a folder"
    [(level, message)] = logged
    assert level == WARNING and str(blocked) in message and "embedding without a cache" in message
    np.testing.assert_array_equal(first, _embed(TEXTS, tmp_path / "writable", dataset="so"))


def test_a_read_only_cache_still_serves_its_hits(loader: Loader, tmp_path: Path) -> None:
    """An entry made before its text index existed, in a cache that no longer takes writes: a hit."""
    vectors = _embed(TEXTS, tmp_path, dataset="so")
    array_path, _ = _entry(tmp_path, "so")
    array_path.with_suffix(".idx").unlink()

    def read_only(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embeddings, "_atomic_write", read_only)
        np.testing.assert_array_equal(_embed(TEXTS, tmp_path, dataset="so"), vectors)
    assert len(loader.calls) == 1


def test_default_cache_dir_is_used_when_none_is_given(
    loader: Loader, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    embed_texts(TEXTS, dataset="so", device="cpu", show_progress=False)
    assert _entry(tmp_path, "so")[0].is_file()


# --------------------------------------------------------------------------- corrupt entries and crashes


def _corrupt_truncate(array_path: Path, meta_path: Path) -> None:
    array_path.write_bytes(array_path.read_bytes()[:100])


def _corrupt_flip_a_value(array_path: Path, meta_path: Path) -> None:
    raw = bytearray(array_path.read_bytes())
    raw[-3] ^= 0xFF  # same size and header: only the hash check can notice
    array_path.write_bytes(bytes(raw))


def _corrupt_sidecar_garbage(array_path: Path, meta_path: Path) -> None:
    meta_path.write_text("{not json")


def _corrupt_sidecar_missing(array_path: Path, meta_path: Path) -> None:
    meta_path.unlink()


def _corrupt_array_missing(array_path: Path, meta_path: Path) -> None:
    array_path.unlink()


def _corrupt_wrong_shape(array_path: Path, meta_path: Path) -> None:
    np.save(array_path, np.zeros((3, FakeModel.dim), dtype=np.float32))


def _corrupt_sidecar_mismatch(array_path: Path, meta_path: Path) -> None:
    meta = json.loads(meta_path.read_text())
    meta["texts_sha256"] = "0" * 64
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "corrupt",
    [
        _corrupt_truncate,
        _corrupt_flip_a_value,
        _corrupt_sidecar_garbage,
        _corrupt_sidecar_missing,
        _corrupt_array_missing,
        _corrupt_wrong_shape,
        _corrupt_sidecar_mismatch,
    ],
)
def test_corrupt_entry_is_recomputed_with_a_warning(
    loader: Loader, logged: list, tmp_path: Path, corrupt
) -> None:
    good = _embed(TEXTS, tmp_path)
    corrupt(*_entry(tmp_path))
    assert not _warnings(logged)
    again = _embed(TEXTS, tmp_path)
    assert len(loader.calls) == 2
    [warning] = _warnings(logged)
    assert "unusable" in warning and "re-encoding" in warning
    np.testing.assert_array_equal(again, good)
    _embed(TEXTS, tmp_path)  # repaired: a hit, no new warning
    assert len(loader.calls) == 2 and len(_warnings(logged)) == 1


def test_a_crash_while_writing_the_array_leaves_no_entry(
    loader: Loader, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def crash_halfway(stream, array, allow_pickle=False):
        stream.write(b"\x93NUMPY half an array")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of the write

    with monkeypatch.context() as patch:
        patch.setattr(embeddings.np, "save", crash_halfway)
        with pytest.raises(KeyboardInterrupt):
            _embed(TEXTS, tmp_path)
    folder = tmp_path / "embeddings" / "unnamed"
    assert sorted(p.suffix for p in folder.iterdir()) == [".lock"]  # no array, sidecar or temporary file
    _embed(TEXTS, tmp_path)
    assert len(loader.calls) == 2 and _entry(tmp_path)[1].is_file()


def test_a_crash_before_the_sidecar_is_written_is_not_trusted(
    loader: Loader, logged: list, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_write = embeddings._atomic_write

    def fail_on_sidecar(path: Path, write) -> None:
        if path.suffix == ".json":
            raise OSError("disk full")
        real_write(path, write)

    with monkeypatch.context() as patch:
        patch.setattr(embeddings, "_atomic_write", fail_on_sidecar)
        first = _embed(TEXTS, tmp_path)  # the run goes on with the vectors it made
    assert list((tmp_path / "embeddings" / "unnamed").glob("*.npy"))
    assert not list((tmp_path / "embeddings" / "unnamed").glob("*.json"))
    np.testing.assert_array_equal(_embed(TEXTS, tmp_path), first)
    unwritable, unusable = _warnings(logged)
    assert "disk full" in unwritable and "embedding without a cache" in unwritable
    assert len(loader.calls) == 2 and "no sidecar" in unusable


def test_concurrent_callers_encode_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    slow = Loader(delay=0.3)
    monkeypatch.setattr(embeddings, "load_sentence_model", slow)
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(_embed(TEXTS, tmp_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len(slow.calls) == 1
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


def test_a_cache_hit_imports_neither_torch_nor_sentence_transformers(loader: Loader, tmp_path: Path) -> None:
    expected = _embed(TEXTS, tmp_path, dataset="so")
    np.save(tmp_path / "expected.npy", expected)
    script = (
        "import sys, numpy as np\n"
        "from fedapp.features.embeddings import embed_texts\n"
        f"vectors = embed_texts({TEXTS!r}, dataset='so', device='cpu')\n"
        f"assert np.array_equal(vectors, np.load({str(tmp_path / 'expected.npy')!r}))\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules))\n"
    )
    environment = {**os.environ, CACHE_DIR_ENV: str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------------------- progress and input checks


def test_progress_off_a_tty_is_a_few_log_lines(loader: Loader, logged: list, tmp_path: Path) -> None:
    texts = [f"title {i}" for i in range(100)]
    embed_texts(texts, cache_dir=tmp_path, dataset="so", batch_size=4, device="cpu", show_progress=True)
    lines = [message for level, message in logged if level == 20]
    assert 5 <= len(lines) <= 12  # 25 batches -> about one line per 10 %
    assert lines[-1].startswith("embedding so: 100/100 texts")
    embed_texts(texts[1:], cache_dir=tmp_path, batch_size=4, device="cpu", show_progress=False)
    assert len([m for level, m in logged if level == 20]) == len(lines)


@pytest.mark.parametrize(
    ("texts", "options", "message"),
    [
        ([], {}, "at least one text"),
        ("one string", {}, "single string"),
        (["ok", None], {}, "text 1 is a NoneType"),
        (TEXTS, {"batch_size": 0}, "batch_size"),
        (TEXTS, {"max_seq_length": 0}, "max_seq_length"),
        (TEXTS, {"model": "./no/such/model"}, "is not a directory"),
        (TEXTS, {"device": "tpu"}, "device"),
    ],
)
def test_bad_input_fails_with_one_clear_line(loader: Loader, tmp_path: Path, texts, options, message) -> None:
    with pytest.raises(EmbeddingError, match=message) as error:
        embed_texts(texts, cache_dir=tmp_path, show_progress=False, **options)
    assert "\n" not in str(error.value)
    assert not loader.calls


def test_a_bad_device_fails_on_a_cache_hit_too(loader: Loader, tmp_path: Path) -> None:
    _embed(TEXTS, tmp_path)
    with pytest.raises(EmbeddingError, match="device must be"):
        embed_texts(TEXTS, cache_dir=tmp_path, device="gpu")


def test_cuda_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert embeddings.resolve_device("auto") == "cpu"
    with pytest.raises(EmbeddingError, match="device=cuda but torch .* sees no CUDA GPU"):
        embeddings.resolve_device("cuda")
    with pytest.raises(EmbeddingError, match="device must be one of auto | cpu | cuda"):
        embeddings.resolve_device("cuda:0")


# --------------------------------------------------------------------------- hub models offline


class HubFactory:
    """Stands in for `SentenceTransformer`: fails unless it may download, and records how it was called."""

    def __init__(self, in_local_cache: bool = False, download_works: bool = True) -> None:
        self.in_local_cache, self.download_works = in_local_cache, download_works
        self.calls: list[dict] = []

    def __call__(self, name: str, **options):
        self.calls.append(options)
        if options.get("local_files_only") and not self.in_local_cache:
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files ...")
        if not options.get("local_files_only") and not self.download_works:
            raise OSError("404 Client Error.\nRepository Not Found for url: https://huggingface.co/...")
        return f"model {name}"


def test_hub_model_from_the_local_cache_never_goes_online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embeddings, "_hub_reachable", lambda: pytest.fail("probed the network"))
    factory = HubFactory(in_local_cache=True)
    assert embeddings._load_hub_model(factory, "org/model", "cpu") == "model org/model"
    assert factory.calls == [{"device": "cpu", "local_files_only": True}]


@pytest.mark.parametrize(
    ("offline_env", "reachable", "download_works", "message"),
    [
        ("1", True, True, "HF_HUB_OFFLINE is set"),
        ("", False, True, "hub cannot be reached"),
        ("", True, False, "cannot download sentence model 'org/model': 404 Client Error. Repository"),
    ],
)
def test_unavailable_hub_model_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, offline_env: str, reachable: bool, download_works: bool, message: str
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", offline_env)
    monkeypatch.setattr(embeddings, "_hub_reachable", lambda: reachable)
    with pytest.raises(EmbeddingError, match=message) as error:
        embeddings._load_hub_model(HubFactory(download_works=download_works), "org/model", "cpu")
    assert "\n" not in str(error.value) and "bundled" in str(error.value)
    shown_context = error.value.__context__ is not None and not error.value.__suppress_context__
    assert error.value.__cause__ is None and not shown_context  # no chained Hugging Face traceback


def test_hub_model_downloads_when_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(embeddings, "_hub_reachable", lambda: True)
    factory = HubFactory()
    assert embeddings._load_hub_model(factory, "org/model", "cpu") == "model org/model"
    assert factory.calls[-1] == {"device": "cpu"}


# --------------------------------------------------------------------------- the bundled model


def test_bundled_model_embeds_similar_sentences_closer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    torch.set_num_threads(1)
    topics = [
        (
            "How do I sort a list of dictionaries by a value in Python?",
            "Sorting a Python list of dicts by key",
        ),
        ("Oracle SQL: join two tables on a date column", "How to join tables by date in Oracle"),
        ("Revert a commit in Subversion", "svn: undo the last committed revision"),
        ("Install Apache with mod_rewrite on Ubuntu", "Enable mod_rewrite for apache2 on ubuntu"),
        ("Excel VBA: loop over all worksheets", "Iterate through every sheet in an Excel workbook with VBA"),
        ("Matlab: plot two curves in one figure", "Plotting multiple lines on the same MATLAB figure"),
        ("Haskell monad transformer example", "Using StateT over IO in Haskell"),
        ("Qt signal and slot across threads", "Connect a Qt signal to a slot in another thread"),
        ("Magento: add a custom product attribute", "Create a new product attribute in Magento"),
        ("Spring bean injection with annotations", "Autowire a Spring bean with @Autowired"),
    ]
    texts = [text for pair in topics for text in pair]
    loads = []
    real_load = embeddings.load_sentence_model
    monkeypatch.setattr(embeddings, "load_sentence_model", lambda *a: loads.append(a) or real_load(*a))

    vectors = _embed(texts, tmp_path)
    assert vectors.shape == (20, 384) and vectors.dtype == np.float32 and np.isfinite(vectors).all()
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    for i in range(len(topics)):
        paraphrase = similarity[2 * i, 2 * i + 1]
        unrelated = np.delete(similarity[2 * i], [2 * i, 2 * i + 1]).max()
        assert paraphrase > unrelated, f"{topics[i]}: {paraphrase:.3f} <= {unrelated:.3f}"

    # The simulation shortcut: embedding the union and slicing equals each client embedding its own.
    client = _embed(texts[:7], tmp_path / "client", batch_size=3)
    np.testing.assert_allclose(client, vectors[:7], atol=1e-5)
    # Truncation to 4 tokens changes long texts, so it is its own cache entry.
    short = _embed(texts, tmp_path, max_seq_length=4)
    assert not np.allclose(short[0], vectors[0], atol=1e-3)
    np.testing.assert_array_equal(_embed(texts, tmp_path), vectors)
    assert len(loads) == 3


def test_load_sentence_model_exposes_what_fine_tuning_needs() -> None:
    model = load_sentence_model(DEFAULT_MODEL, "cpu", max_seq_length=32)
    assert model.max_seq_length == 32
    assert model.tokenizer("a title", truncation=True, max_length=32)["input_ids"]
    assert sum(p.numel() for p in model[0].auto_model.parameters()) > 1_000_000


def test_a_folder_that_is_no_model_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError, match=f"cannot load sentence model from {tmp_path}") as error:
        load_sentence_model(str(tmp_path), "cpu")
    assert "\n" not in str(error.value)


def test_loading_the_model_draws_no_library_progress_bar(capfd: pytest.CaptureFixture[str]) -> None:
    """transformers' "Loading weights" bar came on every load (three per run on three sites): the console
    and the logs carry fedapp's own lines only."""
    from transformers.utils import logging as transformers_logging

    load_sentence_model()
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert transformers_logging.is_progress_bar_enabled()  # restored for whoever else uses transformers
