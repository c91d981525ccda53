"""Document corpora for topic models (gFedNTM): 20 Newsgroups, raw messages with their group names.

The bydate tarball is streamed once without extraction: train then test, label = newsgroup name (classes
in sorted name order). `20news-families` is the same corpus labelled by newsgroup family (comp, rec, sci,
talk + religion, misc.forsale) with header blocks and quoted lines removed, so that partition
`by-group` gives each of 5 clients its own topics.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from fedapp.datasets.common import Dataset, DatasetError, OnDisk, build


def newsgroup_family(group: str) -> str:
    """comp.*, rec.*, sci.*, talk.* with alt.atheism and soc.religion.christian, misc.forsale."""
    if group in ("alt.atheism", "soc.religion.christian") or group.startswith("talk."):
        return "talk-religion"
    if group == "misc.forsale":
        return "misc-forsale"
    return group.split(".")[0]


def _read_20news_families(name: str, paths: tuple[Path, ...]) -> Dataset:
    groups = _read_20news(name, paths)
    assert groups.class_names is not None and groups.texts is not None  # set by _read_20news
    families = [newsgroup_family(groups.class_names[label]) for label in groups.y]
    bodies = [message_body(text) for text in groups.texts]
    return build(
        name, "texts", families, source=paths[0], expected_n=18_846, expected_classes=5, texts=bodies
    )


def message_body(message: str) -> str:
    """The message without its header block and quoted lines (as scikit-learn's remove=("headers",
    "quotes")): topics should come from what people wrote, not from e-mail addresses."""
    _, _, body = message.partition("\n\n")
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith((">", "|")))


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
    "20news-families": OnDisk(
        "texts",
        "20 Newsgroups (as 20news) labelled by family: comp, misc-forsale, rec, sci, talk-religion",
        ("20newsgroups/20news-bydate.tar.gz",),
        _read_20news_families,
    ),
}
