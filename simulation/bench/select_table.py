"""What `select = best` saw in finished runs, and its margin chosen leaving one setting out
(docs/model-selection.md, "Keeping the better model").

Each run's summary.json `report.select` holds both candidates' scatter in the start's space (SSB, SSW,
clusters used) and, on labelled data, both NMIs. For every setting (a run's folder name without its
`-s<seed>` suffix) in turn, `KEEP_MARGIN` is fitted on the other settings' runs and the rule applied to
this one's:

    python -m simulation.bench.select_table results/select/*/ [--baseline results/select-kfed]

The loss a margin is fitted to: a kept model more than 1 NMI below the better candidate costs 100, and
every point of NMI below the better candidate costs 1. `--baseline DIR` adds the kept model's NMI
against a run of the same name under DIR (FSBERT k-FED on the same data and seed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from fedapp.report.keep import COLLAPSE_FRACTION, KEEP_MARGIN

MARGINS = (0.0, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1)


@dataclass(frozen=True)
class Scored:
    """One run's two candidates: SSB / SSW and clusters used, NMI x 100 (labels only score)."""

    name: str
    setting: str
    ratio: dict[str, float]
    used: dict[str, int]
    nmi: dict[str, float]

    def kept(self, margin: float) -> str:
        """What `fedapp.report.keep.choose` keeps at `margin` (with the collapse guard)."""
        if self.used["final"] < COLLAPSE_FRACTION * self.used["start"]:
            return "start"
        return "start" if self.ratio["final"] < (1.0 - margin) * self.ratio["start"] else "final"

    def loss(self, margin: float) -> float:
        return kept_loss(self.nmi, self.kept(margin))


def kept_loss(nmi: dict[str, float], kept: str) -> float:
    """The loss a margin is fitted to: each NMI point the kept candidate is below the better one costs 1,
    and more than 1 below costs 100 more."""
    gap = max(nmi.values()) - nmi[kept]
    return gap + (100.0 if gap > 1.0 else 0.0)


def read(run: Path) -> Scored | None:
    summary = json.loads((run / "summary.json").read_text())
    select = summary.get("report", {}).get("select") or {}
    scatter, labelled = select.get("scatter"), select.get("labelled") or {}
    if not scatter or not labelled:
        return None

    def ratio(name: str) -> float:
        part = scatter[name]
        return part["ssb"] / part["ssw"] if part["ssw"] else float("inf")

    return Scored(
        run.name,
        re.sub(r"-s\d+$", "", run.name),
        {name: ratio(name) for name in ("start", "final")},
        {name: int(scatter[name]["clusters_used"]) for name in ("start", "final")},
        {name: 100 * float(labelled[name]["nmi"]) for name in ("start", "final")},
    )


def fit(runs: list[Scored]) -> float:
    """The margin with the smallest total loss on `runs` (ties: the smaller margin)."""
    return min(MARGINS, key=lambda margin: (sum(run.loss(margin) for run in runs), margin))


def table(runs: list[Scored], baseline: Path | None = None) -> str:
    lines = [
        "| run | SSB/SSW final / start | clusters used start / final | NMI start | NMI final "
        "| margin fitted without it | kept | kept − start |" + (" kept − baseline |" if baseline else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if baseline else ""),
    ]
    for run in sorted(runs, key=lambda r: r.name):
        margin = fit([other for other in runs if other.setting != run.setting])
        kept = run.kept(margin)
        line = (
            f"| {run.name} | {run.ratio['final'] / run.ratio['start']:.3f} | {run.used['start']} / "
            f"{run.used['final']} | {run.nmi['start']:.2f} | {run.nmi['final']:.2f} | {margin:g} | {kept} "
            f"| {run.nmi[kept] - run.nmi['start']:+.2f} |"
        )
        if baseline is not None:
            line += _against(run.nmi[kept], baseline / run.name)
        lines.append(line)
    lines.append(
        f"\nmargin fitted on all {len({r.setting for r in runs})} settings: {fit(runs):g} "
        f"(fedapp.report.keep.KEEP_MARGIN = {KEEP_MARGIN:g})"
    )
    return "\n".join(lines)


def _against(kept: float, baseline_run: Path) -> str:
    path = baseline_run / "summary.json"
    other = json.loads(path.read_text()).get("metrics", {}).get("nmi") if path.exists() else None
    return " — |" if other is None else f" {kept - 100 * other:+.2f} |"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--baseline", type=Path, help="runs of the same names to compare the kept NMI with")
    args = parser.parse_args(argv)
    scored = [s for run in args.runs if (run / "summary.json").exists() and (s := read(run)) is not None]
    if not scored:
        print("no run with report.select scatter and labels", file=sys.stderr)
        return 2
    print(table(scored, args.baseline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
