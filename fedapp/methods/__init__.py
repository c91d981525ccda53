"""The method registry: run-config `method` -> (strategy class, client class, config table).

A method is four pieces: `fedapp/methods/<method>.py` (its config keys as a `ConfigSection` dataclass and
whatever else both protocol sides share), `strategies/<method>.py`, `clients/<method>.py` and, where it has
experiments, `simulation/papers/<method>/`; plus its `MethodSpec` here, in `METHODS`. Strategy and client
classes are named by import path and imported lazily, so the ServerApp of one method never imports the
dependencies (torch, sentence-transformers) of another, and `fedapp/` never imports `clients/` or
`strategies/`.

A method kept outside this package registers its `MethodSpec` with `register` from its own module; listed in
`FEDAPP_METHODS` (module names, comma-separated), that module is imported here, so every process of a run
(Ray's workers, a SuperNode's ClientApps: they inherit the environment) knows the method.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from fedapp.config.keys import ConfigSection
from fedapp.methods.bench_echo import EchoConfig
from fedapp.methods.ccfc import CCFC_DP, CCFCConfig
from fedapp.methods.cefmc import CeFMCConfig
from fedapp.methods.fedcmv import FedCMvConfig, FedFCMvConfig
from fedapp.methods.ffcm import FFCM_DP, FFCMConfig
from fedapp.methods.fsccl import FSCCLConfig
from fedapp.methods.fstc import FSTC_DP, FSTCConfig
from fedapp.methods.gfedntm import GFEDNTM_DP, GFedNTMConfig
from fedapp.methods.kfed import KFED_DP, KFedConfig
from fedapp.methods.textkfed import TextKFedConfig
from fedapp.privacy.dp import DPSupport

# Measured on real data shapes (docs/methods/fstc.md and cefmc.md, "Real data shapes" / "More clusters
# than a view has dimensions"): printed by `fedapp methods NAME` so users pick the right method.
FSTC_WHEN = (
    "Sites with similar topic mixes, balanced or long-tailed clusters (StackOverflow and Biomedical at "
    "imbalance 10 and 50: level with or above fsbert-kfed), or few topics mildly skewed (AgNews, Dirichlet "
    "alpha 0.3 and 1: above). Sites holding different topics cost it 3.5 NMI against fsbert-kfed at alpha 1 "
    "and 19-28 at alpha 0.3-0.1 (StackOverflow, 20 topics), 3.5 at alpha 0.1 on AgNews, 11 with one family "
    "per site (20 Newsgroups), and neither fstc.marginal=adaptive nor fstc-stc closes that: use fsbert-kfed "
    "there; a run warns when it sees that shape (summary.json "
    "fstc.site_skew > 0.15). With select = best (the default) a run whose training collapsed keeps its "
    "start, which is FSBERT k-FED's clustering (fstc.init-merge = kfed): on those 5 settings it kept "
    "exactly fsbert-kfed's result (docs/model-selection.md)."
)
CEFMC_WHEN = (
    "Views wider than k, or k above a view's width on real multi-view sets (HW, BDGP, DryBean: level with "
    "or above k-means on the concatenated views). Many clusters in narrow, noisy views (100 clusters, "
    "three 64-d views, generated) trail k-means on the concatenated views by about 16 ACC."
)


@dataclass(frozen=True)
class MethodSpec:
    """One runnable method. `strategy`/`client` are "module:Class"; None means centralized (no Flower)."""

    name: str
    description: str
    strategy: str | None
    client: str | None
    vertical: bool = False
    # dataset kinds this method can run on (see fedapp.datasets KINDS); horizontal vector methods take
    # images flattened and multi-view sets with their views concatenated
    modalities: tuple[str, ...] = ("vectors", "images", "multiview")
    config: type[ConfigSection] | None = None  # the method's own keys; None: it has none
    table: str = ""  # its table [tool.flwr.app.config.<table>]; "" -> the method's name
    # per-sample arrays its messages carry by design ("" = none: only model-sized arrays cross the wire);
    # the payload audit test holds every method to this
    per_sample: str = ""
    secagg: bool = False  # its fit replies are averaged/summed, so Flower's SecAgg+ can hide them
    dp: DPSupport | None = None  # how it runs under differential privacy; None: it cannot
    # rounds of a run that does not set num-rounds (`python -m simulation run` without --rounds);
    # 0: the common default. FSTC: 1 initialisation round + the paper's 40 training rounds.
    default_rounds: int = 0
    torch_model: bool = False  # its global model is torch state (saved as safetensors)
    own_k: bool = False  # its number of clusters is a key of its own (gfedntm.topics), not run-config k
    extra: str = ""  # the optional dependencies its code imports (`EXTRAS`: pip install 'fedapp[torch]')
    when: str = ""  # measured guidance: where it holds up, where another method does better

    @property
    def federated(self) -> bool:
        return self.strategy is not None

    @property
    def config_table(self) -> str:
        """Prefix of the method's keys (`cefmc` in `cefmc.lambda`); a variant may share its parent's."""
        return self.table or self.name


def _fstc_ablation(name: str, description: str, strategy: str, client: str) -> MethodSpec:
    """An FSTC ablation: FSTC's texts, keys (its `fstc` table) and rounds, without SecAgg+ or DP."""
    return MethodSpec(
        name,
        description,
        strategy,
        client,
        modalities=("texts",),
        config=FSTCConfig,
        table="fstc",
        default_rounds=41,
        torch_model=True,
        extra="torch",
    )


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("kmeans", "centralized k-means on the pooled data (reference; no federation)", None, None),
        MethodSpec(
            "kfed",
            "k-FED (Dennis et al. 2021): one-shot local k-means, server k-means over local centres",
            "strategies.kfed:KFedStrategy",
            "clients.kfed:KFedClient",
            config=KFedConfig,
            dp=KFED_DP,
        ),
        MethodSpec(
            "ffcm",
            "federated fuzzy c-means (Stallmann & Wilbik 2022): membership-weighted sums each round",
            "strategies.ffcm:FFCMStrategy",
            "clients.ffcm:FFCMClient",
            config=FFCMConfig,
            secagg=True,
            dp=FFCM_DP,
        ),
        MethodSpec(
            "ccfc",
            "CCFC (Liu et al.): federated SimSiam, then cluster-contrastive FedAvg + k-means of centroids",
            "strategies.ccfc:CCFCStrategy",
            "clients.ccfc:CCFCClient",
            modalities=("images",),
            config=CCFCConfig,
            torch_model=True,
            extra="torch",
            secagg=True,
            dp=CCFC_DP,
        ),
        MethodSpec(
            "cefmc",
            "CeFMC (vertical multi-view): H_v^(0) once, then labels + objective up, labels + C̄_v down",
            "strategies.cefmc:CeFMCStrategy",
            "clients.cefmc:CeFMCClient",
            vertical=True,
            modalities=("multiview",),
            config=CeFMCConfig,
            per_sample="up: H_v^(0) (N x k) once, then labels y_v (N); down: consensus labels y (N)",
            when=CEFMC_WHEN,
        ),
        MethodSpec(
            "cefmc-h",
            "CeFMC-H ablation: clients send their full representation H_v every round",
            "strategies.cefmc:CeFMCHStrategy",
            "clients.cefmc:CeFMCHClient",
            vertical=True,
            modalities=("multiview",),
            config=CeFMCConfig,
            table="cefmc",  # the ablation runs with CeFMC's own keys
            per_sample="up: H_v (N x k) every round; down: consensus labels y (N)",
        ),
        MethodSpec(
            "fedcmv",
            "FedCMv (Bárcena et al. 2024): vertical c-means, per-sample partial distances up",
            "strategies.fedcmv:FedCMvStrategy",
            "clients.fedcmv:FedCMvClient",
            vertical=True,
            modalities=("multiview",),
            config=FedCMvConfig,
            per_sample="up: partial distances (N x k); down: labels (N)",
        ),
        MethodSpec(
            "fedfcmv",
            "FedFCMv (Bárcena et al. 2024): vertical fuzzy c-means, partial distances up",
            "strategies.fedcmv:FedFCMvStrategy",
            "clients.fedcmv:FedCMvClient",
            vertical=True,
            modalities=("multiview",),
            config=FedFCMvConfig,
            per_sample="up: partial distances (N x k); down: memberships (N x k)",
        ),
        MethodSpec(
            "gfedntm",
            "gFedNTM (Calvo-Bartolome & Arenas-Garcia 2023): vocabulary consensus, then one mini-batch "
            "gradient step per round (ProdLDA / CombinedTM)",
            "strategies.gfedntm:GFedNTMStrategy",
            "clients.gfedntm:GFedNTMClient",
            modalities=("bow", "texts"),
            config=GFedNTMConfig,
            torch_model=True,
            extra="torch",
            secagg=True,
            own_k=True,
            dp=GFEDNTM_DP,
        ),
        MethodSpec(
            "bench-echo",
            "round-cost floor: clients echo a fixed payload, no maths (simulation.bench.rounds)",
            "strategies.bench_echo:EchoStrategy",
            "clients.bench_echo:EchoClient",
            config=EchoConfig,
        ),
        MethodSpec(
            "fstc",
            "FSTC (Hu et al. 2023): OT pseudo-labels + robust weights; local centres up, global centres down",
            "strategies.fstc:FSTCStrategy",
            "clients.fstc:FSTCClient",
            modalities=("texts",),
            config=FSTCConfig,
            default_rounds=41,
            torch_model=True,
            secagg=True,
            extra="torch",
            when=FSTC_WHEN,
            dp=FSTC_DP,
        ),
        _fstc_ablation(
            "fstc-rstc",
            "FSTC-RSTC ablation: pseudo-labels + robust weights, no centre aggregation, final averaging",
            "strategies.fstc:FSTCRSTCStrategy",
            "clients.fstc:FSTCRSTCClient",
        ),
        _fstc_ablation(
            "fstc-stc",
            "FSTC-STC ablation: pseudo-labels only, no centre aggregation, final averaging",
            "strategies.fstc:FSTCSTCStrategy",
            "clients.fstc:FSTCSTCClient",
        ),
        MethodSpec(
            "fsccl",
            "FSCCL (FSTC baseline): FedAvg over SCCL (instance-CL + DEC) on frozen sentence embeddings",
            "strategies.fsccl:FSCCLStrategy",
            "clients.fsccl:FSCCLClient",
            modalities=("texts",),
            config=FSCCLConfig,
            default_rounds=41,
            torch_model=True,
            extra="torch",
        ),
        MethodSpec(
            "fbow",
            "FBOW (FSTC baseline): k-FED on term counts over a vocabulary merged from document frequencies",
            "strategies.textkfed:BagOfWordsKFedStrategy",
            "clients.textkfed:BagOfWordsKFedClient",
            modalities=("texts",),
            config=TextKFedConfig,
            table="textkfed",
        ),
        MethodSpec(
            "ftfidf",
            "FTF-IDF (FSTC baseline): k-FED on TF-IDF rows over a merged vocabulary and idf",
            "strategies.textkfed:TfIdfKFedStrategy",
            "clients.textkfed:BagOfWordsKFedClient",
            modalities=("texts",),
            config=TextKFedConfig,
            table="textkfed",
        ),
        MethodSpec(
            "fsbert-kfed",
            "FSBERT, federated (FSTC baseline): k-FED on the clients' sentence embeddings",
            "strategies.textkfed:SentenceKFedStrategy",
            "clients.textkfed:SentenceKFedClient",
            modalities=("texts",),
            config=TextKFedConfig,
            table="textkfed",
            dp=KFED_DP,
            extra="torch",
        ),
        MethodSpec(
            "fsbert",
            "FSBERT (FSTC baseline, as in the paper): centralized k-means on the pooled sentence embeddings",
            None,
            None,
            modalities=("texts",),
            config=TextKFedConfig,
            table="textkfed",
            extra="torch",  # sentence embeddings
        ),
    )
}


# The modules of each optional dependency group (pyproject's [project.optional-dependencies]) whose absence
# a method that needs the group is refused for, before any process starts (`fedapp.app.preflight`).
# torchvision is left out: only CCFC's ResNet-18 backbone (RGB images) imports it, when it builds one.
EXTRAS: dict[str, tuple[str, ...]] = {"torch": ("torch", "sentence_transformers")}


def missing_modules(spec: MethodSpec) -> list[str]:
    """The modules of the method's extra that this environment lacks (looked up, not imported: fast)."""
    return [module for module in EXTRAS.get(spec.extra, ()) if importlib.util.find_spec(module) is None]


class UnknownMethodError(ValueError):
    """Raised for a method name that is not registered."""


METHODS_ENV = "FEDAPP_METHODS"  # modules that register methods of their own (module docstring)


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry (the same spec again is a no-op; another under a taken name is an
    error: a method is never replaced behind its users' backs)."""
    if METHODS.setdefault(spec.name, spec) != spec:
        raise ValueError(f"method '{spec.name}' is registered already")
    return spec


def unregister(name: str) -> None:
    """Take a registered method out again (a test's fixture)."""
    METHODS.pop(name, None)


def _import_registering_modules() -> None:
    for module in filter(None, (name.strip() for name in os.environ.get(METHODS_ENV, "").split(","))):
        importlib.import_module(module)


def method_spec(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownMethodError(f"unknown method '{name}'; choose one of {sorted(METHODS)}") from None


def methods_for_kind(kind: str) -> tuple[str, ...]:
    """Registered methods that accept datasets of this kind (`MethodSpec.modalities`)."""
    return tuple(name for name, spec in METHODS.items() if kind in spec.modalities)


def config_tables() -> dict[str, type[ConfigSection]]:
    """Table name -> its keys' dataclass, one entry per table (variants share their parent's)."""
    tables: dict[str, type[ConfigSection]] = {}
    for spec in METHODS.values():
        if spec.config is not None and tables.setdefault(spec.config_table, spec.config) is not spec.config:
            raise TypeError(f"methods sharing table '{spec.config_table}' declare different keys")
    return tables


def load_class(path: str) -> Any:
    """Import "package.module:Class"."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


_import_registering_modules()
