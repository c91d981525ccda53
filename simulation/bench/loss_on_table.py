"""Eq. 14 on O or on softmax(O): paired runs of the two targets, and whether a threshold on k that
takes softmax(O) from some k on holds leaving one dataset out (docs/methods/fstc.md, "Eq. 14 on O or
softmax(O)": it does not, so `loss-on` stays `scores`).

    python -m simulation.bench.loss_on_table results/select-scores results/select --runs

The two folders hold runs of the same names (setting and seed) with `fstc.loss-on = scores` and
`softmax`. Each pair gives both targets' final model (`select = final`) and kept model (`select = best`,
fedapp.report.keep's rule at `KEEP_MARGIN`), NMI only scoring. A threshold T takes softmax(O) where the
run's k >= T. Its loss on a pair: the NMI the chosen target's kept model is below the other target's,
plus the same for the final model (the default keeps, `select = final` trains; both count). For every
dataset in turn (CLINC150's intents and domains are one dataset) T is fitted on the other datasets' pairs
and applied to this one's; ties go to the larger T (the paper's O wherever softmax(O) shows no gain).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from fedapp.report.keep import KEEP_MARGIN
from simulation.bench.select_table import read

NEVER = 10**6  # a threshold no k reaches: O everywhere
ALWAYS = 0  # a threshold every k reaches: softmax(O) everywhere


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

    def target(self, threshold: int) -> str:
        return "softmax" if self.k >= threshold else "scores"

    def loss(self, threshold: int) -> float:
        chosen = self.target(threshold)
        return sum(max(nmi.values()) - nmi[chosen] for nmi in (self.final, self.kept))


def _dataset(summary: dict) -> str:
    return str(summary["dataset"]).removesuffix("-domains")


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
    names = sorted(
        run.name
        for run in scores.iterdir()
        if (run / "summary.json").exists() and (softmax / run.name / "summary.json").exists()
    )
    found = (read_pair(name, {"scores": scores / name, "softmax": softmax / name}) for name in names)
    return [pair for pair in found if pair is not None]


def fit(runs: list[Pair]) -> int:
    """The threshold with the least total loss on `runs` (ties: the larger): one at each k seen, or never."""
    candidates = sorted({pair.k for pair in runs}) + [NEVER]
    return min(candidates, key=lambda t: (sum(pair.loss(t) for pair in runs), -t))


def _threshold(t: int) -> str:
    return "never" if t == NEVER else f"k ≥ {t}"


def table(runs: list[Pair]) -> str:
    lines = [
        "| dataset | k | pairs | final: softmax − O | kept: softmax − O | T fitted without it | chosen "
        "| loss (NMI) | loss with O | loss with softmax(O) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in sorted({p.dataset for p in runs}):
        mine = [p for p in runs if p.dataset == dataset]
        threshold = fit([p for p in runs if p.dataset != dataset])
        for k in sorted({p.k for p in mine}):
            at_k = [p for p in mine if p.k == k]
            final = sum(p.final["softmax"] - p.final["scores"] for p in at_k) / len(at_k)
            kept = sum(p.kept["softmax"] - p.kept["scores"] for p in at_k) / len(at_k)
            loss = [sum(p.loss(t) for p in at_k) / len(at_k) for t in (threshold, NEVER, ALWAYS)]
            lines.append(
                f"| {dataset} | {k} | {len(at_k)} | {final:+.2f} | {kept:+.2f} | {_threshold(threshold)} "
                f"| {at_k[0].target(threshold)} | {loss[0]:.2f} | {loss[1]:.2f} | {loss[2]:.2f} |"
            )
    lines.append(f"\nfitted on all {len({p.dataset for p in runs})} datasets: {_threshold(fit(runs))}")
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
    args = parser.parse_args(argv)
    found = pairs(args.scores, args.softmax)
    if not found:
        print("no pair of runs with report.select scatter and labels", file=sys.stderr)
        return 2
    print(table(found))
    if args.runs:
        print("\n" + per_run(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
