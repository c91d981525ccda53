"""Short texts for text clustering (FSTC): StackOverflow titles, Biomedical titles, AgNews items, CLINC150
queries (many clusters: 150 intents, or their 10 domains).

Raw strings as distributed (see the data catalogue for casing and preprocessing); embedding them is the
caller's business. Sample and class counts are checked against the catalogue.

Also here: `texts-demo`, a small embedded set of generated topic sentences (tests and quick runs need no
files). SCCL's augmented views of these datasets live in `fedapp.datasets.augmented_texts`.
"""

from __future__ import annotations

import json
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


def _read_clinc(name: str, paths: tuple[Path, ...]) -> Dataset:
    """CLINC150's imbalanced in-scope split (train + val + test: 18,025 queries, 75-150 per intent),
    labelled by intent (`clinc150`) or by the domain of the intent (`clinc150-domains`)."""
    data_path, domains_path = paths
    try:
        data = json.loads(read_gzip_text(data_path))
        rows = [tuple(row) for part in ("train", "val", "test") for row in data[part]]
        domains = json.loads(read_gzip_text(domains_path))
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{data_path}: not CLINC150's JSON ({exc})") from exc
    if any(len(row) != 2 for row in rows):
        raise DatasetError(f"{data_path}: a row is not [text, intent]")
    texts, intents = [str(t) for t, _ in rows], [str(i) for _, i in rows]
    expected = 150
    if name.endswith("-domains"):
        domain_of = {intent: domain for domain, members in domains.items() for intent in members}
        missing = sorted(set(intents) - domain_of.keys())
        if missing:
            raise DatasetError(f"{domains_path}: intent {missing[0]!r} has no domain")
        intents, expected = [domain_of[intent] for intent in intents], 10
    return build(
        name, "texts", intents, source=data_path, expected_n=18_025, expected_classes=expected, texts=texts
    )


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
    "clinc150": OnDisk(
        "texts",
        "CLINC150 queries (imbalanced split, in scope), 18,025 texts, 150 intents",
        ("clinc150/data_imbalanced.json.gz", "clinc150/domains.json.gz"),
        _read_clinc,
    ),
    "clinc150-domains": OnDisk(
        "texts",
        "CLINC150 queries (as clinc150) labelled by domain, 18,025 texts, 10 domains",
        ("clinc150/data_imbalanced.json.gz", "clinc150/domains.json.gz"),
        _read_clinc,
    ),
}
