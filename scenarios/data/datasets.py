"""What every dataset is, and the pieces the built-in loaders share.

A loader (one module per dataset in :mod:`fairclip.scenarios.data.builtin`, registered by name in
:mod:`fairclip.scenarios.dataset_registry`) takes the data directory (``None``: ``$FAIRCLIP_DATA``,
see :mod:`.files`), checks the SHA-256 of each file it reads, and returns a :class:`Dataset`:
``x`` float32, ``y`` int64 class index, ``g`` int64 protected-attribute index (``None`` for the
image datasets). Parsed files are cached in this process (keyed on path, size and modification
time); every call returns fresh arrays, so callers may modify them. Nothing here needs the
network or torch. Each built-in module's docstring says exactly what its loader does.

Shared here: the gzip IDX reader (MNIST, Fashion-MNIST), the class skew of ``skewed-mnist``, the
tabular helpers (row splits, group sampling, one-hot columns) and :func:`load_dataset`, which
loads any built-in dataset by name with the papers' defaults.

Skewed MNIST (:func:`skew_class`, seeds 000/003/004)
    Each *training* example of class ``cls`` (8) is kept independently with probability ``keep``
    (0.09), drawn from ``numpy.random.default_rng(seed)``: of MNIST's 5,851 eights about 527 ± 22
    remain (the papers quote "about 500"). Every other class and the whole test set are untouched.

"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import math
import os
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fairclip.scenarios import dataset_registry as registry
from fairclip.scenarios.errors import DataError

from .files import ENV_VAR, resolve_data_dir, verified_path

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049

SEX_GROUPS = ("male", "female")
"""The groups of a ``sex`` grouping (Adult, Dutch): ``g = 0`` male, ``g = 1`` female."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split with labels and, for tabular data, a protected attribute per example."""

    x_train: np.ndarray
    y_train: np.ndarray
    g_train: np.ndarray | None
    x_test: np.ndarray
    y_test: np.ndarray
    g_test: np.ndarray | None
    num_classes: int
    name: str
    group_names: tuple[str, ...] = ()
    feature_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y, g = (getattr(self, f"{field}_{split}") for field in "xyg")
            what = f"{split} split of {self.name}"
            if x.dtype != np.float32 or y.dtype != np.int64 or y.ndim != 1 or len(x) != len(y):
                raise ValueError(f"{what}: need float32 x and 1-D int64 y of equal length")
            if (g is None) != (self.g_train is None):
                raise ValueError(f"{what}: g must be None in both splits or in neither")
            if g is not None and (g.dtype != np.int64 or g.shape != y.shape):
                raise ValueError(f"{what}: g must be int64 and shaped like y")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise ValueError(f"{self.name}: train and test examples differ in shape")

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example: ``(1, 28, 28)`` for images, ``(num_features,)`` for tables."""
        return tuple(self.x_train.shape[1:])

    @property
    def num_groups(self) -> int:
        return len(self.group_names)


def malformed(path: Path, what: str) -> DataError:
    path = path.absolute()
    return DataError(
        f"malformed data file {path}: {what}; delete it and run `fairclip data --data-dir "
        f"{path.parent.parent}` where the network allows, or set {ENV_VAR} to a folder holding an intact copy"
    )


def file_key(path: Path) -> tuple[str, int, int]:
    status = path.stat()
    return str(path), status.st_size, status.st_mtime_ns


# ----------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)


def read_idx(path: str | os.PathLike[str], magic: int) -> np.ndarray:
    """The uint8 array in gzip IDX file ``path`` (read-only, cached); :class:`DataError` if malformed.

    ``magic`` is 2051 for images (3 dimensions) or 2049 for labels (1 dimension). No checksum is
    checked here; loaders pass paths from :func:`verified_path`.
    """
    return _read_idx(*file_key(Path(path)), magic)


@functools.lru_cache(maxsize=16)
def _read_idx(path_text: str, _size: int, _mtime_ns: int, magic: int) -> np.ndarray:
    path = Path(path_text)
    try:
        with gzip.open(path, "rb") as stream:
            raw = stream.read()
    except (OSError, EOFError, zlib.error) as error:
        raise malformed(path, f"not a complete gzip stream ({error})") from None
    if len(raw) < 4 or int.from_bytes(raw[:4], "big") != magic:
        found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
        raise malformed(path, f"IDX magic number {found} where {magic} is expected")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise malformed(path, "IDX header is truncated")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if len(raw) - header != math.prod(dims):
        raise malformed(path, f"IDX payload has {len(raw) - header} bytes where the header announces {dims}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_idx_dataset(data_dir: str | os.PathLike[str] | None, folder: str, name: str) -> Dataset:
    root = resolve_data_dir(data_dir)
    paths = {
        (split, kind): verified_path(root, f"{folder}/{split}-{kind}-ubyte.gz")
        for split in ("train", "t10k")
        for kind in ("images-idx3", "labels-idx1")
    }
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split in ("train", "t10k"):
        image_path, label_path = paths[split, "images-idx3"], paths[split, "labels-idx1"]
        images = read_idx(image_path, IDX_IMAGES_MAGIC)
        labels = read_idx(label_path, IDX_LABELS_MAGIC)
        if images.shape[1:] != (28, 28):
            raise malformed(image_path, f"images are {images.shape[1:]} where 28x28 is expected")
        if len(labels) != len(images):
            raise malformed(label_path, f"{len(labels)} labels for {len(images)} images")
        if labels.size and labels.max() > 9:
            raise malformed(label_path, f"label {labels.max()} outside 0..9")
        x = images.reshape(-1, 1, 28, 28).astype(np.float32)
        x /= 255.0
        arrays[split] = x, labels.astype(np.int64)
    (x_train, y_train), (x_test, y_test) = arrays["train"], arrays["t10k"]
    return Dataset(x_train, y_train, None, x_test, y_test, None, num_classes=10, name=name)


def skew_class(
    dataset: Dataset, cls: int = 8, keep: float = 0.09, *, seed: int, count: int | None = None
) -> Dataset:
    """Keep each training example of class ``cls`` with probability ``keep`` (seeded), or, with
    ``count``, exactly ``count`` of them (a seeded uniform subset: seed 004 keeps 500 eights);
    test untouched."""
    if not 0 <= cls < dataset.num_classes:
        raise ValueError(f"class {cls} is outside 0..{dataset.num_classes - 1} of {dataset.name}")
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must lie in [0, 1], not {keep}")
    rng = np.random.default_rng(seed)
    of_class = np.flatnonzero(dataset.y_train == cls)
    if count is not None:
        if not 0 <= count <= len(of_class):
            raise ValueError(
                f"cannot keep {count} examples of class {cls}: {dataset.name} has {len(of_class)}"
            )
        dropped = np.setdiff1d(of_class, rng.choice(of_class, size=count, replace=False))
    else:
        dropped = of_class[rng.random(len(of_class)) >= keep]
    if dropped.size == 0:  # keep = 1 (galli-mnist): no copy of the training images
        return dataclasses.replace(dataset, name=f"skewed-{dataset.name}")
    mask = np.ones(dataset.num_train, dtype=bool)
    mask[dropped] = False
    return dataclasses.replace(
        dataset,
        x_train=dataset.x_train[mask],
        y_train=dataset.y_train[mask],
        g_train=None if dataset.g_train is None else dataset.g_train[mask],
        name=f"skewed-{dataset.name}",
    )


# ----------------------------------------------------------------------------------------------
# Tabular helpers


def check_split_args(seed: int, test_fraction: float) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, not {test_fraction}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, not {seed!r}")


def split_rows(rows: np.ndarray, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    shuffled = rng.permutation(rows)
    n_test = round(test_fraction * len(shuffled))
    if not 0 < n_test < len(shuffled):
        raise ValueError(f"test_fraction {test_fraction} leaves {len(rows)} rows an empty train or test set")
    return shuffled[n_test:], shuffled[:n_test]


TEST_ROWS = ("split", "left-out")
"""Where a sampled census set's test rows come from (``test_rows`` of the Adult and Dutch
loaders): ``split``, ``test_fraction`` of the sample; ``left-out``, every row the sample did not
draw, while ``1 - test_fraction`` of the sample trains and its held-out share only validates
(seed 000's code: its grid runs are compared there, its final models tested on the rest)."""


def split_sample(
    rows: np.ndarray,
    total: int,
    test_fraction: float,
    rng: np.random.Generator,
    test_rows: str = "split",
    sampled: bool = True,
    validate: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The training and test rows of ``rows``, a sample (``sampled``) of ``total`` rows, under
    ``test_rows`` (:data:`TEST_ROWS`); ``split`` is :func:`split_rows`. ``validate`` with
    ``left-out``: the sample's held-out share in place of the test rows (the validation rows of
    seed 000's grid runs, which train on the same rows as its final runs)."""
    if test_rows not in TEST_ROWS:
        raise ValueError(f"test_rows must be one of {', '.join(TEST_ROWS)}, not {test_rows!r}")
    if test_rows == "left-out" and not sampled:
        raise ValueError("test_rows = left-out needs a sample of the rows (group_rows, or Adult's balance)")
    train, held_out = split_rows(rows, test_fraction, rng)
    if test_rows == "left-out" and not validate:
        return train, np.setdiff1d(np.arange(total), rows)
    return train, held_out


def sample_group_rows(
    g: np.ndarray,
    group_names: tuple[str, ...],
    counts: Mapping[str, int],
    rng: np.random.Generator,
    dataset: str,
) -> np.ndarray:
    """The sorted indices of ``counts[name]`` rows of each group, drawn without replacement in
    the order of ``group_names`` (a group not named keeps no row): seed 004's sampled census
    sets (balanced Adult, 14,000 + 14,000; unbalanced Dutch, 30,000 + 10,000)."""
    unknown = sorted(set(counts) - set(group_names))
    if unknown:
        raise ValueError(
            f"group_rows names no group {unknown[0]!r} of {dataset} (its groups: {', '.join(group_names)})"
        )
    chosen = []
    for group, name in enumerate(group_names):
        if name not in counts:
            continue
        wanted = counts[name]
        members = np.flatnonzero(g == group)
        if isinstance(wanted, bool) or not isinstance(wanted, int | np.integer) or wanted < 1:
            raise ValueError(f"group_rows.{name} must be a positive integer, not {wanted!r}")
        if len(members) < wanted:
            raise ValueError(
                f"{dataset} has {len(members)} {name} rows, fewer than group_rows.{name} = {wanted}"
            )
        chosen.append(rng.choice(members, size=wanted, replace=False))
    if not chosen:
        raise ValueError("group_rows keeps no row")
    return np.sort(np.concatenate(chosen))


ONE_HOT = ("every", "drop-first")
"""How a census set's categorical attributes become inputs (``one_hot`` of the Adult and Dutch
loaders): ``every`` category gets an indicator, or each attribute's first category (in sorted
order) gets none, as scikit-learn's ``OneHotEncoder(drop="first")`` encodes them (seed 000's
code). With a bias in the model the two span the same functions, but DP-SGD clips each
example's gradient by its norm and noises every coordinate, so the runs differ."""


def check_one_hot(one_hot: str) -> None:
    """Refuse a ``one_hot`` that is not one of :data:`ONE_HOT`."""
    if one_hot not in ONE_HOT:
        raise ValueError(f"one_hot must be one of {', '.join(ONE_HOT)}, not {one_hot!r}")


def one_hot_columns(
    values: pd.Series, column: str, categories: list[str], drop_first: bool = False
) -> tuple[np.ndarray, list[str]]:
    """One indicator column per category of ``categories`` (in that order), named
    ``column=category``; ``drop_first``: none for ``categories[0]`` (its rows are all zero). A
    value outside ``categories`` (a missing one) gets no indicator: its row is all zero."""
    codes = pd.Categorical(values, categories=categories).codes
    matrix = np.zeros((len(values), len(categories)), dtype=np.float32)
    known = np.flatnonzero(codes >= 0)
    matrix[known, codes[known]] = 1.0
    names = [f"{column}={category}" for category in categories]
    start = 1 if drop_first else 0
    return np.ascontiguousarray(matrix[:, start:]), names[start:]


def tabular(
    x: np.ndarray,
    y: np.ndarray,
    g: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    name: str,
    feature_names: list[str],
    group_names: tuple[str, ...] = SEX_GROUPS,
) -> Dataset:
    return Dataset(
        x_train=np.ascontiguousarray(x[train]),
        y_train=y[train],
        g_train=g[train],
        x_test=np.ascontiguousarray(x[test]),
        y_test=y[test],
        g_test=g[test],
        num_classes=2,
        name=name,
        group_names=group_names,
        feature_names=tuple(feature_names),
    )


# ----------------------------------------------------------------------------------------------


def _aliases() -> dict[str, Callable[..., Dataset]]:
    return {alias: load for name in registry.names() for alias, load in registry.get(name).aliases.items()}


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0) -> Dataset:
    """Load a built-in dataset by name, with the defaults of the papers (see its module)."""
    aliases = _aliases()
    if name in aliases:
        return aliases[name](data_dir, seed)
    return registry.get(name).load(data_dir, seed)
