"""Benchmark datasets as numpy arrays: MNIST, skewed MNIST, Fashion-MNIST, Adult and Dutch census.

Every loader takes the data directory (``None``: ``$FAIRCLIP_DATA``, see :mod:`.files`), checks
the SHA-256 of each file it reads, and returns a :class:`Dataset`: ``x`` float32, ``y`` int64 class
index, ``g`` int64 protected-attribute index (``None`` for the image datasets). Parsed files are
cached in this process (keyed on path, size and modification time); every call returns fresh
arrays, so callers may modify them. Nothing here needs the network or torch.

What is done, exactly
=====================

MNIST and Fashion-MNIST (:func:`load_mnist`, :func:`load_fashion_mnist`)
    The gzip IDX files are parsed with numpy: magic number 2051 (images, unsigned bytes, 3
    dimensions) or 2049 (labels, 1 dimension), big-endian dimensions, and a payload whose length
    must equal their product. Images become ``(n, 1, 28, 28)`` float32 pixel/255 in [0, 1]; no
    mean/std normalisation (a model may add it). The original train (60,000) and test (10,000)
    splits are kept; 10 classes.

Skewed MNIST (:func:`skew_class`, seeds 000/003/004)
    Each *training* example of class ``cls`` (8) is kept independently with probability ``keep``
    (0.09), drawn from ``numpy.random.default_rng(seed)``: of MNIST's 5,851 eights about 527 ± 22
    remain (the papers quote "about 500"). Every other class and the whole test set are untouched.

Adult (:func:`load_adult`; Esipova et al. 2023, appendix B.1, and their code ``fair-dp``)
    ``adult.data`` (32,561 rows) and ``adult.test`` (16,281 rows; its first line, a banner, is
    skipped) are concatenated; fields are comma-separated with a leading space. ``fnlwgt`` (a
    sampling weight) is dropped and every row with a ``?`` in any field is dropped, leaving the
    45,222 complete rows. Label: 1 iff income is ``>50K`` (``>50K.`` in adult.test, whose labels
    carry a trailing period), else 0. Protected attribute: ``sex``, ``g = 0`` male, ``g = 1``
    female (``group_names = ("male", "female")``, the coding of Esipova et al.). With
    ``balance=True`` (default), ``per_group`` = 14,000 female and 14,000 male rows are drawn
    without replacement (28,000 rows; there are 14,695 complete female rows). The rows (all, or
    the balanced 28,000) are then shuffled and the first ``round(test_fraction·n)`` form the test
    set (5,600 of 28,000 by default), the rest the training set (22,400). Both draws come from
    ``numpy.random.default_rng(seed)``, in that order. Features, in this order:

    * ``age``, ``education_num``, ``capital_gain``, ``capital_loss``, ``hours_per_week``. By
      default (``scaling="public"``) each is clipped to its documented domain and mapped into
      [0, 1] by that domain alone (:data:`ADULT_PUBLIC_DOMAINS`: age 17-90, education_num
      1-16 and hours_per_week 1-99 linearly, capital gain and loss by log1p(x)/log1p(99,999)),
      so no statistic of the rows enters the features and every row's features depend on that
      row only. The papers' preprocessing scales by statistics of the rows, a step outside ε:
      ``scaling="standardize"`` subtracts the mean and divides by the (population, ddof=0)
      standard deviation of the *training* rows (Esipova et al. used the whole table's
      statistics, before the split), ``scaling="minmax"`` maps into [0, 1] by the training
      rows' minimum and maximum (seed 004's "scaled to [0, 1]"; a test row may fall slightly
      outside). With those two, a validation split held out of the training rows scales them
      again by the kept rows' statistics alone (:func:`refit_adult_scaling`; ``public`` has
      nothing to refit);
    * ``race`` binarised: 0 White, 1 any other value;
    * ``sex``: 0 male, 1 female (the protected attribute is also an input feature, as in
      ``fair-dp``; pass ``include_protected=False`` to leave it out);
    * one-hot indicators of ``workclass`` (7 values), ``education`` (16), ``marital_status``
      (7), ``occupation`` (14), ``relationship`` (6) and ``native_country`` (41), one per value
      that ``adult.names`` documents (:data:`ADULT_CATEGORIES`; ``workclass`` less
      ``Never-worked``, which no complete row holds), sorted by name: the layout (98 features in
      all) is public and does not depend on the rows, the seed or the balancing (``fair-dp``
      one-hot encodes the values seen after its sampling instead).

    With ``protected="age"`` the groups are age below 40 (``younger``) and 40 or more
    (``older``), a public threshold (:data:`ADULT_AGE_THRESHOLD`); ``age_split="median"`` splits
    at the median age of all complete rows instead (37; seed 001's grouping, a statistic of the
    rows that, with balancing, also decides which rows are sampled: outside ε).

    Balancing samples the groups of the protected attribute, or, with ``balance_by``, those of
    another attribute: seed 001 (SoftAdaClip, appendix A.3) draws Esipova et al.'s 14,000 men and
    14,000 women and groups the same rows by age for its age disparities
    (``protected="age", balance_by="sex"``). The rows, split and features are then those of the
    sex grouping with the same seed, row for row (21.2 % of the 28,000 rows earn >50K).

Dutch census 2001 (:func:`load_dutch`; Esipova et al. 2023, appendix B.1, ``fair-dp``)
    The file is the ARFF of the fairness-benchmark version (Le Quy et al. 2022, tailequy/
    fairness_dataset): 60,420 rows and 12 nominal attributes, no missing values. It is *already*
    preprocessed the way ``fair-dp``'s ``preprocess_dutch`` treats the original IPUMS file: it
    has no ``weight`` column (the ARFF header records Weka's ``Remove-R12``), no under-age rows
    (age codes present are 4–15; codes 1–3, which ``fair-dp`` drops as under-age, are declared
    in the header but unused), and, judging by the Weka filters its header records, occupation
    is already merged into two classes with the middle-level codes removed. The loader still
    drops a ``weight`` column and rows with age code ≤ 3 should a file contain them, which this
    one does not, so all 60,420 rows stay.

    * Label ``occupation``: ``2_1`` → 1 (positive), ``5_4_9`` → 0. By the ISCO-88 major-group
      codes, ``2_1`` is groups 1 (legislators, senior officials and managers) and 2
      (professionals), the "high-level" occupations; ``5_4_9`` is groups 5 (service and sales
      workers), 4 (clerks) and 9 (elementary occupations). ``fair-dp`` maps 1, 2 → 1 and
      4, 5, 9 → 0, i.e. predicts a high-level occupation, as in the benchmark's origin
      (Žliobaitė et al. 2011). Counts: 28,763 positive, 31,657 negative.
    * Protected attribute ``sex``: code 1 → ``g = 0`` male, code 2 → ``g = 1`` female
      (``group_names = ("male", "female")``). This is the IPUMS-International convention
      (SEX: 1 male, 2 female), the mapping ``{1: 0, 2: 1}`` of ``fair-dp`` (whose Adult coding is
      male 0, female 1), and it matches the data: 62.6 % of code-1 rows but 32.7 % of code-2 rows
      hold a high-level occupation. Counts: 30,147 male, 30,273 female.
    * Features, in this order: ``sex`` (0 male, 1 female; left out with
      ``include_protected=False``), ``prev_residence_place`` as one indicator (code 2 → 1, code
      1 → 0; the only two codes present), then one-hot indicators of ``age`` (12 codes present),
      ``household_position``, ``household_size``, ``citizenship``, ``country_birth``,
      ``edu_level``, ``economic_status``, ``cur_eco_activity``, ``Marital_status``, one per code
      present in the file (59 features in all). All features are 0/1; none is standardised (as in
      ``fair-dp``): no statistic of the rows scales a Dutch feature. The one-hot layout follows
      the codes present in the file, not all the codes its header declares: 12 declared codes
      that no row holds (age 1-3, 16 and 17; edu_level 9; economic_status 210 and 221-224;
      cur_eco_activity 200) have no column, which keeps the 59-feature layout of the recorded
      Dutch results. Which codes occur is, strictly, a fact of the rows (fixed here by the
      file's checksum).
    * No group rebalancing by default; ``numpy.random.default_rng(seed)`` shuffles the rows and
      the first ``round(test_fraction·n)`` (12,084) form the test set, the remaining 48,336 the
      training set. ``group_rows`` first draws the given number of rows of each group from the
      same generator (seed 004's unbalanced Dutch: 30,000 of one sex, 10,000 of the other), and
      the split then shuffles those. (``fair-dp``'s Dutch runs additionally subsample women to a
      1 : 0.333 ratio; the cohort partitioners are the place for such skews there.)
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import math
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fairclip.scenarios.errors import DataError

from .files import ENV_VAR, resolve_data_dir, verified_path

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049

SEX_GROUPS = ("male", "female")
AGE_GROUPS = ("younger", "older")
"""Adult's age groups with ``protected="age"``: below the age split, and at or above it
(:data:`ADULT_AGE_SPLITS`)."""
PROTECTED_ATTRIBUTES = ("sex", "age")
"""Adult's groupings (``load_adult``'s ``protected``)."""
MARITAL_GROUPS = ("marital-other", "marital-4")
"""Dutch groups with ``protected="marital-status"``: ``Marital_status`` codes 1-3, and code 4."""
DUTCH_PROTECTED = ("sex", "marital-status")
"""Dutch's groupings (``load_dutch``'s ``protected``)."""


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


def _malformed(path: Path, what: str) -> DataError:
    path = path.absolute()
    return DataError(
        f"malformed data file {path}: {what}; delete it and run `fairclip data --data-dir "
        f"{path.parent.parent}` where the network allows, or set {ENV_VAR} to a folder holding an intact copy"
    )


def _file_key(path: Path) -> tuple[str, int, int]:
    status = path.stat()
    return str(path), status.st_size, status.st_mtime_ns


# ----------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)


def read_idx(path: str | os.PathLike[str], magic: int) -> np.ndarray:
    """The uint8 array in gzip IDX file ``path`` (read-only, cached); :class:`DataError` if malformed.

    ``magic`` is 2051 for images (3 dimensions) or 2049 for labels (1 dimension). No checksum is
    checked here; loaders pass paths from :func:`verified_path`.
    """
    return _read_idx(*_file_key(Path(path)), magic)


@functools.lru_cache(maxsize=16)
def _read_idx(path_text: str, _size: int, _mtime_ns: int, magic: int) -> np.ndarray:
    path = Path(path_text)
    try:
        with gzip.open(path, "rb") as stream:
            raw = stream.read()
    except (OSError, EOFError, zlib.error) as error:
        raise _malformed(path, f"not a complete gzip stream ({error})") from None
    if len(raw) < 4 or int.from_bytes(raw[:4], "big") != magic:
        found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
        raise _malformed(path, f"IDX magic number {found} where {magic} is expected")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise _malformed(path, "IDX header is truncated")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if len(raw) - header != math.prod(dims):
        raise _malformed(path, f"IDX payload has {len(raw) - header} bytes where the header announces {dims}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _load_idx_dataset(data_dir: str | os.PathLike[str] | None, folder: str, name: str) -> Dataset:
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
            raise _malformed(image_path, f"images are {images.shape[1:]} where 28x28 is expected")
        if len(labels) != len(images):
            raise _malformed(label_path, f"{len(labels)} labels for {len(images)} images")
        if labels.size and labels.max() > 9:
            raise _malformed(label_path, f"label {labels.max()} outside 0..9")
        x = images.reshape(-1, 1, 28, 28).astype(np.float32)
        x /= 255.0
        arrays[split] = x, labels.astype(np.int64)
    (x_train, y_train), (x_test, y_test) = arrays["train"], arrays["t10k"]
    return Dataset(x_train, y_train, None, x_test, y_test, None, num_classes=10, name=name)


def load_mnist(data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """MNIST: 60,000 train and 10,000 test images ``(n, 1, 28, 28)`` in [0, 1], 10 classes."""
    return _load_idx_dataset(data_dir, "mnist", "mnist")


def load_fashion_mnist(data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """Fashion-MNIST: 60,000 train and 10,000 test images ``(n, 1, 28, 28)`` in [0, 1], 10 classes."""
    return _load_idx_dataset(data_dir, "fashion-mnist", "fashion-mnist")


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


def _check_split_args(seed: int, test_fraction: float) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, not {test_fraction}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, not {seed!r}")


def _split_rows(rows: np.ndarray, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    shuffled = rng.permutation(rows)
    n_test = round(test_fraction * len(shuffled))
    if not 0 < n_test < len(shuffled):
        raise ValueError(f"test_fraction {test_fraction} leaves {len(rows)} rows an empty train or test set")
    return shuffled[n_test:], shuffled[:n_test]


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


def _one_hot(values: pd.Series, column: str, categories: list[str]) -> tuple[np.ndarray, list[str]]:
    codes = pd.Categorical(values, categories=categories).codes
    matrix = np.zeros((len(values), len(categories)), dtype=np.float32)
    matrix[np.arange(len(values)), codes] = 1.0
    return matrix, [f"{column}={category}" for category in categories]


def _tabular(
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
# Adult

ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education_num",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
    "native_country",
    "income",
)
ADULT_NUMERIC = ("age", "education_num", "capital_gain", "capital_loss", "hours_per_week")


@dataclass(frozen=True)
class PublicDomain:
    """A numeric column's documented range [``low``, ``high``] and its map into [0, 1]: values
    are clipped to the range (a data-independent step), then mapped linearly, or with ``log``
    by log1p(x − low) / log1p(high − low) (dollar amounts, mostly 0 with a long tail)."""

    low: float
    high: float
    log: bool = False

    def scale(self, values: np.ndarray) -> np.ndarray:
        """``values`` (float64) clipped to the domain and mapped into [0, 1]: low → 0, high → 1."""
        above_low = np.clip(values, self.low, self.high) - self.low
        if self.log:
            return np.log1p(above_low) / np.log1p(self.high - self.low)
        return above_low / (self.high - self.low)


ADULT_PUBLIC_DOMAINS = {
    "age": PublicDomain(17, 90),
    "education_num": PublicDomain(1, 16),
    "capital_gain": PublicDomain(0, 99_999, log=True),
    "capital_loss": PublicDomain(0, 99_999, log=True),
    "hours_per_week": PublicDomain(1, 99),
}
"""The public domain of each of :data:`ADULT_NUMERIC`, from the documentation of the Adult
extraction from the 1994 Current Population Survey (``adult.names``: the extraction kept rows
with ``AAGE > 16`` and ``HRSWK > 0``; the CPS public-use file top-codes age at 90, capital gain
and capital loss at 99,999 dollars and hours per week at 99; ``education-num`` codes the 16
documented education levels 1-16). ``scaling="public"`` maps each column by its domain alone,
so no statistic of the rows enters the features."""

ADULT_SCALINGS = ("public", "standardize", "minmax")
"""``load_adult``'s ``scaling``: ``public`` (:data:`ADULT_PUBLIC_DOMAINS`, no statistic of the
rows; the default), or ``standardize`` / ``minmax`` by statistics of the training rows (the
papers' preprocessing: a step outside ε, which a run's summary says)."""

ADULT_AGE_THRESHOLD = 40
"""Adult's public age split (``protected="age"``, ``age_split="public"``): ``older`` is aged 40
or more, the age from which the US Age Discrimination in Employment Act (1967) protects people
from age discrimination in employment: a documented threshold that no row decides (the median
age of the complete rows, 37, is a statistic of the rows)."""
ADULT_AGE_SPLITS = ("public", "median")
"""``load_adult``'s ``age_split``: at :data:`ADULT_AGE_THRESHOLD` (the default), or at the
median age of all 45,222 complete rows, test rows included (seed 001's grouping; a statistic
of the rows, outside ε)."""

ADULT_CATEGORIES = {
    "workclass": (
        "Private",
        "Self-emp-not-inc",
        "Self-emp-inc",
        "Federal-gov",
        "Local-gov",
        "State-gov",
        "Without-pay",
    ),
    "education": (
        "Bachelors",
        "Some-college",
        "11th",
        "HS-grad",
        "Prof-school",
        "Assoc-acdm",
        "Assoc-voc",
        "9th",
        "7th-8th",
        "12th",
        "Masters",
        "1st-4th",
        "10th",
        "Doctorate",
        "5th-6th",
        "Preschool",
    ),
    "marital_status": (
        "Married-civ-spouse",
        "Divorced",
        "Never-married",
        "Separated",
        "Widowed",
        "Married-spouse-absent",
        "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support",
        "Craft-repair",
        "Other-service",
        "Sales",
        "Exec-managerial",
        "Prof-specialty",
        "Handlers-cleaners",
        "Machine-op-inspct",
        "Adm-clerical",
        "Farming-fishing",
        "Transport-moving",
        "Priv-house-serv",
        "Protective-serv",
        "Armed-Forces",
    ),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "native_country": (
        "United-States",
        "Cambodia",
        "England",
        "Puerto-Rico",
        "Canada",
        "Germany",
        "Outlying-US(Guam-USVI-etc)",
        "India",
        "Japan",
        "Greece",
        "South",
        "China",
        "Cuba",
        "Iran",
        "Honduras",
        "Philippines",
        "Italy",
        "Poland",
        "Jamaica",
        "Vietnam",
        "Mexico",
        "Portugal",
        "Ireland",
        "France",
        "Dominican-Republic",
        "Laos",
        "Ecuador",
        "Taiwan",
        "Haiti",
        "Columbia",
        "Hungary",
        "Guatemala",
        "Nicaragua",
        "Scotland",
        "Thailand",
        "Yugoslavia",
        "El-Salvador",
        "Trinadad&Tobago",
        "Peru",
        "Hong",
        "Holand-Netherlands",
    ),
}
"""The values of Adult's one-hot columns as ``adult.names`` lists them (the layout sorts them by
name), so the layout is public. ``workclass`` leaves out the listed ``Never-worked``: a person
who never worked has no occupation, and all 10 such rows have occupation ``?``, so no complete
row holds it. A complete row with a value not listed here is a malformed file."""
ADULT_CATEGORICAL = tuple(ADULT_CATEGORIES)
_ADULT_INCOME = {"<=50K": 0, ">50K": 1, "<=50K.": 0, ">50K.": 1}


def _read_adult_file(path: Path, skip_rows: int) -> pd.DataFrame:
    try:
        frame = pd.read_csv(
            path,
            header=None,
            names=list(ADULT_COLUMNS),
            skiprows=skip_rows,
            skipinitialspace=True,
            dtype=str,
            na_values=["?"],
            keep_default_na=False,
            skip_blank_lines=True,
            engine="c",
        )
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as error:
        raise _malformed(path, f"not the 15-field Adult CSV ({str(error).splitlines()[0]})") from None
    if frame["income"].isna().any() or not frame["income"].isin(list(_ADULT_INCOME)).all():
        raise _malformed(path, "a row lacks a valid income label (<=50K or >50K)")
    for column in (*ADULT_NUMERIC, "fnlwgt"):
        values = pd.to_numeric(frame[column], errors="coerce")
        if (values.isna() & frame[column].notna()).any():
            raise _malformed(path, f"column {column} holds a non-numeric value")
        frame[column] = values
    return frame


@functools.lru_cache(maxsize=2)
def _adult_complete_rows(train_key: tuple[str, int, int], test_key: tuple[str, int, int]) -> pd.DataFrame:
    frames = [_read_adult_file(Path(train_key[0]), 0), _read_adult_file(Path(test_key[0]), 1)]
    frame = pd.concat(frames, ignore_index=True).drop(columns="fnlwgt")
    return frame.dropna(how="any").reset_index(drop=True)


def load_adult(
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    balance: bool = True,
    test_fraction: float = 0.2,
    *,
    per_group: int = 14_000,
    include_protected: bool = True,
    scaling: str = "public",
    protected: str = "sex",
    age_split: str = "public",
    balance_by: str | None = None,
    group_rows: Mapping[str, int] | None = None,
) -> Dataset:
    """UCI Adult, income > 50K; see the module docstring. The protected attribute is sex (0 male,
    1 female), or with ``protected="age"`` the age binarised at ``age_split`` (0 younger, 1 at
    least :data:`ADULT_AGE_THRESHOLD`, or with ``"median"`` at least the median age of the
    complete rows: seed 001's second grouping); ``balance`` samples ``per_group`` rows of each
    group of the protected attribute, or of ``balance_by`` (one of :data:`PROTECTED_ATTRIBUTES`)
    where given, ``group_rows`` (with ``balance=False``) the given number of rows of each group
    by name (:func:`sample_group_rows`). ``scaling`` is one of :data:`ADULT_SCALINGS`."""
    _check_split_args(seed, test_fraction)
    if protected not in PROTECTED_ATTRIBUTES:
        raise ValueError(f"protected must be one of {', '.join(PROTECTED_ATTRIBUTES)}, not {protected!r}")
    if scaling not in ADULT_SCALINGS:
        raise ValueError(f"scaling must be one of {', '.join(ADULT_SCALINGS)}, not {scaling!r}")
    if age_split not in ADULT_AGE_SPLITS:
        raise ValueError(f"age_split must be one of {', '.join(ADULT_AGE_SPLITS)}, not {age_split!r}")
    if balance_by is not None and balance_by not in PROTECTED_ATTRIBUTES:
        raise ValueError(f"balance_by must be one of {', '.join(PROTECTED_ATTRIBUTES)}, not {balance_by!r}")
    root = resolve_data_dir(data_dir)
    train_path = verified_path(root, "adult/adult.data")
    test_path = verified_path(root, "adult/adult.test")
    frame = _adult_complete_rows(_file_key(train_path), _file_key(test_path))

    y = frame["income"].map(_ADULT_INCOME).to_numpy(dtype=np.int64)
    sex = frame["sex"]
    if not sex.isin(["Male", "Female"]).all():
        raise _malformed(train_path, "sex is neither Male nor Female in some row")
    female = (sex == "Female").to_numpy(dtype=np.int64)
    age = frame["age"].astype(np.float64).to_numpy()
    threshold = np.median(age) if age_split == "median" else ADULT_AGE_THRESHOLD
    groupings = {"sex": (female, SEX_GROUPS), "age": ((age >= threshold).astype(np.int64), AGE_GROUPS)}
    g, group_names = groupings[protected]

    rng = np.random.default_rng(seed)
    if balance and group_rows is not None:
        raise ValueError("group_rows samples the groups itself: give it with balance=False")
    if group_rows is not None:
        rows = sample_group_rows(g, group_names, group_rows, rng, "Adult")
    elif balance:
        if per_group <= 0:
            raise ValueError(f"per_group must be positive, not {per_group}")
        strata, strata_names = groupings[balance_by or protected]
        chosen = []
        for group, group_name in enumerate(strata_names):
            members = np.flatnonzero(strata == group)
            if len(members) < per_group:
                raise ValueError(f"Adult has {len(members)} complete {group_name} rows, not {per_group}")
            chosen.append(rng.choice(members, size=per_group, replace=False))
        rows = np.sort(np.concatenate(chosen))
    else:
        rows = np.arange(len(frame))
    train, test = _split_rows(rows, test_fraction, rng)

    columns: list[np.ndarray] = []
    names: list[str] = []
    numeric = frame[list(ADULT_NUMERIC)].to_numpy(dtype=np.float64)
    if scaling == "public":
        columns.append(_public_scaling(numeric))
    else:
        shift, spread = _scaling(numeric[train], scaling)
        columns.append(((numeric - shift) / spread).astype(np.float32))
    names.extend(ADULT_NUMERIC)
    columns.append((frame["race"] != "White").to_numpy(dtype=np.float32)[:, None])
    names.append("race=non-white")
    if include_protected:  # the sex column, whichever attribute defines the groups (age is numeric)
        columns.append(female.astype(np.float32)[:, None])
        names.append("sex=female")
    for column, categories in ADULT_CATEGORIES.items():
        unlisted = ~frame[column].isin(categories)
        if unlisted.any():
            value = frame[column][unlisted].iloc[0]
            raise _malformed(train_path, f"{column} {value!r} in a complete row is not listed in adult.names")
        matrix, labels = _one_hot(frame[column], column, sorted(categories))
        columns.append(matrix)
        names.extend(labels)
    x = np.concatenate(columns, axis=1)
    return _tabular(x, y, g, train, test, "adult", names, group_names)


def _public_scaling(numeric: np.ndarray) -> np.ndarray:
    """Adult's numeric columns (:data:`ADULT_NUMERIC`, float64) mapped by their public domains
    (:data:`ADULT_PUBLIC_DOMAINS`) alone, as float32."""
    scaled = [ADULT_PUBLIC_DOMAINS[name].scale(numeric[:, k]) for k, name in enumerate(ADULT_NUMERIC)]
    return np.stack(scaled, axis=1).astype(np.float32)


def _scaling(fit: np.ndarray, scaling: str) -> tuple[np.ndarray, np.ndarray]:
    """(shift, spread) per column of the rows ``fit``: mean and population standard deviation
    (``standardize``) or minimum and range (``minmax``); a constant column keeps spread 1."""
    values = fit.astype(np.float64)
    if scaling == "standardize":
        shift, spread = values.mean(axis=0), values.std(axis=0)
    elif scaling == "minmax":
        shift = values.min(axis=0)
        spread = values.max(axis=0) - shift
    else:
        raise ValueError(f"scaling by statistics of the rows is standardize or minmax, not {scaling!r}")
    spread[spread == 0] = 1.0
    return shift, spread


def refit_adult_scaling(
    fit: np.ndarray, others: tuple[np.ndarray, ...], feature_names: tuple[str, ...], scaling: str
) -> tuple[np.ndarray, ...]:
    """``fit`` and ``others`` (Adult's feature rows) with the numeric columns scaled again by the
    statistics of the rows ``fit`` alone: a validation split held out of the training rows then
    feeds none of them. Both row-statistic scalings are affine per column, so scaling the scaled
    values again is scaling the raw values by ``fit``'s statistics (up to float32 rounding).
    ``public`` scaling uses no statistic, so there is nothing to refit: the arrays come back as
    they are."""
    if scaling not in ADULT_SCALINGS:
        raise ValueError(f"scaling must be one of {', '.join(ADULT_SCALINGS)}, not {scaling!r}")
    if scaling == "public":
        return (fit, *others)
    columns = [feature_names.index(name) for name in ADULT_NUMERIC]
    shift, spread = _scaling(fit[:, columns], scaling)
    rescaled = []
    for x in (fit, *others):
        x = x.copy()
        x[:, columns] = ((x[:, columns].astype(np.float64) - shift) / spread).astype(np.float32)
        rescaled.append(x)
    return tuple(rescaled)


# ----------------------------------------------------------------------------------------------
# Dutch census

DUTCH_ATTRIBUTES = (
    "sex",
    "age",
    "household_position",
    "household_size",
    "prev_residence_place",
    "citizenship",
    "country_birth",
    "edu_level",
    "economic_status",
    "cur_eco_activity",
    "Marital_status",
    "occupation",
)
DUTCH_ONE_HOT = (
    "age",
    "household_position",
    "household_size",
    "citizenship",
    "country_birth",
    "edu_level",
    "economic_status",
    "cur_eco_activity",
    "Marital_status",
)
_DUTCH_OCCUPATION = {"2_1": 1, "5_4_9": 0}
_DUTCH_SEX = {"1": 0, "2": 1}


def read_arff(path: str | os.PathLike[str]) -> tuple[pd.DataFrame, dict[str, tuple[str, ...]]]:
    """A nominal-only ARFF file as a frame of strings (``?`` → missing) and each attribute's values."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise _malformed(path, f"not a readable ARFF text file ({error})") from None
    attributes: dict[str, tuple[str, ...]] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        lowered = stripped.lower()
        if lowered.startswith("@attribute"):
            parts = stripped.split(None, 2)
            if len(parts) < 3 or not (parts[2].startswith("{") and parts[2].endswith("}")):
                raise _malformed(path, f"line {number + 1} is not a nominal @attribute")
            values = parts[2][1:-1].split(",")
            attributes[parts[1].strip("'\"")] = tuple(value.strip().strip("'\"") for value in values)
        elif lowered.startswith("@data"):
            body = "\n".join(lines[number + 1 :])
            break
    else:
        raise _malformed(path, "no @data section")
    try:
        frame = pd.read_csv(
            io.StringIO(body),
            header=None,
            names=list(attributes),
            dtype=str,
            comment="%",
            skip_blank_lines=True,
            na_values=["?"],
            keep_default_na=False,
            skipinitialspace=True,
        )
    except (pd.errors.ParserError, ValueError) as error:
        raise _malformed(path, f"bad @data row ({str(error).splitlines()[0]})") from None
    for name, values in attributes.items():
        column = frame[name]
        unknown = column.notna() & ~column.isin(values)
        if unknown.any():
            raise _malformed(path, f"attribute {name} has undeclared value {column[unknown].iloc[0]!r}")
    return frame, attributes


@functools.lru_cache(maxsize=2)
def _dutch_rows(key: tuple[str, int, int]) -> pd.DataFrame:
    path = Path(key[0])
    frame, _ = read_arff(path)
    missing = [name for name in DUTCH_ATTRIBUTES if name not in frame.columns]
    extra = [name for name in frame.columns if name not in DUTCH_ATTRIBUTES and name != "weight"]
    if missing or extra:
        raise _malformed(path, f"attributes are not the Dutch census ones (missing {missing}, extra {extra})")
    frame = frame.drop(columns=[c for c in frame.columns if c == "weight"]).dropna(how="any")
    frame = frame[frame["age"].astype(int) > 3]  # under-age rows (none in the benchmark file)
    if not frame["occupation"].isin(list(_DUTCH_OCCUPATION)).all() or not frame["sex"].isin(["1", "2"]).all():
        raise _malformed(path, "occupation must be 2_1 or 5_4_9 and sex 1 or 2")
    return frame.reset_index(drop=True)


def load_dutch(
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    *,
    include_protected: bool = True,
    protected: str = "sex",
    group_rows: Mapping[str, int] | None = None,
) -> Dataset:
    """Dutch census 2001, high-level occupation, protected attribute sex (0 male, 1 female).

    ``group_rows`` keeps the given number of rows of each group by name, drawn before the split
    (:func:`sample_group_rows`; seed 004's unbalanced Dutch); the split then shuffles those.

    ``protected="marital-status"`` groups the rows by ``Marital_status`` code 4 (``g = 1``,
    ``marital-4``) against codes 1-3 (``g = 0``, ``marital-other``) instead: the grouping seed
    000's code evaluates (its group accuracies take the last input column, ``X[:, -1]``, which
    for Dutch is the last one-hot column of ``Marital_status``, not sex). The inputs, the rows
    and the split are the same as with ``sex``; the ``sex`` input column stays sex."""
    _check_split_args(seed, test_fraction)
    if protected not in DUTCH_PROTECTED:
        known = ", ".join(DUTCH_PROTECTED)
        raise ValueError(f"protected must be one of {known} for dutch, not {protected!r}")
    root = resolve_data_dir(data_dir)
    path = verified_path(root, "dutch/dutch_census_2001.arff")
    frame = _dutch_rows(_file_key(path))

    y = frame["occupation"].map(_DUTCH_OCCUPATION).to_numpy(dtype=np.int64)
    sex = frame["sex"].map(_DUTCH_SEX).to_numpy(dtype=np.int64)
    columns: list[np.ndarray] = []
    names: list[str] = []
    if include_protected:
        columns.append(sex.astype(np.float32)[:, None])
        names.append("sex=female")
    columns.append((frame["prev_residence_place"] == "2").to_numpy(dtype=np.float32)[:, None])
    names.append("prev_residence_place=2")
    for column in DUTCH_ONE_HOT:
        matrix, labels = _one_hot(frame[column], column, sorted(frame[column].unique(), key=int))
        columns.append(matrix)
        names.extend(labels)
    x = np.concatenate(columns, axis=1)

    if protected == "marital-status":
        g, group_names = (frame["Marital_status"] == "4").to_numpy(dtype=np.int64), MARITAL_GROUPS
    else:
        g, group_names = sex, SEX_GROUPS
    rng = np.random.default_rng(seed)
    rows = np.arange(len(frame))
    if group_rows is not None:
        rows = sample_group_rows(g, group_names, group_rows, rng, "Dutch")
    train, test = _split_rows(rows, test_fraction, rng)
    return _tabular(x, y, g, train, test, "dutch", names, group_names)


# ----------------------------------------------------------------------------------------------

DATASETS = ("mnist", "skewed-mnist", "fashion-mnist", "adult", "dutch")


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0) -> Dataset:
    """Load a dataset by its scenario name, with the defaults of the papers (see module docstring)."""
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "skewed-mnist":
        return skew_class(load_mnist(data_dir), cls=8, keep=0.09, seed=seed)
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir)
    if name == "adult":
        return load_adult(data_dir, seed=seed)
    if name == "dutch":
        return load_dutch(data_dir, seed=seed)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
