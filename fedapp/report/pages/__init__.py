"""Pages a person opens: the run's `report.html` (what the server holds), each node's own `report.html`
(that node's records, never sent) and an experiment's `table.html`. One self-contained HTML file each:
styles inline, charts as inline SVG, thumbnails as data URIs, no script and no network access."""

from __future__ import annotations

from pathlib import Path

from fedapp.report.pages.node import NODE_DATA, rebuild_node_page
from fedapp.report.pages.run import write_run_report


def rebuild(folder: Path) -> list[Path]:
    """`fedapp report`: redraw the pages of a run folder (its own and `nodes/*/`) or of one node's
    folder from the files beside them; returns the pages written."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    written = []
    if (folder / "summary.json").is_file():
        written.append(write_run_report(folder))
    nodes = sorted(
        (folder / "nodes").glob(f"*/{NODE_DATA}"), key=lambda p: (len(p.parent.name), p.parent.name)
    )
    for data in [folder / NODE_DATA, *nodes]:
        if data.is_file():
            written.append(rebuild_node_page(data.parent))
    if not written:
        raise FileNotFoundError(
            f"{folder}: neither a run folder (summary.json) nor a node folder ({NODE_DATA}) to draw from"
        )
    return written
