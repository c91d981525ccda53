"""Short texts for text clustering (FSTC): StackOverflow titles, Biomedical titles, AgNews items.

Raw strings as distributed (see the data catalogue for casing and preprocessing); embedding them is the
caller's business. Sample and class counts are checked against the catalogue.

Also here: `texts-demo`, a small embedded set of generated topic sentences (tests and quick runs need no
files), and `augmented_views`, SCCL's two contextual-augmentation views of StackOverflow and AgNews
(``sccl-augmented/``), aligned row by row with those datasets.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedapp.datasets.common import Dataset, DatasetError, Embedded, OnDisk, Source, build, read_gzip_text

# Label order 1..20 as given in the data catalogue (jacoxu/StackOverflow).
# fmt: off
STACKOVERFLOW_TAGS = (
    "wordpress", "oracle", "svn", "apache", "excel", "matlab", "visual-studio", "cocoa", "osx", "bash",
    "spring", "hibernate", "scala", "sharepoint", "ajax", "qt", "drupal", "linq", "haskell", "magento",
)
# fmt: on


def _split_label_tab_text(rows: list[str], path: Path) -> tuple[list[int], list[str]]:
    """`label<TAB>text` rows -> integer labels and texts."""
    labels, texts = [], []
    for number, row in enumerate(rows, start=1):
        label, tab, text = row.partition("\t")
        if not tab or not label.strip().isdigit():
            raise DatasetError(f"{path}: line {number} is not 'label<TAB>text'")
        labels.append(int(label))
        texts.append(text)
    return labels, texts


def _read_stackoverflow(name: str, paths: tuple[Path, ...]) -> Dataset:
    title_path, label_path = paths
    texts = read_gzip_text(title_path).split("\n")[:-1]  # LF-terminated, one title per line
    try:
        labels = [int(x) for x in read_gzip_text(label_path).split()]
    except ValueError as exc:
        raise DatasetError(f"{label_path}: non-integer label: {exc}") from exc
    if len(texts) != len(labels):
        raise DatasetError(
            f"{title_path}: {len(texts)} titles but {label_path.name} holds {len(labels)} labels"
        )
    return build(
        name,
        "texts",
        labels,
        source=title_path,
        expected_n=20_000,
        expected_classes=20,
        texts=texts,
        class_names=STACKOVERFLOW_TAGS,
    )


def _read_biomedical(name: str, paths: tuple[Path, ...]) -> Dataset:
    rows = [r for r in read_gzip_text(paths[0]).split("\r\n") if r]  # CRLF, no final newline
    labels, texts = _split_label_tab_text(rows, paths[0])
    return build(name, "texts", labels, source=paths[0], expected_n=20_000, expected_classes=20, texts=texts)


def _read_agnews(name: str, paths: tuple[Path, ...]) -> Dataset:
    rows = read_gzip_text(paths[0]).split("\n")[:-1]  # LF-terminated
    labels, texts = _split_label_tab_text(rows, paths[0])
    return build(name, "texts", labels, source=paths[0], expected_n=8_000, expected_classes=4, texts=texts)


# The demo set: each topic has its own words; sentences mix 3 topic words into shared templates.
# fmt: off
DEMO_TOPICS = (
    ("python", "pandas", "numpy", "dataframe", "pip", "virtualenv", "django", "list", "dictionary", "import"),
    ("football", "goal", "striker", "league", "referee", "penalty", "midfield", "coach", "stadium", "season"),
    ("protein", "enzyme", "cell", "gene", "receptor", "mutation", "tissue", "cancer", "clinical", "patients"),
    ("recipe", "oven", "flour", "butter", "sugar", "bake", "sauce", "garlic", "onion", "dessert"),
)
DEMO_TEMPLATES = (
    "how do i use {} with {} and {}", "question about {} {} {}", "{} and {} in the {}",
    "why does my {} break the {} {}", "best {} for {} and {}", "news on {} {} and {} today",
)
# fmt: on
DEMO_PER_TOPIC = 100


def _read_demo(name: str, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    labels, texts = [], []
    for topic, words in enumerate(DEMO_TOPICS):
        for _ in range(DEMO_PER_TOPIC):
            template = DEMO_TEMPLATES[rng.integers(len(DEMO_TEMPLATES))]
            texts.append(template.format(*rng.choice(words, size=3, replace=False)))
            labels.append(topic)
    order = rng.permutation(len(texts))
    return build(
        name,
        "texts",
        np.asarray(labels)[order],
        source="generated",
        texts=[texts[i] for i in order],
        class_names=tuple(words[0] for words in DEMO_TOPICS),
    )


# ------------------------------------------------------------------------------ augmented views
AUGMENTED_FILES = {
    "stackoverflow": "sccl-augmented/stackoverflow_trans_subst_10.csv.gz",
    "agnews": "sccl-augmented/agnewsdataraw-8000_trans_subst_10.csv.gz",
}
AUGMENTED_COLUMNS = ("label", "text", "text1", "text2")
MIN_ALIGNED = 0.999  # rows whose text must equal the dataset's (after `_comparable`): one SO row differs


def _comparable(text: str) -> str:
    """Letters and digits only, lowercased: the SCCL copies differ from ours in quotes and spacing."""
    return re.sub(r"[^0-9a-z]+", "", text.lower())


def augmented_views(data: Dataset, data_dir: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """SCCL's two augmented views (nlpaug word substitution, 10 %) of every text of `data`, in its order.

    Works for the full dataset and its `max-samples` subsets. Raises DatasetError for a dataset without
    an augmented file, a missing file, or a file whose rows do not line up with the dataset (labels must
    agree everywhere, texts in at least 99.9 % of rows).
    """
    if data.texts is None or data.name not in AUGMENTED_FILES:
        raise DatasetError(
            f"no augmented views for dataset {data.name!r}; available for {sorted(AUGMENTED_FILES)}"
        )
    full_texts, view1, view2 = _aligned_views(data.name, data_dir / AUGMENTED_FILES[data.name])
    row_of: dict[str, int] = {}
    for row, text in enumerate(full_texts):
        row_of.setdefault(text, row)
    missing = [text for text in data.texts if text not in row_of]
    if missing:
        raise DatasetError(f"{len(missing)} texts of {data.name!r} are not in {data.name}'s full text list")
    rows = [row_of[text] for text in data.texts]
    return tuple(view1[r] for r in rows), tuple(view2[r] for r in rows)


@lru_cache(maxsize=4)
def _aligned_views(name: str, path: Path) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(dataset texts, view 1, view 2) of the full dataset, after checking the file lines up with it."""
    from fedapp.datasets.registry import load_dataset  # the registry imports this module

    if not path.is_file():
        raise DatasetError(f"augmented views of {name!r}: missing {path}")
    try:
        with gzip.open(path, "rb") as raw:
            rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline="")))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot read as gzipped CSV: {exc}") from exc
    if rows and not set(AUGMENTED_COLUMNS) <= set(rows[0]):
        raise DatasetError(f"{path}: needs columns {AUGMENTED_COLUMNS}, has {sorted(rows[0])}")
    full = load_dataset(name, path.parents[1])
    if len(rows) != full.n_samples:
        raise DatasetError(f"{path}: {len(rows)} rows, dataset {name!r} has {full.n_samples}")
    try:
        _, labels = np.unique([int(row["label"]) for row in rows], return_inverse=True)
    except ValueError as exc:
        raise DatasetError(f"{path}: non-integer label: {exc}") from exc
    if not np.array_equal(labels, full.y):
        raise DatasetError(f"{path}: labels do not line up with dataset {name!r} row by row")
    assert full.texts is not None
    same = np.mean(
        [_comparable(row["text"]) == _comparable(t) for row, t in zip(rows, full.texts, strict=True)]
    )
    if same < MIN_ALIGNED:
        raise DatasetError(f"{path}: only {100 * same:.2f} % of texts line up with dataset {name!r}")
    return full.texts, tuple(row["text1"] for row in rows), tuple(row["text2"] for row in rows)


DATASETS: dict[str, Source] = {
    "texts-demo": Embedded(
        "texts",
        f"generated topic sentences, {len(DEMO_TOPICS) * DEMO_PER_TOPIC} texts, {len(DEMO_TOPICS)} topics",
        _read_demo,
        seeded=True,
    ),
    "stackoverflow": OnDisk(
        "texts",
        "StackOverflow question titles, 20,000 texts, 20 tags",
        ("stackoverflow/title_StackOverflow.txt.gz", "stackoverflow/label_StackOverflow.txt.gz"),
        _read_stackoverflow,
    ),
    "biomedical": OnDisk(
        "texts",
        "Biomedical paper titles, 20,000 texts, 20 topics",
        ("biomedical/biomedical_true_text.gz",),
        _read_biomedical,
    ),
    "agnews": OnDisk(
        "texts", "AgNews subset, 8,000 texts, 4 classes", ("agnews/agnewsdataraw-8000.gz",), _read_agnews
    ),
}
