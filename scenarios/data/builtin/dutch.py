"""Dutch census 2001 (``dutch``): high-level occupation, protected attribute sex (or marital status).

What is done, exactly
=====================

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
      file's checksum). ``one_hot="drop-first"`` leaves out each one-hot attribute's lowest
      code present (50 features), as seed 000's code encodes Dutch.
    * No group rebalancing by default; ``numpy.random.default_rng(seed)`` shuffles the rows and
      the first ``round(test_fraction·n)`` (12,084) form the test set, the remaining 48,336 the
      training set. ``group_rows`` first draws the given number of rows of each group from the
      same generator (seed 004's unbalanced Dutch: 30,000 of one sex, 10,000 of the other), and
      the split then shuffles those. (``fair-dp``'s Dutch runs additionally subsample women to a
      1 : 0.333 ratio; the cohort partitioners are the place for such skews there.)
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Mapping
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
from fairclip.scenarios.data.files import resolve_data_dir, verified_path
from fairclip.scenarios.dataset_registry import DatasetSpec, register

FILES = {"dutch/dutch_census_2001.arff": "0e7e3f32668919c239db820f625815e1ea834c71402cdea595e03ef08c8616ef"}
"""SHA-256 of the file, by path under the data directory."""
_ARFF = "Dutch_census/dutch_census_2001.arff"
SOURCES = {
    "dutch/dutch_census_2001.arff": (
        "https://raw.githubusercontent.com/tailequy/fairness_dataset/main/" + _ARFF,
        "https://raw.githubusercontent.com/tailequy/fairness_dataset/"
        "abb5a18b822ba56a221c5311082e192e85000b95/" + _ARFF,
    ),
}

MARITAL_GROUPS = ("marital-other", "marital-4")
"""Dutch groups with ``protected="marital-status"``: ``Marital_status`` codes 1-3, and code 4."""
DUTCH_PROTECTED = ("sex", "marital-status")
"""Dutch's groupings (``load_dutch``'s ``protected`` and ``group_rows_by``)."""

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
        raise malformed(path, f"not a readable ARFF text file ({error})") from None
    attributes: dict[str, tuple[str, ...]] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        lowered = stripped.lower()
        if lowered.startswith("@attribute"):
            parts = stripped.split(None, 2)
            if len(parts) < 3 or not (parts[2].startswith("{") and parts[2].endswith("}")):
                raise malformed(path, f"line {number + 1} is not a nominal @attribute")
            values = parts[2][1:-1].split(",")
            attributes[parts[1].strip("'\"")] = tuple(value.strip().strip("'\"") for value in values)
        elif lowered.startswith("@data"):
            body = "\n".join(lines[number + 1 :])
            break
    else:
        raise malformed(path, "no @data section")
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
        raise malformed(path, f"bad @data row ({str(error).splitlines()[0]})") from None
    for name, values in attributes.items():
        column = frame[name]
        unknown = column.notna() & ~column.isin(values)
        if unknown.any():
            raise malformed(path, f"attribute {name} has undeclared value {column[unknown].iloc[0]!r}")
    return frame, attributes


@functools.lru_cache(maxsize=2)
def _dutch_rows(key: tuple[str, int, int]) -> pd.DataFrame:
    path = Path(key[0])
    frame, _ = read_arff(path)
    missing = [name for name in DUTCH_ATTRIBUTES if name not in frame.columns]
    extra = [name for name in frame.columns if name not in DUTCH_ATTRIBUTES and name != "weight"]
    if missing or extra:
        raise malformed(path, f"attributes are not the Dutch census ones (missing {missing}, extra {extra})")
    frame = frame.drop(columns=[c for c in frame.columns if c == "weight"]).dropna(how="any")
    frame = frame[frame["age"].astype(int) > 3]  # under-age rows (none in the benchmark file)
    if not frame["occupation"].isin(list(_DUTCH_OCCUPATION)).all() or not frame["sex"].isin(["1", "2"]).all():
        raise malformed(path, "occupation must be 2_1 or 5_4_9 and sex 1 or 2")
    return frame.reset_index(drop=True)


def load_dutch(
    data_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    *,
    include_protected: bool = True,
    protected: str = "sex",
    group_rows: Mapping[str, int] | None = None,
    group_rows_by: str | None = None,
    test_rows: str = "split",
    validate: bool = False,
    one_hot: str = "every",
) -> Dataset:
    """Dutch census 2001, high-level occupation, protected attribute sex (0 male, 1 female).

    ``group_rows`` keeps the given number of rows of each group by name, drawn before the split
    (:func:`sample_group_rows`; seed 004's unbalanced Dutch); the split then shuffles those.
    ``group_rows_by`` names the attribute whose groups ``group_rows`` counts (default
    ``protected``). ``test_rows`` (:data:`TEST_ROWS`) ``"left-out"`` tests on every row the sample
    left out: seed 000's code, which draws 14,000 rows of each sex, trains on 70 % of them and
    tests on the rows it did not draw (``validate``: on the sample's held-out share instead,
    :func:`split_sample`).

    ``protected="marital-status"`` groups the rows by ``Marital_status`` code 4 (``g = 1``,
    ``marital-4``) against codes 1-3 (``g = 0``, ``marital-other``) instead: the grouping seed
    000's code evaluates (its group accuracies take the last input column, ``X[:, -1]``, which
    for Dutch is the last one-hot column of ``Marital_status``, not sex). The inputs, the rows
    and the split are the same as with ``sex``; the ``sex`` input column stays sex.

    ``one_hot`` (:data:`ONE_HOT`) ``"drop-first"`` gives no indicator to each one-hot attribute's
    lowest code present (50 features with sex instead of 59), as seed 000's code encodes Dutch;
    ``prev_residence_place`` is one indicator (code 2) either way."""
    check_split_args(seed, test_fraction)
    check_one_hot(one_hot)
    known = ", ".join(DUTCH_PROTECTED)
    if protected not in DUTCH_PROTECTED:
        raise ValueError(f"protected must be one of {known} for dutch, not {protected!r}")
    if group_rows_by is not None and group_rows_by not in DUTCH_PROTECTED:
        raise ValueError(f"group_rows_by must be one of {known} for dutch, not {group_rows_by!r}")
    root = resolve_data_dir(data_dir)
    path = verified_path(root, "dutch/dutch_census_2001.arff")
    frame = _dutch_rows(file_key(path))

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
        codes = sorted(frame[column].unique(), key=int)
        matrix, labels = one_hot_columns(frame[column], column, codes, one_hot == "drop-first")
        columns.append(matrix)
        names.extend(labels)
    x = np.concatenate(columns, axis=1)

    groupings = {
        "sex": (sex, SEX_GROUPS),
        "marital-status": ((frame["Marital_status"] == "4").to_numpy(dtype=np.int64), MARITAL_GROUPS),
    }
    g, group_names = groupings[protected]
    rng = np.random.default_rng(seed)
    rows = np.arange(len(frame))
    if group_rows is not None:
        strata, strata_names = groupings[group_rows_by or protected]
        rows = sample_group_rows(strata, strata_names, group_rows, rng, "Dutch")
    train, test = split_sample(
        rows, len(frame), test_fraction, rng, test_rows, group_rows is not None, validate
    )
    return tabular(x, y, g, train, test, "dutch", names, group_names)


def _from_scenario(spec: Any, directory: Path, rows_seed: int) -> Dataset:
    """Dutch with a scenario's options (``[scenario]`` keys of the same names)."""
    return load_dutch(
        directory,
        seed=rows_seed,
        test_fraction=spec.test_fraction,
        protected=spec.protected,
        include_protected=spec.include_protected,
        group_rows=spec.group_rows,
        group_rows_by=spec.group_rows_by,
        test_rows=spec.test_rows,
        validate=spec.evaluate_on == "validation",
        one_hot=spec.one_hot,
    )


SPEC = register(
    DatasetSpec(
        name="dutch",
        summary="Dutch census 2001: high-level occupation, 60,420 rows, protected attribute sex",
        files=FILES,
        sources=SOURCES,
        load=lambda data_dir, seed: load_dutch(data_dir, seed=seed),
        from_scenario=_from_scenario,
        row_split=True,
    )
)
