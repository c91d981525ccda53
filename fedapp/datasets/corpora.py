"""Document corpora for topic models (gFedNTM): 20 Newsgroups, raw messages with their group names.

The bydate tarball is streamed once without extraction: train then test, label = newsgroup name (classes
in sorted name order).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from fedapp.datasets.common import Dataset, DatasetError, OnDisk, build


def _read_20news(name: str, paths: tuple[Path, ...]) -> Dataset:
    """Stream the bydate tarball once (no extraction): train then test, label = newsgroup name."""
    path = paths[0]
    documents: dict[str, list[tuple[str, str]]] = {"20news-bydate-train": [], "20news-bydate-test": []}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                parts = member.name.split("/")
                if not member.isfile() or len(parts) != 3 or parts[0] not in documents:
                    continue
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                documents[parts[0]].append((parts[1], handle.read().decode("latin-1")))
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise DatasetError(f"{path}: cannot read the tar.gz archive: {exc}") from exc
    ordered = documents["20news-bydate-train"] + documents["20news-bydate-test"]
    labels = [group for group, _ in ordered]
    return build(
        name,
        "texts",
        labels,
        source=path,
        expected_n=18_846,
        expected_classes=20,
        texts=[text for _, text in ordered],
    )


DATASETS: dict[str, OnDisk] = {
    "20news": OnDisk(
        "texts",
        "20 Newsgroups bydate train + test, 18,846 raw messages, 20 groups",
        ("20newsgroups/20news-bydate.tar.gz",),
        _read_20news,
    ),
}
