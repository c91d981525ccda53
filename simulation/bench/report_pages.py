"""Measure the report pages: a 100-round, 10-client run's report.html (size, time to draw it, time to
render it in headless Chromium) and, with --screenshots, the README's pictures of a run's page and a
node's page.

    python -m simulation.bench.report_pages [--engine flwr] [--rounds 100] [--clients 10] [--loads 5]
        [--screenshots docs]

The run is FFCM on the bundled digits, evaluated every round, with a seeded 10 % dropout so the
participation grid has gaps (every client-round a cell). Rendering opens the page from disk in Debian's
Chromium (Playwright, a fresh profile) `--loads` times and reads the browser's own navigation timing
(load event end) and first contentful paint. Prints one JSON object. Targets (docs/report.md): under
3 MB and under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from fedapp.launch.resolve import build_overrides
from fedapp.report.pages.run import build_run_report
from simulation.runner import execute

FLAGS = [  # what Chromium needs here: headless, no sandbox as root, and nothing of its own on the network
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright: Any, profile: str, chromium: str, viewport: dict[str, int]) -> Any:
    """Debian's Chromium through Playwright with FLAGS, in its own profile folder."""
    return playwright.chromium.launch_persistent_context(
        profile, executable_path=chromium, args=FLAGS, headless=True, viewport=viewport
    )


TIMING = """async () => {
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));  // painted
  const nav = performance.getEntriesByType("navigation")[0];
  const paint = performance.getEntriesByName("first-contentful-paint")[0];
  return {load_ms: nav.loadEventEnd, paint_ms: paint ? paint.startTime : null};
}"""


def long_run(out: Path, engine: str, rounds: int, clients: int) -> dict[str, object]:
    keys = {
        "method": "ffcm",
        "dataset": "digits",
        "num-clients": clients,
        "num-rounds": rounds,
        "eval-every": 1,
        "dropout-rate": 0.1,
        "ffcm.delta": 0.0,
        "seed": 0,
    }
    started = time.perf_counter()
    summary = execute(build_overrides(keys, out), engine=engine, quiet=True)
    return {
        "status": summary["status"],
        "rounds": summary["rounds"],
        "run_seconds": time.perf_counter() - started,
    }


def render_times(chromium: str, pages: list[Path], loads: int) -> dict[str, dict[str, float]]:
    """Per page: median and largest load-event time and first paint over `loads` fresh tabs."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="fedapp-bench-")
    found: dict[str, dict[str, float]] = {}
    try:
        with sync_playwright() as playwright:
            context = launch(playwright, profile, chromium, {"width": 1200, "height": 900})
            for path in pages:
                samples = []
                for _ in range(loads):
                    page = context.new_page()
                    page.goto(path.resolve().as_uri(), wait_until="load")
                    samples.append(page.evaluate(TIMING))
                    page.close()
                loaded = [s["load_ms"] for s in samples]
                painted = [s["paint_ms"] for s in samples if s["paint_ms"] is not None]
                found[str(path)] = {
                    "load_ms_median": round(statistics.median(loaded), 1),
                    "load_ms_max": round(max(loaded), 1),
                    "first_paint_ms_median": round(statistics.median(painted), 1) if painted else None,
                }
            context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return found


def screenshots(chromium: str, folder: Path, scratch: Path) -> list[str]:
    """The README's pictures: a text run's page (own files, k chosen) and one node's page."""
    from playwright.sync_api import sync_playwright

    from fedapp.datasets import load_dataset

    texts = load_dataset("texts-demo").texts
    assert texts is not None
    for site in range(3):
        rows = range(site, len(texts), 3)
        frame = pd.DataFrame({"id": [f"rec-{i}" for i in rows], "text": [texts[i] for i in rows]})
        frame.to_csv(scratch / f"site-{site}.csv", index=False)
    out = scratch / "my-texts"
    keys = {"method": "fsbert-kfed", "dataset": f"csv:{scratch}/site-{{partition-id}}.csv", "num-clients": 3}
    execute(build_overrides({**keys, "id-column": "id", "seed": 0}, out), engine="inprocess", quiet=True)
    shots = [  # (page, picture, the section at the top: the clusters' words, the k selection below them)
        (out / "report.html", folder / "report-run.png", "clusters"),
        (out / "nodes/0/report.html", folder / "report-node.png", None),
    ]
    profile = tempfile.mkdtemp(prefix="fedapp-bench-")
    try:
        with sync_playwright() as playwright:
            context = launch(playwright, profile, chromium, {"width": 1100, "height": 940})
            for page_file, picture, anchor in shots:
                page = context.new_page()
                page.goto(page_file.resolve().as_uri(), wait_until="load")
                if anchor:
                    page.evaluate(f"document.getElementById('{anchor}').scrollIntoView()")
                page.screenshot(path=str(picture))
                page.close()
            context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return [str(picture) for _, picture, _ in shots]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("flwr", "inprocess"), default="flwr")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--loads", type=int, default=5, help="page loads per page")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--screenshots", type=Path, help="also write report-run.png and report-node.png here")
    args = parser.parse_args()
    report: dict[str, object] = {"load": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "long"
        report.update(long_run(out, args.engine, args.rounds, args.clients), engine=args.engine)
        started = time.perf_counter()
        build_run_report(out)
        report["build_seconds"] = round(time.perf_counter() - started, 4)
        node = out / "nodes" / "0" / "report.html"
        report["report_bytes"] = (out / "report.html").stat().st_size
        report["node_report_bytes"] = node.stat().st_size
        report["render"] = render_times(args.chromium, [out / "report.html", node], args.loads)
        if args.screenshots:
            report["screenshots"] = screenshots(args.chromium, args.screenshots, Path(scratch))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
