"""Run configuration: one validated, typed view of Flower's `context.run_config`.

Common keys live in `[tool.flwr.app.config]`; a method's own keys in `[tool.flwr.app.config.<method>]`,
which Flower flattens to dotted keys (`cefmc.lambda`). Both are declared in code as `ConfigSection`
dataclasses (type, range, doc): the common ones here, each method's in `fedapp/methods/<method>.py`.
The `[tool.flwr.app.config.dp]` table (`fedapp.privacy.dp.DPConfig`) holds keys that apply to every method
that
supports differential privacy, so it is parsed beside the method's own table.
pyproject.toml repeats the defaults because Flower rejects keys it was not told about; a test keeps the two
identical (`python -m simulation methods --toml` prints the tables). Every check here runs before any
process starts (in the runner and the deploy script) and again in `server_fn` before round 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from fedapp.config.keys import ConfigError, ConfigSection, config_key, unknown_key_message
from fedapp.datasets.preprocessing import SCALINGS
from fedapp.methods import METHODS, config_tables, method_spec
from fedapp.methods.ccfc import CCFCConfig
from fedapp.methods.ffcm import FFCMConfig
from fedapp.privacy.dp import DPConfig

__all__ = [
    "ConfigError",
    "NodeSettings",
    "RunConfig",
    "config_sections",
    "default_run_config",
    "parse_run_config",
    "valid_keys",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = ("auto", "iid", "p-hetero", "size-ratio", "dirichlet", "by-group", "vertical")
DEVICES = ("auto", "cpu", "cuda")
# `embedding-cache` takes one of these or an absolute directory (`fedapp.features.embeddings.embedding_cache`)
EMBEDDING_CACHE_MODES = ("auto", "node", "off")
DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
Section = TypeVar("Section", bound=ConfigSection)
DP_TABLE = "dp"  # [tool.flwr.app.config.dp]: differential privacy, any method with a `MethodSpec.dp`


@dataclass(frozen=True)
class NodeSettings:
    """What a SuperNode's own config changed in its view of the run, merged once by the ClientApp
    (`fedapp.app.client_app.node_run_config`); the defaults describe a node that changed nothing."""

    own_file: bool = False  # its node config named its data file: it reads that file whole, nothing else
    run_dataset: str = ""  # the run config's `dataset`, the same on every party whatever a node reads


@dataclass(frozen=True)
class RunConfig(ConfigSection):
    """The common keys (hyphenated Flower keys become snake_case attributes) + the method's own table."""

    method: str = config_key("kfed", doc="which method runs (`python -m simulation methods`)")
    dataset: str = config_key(
        "digits",
        doc="a registered dataset, mat:<path>, or your own file: csv: tsv: jsonl: parquet: npy: npz: images: "
        "(a {partition-id} in the path gives each client its own file)",
    )
    data_dir: str = config_key("", doc='dataset directory; "" -> $FEDAPP_DATA_DIR -> ../shared/data')
    num_clients: int = config_key(
        0, ge=0, doc="0: every connected SuperNode; N: wait for exactly N (deployment)"
    )
    num_rounds: int = config_key(5, ge=1, doc="server rounds (one-shot / converged methods stop earlier)")
    seed: int = config_key(0, ge=0, doc="every random choice derives from it; same seed, same result")
    partition: str = config_key(
        "auto", choices=PARTITIONS, doc="auto: vertical for vertical methods, else iid"
    )
    p: float = config_key(0.0, ge=0.0, le=1.0, doc="p-heterogeneity of partition p-hetero (CCFC)")
    ratio: str = config_key("6:4", doc="client size ratio of partition size-ratio (FSTC rho), e.g. 9:1")
    alpha: float = config_key(0.5, gt=0.0, doc="Dirichlet label skew of partition dirichlet")
    k: int = config_key(
        0, ge=0, doc="clusters; 0 = number of classes, or without labels chosen in k-min..k-max (tune)"
    )
    k_min: int = config_key(2, ge=2, doc="k = 0 without labels: smallest candidate k")
    k_max: int = config_key(
        30, ge=2, doc="k = 0 without labels: largest candidate k (extended while the choice is on top)"
    )
    k_rule: str = config_key(
        "stability",
        choices=("stability", "davies_bouldin", "silhouette", "calinski_harabasz"),
        doc="k = 0 without labels: the criterion that chooses k (docs/model-selection.md)",
    )
    k_extend: bool = config_key(
        True, doc="k = 0 without labels: a choice on the top of the range doubles k-max and asks again"
    )
    select: str = config_key(
        "best",
        choices=("best", "final"),
        doc="iterative methods: best = keep the starting clustering when training made it clearly worse "
        "by a label-free criterion (docs/model-selection.md); final = always the last model (paper presets)",
    )
    max_samples: int = config_key(0, ge=0, doc="> 0: a seeded class-stratified subsample (quick runs)")
    imbalance: float = config_key(
        0.0, ge=0.0, doc=">= 1: a seeded long-tailed subset, largest / smallest class = this (0 = off)"
    )
    scaling: str = config_key(
        "none", choices=SCALINGS, doc="feature scaling each client applies to its own data"
    )
    out_dir: str = config_key("", doc='output directory; "" -> results/<method>-<dataset>-s<seed>')
    eval_every: int = config_key(
        0,
        ge=0,
        doc="evaluate every N rounds, always after the last one; 0 = auto: every round up to 10 rounds, "
        "else about 10 evaluations per run (evaluating every round doubles a long run's messages)",
    )
    dropout_rate: float = config_key(
        0.0, ge=0.0, lt=1.0, doc="simulated unavailability: a seeded fraction of clients skips each fit round"
    )
    round_timeout: float = config_key(
        1800.0, ge=0.0, doc="seconds a round waits for replies; later clients count as failed (0 = no limit)"
    )
    min_fit_clients: int = config_key(1, ge=1, doc="fewer valid replies than this: the round changes nothing")
    min_fit_fraction: float = config_key(
        0.0, ge=0.0, le=1.0, doc="the same as a fraction of the federation (the larger minimum applies)"
    )
    checkpoint_every: int = config_key(
        0, ge=0, doc="checkpoint the server and client state every N rounds (0 = never)"
    )
    resume: bool = config_key(False, doc="continue from the last checkpoint in checkpoint-dir")
    checkpoint_dir: str = config_key("", doc='checkpoint directory; "" -> <out-dir>/checkpoint')
    secagg: bool = config_key(
        False,
        doc="Flower SecAgg+: the server sees only the sum of the clients' updates (methods that allow it)",
    )
    secagg_clip: float = config_key(8.0, gt=0.0, doc="SecAgg+ clipping range: |every uploaded value| <= this")
    secagg_max_weight: float = config_key(
        100000.0, gt=0.0, doc="SecAgg+ largest client weight (its sample count)"
    )
    device: str = config_key("auto", choices=DEVICES, doc="torch device; auto = cuda when available")
    deterministic: bool = config_key(False, doc="torch deterministic algorithms (slower; bitwise repeatable)")
    embedding_model: str = config_key(
        DEFAULT_EMBEDDING_MODEL,
        doc="sentence-transformers model name or path (default: the bundled all-MiniLM-L6-v2)",
    )
    text_column: str = config_key("text", doc="own data: the column of texts (its presence makes a text set)")
    label_column: str = config_key(
        "label", doc="own data: the column of labels; optional (absent: unlabelled)"
    )
    id_column: str = config_key(
        "", doc='own data: the column of record ids; "" -> a column named id, else row numbers'
    )
    feature_columns: str = config_key(
        "", doc='own data: comma-separated numeric feature columns; "" -> every numeric column but id/label'
    )
    node_out_dir: str = config_key(
        "",
        doc='where each node writes assignments.csv ({partition-id} allowed); "" -> ./fedapp-results/<run>',
    )
    embedding_cache: str = config_key(
        "auto",
        doc="where a node caches its texts' embeddings: auto (registered datasets: the user cache; own data: "
        "node), node (beside its assignments.csv), off, or an absolute directory ({partition-id} allowed)",
    )
    id_key: str = config_key(
        "", doc="vertical own data: per-run secret for hashing ids (weaker than a node's own id-key)"
    )
    min_cluster_size: int = config_key(
        5,
        ge=1,
        doc="privacy floor: no message carries a statistic of fewer records (clients never go below 5 or "
        "their node's min-cluster-size)",
    )
    keyword_min_docs: int = config_key(
        5,
        ge=1,
        doc="cluster keywords: a term counts only if >= this many of a cluster's documents on one client",
    )
    method_config: ConfigSection | None = field(default=None, compare=True)
    dp: DPConfig = field(default_factory=DPConfig, compare=True)
    node: NodeSettings = field(default_factory=NodeSettings, compare=True)

    @cached_property
    def own_data(self) -> bool:
        """Whether `dataset` is a user's own file(s) (a source spec) rather than a registered name: asked
        of the config (once per config) by every check and loader of the run."""
        from fedapp.datasets import is_source_spec

        return is_source_spec(self.dataset)

    @property
    def evaluation_interval(self) -> int:
        """Rounds between evaluations (`eval-every`, with 0 resolved)."""
        return self.eval_every or max(1, -(-self.num_rounds // 10))

    def params(self, kind: type[Section]) -> Section:
        """The method's own keys, typed: `cfg.params(CeFMCConfig).lam`."""
        if not isinstance(self.method_config, kind):
            raise ConfigError(
                f"method '{self.method}' has no {kind.__name__} (its keys: {self.method_config})"
            )
        return self.method_config

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration with Flower's key names (method keys dotted), for summary.json."""
        out = self.to_flower()
        if self.method_config is not None:
            out.update(self.method_config.to_flower(method_spec(self.method).config_table))
        out.update(self.dp.to_flower(DP_TABLE))
        return out


def config_sections() -> dict[str, type[ConfigSection]]:
    """Every dotted table: the methods' own (`fedapp.methods.config_tables`) and the shared `dp` one."""
    return {**config_tables(), DP_TABLE: DPConfig}


def default_run_config() -> dict[str, Any]:
    """Every key's default, flattened as Flower flattens `[tool.flwr.app.config]` (method keys dotted)."""
    out = RunConfig.defaults()
    for table, section in config_sections().items():
        out.update(section.defaults(table))
    return out


def valid_keys() -> list[str]:
    return sorted(default_run_config())


def parse_run_config(overrides: Mapping[str, Any] | None = None, *, cross_checks: bool = True) -> RunConfig:
    """Check `overrides` (Flower keys; a full `context.run_config` or just the changes) and resolve them.

    Unknown keys name the nearest valid one. A key of another method's table is an error unless it still
    holds its default (Flower hands every run the defaults of every table). `cross_checks=False` checks
    each key alone (a preset that leaves the dataset open), not how the keys fit together.
    """
    raw = dict(overrides or {})
    defaults = default_run_config()
    method = raw.get("method", defaults["method"])
    if not isinstance(method, str):
        raise ConfigError(f"run-config 'method' must be a string, got {method!r}")
    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}'; choose one of {sorted(METHODS)}")
    spec = method_spec(method)
    own_table = spec.config_table if spec.config is not None else None
    for key in raw:
        if key not in defaults:
            raise ConfigError(unknown_key_message(key, defaults, prefer=own_table))
    common = {key: value for key, value in raw.items() if "." not in key}
    own: dict[str, Any] = {}
    dp: dict[str, Any] = {}
    for key, value in raw.items():
        table, dot, name = key.partition(".")
        if not dot:
            continue
        if table == own_table:
            own[name] = value
        elif table == DP_TABLE:
            dp[name] = value
        elif value != defaults[key]:
            owners = sorted(m for m, s in METHODS.items() if s.config is not None and s.config_table == table)
            raise ConfigError(
                f"run-config '{key}' belongs to method {' / '.join(owners)}, but the method is '{method}'"
            )
    method_config = spec.config.parse(own, own_table) if spec.config is not None else None
    if common.get("partition", "auto") == "auto":
        common["partition"] = "vertical" if spec.vertical else "iid"
    cfg = RunConfig.parse(common, method_config=method_config, dp=DPConfig.parse(dp, DP_TABLE))
    if cross_checks:
        _validate(cfg)
    return cfg


def _validate(cfg: RunConfig) -> None:
    """Checks that involve more than one key."""
    if not cfg.dataset:
        raise ConfigError("run-config 'dataset' is empty")
    spec = method_spec(cfg.method)
    if cfg.secagg and not spec.secagg:
        supported = sorted(name for name, other in METHODS.items() if other.secagg)
        raise ConfigError(
            f"secagg=true: method '{cfg.method}' does not aggregate sums; SecAgg+ works with {supported}"
        )
    if cfg.secagg and cfg.method == "ccfc" and not cfg.params(CCFCConfig).federated:
        raise ConfigError(
            "secagg=true: standalone CCFC (ccfc.federation=standalone) sends nothing to average"
        )
    _validate_dp(cfg)
    _validate_embedding_cache(cfg.embedding_cache)
    if cfg.k_min > cfg.k_max:
        raise ConfigError(f"k-min={cfg.k_min} > k-max={cfg.k_max}: no candidate k to choose from")
    if spec.vertical != (cfg.partition == "vertical"):
        need = "partition='vertical'" if spec.vertical else "a horizontal partition (not 'vertical')"
        raise ConfigError(f"method '{cfg.method}' needs {need}, got partition='{cfg.partition}'")
    _validate_dataset(cfg)


def _validate_dp(cfg: RunConfig) -> None:
    """Differential privacy only where every message the method sends is noised (`fedapp.privacy.dp`)."""
    if not cfg.dp.enabled:
        return
    if method_spec(cfg.method).dp is None:
        supported = sorted(name for name, spec in METHODS.items() if spec.dp is not None)
        raise ConfigError(
            f"dp.epsilon={cfg.dp.epsilon:g}: method '{cfg.method}' does not support differential privacy; "
            f"use one of {supported}"
        )
    if cfg.secagg:
        raise ConfigError(
            "dp.epsilon > 0 with secagg=true: not supported together; the noise is local, use one"
        )
    if cfg.method == "ffcm" and cfg.params(FFCMConfig).local_iters > 1:
        raise ConfigError(
            "dp.epsilon > 0 needs ffcm.local-iters=1: local iterations move the centres by private data"
        )


def _validate_embedding_cache(value: str) -> None:
    """A mode or an absolute directory: a relative one would land wherever a worker process runs (Ray's
    workers do not start in the user's directory)."""
    from fedapp.datasets import PARTITION_PLACEHOLDER

    if value in EMBEDDING_CACHE_MODES:
        return
    if not Path(value.replace(PARTITION_PLACEHOLDER, "0")).expanduser().is_absolute():
        raise ConfigError(
            f"run-config 'embedding-cache' must be {', '.join(EMBEDDING_CACHE_MODES)} or an absolute "
            f"directory, got {value!r}"
        )


def _validate_dataset(cfg: RunConfig) -> None:
    """The dataset exists and is of a kind the method can run on (files are checked by the runner)."""
    from fedapp.datasets import MAT_PREFIX, available_datasets, dataset_info

    if cfg.own_data:
        _validate_source(cfg)
        return
    if cfg.dataset.startswith(MAT_PREFIX):
        kind = "multiview"
    elif cfg.dataset in available_datasets():
        kind = dataset_info(cfg.dataset).kind
    else:
        names = sorted(name for name in available_datasets() if not name.startswith(MAT_PREFIX))
        raise ConfigError(
            f"unknown dataset '{cfg.dataset}'; choose one of {names}, 'mat:<path>', or your own file "
            "(csv:, tsv:, jsonl:, parquet:, npy:, npz:<path>, images:<folder>)"
        )
    accepted = method_spec(cfg.method).modalities
    if kind not in accepted:
        raise ConfigError(
            f"method '{cfg.method}' runs on datasets of kind {', '.join(accepted)}; "
            f"'{cfg.dataset}' is of kind {kind} (`python -m simulation datasets`)"
        )


def _validate_source(cfg: RunConfig) -> None:
    """An own-data spec is well formed. Its files are read by whoever holds them (the runner's checks,
    each node), not here: a server need not see the data."""
    from fedapp.datasets import SOURCE_PREFIXES

    prefix, _, path = cfg.dataset.partition(":")
    if not path.strip():
        raise ConfigError(f"dataset '{cfg.dataset}': give a path after '{prefix}:'")
    if f"{prefix}:" not in SOURCE_PREFIXES:
        raise ConfigError(f"dataset '{cfg.dataset}': unknown source prefix; use one of {SOURCE_PREFIXES}")
