"""Run configuration: one validated, typed view of Flower's `context.run_config`.

The defaults live in exactly one place, `[tool.flwr.app.config]` of pyproject.toml (Flower merges them into
`context.run_config`; the in-process engine and the runner read the same table). Every check here runs
before round 1, on the server (`server_fn`) and in the runner, so a typo fails fast with a clear message.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fedapp.methods import METHODS, method_spec
from fedapp.preprocessing import SCALINGS

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = ("auto", "iid", "p-hetero", "size-ratio", "dirichlet", "vertical")


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


@cache
def default_run_config() -> dict[str, Any]:
    """The `[tool.flwr.app.config]` table of pyproject.toml (shipped inside the FAB too)."""
    path = PROJECT_ROOT / "pyproject.toml"
    try:
        with path.open("rb") as fh:
            return dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])
    except (OSError, KeyError) as exc:
        raise ConfigError(f"cannot read [tool.flwr.app.config] from {path}: {exc}") from exc


@dataclass(frozen=True)
class RunConfig:
    """Validated run configuration (hyphenated Flower keys become snake_case attributes)."""

    method: str
    dataset: str
    data_dir: str
    num_clients: int
    num_rounds: int
    seed: int
    partition: str
    p: float
    ratio: str
    alpha: float
    k: int
    local_k: int
    fuzziness: float
    local_iters: int
    max_samples: int
    out_dir: str
    lam: float
    beta: float
    delta: float
    mm_factor: float
    scaling: str
    h_iters: int
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def effective_beta(self) -> float:
        """CeFMC's beta; the paper sets lambda = beta unless told otherwise."""
        return self.lam if self.beta < 0 else self.beta

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration, with Flower's key names, for summary.json."""
        out = dict(self.raw)
        out.update({k: v for k, v in asdict(self).items() if k != "raw"})
        return out


_KEYS: dict[str, tuple[str, type]] = {
    "method": ("method", str),
    "dataset": ("dataset", str),
    "data-dir": ("data_dir", str),
    "num-clients": ("num_clients", int),
    "num-rounds": ("num_rounds", int),
    "seed": ("seed", int),
    "partition": ("partition", str),
    "p": ("p", float),
    "ratio": ("ratio", str),
    "alpha": ("alpha", float),
    "k": ("k", int),
    "local-k": ("local_k", int),
    "fuzziness": ("fuzziness", float),
    "local-iters": ("local_iters", int),
    "max-samples": ("max_samples", int),
    "out-dir": ("out_dir", str),
    "lambda": ("lam", float),
    "beta": ("beta", float),
    "delta": ("delta", float),
    "mm-factor": ("mm_factor", float),
    "scaling": ("scaling", str),
    "h-iters": ("h_iters", int),
}


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"run-config '{key}' must be a string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"run-config '{key}' must be a number, got {value!r}")
    if kind is int:
        if not math.isfinite(value) or float(value) != int(value):
            raise ConfigError(f"run-config '{key}' must be an integer, got {value!r}")
        return int(value)
    return float(value)


def parse_run_config(overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Merge `overrides` over pyproject's defaults, type-check and range-check everything."""
    raw = dict(default_run_config())
    unknown = sorted(set(overrides or {}) - set(raw))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {unknown}; valid keys: {sorted(raw)}")
    raw.update(overrides or {})
    values = {attr: _coerce(key, raw[key], kind) for key, (attr, kind) in _KEYS.items()}
    if values["partition"] == "auto" and values["method"] in METHODS:
        values["partition"] = "vertical" if METHODS[values["method"]].vertical else "iid"
    cfg = RunConfig(**values, raw=raw)
    _validate(cfg)
    return cfg


def _validate(cfg: RunConfig) -> None:
    if cfg.method not in METHODS:
        raise ConfigError(f"unknown method '{cfg.method}'; choose one of {sorted(METHODS)}")
    if not cfg.dataset:
        raise ConfigError("run-config 'dataset' is empty")
    checks: list[tuple[bool, str]] = [
        (
            cfg.num_clients >= 0,
            f"'num-clients' must be >= 0 (0 = every connected SuperNode), got {cfg.num_clients}",
        ),
        (cfg.num_rounds >= 1, f"'num-rounds' must be >= 1, got {cfg.num_rounds}"),
        (cfg.seed >= 0, f"'seed' must be >= 0, got {cfg.seed}"),
        (cfg.partition in PARTITIONS, f"unknown partition '{cfg.partition}'; choose one of {PARTITIONS}"),
        (0.0 <= cfg.p <= 1.0, f"'p' must be in [0, 1], got {cfg.p}"),
        (cfg.alpha > 0, f"'alpha' must be > 0, got {cfg.alpha}"),
        (cfg.k >= 0, f"'k' must be >= 0 (0 = number of classes), got {cfg.k}"),
        (cfg.local_k >= 0, f"'local-k' must be >= 0 (0 = k), got {cfg.local_k}"),
        (cfg.fuzziness > 1.0, f"'fuzziness' must be > 1, got {cfg.fuzziness}"),
        (cfg.local_iters >= 1, f"'local-iters' must be >= 1, got {cfg.local_iters}"),
        (cfg.max_samples >= 0, f"'max-samples' must be >= 0, got {cfg.max_samples}"),
        (cfg.lam >= 0, f"'lambda' must be >= 0, got {cfg.lam}"),
        (cfg.delta >= 0, f"'delta' must be >= 0, got {cfg.delta}"),
        (cfg.mm_factor > 0, f"'mm-factor' must be > 0, got {cfg.mm_factor}"),
        (cfg.scaling in SCALINGS, f"unknown scaling '{cfg.scaling}'; choose one of {SCALINGS}"),
        (cfg.h_iters >= 1, f"'h-iters' must be >= 1, got {cfg.h_iters}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    for key, (attr, kind) in _KEYS.items():
        value = getattr(cfg, attr)
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"run-config '{key}' must be a finite number, got {value!r}")
    spec = method_spec(cfg.method)
    if spec.vertical != (cfg.partition == "vertical"):
        need = "partition='vertical'" if spec.vertical else "a horizontal partition (not 'vertical')"
        raise ConfigError(f"method '{cfg.method}' needs {need}, got partition='{cfg.partition}'")
    _validate_dataset_name(cfg.dataset)


def _validate_dataset_name(name: str) -> None:
    from fedapp.datasets import available_datasets  # local: keeps config importable without heavy deps

    if name.startswith("mat:"):
        return
    names = available_datasets()
    if name not in names:
        raise ConfigError(f"unknown dataset '{name}'; choose one of {sorted(names)} or 'mat:<path>'")
