"""Datasets: every dataset the experiments use, read once per process into one `Dataset` type.

One module per family (embedded, multi-view tables, images, short texts, corpora) registers its entries;
`registry` gathers them, resolves the data directory and caches what it loads. On-disk datasets are
read from the data directory (see `resolve_data_dir`) with the file names and counts of its catalogue
(``README.md`` there). `python -m simulation datasets` lists every entry with its kind, the methods
that accept it and its files. A user's own file is a source spec (``csv:PATH``, ``images:DIR`` ...,
see `fedapp.datasets.sources`), with or without labels. Image augmentations for contrastive training
(torch) live in `fedapp.datasets.augment`, which this package does not import.
"""

from fedapp.datasets.common import KINDS, Dataset, DatasetError
from fedapp.datasets.multiview import MAT_PREFIX
from fedapp.datasets.registry import (
    DATA_DIR_ENV,
    DATASETS,
    EMBEDDED,
    DatasetInfo,
    available_datasets,
    dataset_info,
    dataset_infos,
    load_dataset,
    require_files,
    resolve_data_dir,
)
from fedapp.datasets.sources import (
    PARTITION_PLACEHOLDER,
    SOURCE_PREFIXES,
    Columns,
    has_placeholder,
    is_source_spec,
    read_source,
    source_kind,
    source_path,
)

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "EMBEDDED",
    "KINDS",
    "MAT_PREFIX",
    "PARTITION_PLACEHOLDER",
    "SOURCE_PREFIXES",
    "Columns",
    "Dataset",
    "DatasetError",
    "DatasetInfo",
    "available_datasets",
    "dataset_info",
    "dataset_infos",
    "has_placeholder",
    "is_source_spec",
    "load_dataset",
    "read_source",
    "require_files",
    "resolve_data_dir",
    "source_kind",
    "source_path",
]
