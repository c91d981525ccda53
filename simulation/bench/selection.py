"""How well k = 0 chooses k on data whose k is known, validated leaving one dataset out
(docs/model-selection.md).

For each benchmark (every shared set with a known k at full size, and synthetic sets with k = 2..200 or
no cluster structure at all) the selection of `fedapp.maths.selection` runs over the clients' rows, its
range extended to `--extend-to` whatever the rule says (a later pass only adds candidates, so the choice
the default search would make is the one on the table's prefix: `simulate`). Each candidate's criteria
and the NMI of its clustering (every record to its nearest candidate centre: k-FED with the selection's
local k') are written to `OUT/<name>-<layout>.json`; labels are used only to score.

Held out, measured only when named and in a fit only through `--loo --also FOLDER`: the composites of
the shared text sets (`composite24` .. `composite64`) and elongated clusters (`elong-kK-dD`).

`--loo` then chooses the stability rule's constants (`fedapp.maths.selection.StabilityRule`) on all
datasets but one family and reports that family with them, for every family in turn:

    .venv/bin/python -m simulation.bench.selection [--layout iid|unequal] [NAME ...]   # measure
    .venv/bin/python -m simulation.bench.selection --loo [--layout iid|unequal]        # the table
    .venv/bin/python -m simulation.bench.selection --loo --strength   # with the prediction-strength check
    .venv/bin/python -m simulation.bench.selection --loo --why hw     # what moves that family's constants
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import normalized_mutual_info_score

from fedapp.maths.clustering import nearest_centre
from fedapp.maths.selection import (
    EXTEND_FACTOR,
    STABILITY_RULE,
    KSearch,
    StabilityRule,
    candidate_centres,
    candidate_statistics,
    choose_k,
    confidence,
    local_summary,
    merge_statistics,
    structureless,
)

FLOOR, SEED = 5, 0
OUT = Path("results/selection-bench")
# name -> (method, dataset, scaling): text sets through FSBERT-kFED's sentence embeddings, the others
# through k-FED on their features; a second truth where a set has one (CLINC150's domains)
REGISTERED = {
    "digits": ("kfed", "digits", "none"),
    "digits-zscore": ("kfed", "digits", "zscore"),
    "hw": ("kfed", "hw", "none"),
    "hw-zscore": ("kfed", "hw", "zscore"),
    "bdgp": ("kfed", "bdgp", "none"),
    "bdgp-zscore": ("kfed", "bdgp", "zscore"),
    "drybean": ("kfed", "drybean", "none"),
    "drybean-zscore": ("kfed", "drybean", "zscore"),
    "mnist": ("kfed", "mnist", "none"),
    "mnist-zscore": ("kfed", "mnist", "zscore"),
    "stackoverflow": ("fsbert-kfed", "stackoverflow", "none"),
    "biomedical": ("fsbert-kfed", "biomedical", "none"),
    "agnews": ("fsbert-kfed", "agnews", "none"),
    "20news": ("fsbert-kfed", "20news", "none"),
    "clinc150": ("fsbert-kfed", "clinc150", "none"),
}
# held out: measured only when named, and in a fit only when `--loo --also` names their folder; the files
# are made by `python -m simulation.bench.composite_texts` (24 to 64 classes of the shared text sets)
HELD_OUT = {
    f"composite{classes}": ("fsbert-kfed", f"csv:results/composite/texts{classes}.csv", "none")
    for classes in (24, 28, 32, 40, 64)
}
SECOND_TRUTH = {"clinc150": "clinc150-domains"}


def _clusters(
    k: int,
    dims: int,
    spread: float,
    seed: list[int],
    cluster: Callable[[np.random.Generator, np.ndarray, int], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """k clusters, centres drawn N(0, spread^2), sizes Dirichlet(2) (imbalanced), each cluster's rows drawn
    by `cluster(rng, centre, size)`, shuffled."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dims)) * spread
    per = max(100, 4000 // k)
    sizes = np.maximum(10, np.round(rng.dirichlet(np.full(k, 2.0)) * per * k)).astype(int)
    X = np.concatenate([cluster(rng, centre, size) for centre, size in zip(centres, sizes, strict=True)])
    y = np.repeat(np.arange(k), sizes)
    order = rng.permutation(len(y))
    return X[order], y[order]


def _mixture(k: int, dims: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    """k unit-variance Gaussian clusters (`_clusters`)."""
    return _clusters(
        k, dims, spread, [k, dims], lambda rng, centre, size: centre + rng.normal(size=(size, dims))
    )


def _elongated(
    k: int, dims: int, spread: float, stretch: float = 4.0, draw: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """`_mixture`'s clusters (the same centres' spread and sizes), each stretched `stretch`:1 along its
    own random axes at the same total variance: clusters that are not round, whose cut at the true k is
    less reproducible for k-means than a coarser level's (docs/model-selection.md). `draw` > 0: another
    draw of the same shape."""
    scales = np.geomspace(stretch, 1.0, dims)
    scales /= np.sqrt(np.mean(scales**2))  # unit variance per dimension on average, as `_mixture`'s

    def stretched(rng: np.random.Generator, centre: np.ndarray, size: int) -> np.ndarray:
        axes = np.linalg.qr(rng.normal(size=(dims, dims)))[0]
        return centre + (rng.normal(size=(size, dims)) * scales) @ axes.T

    return _clusters(k, dims, spread, [k, dims, 4, *([draw] if draw else [])], stretched)


def _structureless(
    kind: str, dims: int, rows: int = 4000, seed: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows without clusters: an isotropic or an elongated Gaussian, a uniform box, and two shapes
    neither null has: heavy tails (Laplace) and skew (log-normal), elongated as the box."""
    rng = np.random.default_rng(seed or [dims, STRUCTURELESS_TAGS[kind]])
    scales = np.geomspace(3.0, 0.3, dims)
    X = {
        "gauss": lambda: rng.normal(size=(rows, dims)),
        "gauss-aniso": lambda: rng.normal(size=(rows, dims)) * scales,
        "uniform": lambda: rng.uniform(size=(rows, dims)) * scales,
        "laplace": lambda: rng.laplace(size=(rows, dims)) * scales,
        "lognormal": lambda: rng.lognormal(sigma=0.75, size=(rows, dims)) * scales,
    }[kind]()
    return X, np.zeros(len(X), dtype=np.int64)


# each structureless kind's seed tag (the first three: their names' lengths, the draws measured first)
STRUCTURELESS_TAGS = {"gauss": 5, "gauss-aniso": 11, "uniform": 7, "laplace": 21, "lognormal": 23}


SYNTHETIC: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
    **{
        f"mix-k{k}-d{d}": (lambda k=k, d=d, s=s: _mixture(k, d, s))
        for k in (2, 3, 5, 8, 10, 15, 20, 30, 50, 100, 200)
        for d, s in ((10, 1.6), (50, 0.9))
    },
    **{
        f"none-{kind}-d{d}": (lambda kind=kind, d=d: _structureless(kind, d))
        for kind in STRUCTURELESS_TAGS
        for d in (8, 64)
    },
    **{
        # as tests/test_selection.py's clouds (2,000 rows, 4 clients), where one draw of the null is
        # noisiest (docs/model-selection.md): four draws of each kind
        f"none-{kind}-d8-small{draw}": (
            lambda kind=kind, draw=draw: _structureless(
                kind, 8, 2000, [8, STRUCTURELESS_TAGS[kind], 100 + draw]
            )
        )
        for kind in STRUCTURELESS_TAGS
        for draw in range(4)
    },
}
CLIENTS = {name: 4 for name in SYNTHETIC if "-small" in name}  # the others: 10
# held out as the composites are: elongated clusters, a shape no fit had seen (`--also`)
ELONGATED: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
    **{
        f"elong-k{k}-d{d}": (lambda k=k, d=d, s=s: _elongated(k, d, s))
        for k in (3, 5, 10, 20, 50)
        for d, s in ((10, 1.6), (50, 0.9))
    },
    # five more draws where the first draws missed (10 dimensions): how often the shape fools the rule
    **{
        f"elong-k{k}-d10-draw{draw}": (lambda k=k, draw=draw: _elongated(k, 10, 1.6, draw=draw))
        for k in (5, 10, 20)
        for draw in range(1, 6)
    },
}


def _split(n: int, clients: int, layout: str) -> np.ndarray:
    """Client of each row: `iid` round robin over a seeded permutation, `unequal` 3 sites of 50/30/20 %."""
    rng = np.random.default_rng(SEED)
    if layout == "iid":
        return rng.permutation(n) % clients
    return rng.choice(3, size=n, p=[0.5, 0.3, 0.2])


def _rows(name: str, layout: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Every record (in the selection space), its client and its truths."""
    generate = SYNTHETIC.get(name) or ELONGATED.get(name)
    if generate is not None:
        X, y = generate()
        return X, _split(len(y), CLIENTS.get(name, 10), layout), {"labels": y}
    from fedapp.config.run import parse_run_config  # registered sets only: the rest needs no Flower
    from fedapp.datasets import load_dataset
    from simulation.tune import client_rows

    method, dataset, scaling = {**REGISTERED, **HELD_OUT}[name]
    with tempfile.TemporaryDirectory() as out:
        cfg = parse_run_config(
            {
                "method": method,
                "dataset": dataset,
                "num-clients": 1,
                "seed": SEED,
                "scaling": scaling,
                "out-dir": out,
                "node-out-dir": f"{out}/nodes/{{partition-id}}",
            }
        )
        (local,), (X,) = client_rows(cfg)
    truths = {"labels": np.asarray(local.labels)}
    if name in HELD_OUT:  # a composite's labels are "<set>:<class>": the sets are a second truth
        names = load_dataset(dataset).class_names or ()
        sources = np.array([names[label].split(":")[0] for label in truths["labels"]])
        truths["sources"] = np.unique(sources, return_inverse=True)[1]
    if name in SECOND_TRUTH:
        truths[SECOND_TRUTH[name]] = np.asarray(load_dataset(SECOND_TRUTH[name]).y)
    return X, _split(len(X), 10, layout), truths


def measure(name: str, layout: str = "iid", extend_to: int = 240) -> dict[str, Any]:
    """The full search (extended to `extend_to` as far as the floor allows), every candidate's criteria
    and NMI (x100), and the NMI at each truth's own k."""
    X, owner, truths = _rows(name, layout)
    return measure_rows(name, layout, X, owner, truths, extend_to)


def measure_rows(
    name: str,
    layout: str,
    X: np.ndarray,
    owner: np.ndarray,
    truths: dict[str, np.ndarray],
    extend_to: int = 240,
) -> dict[str, Any]:
    """`measure` on rows already read: every record, its client and its truths."""
    parts = [np.asarray(X[owner == c], dtype=np.float64) for c in np.unique(owner)]
    started = time.perf_counter()
    search = KSearch(2, 30, floor=FLOOR)
    nmi: dict[int, dict[str, float]] = {}
    true_nmi: dict[str, float] = {}
    passes = []
    lower = 1  # the previous pass's k-max: this pass adds the candidates above it
    while True:
        k_local = search.local_k(len(parts))
        summaries = [local_summary(P, k_local, SEED + i, FLOOR) for i, P in enumerate(parts)]
        centres, sizes, squares = ([part[i] for part in summaries] for i in range(3))
        candidates, pairs = search.plan(centres, sizes, SEED, squares)
        this_max, extended = search.k_max, False
        if candidates:
            merged = merge_statistics([candidate_statistics(P, candidates, FLOOR, pairs) for P in parts])
            extended = search.take(merged, candidates)
        for k, c in candidates.items():
            labels = nearest_centre(X, c)
            nmi[k] = {t: 100 * normalized_mutual_info_score(y, labels) for t, y in truths.items()}
        # each truth's own k, clustered from the union of the pass whose range holds it
        for truth, y in truths.items():
            k_true = len(np.unique(y))
            if k_true >= 2 and lower < k_true <= this_max:
                centre = candidate_centres(centres, sizes, [k_true], SEED)[k_true]
                true_nmi[truth] = 100 * normalized_mutual_info_score(y, nearest_centre(X, centre))
        passes.append({"k_max": this_max, "local_k": k_local, "union": sum(len(c) for c in centres)})
        lower = this_max
        if not candidates or search.capped is not None:
            break
        if not extended:
            search.k_max *= EXTEND_FACTOR
        if search.k_max > extend_to:
            break
    return {
        "name": name,
        "layout": layout,
        "n": int(len(X)),
        "dims": int(X.shape[1]),
        "clients": len(parts),
        "truths": {t: int(len(np.unique(y))) for t, y in truths.items()},
        "passes": passes,
        "capped": search.capped,
        "dominance": search.dominance,
        "seconds": round(time.perf_counter() - started, 1),
        "candidates": {str(k): {**search.table[k], "nmi": nmi[k]} for k in sorted(search.table)},
        "true_k_nmi": true_nmi,
    }


# ------------------------------------------------------------------------------------- the rule
def simulate(result: dict[str, Any], rule: str, constants: StabilityRule) -> tuple[int, str, list[int]]:
    """The (k, verdict, range tried) the default search would reach on this result with these
    constants: pass after pass, extended while its choice is on top of the range."""
    table = {int(k): row for k, row in result["candidates"].items()}
    top = 30
    while True:
        seen = {k: row for k, row in table.items() if k <= top}
        chosen = choose_k(seen, rule, constants)
        bigger = [k for k in table if k > top]
        if chosen < max(seen) or not bigger or structureless(seen, chosen, constants):
            verdict = str(confidence(seen, chosen, constants, result.get("dominance"))["verdict"])
            if chosen == max(seen):  # on the edge and not extended further: the search says so
                verdict = "weak"
            return chosen, verdict, [min(seen), max(seen)]
        top *= EXTEND_FACTOR


def _shortfalls(result: dict[str, Any], k: int) -> list[float]:
    """NMI at each truth's own k minus NMI at k, one per truth (none: no structure)."""
    row = result["candidates"][str(k)]["nmi"]
    return [result["true_k_nmi"][t] - row[t] for t in result["true_k_nmi"] if t in row]


def misses(result: dict[str, Any], k: int) -> float | None:
    """NMI at the truth's own k minus NMI at k (the smallest over the truths); None: no structure."""
    gaps = _shortfalls(result, k)
    return min(gaps) if gaps else None


def loss(results: list[dict[str, Any]], constants: StabilityRule) -> float:
    """What the constants are fitted to: a silent miss (> 5 NMI on the nearer truth, verdict strong) or a
    strong verdict on data without structure costs 100; each point missed costs 1; a weak verdict costs 2
    where it warns for nothing: the choice within 5 NMI of every truth. On a set with two truths (CLINC150's
    intents and domains, a composite's classes and sets) a choice that hits one level and misses the other
    deserves its warning: the other level is there."""
    return sum(_loss_one(result, constants) for result in results)


def _loss_one(result: dict[str, Any], constants: StabilityRule) -> float:
    k, verdict, _ = simulate(result, "stability", constants)
    gaps = _shortfalls(result, k)
    if not gaps:
        return 100.0 if verdict == "strong" else 0.0
    miss = min(gaps)
    silent = 100.0 if miss > 5 and verdict == "strong" else 0.0
    return max(miss, 0.0) + silent + (2.0 if verdict == "weak" and max(gaps) <= 5 else 0.0)


# each verdict check from its most cautious setting (the most weak verdicts) to off, so that among
# constants the other benchmarks cannot tell apart the fit keeps a check a left-out benchmark may need
PLATEAU_SETTLED = (None, 0.99, 0.95, 0.9)  # the plateau check always, or only where the gap is unsettled
STRENGTH_MARGINS = (0.05, 0.1, 0.15, 0.2, None)  # `--strength`: the prediction-strength check's settings


def grid(strength_margins: tuple[float | None, ...] = (None,)) -> list[StabilityRule]:
    """Every constants the fit chooses among (the prediction-strength check off unless asked)."""
    return [
        StabilityRule(
            tolerance, weak_below, raw_below, ambiguity, dominant_above, plateau, gap_below, margin, settled
        )
        for tolerance in (0.0, 0.02, 0.03, 0.05, 0.1)
        for weak_below in (0.4, 0.2, 0.0)
        for raw_below in (0.3, 0.2, 0.1, 0.0)
        for ambiguity in (0.2, 0.1, 0.05, None)
        for dominant_above in (0.8, 0.9, 0.95, None)
        for plateau in (0.8, 0.67, 0.5, None)
        for gap_below in (0.2, 0.1, 0.05, 0.0, None)
        for margin in strength_margins
        for settled in PLATEAU_SETTLED
    ]


GRID = grid()


def fit(
    results: list[dict[str, Any]],
    table: dict[str, np.ndarray] | None = None,
    constants: list[StabilityRule] = GRID,
) -> StabilityRule:
    """The constants with the smallest loss on `results`; ties: the first in grid order, the most
    cautious (a weak verdict on a benchmark left out costs 2 points, a silent miss 100). `table`: each
    result's loss for every entry of `constants`, by name (`loss_table`), when already computed."""
    table = table or loss_table(results, constants)
    total = np.sum([table[result["name"]] for result in results], axis=0)
    return constants[int(np.argmin(total))]  # argmin: the first of equal totals


def loss_table(results: list[dict[str, Any]], constants: list[StabilityRule] = GRID) -> dict[str, np.ndarray]:
    """Each result's loss under every entry of `constants` (a fit leaving any set out only adds rows),
    the results spread over the machine's cores (76,800 constants x 67 results: 7.5 min on 2; `--strength`
    multiplies the constants by 5)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor() as pool:
        losses = list(pool.map(partial(_losses, constants=constants), results))
    return {result["name"]: row for result, row in zip(results, losses, strict=True)}


def _losses(result: dict[str, Any], constants: list[StabilityRule]) -> np.ndarray:
    return np.array([_loss_one(result, c) for c in constants])


def family(name: str) -> str:
    """Datasets left out together: the scalings of one set, the dimensions of one synthetic generator,
    the held-out composites."""
    if name.startswith("none-"):
        return "none-" + name.split("-")[1]
    if name.startswith("mix-"):
        return name.rsplit("-", 1)[0]
    if name.startswith("elong-"):  # its dimensions and draws together
        return "-".join(name.split("-")[:2])
    if name in HELD_OUT:  # the composites share StackOverflow's, Biomedical's and AgNews' texts
        return "composite"
    return name.removesuffix("-zscore")


def loo_table(results: list[dict[str, Any]], constants: list[StabilityRule] = GRID) -> str:
    families = sorted({family(r["name"]) for r in results})
    lines = [
        "| benchmark | true k | n | DB: k (NMI) | silhouette: k (NMI) | constants fitted without it "
        "| **stability: k (NMI)** | range tried | verdict | NMI at true k | miss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    losses = loss_table(results, constants)
    strength = any(c.strength_margin is not None for c in constants)  # the column shows the margin
    total = 0.0  # the loss of every row under the constants fitted without its family
    for result in sorted(results, key=lambda r: (r["name"] in SYNTHETIC, r["name"])):
        others = [r for r in results if family(r["name"]) != family(result["name"])]
        fitted = fit(others, losses, constants)
        k, verdict, tried = simulate(result, "stability", fitted)
        total += _loss_one(result, fitted)
        cells = [
            f"{rk} ({_nmi(result, rk)})"
            for rk in (simulate(result, rule, fitted)[0] for rule in ("davies_bouldin", "silhouette"))
        ]
        miss = misses(result, k)
        truth = " / ".join(str(v) for v in result["truths"].values())
        true_nmi = " / ".join(f"{v:.1f}" for v in result["true_k_nmi"].values()) or "-"
        lines.append(
            f"| {result['name']} | {truth} | {result['n']} | {cells[0]} | {cells[1]} "
            f"| {_constants(fitted, strength)} | **{k} ({_nmi(result, k)})** | {tried[0]}..{tried[1]} "
            f"| {verdict} "
            f"| {true_nmi} "
            f"| {'-' if miss is None else f'{miss:+.1f}'} |"
        )
    everything = fit(results, losses, constants)
    lines.append(f"\nleft out, each under the constants fitted on the others: loss {total:.1f}")
    lines.append(f"fitted on all {len(families)} families: {_constants(everything, strength)}")
    return "\n".join(lines)


def fold_changes(
    results: list[dict[str, Any]],
    left_out: str,
    table: dict[str, np.ndarray] | None = None,
    constants: list[StabilityRule] = GRID,
    reference: StabilityRule = STABILITY_RULE,
) -> tuple[StabilityRule, list[tuple[str, tuple[float, int, str], tuple[float, int, str]]]]:
    """Why a family's fold gets other constants than `reference` (the code's): the constants fitted
    without the family, and each other benchmark whose loss differs between the two, with its (loss, k,
    verdict) under the reference and under the fold's fit. The sum of those differences is what the fit
    saved by moving away from the reference: where the left-out family needs the reference, these are the
    benchmarks that outvote it."""
    others = [r for r in results if family(r["name"]) != left_out]
    if len(others) == len(results):
        raise ValueError(f"no benchmark of family {left_out!r} among the results")
    table = table or loss_table(others, constants)
    fitted = fit(others, table, constants)
    at = {c: constants.index(c) for c in (reference, fitted)}
    changes = []
    for result in others:
        name = result["name"]
        ours, theirs = (float(table[name][at[c]]) for c in (reference, fitted))
        if ours != theirs:
            k_ours, verdict_ours, _ = simulate(result, "stability", reference)
            k_theirs, verdict_theirs, _ = simulate(result, "stability", fitted)
            changes.append((name, (ours, k_ours, verdict_ours), (theirs, k_theirs, verdict_theirs)))
    return fitted, changes


def why_report(
    results: list[dict[str, Any]], left_out: str, constants: list[StabilityRule], strength: bool = False
) -> str:
    """`--loo --why FAMILY`: `fold_changes` as lines, and what the fold's constants save in all."""
    fitted, changes = fold_changes(results, left_out, constants=constants)
    lines = [f"fitted without {left_out}: {_constants(fitted, strength)}"]
    lines += [
        f"{name}: the code's constants k {k} {verdict} (loss {ours:.2f}), "
        f"the fold's k {k_fit} {verdict_fit} (loss {theirs:.2f})"
        for name, (ours, k, verdict), (theirs, k_fit, verdict_fit) in changes
    ]
    saved = sum(ours - theirs for _, (ours, _, _), (theirs, _, _) in changes)
    lines.append(f"the fold's constants cost {saved:.2f} less on the other benchmarks")
    return "\n".join(lines)


def _constants(constants: StabilityRule, strength: bool = False) -> str:
    values = [
        constants.tolerance,
        constants.weak_below,
        constants.raw_below,
        constants.ambiguity,
        constants.dominant_above,
        constants.plateau_below,
        constants.gap_below,
        constants.plateau_settled,
    ]
    return ", ".join(f"{value}" for value in [*values, *([constants.strength_margin] if strength else [])])


def _nmi(result: dict[str, Any], k: int) -> str:
    return " / ".join(f"{v:.1f}" for v in result["candidates"][str(k)]["nmi"].values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulation.bench.selection")
    parser.add_argument("names", nargs="*", help="benchmarks to measure (default: all)")
    parser.add_argument("--layout", choices=("iid", "unequal"), default="iid")
    parser.add_argument("--loo", action="store_true", help="print the leave-one-dataset-out table")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--extend-to", type=int, default=240)
    parser.add_argument("--also", type=Path, action="append", default=[], help="--loo: more result folders")
    parser.add_argument(
        "--strength", action="store_true", help="--loo: the prediction-strength check in the grid too"
    )
    parser.add_argument("--why", metavar="FAMILY", help="--loo: the benchmarks that move FAMILY's constants")
    args = parser.parse_args(argv)
    if args.why and not args.loo:
        parser.error("--why needs --loo")
    if args.loo:
        found: dict[str, dict[str, Any]] = {}
        for folder in (args.out, *args.also):  # a later folder's result of the same set wins
            for path in sorted(folder.glob(f"*-{args.layout}.json")):
                result = json.loads(path.read_text())
                if "dominance" in result:  # measured with the null (older files lack it)
                    found[result["name"]] = result
        constants = grid(STRENGTH_MARGINS) if args.strength else GRID
        if args.why:
            if args.why not in {family(name) for name in found}:
                parser.error(
                    f"--why {args.why}: no such family (families: {sorted({family(n) for n in found})})"
                )
            print(why_report(list(found.values()), args.why, constants, args.strength))
            return
        print(loo_table(list(found.values()), constants))
        print(
            "(tolerance, weak-below, raw-below, ambiguity, dominant-above, plateau-below, gap-below, "
            "plateau-settled"
            f"{', strength-margin' if args.strength else ''}; the code's: "
            f"{_constants(STABILITY_RULE, args.strength)})"
        )
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or [*REGISTERED, *SYNTHETIC]:
        result = measure(name, args.layout, args.extend_to)
        (args.out / f"{name}-{args.layout}.json").write_text(json.dumps(result) + "\n")
        k, verdict, tried = simulate(result, "stability", STABILITY_RULE)
        print(
            f"{name}: k {k} ({_nmi(result, k)}), {verdict}, tried {tried}, true-k NMI "
            f"{result['true_k_nmi']}, {result['seconds']} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
