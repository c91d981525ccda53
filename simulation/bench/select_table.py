"""Print what `select = best` saw in finished runs: both candidates' Calinski–Harabasz (in the start's
space), their NMI when the data are labelled, and which was kept (`report.select` of summary.json).

    python -m simulation.bench.select_table results/select/*/

`kept` is what the run kept; `at margin M` (with `--margin M`, repeatable) what the rule would keep with
another `fedapp.report.keep.KEEP_MARGIN`, from the same scores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def row(run: Path, margins: list[float]) -> str:
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

    return (
        f"| {run.name} | {ch(start)} | {ch(final)} | {ratio} | {nmi('start')} | {nmi('final')} | "
        f"{select.get('kept', '—')} |" + "".join(f" {_kept_at(start, final, margin)} |" for margin in margins)
    )


def _kept_at(start: float | None, final: float | None, margin: float) -> str:
    if start is None:
        return "—"
    return "start" if final is None or final < (1.0 - margin) * start else "final"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--margin", type=float, action="append", default=[])
    args = parser.parse_args(argv)
    runs = [run for run in args.runs if (run / "summary.json").exists()]
    extra = "".join(f" at margin {margin:g} |" for margin in args.margin)
    print(f"| run | CH start | CH final | final / start | NMI start | NMI final | kept |{extra}")
    print("|---|---|---|---|---|---|---|" + "---|" * len(args.margin))
    for run in sorted(runs):
        print(row(run, args.margin))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
