"""Benchmark data: file checks and downloads, dataset loaders and client partitioners.

See docs/design.md, section 4.
"""

from fairclip.scenarios.errors import DataError

from .datasets import (
    DATASETS,
    Dataset,
    load_adult,
    load_dataset,
    load_dutch,
    load_fashion_mnist,
    load_mnist,
    refit_adult_scaling,
    skew_class,
)
from .files import DATASET_FILES, ENV_VAR, SHA256, SOURCES, fetch, resolve_data_dir, verified_path
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
    "resolve_data_dir",
    "skew_class",
    "verified_path",
]
