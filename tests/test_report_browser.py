"""The report pages in a real browser: Debian's Chromium, driven by Playwright (never a downloaded
browser), opens a text run's and an image run's pages from disk, one browser for all of them. No
console error, no request but the file itself, every section and chart drawn, a screenshot of the size
asked that is not blank, and site 0's page shows none of site 1's records. Skips where Chromium or
Playwright is absent (scripts/setup.sh installs Chromium under CI)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulation.bench.report_pages import FLAGS
from tests.pages import SITES, blank_fraction, run_inprocess, site_records, write_marked_sites

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
VIEWPORT = {"width": 1200, "height": 900}

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)"
)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (pip install playwright)"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    profile = tempfile.mkdtemp(prefix="fedapp-chromium-")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=FLAGS, headless=True, viewport=VIEWPORT
        )
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    sites = write_marked_sites(tmp_path_factory.mktemp("sites"))
    texts, images = tmp_path_factory.mktemp("run") / "texts", tmp_path_factory.mktemp("run") / "images"
    spec = f"csv:{sites}/site-{{partition-id}}.csv"
    run_inprocess(texts, method="fbow", dataset=spec, k=4, **{"num-clients": SITES, "id-column": "id"})
    run_inprocess(images, method="ffcm", dataset="digits", **{"num-clients": SITES, "num-rounds": 4})
    return {"texts": texts, "images": images, "sites": sites}


def open_page(browser: object, path: Path) -> tuple[object, list[str], list[str]]:
    """The page loaded from disk, with its console errors (and uncaught exceptions) and its requests."""
    page = browser.new_page()  # type: ignore[attr-defined]
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.resolve().as_uri(), wait_until="load")
    return page, errors, requests


def check_drawn(browser: object, path: Path, sections: set[str], shots: Path) -> object:
    page, errors, requests = open_page(browser, path)
    assert errors == [], errors
    assert requests == [path.resolve().as_uri()], requests  # the file itself, nothing else
    for anchor in sections:
        box = page.locator(f"section#{anchor}").bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 40, (anchor, box)
    charts = page.locator("svg")
    assert charts.count() >= 1
    for index in range(charts.count()):
        box = charts.nth(index).bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 50, box
    shot = page.screenshot()  # the viewport
    from PIL import Image

    (shots / f"{path.parent.name}-{path.name}.png").write_bytes(shot)
    with Image.open(shots / f"{path.parent.name}-{path.name}.png") as image:
        assert image.size == (VIEWPORT["width"], VIEWPORT["height"])
    assert blank_fraction(shot) < 0.97, "the screenshot is blank"
    return page


def test_server_pages_render_offline(browser: object, runs: dict[str, Path], tmp_path: Path) -> None:
    for name, extra in (("texts", {"clusters"}), ("images", {"clusters", "rounds", "select"})):
        sections = {"identity", "results", "participation", "communication"} | extra
        page = check_drawn(browser, runs[name] / "report.html", sections, tmp_path)
        page.close()  # type: ignore[attr-defined]


def test_the_checks_see_a_page_that_reaches_out(
    browser: object, runs: dict[str, Path], tmp_path: Path
) -> None:
    """The control: the same page with one remote image reports the blocked load as a console error."""
    page_file = tmp_path / "report.html"
    source = (runs["images"] / "report.html").read_text()
    page_file.write_text(source.replace("</main>", '<img src="http://127.0.0.1:9/x.png"></main>'))
    page, errors, _ = open_page(browser, page_file)
    assert errors and "127.0.0.1:9" in " ".join(errors), errors
    page.close()  # type: ignore[attr-defined]


def test_node_pages_render_offline_and_keep_to_their_site(
    browser: object, runs: dict[str, Path], tmp_path: Path
) -> None:
    page = check_drawn(
        browser, runs["texts"] / "nodes" / "0" / "report.html", {"clusters", "map", "examples"}, tmp_path
    )
    shown = page.inner_text("body")  # type: ignore[attr-defined]
    own_ids, _ = site_records(runs["sites"], 0)
    assert sum(i in shown for i in own_ids) >= 5
    for other in range(1, SITES):
        ids, texts = site_records(runs["sites"], other)
        assert not [i for i in ids if i in shown] and not [t for t in texts if t.split()[-1] in shown]
    page.close()  # type: ignore[attr-defined]
    images = check_drawn(
        browser, runs["images"] / "nodes" / "1" / "report.html", {"clusters", "map", "examples"}, tmp_path
    )
    thumbs = images.locator("img.thumb")  # type: ignore[attr-defined]
    assert thumbs.count() > 0
    assert all(
        thumbs.nth(i).evaluate("img => img.complete && img.naturalWidth > 0") for i in range(thumbs.count())
    )
    images.close()  # type: ignore[attr-defined]
