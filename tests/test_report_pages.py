"""The pages a person opens, read with a plain HTML parser: a run's report.html holds its sections and
nothing it may not (no node's record, no reference outside the file), each node's page holds its own
records and none of another's, `fedapp report` redraws them, an experiment links its runs' pages."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from fedapp.report.pages.run import build_run_report
from simulation.__main__ import main
from tests.pages import SITES, Page, run_inprocess, site_records, write_marked_sites

RUN_SECTIONS = {
    "identity",
    "results",
    "clusters",
    "privacy",
    "participation",
    "communication",
    "config",
    "about",
}


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """FBOW on three sites' own files (ids and a token unique to each record), no labels."""
    sites = write_marked_sites(tmp_path_factory.mktemp("sites"))
    out = tmp_path_factory.mktemp("run") / "texts"
    spec = f"csv:{sites}/site-{{partition-id}}.csv"
    summary = run_inprocess(
        out, method="fbow", dataset=spec, k=4, **{"num-clients": SITES, "id-column": "id"}
    )
    assert summary["status"] in ("completed", "converged"), summary["status_reason"]
    return out, sites


@pytest.fixture(scope="module")
def image_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "digits"
    summary = run_inprocess(out, method="kfed", dataset="digits", **{"num-clients": 3})
    assert summary["status"] == "converged", summary["status_reason"]
    return out


def test_the_run_page_has_its_sections_and_loads_nothing(
    text_run: tuple[Path, Path], image_run: Path
) -> None:
    for out in (text_run[0], image_run):
        page = Page(out / "report.html")
        assert set(page.sections) >= RUN_SECTIONS, page.sections
        assert page.count("script") == 0 and page.count("link") == 0 and page.count("iframe") == 0
        assert page.outside_references() == []
        policy = [a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv")]
        assert policy and "default-src 'none'" in policy[0]
    texts = Page(text_run[0] / "report.html")
    summary = json.loads((text_run[0] / "summary.json").read_text())
    for words in summary["report"]["keywords"]:  # each cluster's keywords are on the page
        assert ", ".join(words) in texts.text
    digits = Page(image_run / "report.html")
    nmi = json.loads((image_run / "summary.json").read_text())["metrics"]["nmi"]
    assert f"{100 * nmi:.2f}" in digits.text  # the labelled metrics, in percent


def test_no_record_of_any_node_is_on_the_run_page(text_run: tuple[Path, Path]) -> None:
    out, sites = text_run
    page = (out / "report.html").read_text()
    for site in range(SITES):
        ids, texts = site_records(sites, site)
        assert not [i for i in ids if i in page]
        assert not [t for t in texts if t.split()[-1] in page]  # each record's own token


def test_a_node_page_holds_its_own_records_and_none_of_another_sites(text_run: tuple[Path, Path]) -> None:
    out, sites = text_run
    for site in range(SITES):
        folder = out / "nodes" / str(site)
        page = Page(folder / "report.html")
        source = (folder / "report.html").read_text()
        own_ids, own_texts = site_records(sites, site)
        shown = [i for i in own_ids if i in page.text]
        assert len(shown) >= 5, "its examples are its own records"
        assert any(text.split()[-1] in source for text in own_texts)
        for other in set(range(SITES)) - {site}:
            ids, texts = site_records(sites, other)
            assert not [i for i in ids if i in source], f"site {other}'s ids on site {site}'s page"
            assert not [t for t in texts if t.split()[-1] in source], f"site {other}'s records on {site}'s"
        assert {"clusters", "map", "examples"} <= set(page.sections)
        assert "never sent" in page.text and "Who can see this page" in page.text
        assert page.outside_references() == [] and page.count("script") == 0
        for name in ("report.html", "report.json"):  # records: the owner's alone
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
        data = json.loads((folder / "report.json").read_text())
        assert sum(data["sizes"]) == len(own_ids) == data["map"]["of"]
        assert page.count("circle") >= data["map"]["drawn"]
        assert data["pooled_sizes"] is not None and len(data["pooled_sizes"]) == len(data["sizes"])


def test_a_node_page_of_images_shows_thumbnails(image_run: Path) -> None:
    page = Page(image_run / "nodes" / "0" / "report.html")
    thumbs = [a for t, a in page.tags if t == "img"]
    assert thumbs and all(a["src"].startswith("data:image/png;base64,") for a in thumbs)
    assert len(thumbs) <= 5 * 10


def test_fedapp_report_redraws_the_pages_as_the_run_wrote_them(
    text_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = text_run[0]
    pages = [out / "report.html", *(out / "nodes" / str(s) / "report.html" for s in range(SITES))]
    written = {page: page.read_bytes() for page in pages}
    for page in pages:
        page.unlink()
    assert main(["report", str(out)]) == 0
    assert {page: page.read_bytes() for page in pages} == written
    assert capsys.readouterr().out.count("wrote ") == len(pages)
    assert main(["report", str(out / "nodes")]) == 2  # neither a run nor a node folder: one line
    assert "neither a run folder" in capsys.readouterr().err


def test_unknown_fields_are_shown_not_dropped(tmp_path: Path) -> None:
    """The k selection's and a method's fields the page does not know (a confidence, runner-up ks) appear
    as they are; 100 rounds x 10 clients with failures draw one cell per client-round."""
    rounds, clients = 100, 10
    participation = {}
    for r in range(1, rounds + 1):
        ids = [f"node-{c}" for c in range(clients)]
        failed = [ids[r % clients]] if r % 7 == 0 else []
        participation[str(r)] = {
            "sampled": ids,
            "dropped": [],
            "excluded": [],
            "accepted": [c for c in ids if c not in failed],
            "rejected": [],
            "failed": failed,
        }
    summary = {
        "method": "kfed",
        "dataset": "digits",
        "status": "degraded",
        "status_reason": "14 client-rounds failed or timed out",
        "rounds": rounds,
        "num_rounds": rounds,
        "participation": participation,
        "failure_messages": ["partition-id 3: ValueError: a bad file"],
        "k_selection": {
            "rule": "davies_bouldin",
            "chosen_k": 4,
            "confidence": 0.83,
            "verdict": "clear",
            "runner_up": [5, 3],
            "candidates": [{"k": k, "davies_bouldin": 1.0 + abs(k - 4)} for k in range(2, 9)],
        },
        "mymethod": {"notes": "kept", "loss_per_round": [3.0, 2.0, 1.5]},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "report.html").write_text(build_run_report(tmp_path))
    page = Page(tmp_path / "report.html")
    shown_fields = (
        "confidence",
        "0.83",
        "verdict",
        "clear",
        "runner_up",
        "5, 3",
        "mymethod.notes",
        "a bad file",
    )
    for shown in shown_fields:
        assert shown in page.text, shown
    cells = [a for t, a in page.tags if t == "rect" and a.get("fill") in ("#2e7d32", "#c62828")]
    assert len(cells) == rounds * clients
    assert sum(1 for a in cells if a["fill"] == "#c62828") == rounds // 7


def test_an_experiment_page_links_every_runs_page(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text(
        '[experiment]\nname = "e"\nseeds = [0, 1]\nengine = "inprocess"\nmetrics = ["nmi"]\n'
        '[defaults]\ndataset = "digits"\nnum-clients = 2\n'
        '[[runs]]\nlabel = "k-FED"\nmethod = "kfed"\npaper = { nmi = 0.5 }\n'
    )
    root = tmp_path / "root"
    assert main(["experiment", str(path), "--out", str(root)]) == 0
    page = Page(root / "table.html")
    links = [a["href"] for t, a in page.tags if t == "a" and not a["href"].startswith("#")]
    assert sorted(set(links)) == ["k-FED-s0/report.html", "k-FED-s1/report.html"]
    assert all((root / link).is_file() for link in links)
    assert page.outside_references() == [] and "50.00" in page.text  # the paper's figure
