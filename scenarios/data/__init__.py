"""Benchmark data: file checks and downloads, dataset loaders and client partitioners.

See docs/design.md, section 4.
"""

from fairclip.scenarios import dataset_registry as registry
from fairclip.scenarios.errors import DataError

from .builtin.adult import load_adult, refit_adult_scaling
from .builtin.dutch import load_dutch
from .builtin.fashion_mnist import load_fashion_mnist
from .builtin.mnist import load_mnist
from .datasets import Dataset, load_dataset, skew_class
from .files import ENV_VAR, fetch, resolve_data_dir, verified_path
from .partition import (
    CohortRule,
    Partition,
    by_cohort,
    cohort_client_counts,
    dirichlet,
    group_index,
    iid,
    per_example,
)

SHA256 = registry.checksums()
"""Expected SHA-256 of every built-in data file, by path under the data directory."""
SOURCES = registry.sources()
"""Download URLs of every built-in data file, tried in order."""
DATASET_FILES = registry.dataset_files()
"""The files each built-in dataset reads."""
DATASETS = (*registry.names(), "skewed-mnist")
"""The names :func:`load_dataset` takes."""

__all__ = [
    "DATASETS",
    "DATASET_FILES",
    "ENV_VAR",
    "SHA256",
    "SOURCES",
    "CohortRule",
    "DataError",
    "Dataset",
    "Partition",
    "by_cohort",
    "cohort_client_counts",
    "dirichlet",
    "fetch",
    "group_index",
    "iid",
    "load_adult",
    "load_dataset",
    "load_dutch",
    "load_fashion_mnist",
    "load_mnist",
    "per_example",
    "refit_adult_scaling",
    "registry",
    "resolve_data_dir",
    "skew_class",
    "verified_path",
]
