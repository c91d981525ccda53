"""Measure `fedapp.features.embeddings`: encoding speed of StackOverflow titles per thread count, and a
cached call.

    python -m simulation.bench.embeddings [--data-dir ../shared/data] [--sample 2000] [--threads 1 2]

Loads the model twice (import + load, then load alone); encodes a seeded sample of titles into a fresh
temporary cache once per thread count (texts/s, one model load included); then all 20,000 titles with
the last thread count, then the same 20,000 again (a cache hit: no model load).
Prints one JSON object. Reads the titles directly so that it depends on nothing but the catalogue file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import tempfile
import time
from pathlib import Path

from fedapp.features.embeddings import DEFAULT_MODEL, embed_texts, load_sentence_model  # noqa: E402


def _titles(data_dir: Path) -> list[str]:
    path = data_dir / "stackoverflow" / "title_StackOverflow.txt.gz"
    with gzip.open(path, "rt", encoding="utf-8") as stream:
        return stream.read().split("\n")[:-1]


def _timed_embed(texts: list[str], cache: Path, **options: object) -> tuple[float, tuple[int, ...]]:
    started = time.perf_counter()
    vectors = embed_texts(texts, cache_dir=cache, device="cpu", show_progress=False, **options)
    return time.perf_counter() - started, vectors.shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--sample", type=int, default=2000, help="titles per thread-count measurement")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--skip-full", action="store_true", help="skip the 20,000-title encode and hit")
    args = parser.parse_args()

    import torch

    titles = _titles(args.data_dir)
    sample = random.Random(0).sample(titles, min(args.sample, len(titles)))
    report: dict[str, object] = {"model": args.model, "batch_size": args.batch_size, "load": os.getloadavg()}
    started = time.perf_counter()
    load_sentence_model(args.model, "cpu")  # imports sentence-transformers, so the rates below exclude that
    report["first_import_and_load_seconds"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    load_sentence_model(args.model, "cpu")
    report["model_load_seconds"] = round(time.perf_counter() - started, 2)
    with tempfile.TemporaryDirectory() as scratch:
        for threads in args.threads:
            torch.set_num_threads(threads)
            seconds, _ = _timed_embed(
                sample, Path(scratch) / f"t{threads}", model=args.model, batch_size=args.batch_size
            )
            report[f"texts_per_s_{threads}_threads"] = round(len(sample) / seconds, 1)
            report[f"seconds_{len(sample)}_titles_{threads}_threads"] = round(seconds, 2)
        if not args.skip_full:
            full_cache = Path(scratch) / "full"
            seconds, shape = _timed_embed(titles, full_cache, model=args.model, batch_size=args.batch_size)
            report["full_encode_seconds"] = round(seconds, 2)
            report["full_shape"] = shape
            report["full_texts_per_s"] = round(len(titles) / seconds, 1)
            seconds, _ = _timed_embed(titles, full_cache, model=args.model, batch_size=args.batch_size)
            report["cached_call_seconds"] = round(seconds, 3)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
