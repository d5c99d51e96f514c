"""Real datasets as federated data: load, skew, partition into clients, weigh the test set.

The files come from ``--data-dir`` or ``FAIRCLIP_DATA`` and are checked against their SHA-256
(:mod:`fairclip.scenarios.data`). With ``partition = "cohort"`` each cohort's rule picks its examples
(a protected-attribute value, or fractions of classes); with ``iid`` or ``dirichlet`` the whole
training set is dealt to the clients and cohorts are only a random split of the clients.
A cohort is evaluated on its own test distribution: the test rows of its attribute value, or
the test set reweighted to the class mix of the cohort's training examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fairclip.scenarios import dataset_registry as registry
from fairclip.scenarios.config import ClassificationSpec
from fairclip.scenarios.data import (
    CohortRule,
    Dataset,
    Partition,
    by_cohort,
    cohort_client_counts,
    dirichlet,
    group_index,
    iid,
    per_example,
    resolve_data_dir,
    skew_class,
)
from fairclip.scenarios.data.federated_dataset import FederatedDataset
from fairclip.strategies.randomness import Stream, rng


def load(spec: ClassificationSpec, data_dir: Path | None, seed: int) -> Dataset:
    """The dataset of a scenario, skewed if the scenario says so. ``seed`` seeds the split into
    training and test rows too, unless the scenario fixes that with ``split_seed``."""
    directory = resolve_data_dir(data_dir)
    rows_seed = seed if spec.split_seed is None else spec.split_seed
    builtin = registry.get(spec.dataset)
    if builtin.from_scenario is not None:
        dataset = builtin.from_scenario(spec, directory, rows_seed)
    else:
        dataset = builtin.load(directory, seed)
    if spec.skew_class is not None:
        dataset = skew_class(
            dataset, cls=spec.skew_class, keep=spec.skew_keep, seed=seed, count=spec.skew_count
        )
    if spec.evaluate_on == "validation" and spec.test_rows == "split":  # left-out: the loader
        # returned the sample's held-out share as the evaluation rows already
        dataset = validation_split(dataset, spec.test_fraction, seed, refit=_refit(spec))
    if spec.test_limit is not None:
        dataset = limit_test_rows(dataset, spec.test_limit, seed)
    return dataset


def _refit(spec: ClassificationSpec) -> Callable[..., tuple[np.ndarray, ...]] | None:
    """The dataset's preprocessing fitted again on given rows (Adult's feature scaling), bound to
    ``spec``'s options; None where the dataset has none."""
    refit = registry.get(spec.dataset).refit
    if refit is None:
        return None
    return lambda fit, others, feature_names: refit(fit, others, feature_names, spec)


def outside_epsilon(spec: ClassificationSpec) -> list[str]:
    """The preprocessing steps of ``spec``'s data that use a statistic of the rows, outside the
    run's ε (empty for the defaults; each dataset's module says which: Adult's feature scaling by
    the training rows' statistics, and its age groups split at the median age of the complete
    rows)."""
    if spec.dataset in registry.GENERATED:
        return []
    steps = registry.get(spec.dataset).outside_epsilon
    return [] if steps is None else steps(spec)


def limit_test_rows(dataset: Dataset, limit: int, seed: int) -> Dataset:
    """At most ``limit`` of the test rows, a seeded subset kept in their order (all of them when
    there are no more)."""
    if limit >= len(dataset.y_test):
        return dataset
    kept = np.sort(rng(seed, Stream.DATA, 4).permutation(len(dataset.y_test))[:limit])
    x, y, g = _rows((dataset.x_test, dataset.y_test, dataset.g_test), kept)
    return dataclasses.replace(dataset, x_test=x, y_test=y, g_test=g)


def _rows(
    split: tuple[np.ndarray, np.ndarray, np.ndarray | None], index: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The rows ``index`` of a split's (features, labels, groups); groups stay None without any."""
    x, y, g = split
    return x[index], y[index], None if g is None else g[index]


def validation_split(
    dataset: Dataset,
    fraction: float,
    seed: int,
    refit: Callable[..., tuple[np.ndarray, ...]] | None = None,
) -> Dataset:
    """The training rows split into training and validation rows; the validation rows take the
    place of the test set, which is dropped (selection never sees it). ``refit(fit, others,
    feature_names)`` (from a dataset's :attr:`~fairclip.scenarios.dataset_registry.DatasetSpec.refit`:
    Adult's ``feature_scaling``): the preprocessing fitted again on the kept training rows alone,
    so that the validation rows feed no preprocessing either (Adult's ``public`` scaling uses no
    statistic: nothing changes)."""
    order = rng(seed, Stream.DATA, 3).permutation(len(dataset.y_train))
    cut = round(fraction * len(order))
    held, kept = np.sort(order[:cut]), np.sort(order[cut:])
    train = (dataset.x_train, dataset.y_train, dataset.g_train)
    x_train, y_train, g_train = _rows(train, kept)
    x_test, y_test, g_test = _rows(train, held)
    if refit is not None:
        x_train, x_test = refit(x_train, (x_test,), dataset.feature_names)
    return dataclasses.replace(
        dataset,
        x_train=x_train,
        y_train=y_train,
        g_train=g_train,
        x_test=x_test,
        y_test=y_test,
        g_test=g_test,
        name=f"{dataset.name}-validation",
    )


def partition(spec: ClassificationSpec, dataset: Dataset, num_clients: int, seed: int) -> Partition:
    """Clients' example indices and cohorts."""
    generator = rng(seed, Stream.DATA, 2)
    if spec.partition == "cohort":
        rules = [
            CohortRule(share=c.share, attribute=c.attribute, class_fractions=c.class_fractions, name=name)
            for name, c in spec.cohorts.items()
        ]
        return by_cohort(
            dataset.y_train, dataset.g_train, rules, num_clients, generator, group_names=dataset.group_names
        )
    if spec.partition == "per-example":
        rules = [
            CohortRule(share=c.share, attribute=c.attribute, class_fractions=c.class_fractions, name=name)
            for name, c in spec.cohorts.items()
        ]
        split = per_example(dataset.y_train, dataset.g_train, rules, group_names=dataset.group_names)
        if split.num_clients != num_clients:
            raise ValueError(
                f"the per-example partition makes one client per training example: "
                f"federation.num_clients must be {split.num_clients} (got {num_clients})"
            )
        return split
    if spec.partition == "iid":
        dealt = iid(len(dataset.y_train), num_clients, generator)
    else:
        dealt = dirichlet(dataset.y_train, num_clients, spec.dirichlet_alpha, generator)
    sizes = cohort_client_counts([c.share for c in spec.cohorts.values()], num_clients)
    cohorts = generator.permutation(np.repeat(np.arange(len(sizes)), sizes))
    return Partition(dealt.client_indices, cohorts, tuple(spec.cohorts))


def cohort_test_weights(
    spec: ClassificationSpec, dataset: Dataset, split: Partition
) -> dict[str, np.ndarray]:
    """One weight per test example and cohort: the cohort's own test distribution."""
    weights = {}
    test_counts = np.bincount(dataset.y_test, minlength=dataset.num_classes).astype(np.float64)
    for k, (name, cohort) in enumerate(spec.cohorts.items()):
        if cohort.attribute is not None:
            index = group_index(cohort.attribute, name, dataset.group_names)
            weights[name] = (dataset.g_test == index).astype(np.float64)
            continue
        held = np.concatenate([split.client_indices[c] for c in np.flatnonzero(split.client_cohorts == k)])
        mix = np.bincount(dataset.y_train[held], minlength=dataset.num_classes) / max(len(held), 1)
        per_class = np.divide(mix, test_counts, out=np.zeros_like(mix), where=test_counts > 0)
        weights[name] = per_class[dataset.y_test]
    return weights


def training_examples(spec: ClassificationSpec, data_dir: Path | None, seed: int) -> int:
    """Number of training examples of a scenario's dataset with ``seed`` (after balancing and skew):
    the number of clients of the per-example partition."""
    return len(load(spec, data_dir, seed).y_train)


def real_federated_data(
    spec: ClassificationSpec, num_clients: int, seed: int, data_dir: Path | None
) -> FederatedDataset:
    """Load and partition a real dataset."""
    dataset = load(spec, data_dir, seed)
    split = partition(spec, dataset, num_clients, seed)
    return FederatedDataset(
        train_x=dataset.x_train,
        train_y=dataset.y_train,
        client_indices=split.client_indices,
        client_cohorts=np.asarray(split.client_cohorts),
        test_x=dataset.x_test,
        test_y=dataset.y_test,
        cohort_weights=cohort_test_weights(spec, dataset, split),
        num_classes=dataset.num_classes,
    )
