"""Print what `select = best` saw in finished runs: both candidates' Calinski–Harabasz (in the start's
space), their NMI when the data are labelled, and which was kept (`report.select` of summary.json).

    python -m simulation.bench.select_table results/select/*/

`kept` is what the run kept; `at margin M` (with `--margin M`, repeatable) what the rule would keep with
another `fedapp.report.keep.KEEP_MARGIN`, from the same scores. `--baseline DIR` adds the kept model's NMI
against a run of the same name under DIR (FSBERT k-FED on the same data and seed):

    python -m simulation.bench.select_table results/select/*/ --baseline results/select-kfed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def row(run: Path, margins: list[float], baseline: Path | None = None) -> str:
    summary = json.loads((run / "summary.json").read_text())
    select = summary.get("report", {}).get("select") or {}
    scores, labelled = select.get("scores") or {}, select.get("labelled") or {}
    start, final = scores.get("start"), scores.get("final")
    ratio = f"{final / start:.3f}" if start and final else "—"

    def nmi(name: str) -> str:
        value = labelled.get(name, {}).get("nmi")
        return "—" if value is None else f"{100 * value:.2f}"

    def ch(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    line = (
        f"| {run.name} | {ch(start)} | {ch(final)} | {ratio} | {nmi('start')} | {nmi('final')} | "
        f"{select.get('kept', '—')} |" + "".join(f" {_kept_at(start, final, margin)} |" for margin in margins)
    )
    if baseline is None:
        return line
    return line + _against(labelled.get(select.get("kept"), {}), baseline / run.name)


def _against(kept: dict[str, float], baseline_run: Path) -> str:
    """The kept model's NMI, the baseline run's, and the difference (points)."""
    path = baseline_run / "summary.json"
    other = json.loads(path.read_text()).get("metrics", {}).get("nmi") if path.exists() else None
    mine = kept.get("nmi")
    if mine is None or other is None:
        return " — | — | — |"
    return f" {100 * mine:.2f} | {100 * other:.2f} | {100 * (mine - other):+.2f} |"


def _kept_at(start: float | None, final: float | None, margin: float) -> str:
    if start is None:
        return "—"
    return "start" if final is None or final < (1.0 - margin) * start else "final"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--margin", type=float, action="append", default=[])
    parser.add_argument("--baseline", type=Path, help="runs of the same names to compare the kept NMI with")
    args = parser.parse_args(argv)
    runs = [run for run in args.runs if (run / "summary.json").exists()]
    extra = "".join(f" at margin {margin:g} |" for margin in args.margin)
    columns = len(args.margin) + (3 if args.baseline else 0)
    if args.baseline:
        extra += " NMI kept | baseline NMI | kept − baseline |"
    print(f"| run | CH start | CH final | final / start | NMI start | NMI final | kept |{extra}")
    print("|---|---|---|---|---|---|---|" + "---|" * columns)
    for run in sorted(runs):
        print(row(run, args.margin, args.baseline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
