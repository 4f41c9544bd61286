"""The real data sets and traces the docs use, fetched from their public sources (or a mirror)
into a per-user cache and checked against pinned SHA-256s. Torch-free: it imports no other
part of the library."""

from powertrip.fetch.download import FetchError, Progress
from powertrip.fetch.fetch import (
    DATA_DIR_VARIABLE,
    cached_path,
    data_dir,
    entry_path,
    fetch,
    fetchable,
    missing_files,
)
from powertrip.fetch.sources import DATASETS, DataFile, DataSet, get

__all__ = [
    "DATASETS",
    "DATA_DIR_VARIABLE",
    "DataFile",
    "DataSet",
    "FetchError",
    "Progress",
    "cached_path",
    "data_dir",
    "entry_path",
    "fetch",
    "fetchable",
    "get",
    "missing_files",
]
