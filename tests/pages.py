"""What the report-page tests share: runs that leave pages, and a plain HTML parser's view of a page."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedapp.datasets import load_dataset
from fedapp.launch.resolve import build_overrides
from simulation.runner import execute

SITES = 3


def marker(site: int, row: int) -> str:
    """A token that only this one record holds (too rare to be a keyword)."""
    return f"zq{site}x{row}w"


def write_marked_sites(directory: Path) -> Path:
    """texts-demo over SITES files `site-<i>.csv` (id, text), every record with its own id and token, so
    a page can be searched for another site's records."""
    texts = load_dataset("texts-demo").texts
    assert texts is not None
    for site in range(SITES):
        rows = range(site, len(texts), SITES)
        frame = pd.DataFrame(
            {
                "id": [f"site{site}-rec{row}" for row in rows],
                "text": [f"{texts[row]} {marker(site, row)}" for row in rows],
            }
        )
        frame.to_csv(directory / f"site-{site}.csv", index=False)
    return directory


def site_records(directory: Path, site: int) -> tuple[list[str], list[str]]:
    """(ids, texts) of one site's file."""
    frame = pd.read_csv(directory / f"site-{site}.csv")
    return frame["id"].astype(str).tolist(), frame["text"].astype(str).tolist()


def run_inprocess(out: Path, **keys: Any) -> dict[str, Any]:
    return execute(build_overrides({"seed": 0, **keys}, out), engine="inprocess", quiet=True)


class Page(HTMLParser):
    """A page as a plain parser sees it: its text, every tag with its attributes, the section ids."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.text_parts: list[str] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(path.read_text(encoding="utf-8"))
        self.text = " ".join(self.text_parts)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {name: value or "" for name, value in attrs}))

    def handle_data(self, data: str) -> None:
        self.text_parts.append(data)

    @property
    def sections(self) -> list[str]:
        return [attrs.get("id", "") for tag, attrs in self.tags if tag == "section"]

    def count(self, tag: str) -> int:
        return sum(1 for name, _ in self.tags if name == tag)

    def outside_references(self) -> list[str]:
        """Every URL the page would load or link to outside itself: anything but `#anchors`, inline
        `data:` images and relative links to files beside it (an experiment's runs)."""
        found = []
        for tag, attrs in self.tags:
            for name in ("src", "href", "action", "poster", "srcset"):
                value = attrs.get(name)
                if value is None or value.startswith("#") or value.startswith("data:image/png;base64,"):
                    continue
                if tag == "a" and name == "href" and "://" not in value and not value.startswith("/"):
                    continue
                found.append(f"{tag} {name}={value}")
        return found


def blank_fraction(png: bytes) -> float:
    """The fraction of a screenshot's pixels that are pure white."""
    import io

    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    return float((pixels.min(axis=2) >= 250).mean())
