"""The built-in datasets by name: each is one module of :mod:`fairclip.scenarios.data.builtin`
that registers a :class:`DatasetSpec` (its loader, its files with their checksums and download
sources, and what its rows offer a scenario).

A new built-in dataset is its module in ``builtin/`` (found there by name, no list to edit) and
a scenario TOML that names it: ``scenario.dataset`` is checked against :func:`names`, the files
of ``fairclip data`` and their checksums come from :func:`checksums` and :func:`sources`, and a
scenario's rows from :attr:`DatasetSpec.from_scenario`.

This module imports nothing heavy: the built-in modules (numpy, pandas) are imported the first
time a name is looked up.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fairclip.strategies.errors import did_you_mean

GENERATED = ("synthetic",)
"""Dataset names a scenario may give that no file holds: generated per cohort
(:mod:`fairclip.scenarios.data.synthetic`)."""


@dataclass(frozen=True)
class DatasetSpec:
    """One built-in dataset.

    ``load(data_dir, seed)`` returns its :class:`~fairclip.scenarios.data.datasets.Dataset` with
    the papers' defaults; ``from_scenario(spec, data_dir, rows_seed)`` with a scenario's options
    (default: ``load`` with ``rows_seed``). ``files`` maps each file it reads, by path under the
    data directory, to its SHA-256; ``sources`` each file to the URLs ``fairclip data`` tries in
    turn. ``row_split``: the rows are split into training and test rows by a seed (``split_seed``,
    ``group_rows`` and ``include_protected`` apply); otherwise the files fix the test set.
    ``outside_epsilon(spec)``: the preprocessing steps of a scenario's options that use a
    statistic of the rows (reported in the summary); ``refit(fit, others, feature_names, spec)``:
    that preprocessing fitted again on a validation split's kept training rows alone.
    """

    name: str
    summary: str
    files: Mapping[str, str]
    sources: Mapping[str, tuple[str, ...]]
    load: Callable[..., Any]
    from_scenario: Callable[[Any, Any, int], Any] | None = None
    row_split: bool = False
    outside_epsilon: Callable[[Any], list[str]] | None = None
    refit: Callable[..., tuple[Any, ...]] | None = None
    aliases: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    """Further names :func:`fairclip.scenarios.data.load_dataset` loads from this dataset
    (``skewed-mnist``), each ``load(data_dir, seed)``; not scenario datasets."""

    def __post_init__(self) -> None:
        if set(self.sources) != set(self.files):
            raise ValueError(f"dataset {self.name}: every file needs its sources, and only those")


_REGISTRY: dict[str, DatasetSpec] = {}
_LOADED = False


def register(spec: DatasetSpec) -> DatasetSpec:
    """Add ``spec`` under its name (a built-in module calls this once, at import)."""
    if spec.name in _REGISTRY or spec.name in GENERATED:
        raise ValueError(f"dataset {spec.name!r} is registered twice")
    clash = set(spec.files) & {relative for other in _REGISTRY.values() for relative in other.files}
    if clash:
        raise ValueError(f"dataset {spec.name}: file {sorted(clash)[0]} belongs to another dataset")
    _REGISTRY[spec.name] = spec
    return spec


def _builtin() -> dict[str, DatasetSpec]:
    """The registry, once every module of ``builtin/`` is imported (in name order)."""
    global _LOADED
    if not _LOADED:
        package = importlib.import_module("fairclip.scenarios.data.builtin")  # numpy, pandas: on first use
        for module in sorted(info.name for info in pkgutil.iter_modules(package.__path__)):
            importlib.import_module(f"{package.__name__}.{module}")
        _LOADED = True
    return _REGISTRY


def names() -> tuple[str, ...]:
    """The built-in datasets' names (those with files)."""
    return tuple(_builtin())


def get(name: str) -> DatasetSpec:
    """The dataset ``name``; :class:`ValueError` with a "did you mean" where there is none."""
    registry = _builtin()
    if name not in registry:
        known = (*registry, *GENERATED)
        raise ValueError(f"unknown dataset {name!r}{did_you_mean(name, known)} (known: {', '.join(known)})")
    return registry[name]


def checksums() -> dict[str, str]:
    """SHA-256 of every built-in data file, by path under the data directory."""
    return {relative: digest for spec in _builtin().values() for relative, digest in spec.files.items()}


def sources() -> dict[str, tuple[str, ...]]:
    """Download URLs of every built-in data file, tried in order."""
    return {relative: tuple(urls) for spec in _builtin().values() for relative, urls in spec.sources.items()}


def dataset_files() -> dict[str, tuple[str, ...]]:
    """The files each built-in dataset reads, by dataset name."""
    return {name: tuple(spec.files) for name, spec in _builtin().items()}


def row_split_datasets() -> tuple[str, ...]:
    """The datasets whose training and test rows a seed splits (:attr:`DatasetSpec.row_split`)."""
    return tuple(name for name, spec in _builtin().items() if spec.row_split)
