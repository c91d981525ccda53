"""The model a run leaves behind: `OUT/model/model.json` + its weights, and reading them back for `predict`.

`model.json` says what the model is (method, fedapp and flwr versions, the resolved run config, k, the
score each assignment carries, feature dimension or vocabulary, cluster keywords or topic words, the final
metrics). The weights are exactly the arrays the clients labelled their records with in the final report,
in order: `model.safetensors` for torch methods, `model.npz` for the others. Applying them to a node's own
file with the same method code (`simulation predict`) gives that node's `assignments.csv` again.
Transductive methods (vertical: the model is the training rows' consensus labels) write `model.json` only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

MODEL_DIR = "model"
MODEL_JSON = "model.json"
NPZ_FILE = "model.npz"
SAFETENSORS_FILE = "model.safetensors"
FORMAT_VERSION = 1


class ModelError(ValueError):
    """A model directory that is missing, incomplete or not a fedapp model."""


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class SavedModel:
    """A model read back: its description and its weights (None for a transductive method)."""

    info: dict[str, Any]
    arrays: list[np.ndarray] | None

    @property
    def method(self) -> str:
        return str(self.info["method"])

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.info["config"])


def _array_key(index: int) -> str:
    return f"{index:04d}"


def write_model(
    directory: Path, info: dict[str, Any], arrays: Sequence[np.ndarray] | None, *, torch_weights: bool
) -> None:
    """Write `model.json` and the weights (none for transductive methods) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    stale = [directory / NPZ_FILE, directory / SAFETENSORS_FILE]
    weights_file = None
    if arrays is not None:
        named = {_array_key(i): np.array(a, order="C", copy=True) for i, a in enumerate(arrays)}  # keeps 0-d
        if torch_weights and all(a.dtype.kind in "biuf" for a in named.values()):
            from safetensors.numpy import save_file

            weights_file = SAFETENSORS_FILE
            save_file(named, str(directory / SAFETENSORS_FILE))
        else:  # string arrays (a vocabulary) have no safetensors dtype
            weights_file = NPZ_FILE
            np.savez(directory / NPZ_FILE, **named)
    for path in stale:
        if path.name != weights_file and path.exists():
            path.unlink()
    full = {
        "format": FORMAT_VERSION,
        **info,
        "weights": weights_file,
        "n_arrays": 0 if arrays is None else len(arrays),
        "versions": {"fedapp": package_version("fedapp"), "flwr": package_version("flwr")},
    }
    partial = directory / f".{MODEL_JSON}.part"
    partial.write_text(json.dumps(full, indent=2, default=_jsonable) + "\n", encoding="utf-8")
    partial.replace(directory / MODEL_JSON)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_model(directory: Path) -> SavedModel:
    """The model in `directory` (a run's `OUT/model`, or the run directory itself)."""
    if (directory / MODEL_DIR / MODEL_JSON).is_file():
        directory = directory / MODEL_DIR
    path = directory / MODEL_JSON
    if not path.is_file():
        raise ModelError(f"{directory}: no {MODEL_JSON} (give a run's output directory or its model/ folder)")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not a readable model description: {exc}") from None
    if not isinstance(info, dict) or "method" not in info or "config" not in info:
        raise ModelError(f"{path}: not a fedapp model description (no method / config)")
    weights = info.get("weights")
    if weights is None:
        return SavedModel(info, None)
    try:
        if weights == SAFETENSORS_FILE:
            from safetensors.numpy import load_file

            loaded = load_file(str(directory / weights))
        else:
            with np.load(directory / str(weights), allow_pickle=False) as archive:
                loaded = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"{directory / str(weights)}: cannot read the weights: {exc}") from None
    n_arrays = int(info.get("n_arrays", len(loaded)))
    try:
        arrays = [loaded[_array_key(i)] for i in range(n_arrays)]
    except KeyError as exc:
        raise ModelError(f"{directory / str(weights)}: array {exc} missing") from None
    return SavedModel(info, arrays)
