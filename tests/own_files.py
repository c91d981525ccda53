"""Users' own files for tests: a registered set written out as per-site CSVs without labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedapp.datasets import load_dataset


def write_text_sites(directory: Path, sites: int) -> Path:
    """texts-demo shuffled (seed 1) and split over `sites` files `site-<i>.csv` with columns id,text."""
    texts = load_dataset("texts-demo").texts
    assert texts is not None
    order = np.random.default_rng(1).permutation(len(texts))
    for site, rows in enumerate(np.array_split(order, sites)):
        frame = pd.DataFrame({"id": [f"doc-{i}" for i in rows], "text": [texts[i] for i in rows]})
        frame.to_csv(directory / f"site-{site}.csv", index=False)
    return directory
