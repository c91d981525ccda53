"""Eq. 14 on O or on softmax(O): paired runs of the two targets, and the threshold on k that takes
softmax(O) from some k on, fitted leaving one dataset out (docs/methods/fstc.md, "`loss-on = auto`": it
holds for CLINC150 once the composites of `simulation.bench.composite_texts` are measured; the fit on
all is `fedapp.methods.fstc.SOFTMAX_FROM_K`).

    python -m simulation.bench.loss_on_table results/composite/scores results/composite/softmax \
        --earlier simulation/bench/loss_on_earlier.json --runs

The two folders hold runs of the same names (setting and seed) with `fstc.loss-on = scores` and
`softmax`. Each pair gives both targets' final model (`select = final`) and kept model (`select = best`,
fedapp.report.keep's rule at `KEEP_MARGIN`), NMI only scoring. A threshold T takes softmax(O) where the
run's k >= T. Its loss on a pair: the NMI the chosen target's kept model is below the other target's,
plus the same for the final model (the default keeps, `select = final` trains; both count). For every
dataset in turn (CLINC150's intents and domains are one dataset, and so are the composites) T is fitted
on the other datasets' pairs and applied to this one's; ties go to the larger T (the paper's O wherever
softmax(O) shows no gain). `--earlier` adds published rows whose runs are no longer on disk (a row whose
dataset and k the runs given measure is left out: the runs replace it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from fedapp.datasets.sources import is_source_spec
from fedapp.report.keep import KEEP_MARGIN
from simulation.bench.select_table import read

NEVER = 10**6  # a threshold no k reaches: O everywhere


@dataclass(frozen=True)
class Pair:
    """One setting and seed trained with both targets: NMI x 100 of each target's final and kept model,
    and the sites' label skew FSTC measured at its start (`fstc.site_skew`; None where it could not)."""

    name: str
    dataset: str
    k: int
    skew: float | None
    final: dict[str, float]
    kept: dict[str, float]

    def loss(self, chosen: str) -> float:
        """The NMI the `chosen` target's final and kept models are below the other target's."""
        return sum(max(nmi.values()) - nmi[chosen] for nmi in (self.final, self.kept))


def _dataset(summary: dict) -> str:
    """CLINC150's intents and domains are one dataset, and so are the composites of
    `simulation.bench.composite_texts` (an own file's stem without its digits: texts40, texts64); a
    file cut from CLINC150 alone (`clinc150-intents30`) is CLINC150: it shares its texts."""
    name = str(summary["dataset"])
    if is_source_spec(name):
        stem = Path(name.split(":", 1)[1]).stem
        return "clinc150" if stem.startswith("clinc150") else re.sub(r"\d+$", "", stem)
    return name.removesuffix("-domains")


def read_pair(name: str, runs: dict[str, Path]) -> Pair | None:
    scored = {target: read(run) for target, run in runs.items()}
    if any(s is None for s in scored.values()):
        return None
    summary = json.loads((runs["scores"] / "summary.json").read_text())
    return Pair(
        name,
        _dataset(summary),
        int(summary["k"]),
        summary.get("fstc", {}).get("site_skew"),
        {t: s.nmi["final"] for t, s in scored.items()},
        {t: s.nmi[s.kept(KEEP_MARGIN)] for t, s in scored.items()},
    )


def pairs(scores: Path, softmax: Path) -> list[Pair]:
    """The runs of the same name in both folders (none where a folder is missing: runs are gone)."""
    names = sorted(
        run.name
        for run in (scores.iterdir() if scores.is_dir() else ())
        if (run / "summary.json").exists() and (softmax / run.name / "summary.json").exists()
    )
    found = (read_pair(name, {"scores": scores / name, "softmax": softmax / name}) for name in names)
    return [pair for pair in found if pair is not None]


@dataclass(frozen=True)
class Totals:
    """One dataset's pairs at one k, summed: what the fit needs. Pairs measured earlier whose runs are no
    longer on disk enter as their published row (`--earlier`, means times pairs)."""

    dataset: str
    k: int
    pairs: int
    final_gain: float  # sum over the pairs of softmax(O)'s final NMI minus O's
    kept_gain: float  # the same for the kept model
    loss_scores: float  # summed loss where O is chosen
    loss_softmax: float  # summed loss where softmax(O) is chosen

    def target(self, threshold: int) -> str:
        return "softmax" if self.k >= threshold else "scores"

    def loss(self, threshold: int) -> float:
        return self.loss_softmax if self.target(threshold) == "softmax" else self.loss_scores


def totals(runs: list[Pair]) -> list[Totals]:
    groups: dict[tuple[str, int], list[Pair]] = {}
    for pair in runs:
        groups.setdefault((pair.dataset, pair.k), []).append(pair)
    return [
        Totals(
            dataset,
            k,
            len(at_k),
            sum(p.final["softmax"] - p.final["scores"] for p in at_k),
            sum(p.kept["softmax"] - p.kept["scores"] for p in at_k),
            sum(p.loss("scores") for p in at_k),
            sum(p.loss("softmax") for p in at_k),
        )
        for (dataset, k), at_k in sorted(groups.items())
    ]


def read_earlier(path: Path) -> list[Totals]:
    """Rows of a published table ({"rows": [{dataset, k, pairs, and the per-pair means final_gain,
    kept_gain, loss_scores, loss_softmax}]}), summed back over their pairs."""
    rows = json.loads(path.read_text())["rows"]
    means = ("final_gain", "kept_gain", "loss_scores", "loss_softmax")
    return [
        Totals(row["dataset"], int(row["k"]), int(row["pairs"]), *(row[m] * row["pairs"] for m in means))
        for row in rows
    ]


def merged(on_disk: list[Totals], earlier: list[Totals]) -> list[Totals]:
    """The runs on disk, and the published rows of every dataset and k none of them measures (a published
    row stands in for runs that are gone, never beside them)."""
    measured = {(row.dataset, row.k) for row in on_disk}
    return on_disk + [row for row in earlier if (row.dataset, row.k) not in measured]


def fit(rows: list[Totals]) -> int:
    """The threshold with the least total loss on `rows` (ties: the larger): one at each k seen, or never."""
    candidates = sorted({row.k for row in rows}) + [NEVER]
    return min(candidates, key=lambda t: (sum(row.loss(t) for row in rows), -t))


def _threshold(t: int) -> str:
    return "never" if t == NEVER else f"k ≥ {t}"


def table(rows: list[Totals]) -> str:
    lines = [
        "| dataset | k | pairs | final: softmax − O | kept: softmax − O | T fitted without it | chosen "
        "| loss (NMI) | loss with O | loss with softmax(O) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in sorted({row.dataset for row in rows}):
        threshold = fit([row for row in rows if row.dataset != dataset])
        for row in sorted((row for row in rows if row.dataset == dataset), key=lambda row: row.k):
            n = row.pairs
            lines.append(
                f"| {dataset} | {row.k} | {n} | {row.final_gain / n:+.2f} | {row.kept_gain / n:+.2f} "
                f"| {_threshold(threshold)} | {row.target(threshold)} | {row.loss(threshold) / n:.2f} "
                f"| {row.loss_scores / n:.2f} | {row.loss_softmax / n:.2f} |"
            )
    lines.append(f"\nfitted on all {len({row.dataset for row in rows})} datasets: {_threshold(fit(rows))}")
    return "\n".join(lines)


def per_run(runs: list[Pair]) -> str:
    lines = [
        "| run | k | site skew | final O / softmax | kept O / softmax |",
        "|---|---|---|---|---|",
    ]
    for p in sorted(runs, key=lambda p: p.name):
        skew = "—" if p.skew is None else f"{p.skew:.3f}"
        lines.append(
            f"| {p.name} | {p.k} | {skew} | {p.final['scores']:.2f} / {p.final['softmax']:.2f} "
            f"| {p.kept['scores']:.2f} / {p.kept['softmax']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scores", type=Path, help="runs with fstc.loss-on = scores")
    parser.add_argument("softmax", type=Path, help="runs of the same names with fstc.loss-on = softmax")
    parser.add_argument("--runs", action="store_true", help="also print one row a pair")
    parser.add_argument("--earlier", type=Path, help="a JSON of published rows whose runs are gone")
    args = parser.parse_args(argv)
    found = pairs(args.scores, args.softmax)
    if not found and not args.earlier:
        print("no pair of runs with report.select scatter and labels", file=sys.stderr)
        return 2
    print(table(merged(totals(found), read_earlier(args.earlier) if args.earlier else [])))
    if args.runs:
        print("\n" + per_run(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
