"""A federated classification dataset: whose examples each client holds, each client's cohort, and
a test set weighted per cohort. Built-in scenarios build one from their data; a user builds one
from their own arrays with :meth:`FederatedDataset.from_arrays` (``fairclip.FederatedDataset``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairclip.plugins import resolve
from fairclip.scenarios.data.partition import Partition


@dataclass(frozen=True, eq=False)
class FederatedDataset:
    """Training examples per client and a test set weighted per cohort.

    ``client_indices[i]`` are the rows of ``train_x``/``train_y`` that client i holds and
    ``client_cohorts[i]`` its cohort (an index into ``cohort_names``). ``cohort_weights[name]``
    weighs every test example for the cohort's metrics (1/0 for a test set split by cohort; a
    class mix for cohorts defined by labels). Checked on construction: a bad dataset raises one
    ``ValueError`` line naming the problem.

    The test set is the server's own: every metric of a run is computed on it and published as
    post-processing of the released model, which DP covers only if no client holds these
    examples. Give a held-out split, never the clients' training rows.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    client_indices: list[np.ndarray]
    client_cohorts: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    cohort_weights: dict[str, np.ndarray]
    num_classes: int

    def __post_init__(self) -> None:
        n, clients = len(self.train_y), len(self.client_indices)
        if self.train_x.shape[0] != n or self.test_x.shape[0] != len(self.test_y):
            raise ValueError(
                f"features and labels differ in length (train {self.train_x.shape[0]} vs {n}, "
                f"test {self.test_x.shape[0]} vs {len(self.test_y)})"
            )
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise ValueError(
                f"train examples have shape {self.train_x.shape[1:]}, test {self.test_x.shape[1:]}"
            )
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 (got {self.num_classes})")
        for label, y in (("train", self.train_y), ("test", self.test_y)):
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(f"{label} labels must lie in 0..{self.num_classes - 1}")
        for label, x in (("train", self.train_x), ("test", self.test_x)):
            if not np.all(np.isfinite(x)):
                raise ValueError(f"{label} features hold non-finite values")
        if clients == 0 or self.client_cohorts.shape != (clients,):
            raise ValueError(f"{clients} clients but {self.client_cohorts.shape[0]} cohort labels")
        sizes = np.fromiter((len(rows) for rows in self.client_indices), dtype=np.int64, count=clients)
        if np.any(sizes == 0):
            raise ValueError(f"client {int(np.argmin(sizes))} holds no examples")
        rows = np.concatenate(self.client_indices)
        if rows.min() < 0 or rows.max() >= n:
            raise ValueError(f"clients hold rows outside 0..{n - 1}")
        if not self.cohort_weights:
            raise ValueError("at least one cohort is required")
        k = len(self.cohort_weights)
        if self.client_cohorts.min() < 0 or self.client_cohorts.max() >= k:
            raise ValueError(f"client cohorts must lie in 0..{k - 1}")
        for index, (name, weights) in enumerate(self.cohort_weights.items()):
            if not np.any(self.client_cohorts == index):
                raise ValueError(f"cohort {name!r} has no clients")
            if weights.shape != (len(self.test_y),) or not np.all(weights >= 0) or not weights.sum() > 0:
                raise ValueError(
                    f"cohort {name!r} needs a non-negative test weight per test example, not all 0"
                )

    @property
    def cohort_names(self) -> list[str]:
        return list(self.cohort_weights)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    @classmethod
    def from_arrays(
        cls,
        x: Any,
        y: Any,
        *,
        clients: Sequence[int] | np.ndarray | Partition,
        cohorts: Sequence[Any] | np.ndarray | None = None,
        test_x: Any,
        test_y: Any,
        test_cohorts: Sequence[Any] | np.ndarray,
        num_classes: int | None = None,
    ) -> FederatedDataset:
        """A dataset from arrays (numpy, or anything ``numpy.asarray`` reads, torch tensors too).

        ``x`` (n, ...) features and ``y`` (n,) integer labels of the training examples.
        ``clients``: per training example, the id (0..N-1) of the client holding it -- or a
        :class:`fairclip.scenarios.data.Partition` from one of the partitioners (``iid``,
        ``dirichlet``, ``by_cohort``), which also gives the cohorts. ``cohorts``: per client, its
        cohort, as names or as indices. ``test_cohorts``: per test example, the cohort whose
        metrics it counts for (the same kind of values). Cohorts are ordered by first appearance
        among the clients. ``num_classes`` defaults to the largest label + 1. ``test_x`` and
        ``test_y`` must be examples no client holds (the class docstring says why).
        """
        train_x = _features(x, "x")
        train_y = _labels(y, "y")
        test_features = _features(test_x, "test_x")
        test_labels = _labels(test_y, "test_y")
        for features, labels, name in ((train_x, train_y, ""), (test_features, test_labels, "test_")):
            if features.shape[0] != labels.shape[0]:
                raise ValueError(
                    f"{name}x has {features.shape[0]} examples but {name}y has {labels.shape[0]} labels"
                )
        if train_y.shape[0] == 0:
            raise ValueError("the training set is empty: x and y have no examples")
        if isinstance(clients, Partition):
            client_indices = [np.asarray(rows, dtype=np.int64) for rows in clients.client_indices]
            if cohorts is None:
                cohorts = [clients.cohort_names[k] for k in clients.client_cohorts]
        else:
            owner = np.asarray(clients)
            if owner.shape != train_y.shape or not np.issubdtype(owner.dtype, np.integer):
                raise ValueError(
                    f"clients must give an integer client id per training example ({len(train_y)})"
                )
            if owner.size and owner.min() < 0:
                raise ValueError("client ids must be >= 0")
            order = np.argsort(owner, kind="stable")
            counts = np.bincount(owner, minlength=int(owner.max()) + 1 if owner.size else 0)
            client_indices = np.split(order, np.cumsum(counts)[:-1])
        if cohorts is None:
            raise ValueError("cohorts (one per client) is required unless clients is a Partition")
        client_labels = list(np.asarray(cohorts).tolist())
        if len(client_labels) != len(client_indices):
            raise ValueError(f"{len(client_indices)} clients but {len(client_labels)} cohort labels")
        names = list(dict.fromkeys(client_labels))
        index = {name: k for k, name in enumerate(names)}
        test_labels_of = list(np.asarray(test_cohorts).tolist())
        if len(test_labels_of) != len(test_labels):
            raise ValueError(f"{len(test_labels)} test examples but {len(test_labels_of)} test cohort labels")
        unknown = sorted({str(c) for c in test_labels_of if c not in index})
        if unknown:
            raise ValueError(f"test cohort {unknown[0]!r} is not the cohort of any client")
        test_owner = np.array([index[c] for c in test_labels_of], dtype=np.int64)
        classes = (
            num_classes
            if num_classes is not None
            else int(max(train_y.max(initial=0), test_labels.max(initial=0))) + 1
        )
        return cls(
            train_x=train_x,
            train_y=train_y,
            client_indices=client_indices,
            client_cohorts=np.array([index[c] for c in client_labels], dtype=np.int64),
            test_x=test_features,
            test_y=test_labels,
            cohort_weights={str(name): (test_owner == k).astype(np.float64) for k, name in enumerate(names)},
            num_classes=int(classes),
        )

    @classmethod
    def from_torch(
        cls,
        train: Any,
        test: Any,
        *,
        clients: Sequence[int] | np.ndarray | Partition,
        cohorts: Sequence[Any] | np.ndarray | None = None,
        test_cohorts: Sequence[Any] | np.ndarray,
        num_classes: int | None = None,
    ) -> FederatedDataset:
        """A dataset from two map-style torch datasets (``dataset[i]`` is ``(features, label)``,
        ``len(dataset)`` their number), read once into arrays; the other arguments are those of
        :meth:`from_arrays`, indexed like the datasets."""
        x, y = _stacked(train, "train")
        test_x, test_y = _stacked(test, "test")
        return cls.from_arrays(
            x, y, clients=clients, cohorts=cohorts, test_x=test_x, test_y=test_y,
            test_cohorts=test_cohorts, num_classes=num_classes,
        )  # fmt: skip


def _stacked(dataset: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        items = [dataset[index] for index in range(len(dataset))]
        features = np.stack([np.asarray(item[0]) for item in items])
        labels = np.array([int(item[1]) for item in items], dtype=np.int64)
    except (TypeError, ValueError, IndexError) as error:
        raise ValueError(
            f"the {what} dataset must give (features, label) pairs of one shape ({error})"
        ) from None
    return features, labels


def _features(values: Any, name: str) -> np.ndarray:
    """``values`` as contiguous float32 features, or one ValueError line saying what they hold."""
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        hint = ": encode strings and categories as numbers first" if array.dtype.kind in "OUS" else ""
        raise ValueError(f"{name} must hold numbers (features), not values of dtype {array.dtype}{hint}")
    if array.ndim < 1:
        raise ValueError(f"{name} must have one row per example (got a scalar)")
    return np.ascontiguousarray(array, dtype=np.float32)


def _labels(values: Any, what: str) -> np.ndarray:
    labels = np.asarray(values)
    if labels.ndim != 1 or not (np.issubdtype(labels.dtype, np.integer) or labels.size == 0):
        raise ValueError(
            f"{what} must be a vector of integer class labels (got shape {labels.shape}, {labels.dtype})"
        )
    return labels.astype(np.int64)


def load_federated_dataset(
    reference: str, options: dict[str, Any], num_clients: int, seed: int
) -> FederatedDataset:
    """The dataset a ``federated-dataset`` scenario names (:mod:`fairclip.plugins`): a
    :class:`FederatedDataset` object as it is, or a loader called as ``loader(num_clients=N,
    seed=seed, **options)``. It must hold exactly ``num_clients`` clients. Problems raise one
    ``ValueError`` line."""

    source = resolve("dataset", reference)
    if isinstance(source, FederatedDataset):
        if options:
            raise ValueError(f"dataset {reference!r} is a dataset, not a loader: it takes no options")
        data = source
    elif callable(source):
        try:
            data = source(num_clients=num_clients, seed=seed, **options)
        except TypeError as error:
            raise ValueError(f"dataset loader {reference!r} failed: {error}") from None
    else:
        raise ValueError(f"dataset {reference!r} is {source!r}, neither a FederatedDataset nor a loader")
    if not isinstance(data, FederatedDataset):
        raise ValueError(
            f"dataset loader {reference!r} returned {type(data).__name__}, not a FederatedDataset"
        )
    if data.num_clients != num_clients:
        raise ValueError(
            f"dataset {reference!r} has {data.num_clients} clients, federation.num_clients {num_clients}"
        )
    return data
