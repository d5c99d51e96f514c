"""Client partitioners: IID, Dirichlet label skew and cohorts (fairclip.scenarios.data.partition)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.scenarios.data import CohortRule, Partition, by_cohort, cohort_client_counts, dirichlet, iid


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assigned(partition: Partition) -> np.ndarray:
    return np.concatenate(partition.client_indices)


def assert_disjoint(partition: Partition, num_examples: int) -> None:
    everything = assigned(partition)
    assert len(np.unique(everything)) == len(everything), "an example went to two clients"
    assert everything.min(initial=0) >= 0 and everything.max(initial=0) < num_examples
    assert all(np.all(np.diff(indices) > 0) for indices in partition.client_indices)


def assert_one_line(error: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def balanced_labels(per_class: int = 1000, classes: int = 10) -> np.ndarray:
    return rng(99).permutation(np.repeat(np.arange(classes), per_class))


def label_skew(partition: Partition, labels: np.ndarray, classes: int) -> float:
    """Mean total-variation distance between a client's label distribution and the global one."""
    overall = np.bincount(labels, minlength=classes) / len(labels)
    distances = []
    for indices in partition.client_indices:
        local = np.bincount(labels[indices], minlength=classes) / len(indices)
        distances.append(0.5 * np.abs(local - overall).sum())
    return float(np.mean(distances))


# ----------------------------------------------------------------------------------------------
# IID and Dirichlet


def test_iid_deals_everything_in_near_equal_parts() -> None:
    partition = iid(1003, 10, rng())
    assert partition.num_clients == 10 and partition.client_cohorts.tolist() == [0] * 10
    assert sorted(partition.sizes.tolist()) == [100] * 7 + [101] * 3
    assert_disjoint(partition, 1003)
    assert len(assigned(partition)) == 1003
    again = iid(1003, 10, rng())
    assert all(
        np.array_equal(a, b) for a, b in zip(partition.client_indices, again.client_indices, strict=True)
    )


def test_dirichlet_assigns_every_example_once_and_feeds_every_client() -> None:
    labels = balanced_labels()
    partition = dirichlet(labels, 100, 0.05, rng(), min_size=5)
    assert_disjoint(partition, len(labels))
    assert len(assigned(partition)) == len(labels)
    assert partition.sizes.min() >= 5


def test_small_alpha_is_more_skewed_than_large_alpha() -> None:
    labels = balanced_labels()
    skewed = label_skew(dirichlet(labels, 50, 0.1, rng(1)), labels, 10)
    mild = label_skew(dirichlet(labels, 50, 100.0, rng(1)), labels, 10)
    assert skewed > 0.5 > 0.1 > mild


# ----------------------------------------------------------------------------------------------
# Cohorts


def test_cohort_client_counts_round_half_up_and_give_the_rest_to_the_last() -> None:
    assert cohort_client_counts([0.9, 0.1], 100) == [90, 10]
    assert cohort_client_counts([0.25, 0.75], 10) == [3, 7]
    assert cohort_client_counts([0.3, 0.3, 0.4], 7) == [2, 2, 3]


def test_minority_cohort_holding_80_percent_of_class_8() -> None:
    labels = balanced_labels(per_class=1000)
    cohorts = [
        CohortRule(share=0.9, name="majority"),
        CohortRule(share=0.1, class_fractions={8: 0.8}, name="minority"),
    ]
    partition = by_cohort(labels, None, cohorts, 100, rng())
    assert partition.cohort_names == ("majority", "minority")
    assert np.bincount(partition.client_cohorts).tolist() == [90, 10]
    assert partition.client_cohorts[:90].tolist() == [0] * 90
    assert_disjoint(partition, len(labels))
    assert len(assigned(partition)) == len(labels)

    majority = labels[partition.cohort_indices(0)]
    minority = labels[partition.cohort_indices(1)]
    assert (minority == 8).sum() == 800 and (majority == 8).sum() == 200
    # Other classes are shared in proportion to the number of clients: 10 % to the minority.
    for cls in (0, 1, 2, 3, 4, 5, 6, 7, 9):
        assert (minority == cls).sum() == 100 and (majority == cls).sum() == 900
    assert (minority == 8).mean() == pytest.approx(800 / 1700)
    assert (majority == 8).mean() == pytest.approx(200 / 8300)
    # Within a cohort the split is IID: sizes differ by at most one.
    for cohort in (0, 1):
        sizes = partition.sizes[partition.clients_of(cohort)]
        assert sizes.max() - sizes.min() <= 1


def test_string_class_keys_as_read_from_toml() -> None:
    labels = balanced_labels(per_class=200)
    cohorts = [CohortRule(share=0.5), CohortRule(share=0.5, class_fractions={"8": 1.0, "3": 0.0})]
    partition = by_cohort(labels, None, cohorts, 10, rng())
    second = labels[partition.cohort_indices(1)]
    assert (second == 8).sum() == 200 and (second == 3).sum() == 0
    assert (labels[partition.cohort_indices(0)] == 3).sum() == 200


def test_unclaimed_rest_of_a_class_named_by_every_cohort_stays_unassigned() -> None:
    labels = balanced_labels(per_class=100)
    cohorts = [
        CohortRule(share=0.5, class_fractions={8: 0.5}),
        CohortRule(share=0.5, class_fractions={8: 0.3}),
    ]
    partition = by_cohort(labels, None, cohorts, 4, rng())
    assert_disjoint(partition, len(labels))
    assert (labels[assigned(partition)] == 8).sum() == 80
    assert len(assigned(partition)) == 1000 - 20


def test_attribute_cohorts_hold_only_their_attribute() -> None:
    generator = rng(5)
    labels = generator.integers(0, 2, size=5000)
    groups = (generator.random(5000) < 0.3).astype(np.int64)
    cohorts = [CohortRule(share=0.8, attribute="male"), CohortRule(share=0.2, attribute=1, alpha=0.5)]
    partition = by_cohort(labels, groups, cohorts, 20, rng(), group_names=("male", "female"))
    assert np.bincount(partition.client_cohorts).tolist() == [16, 4]
    assert_disjoint(partition, len(labels))
    for client, indices in enumerate(partition.client_indices):
        assert len(indices) > 0
        assert np.all(groups[indices] == partition.client_cohorts[client])
    np.testing.assert_array_equal(partition.cohort_indices(1), np.flatnonzero(groups == 1))


def test_attribute_values_no_cohort_names_stay_unassigned() -> None:
    groups = np.repeat([0, 1, 2], 100)
    labels = np.zeros(300, dtype=np.int64)
    partition = by_cohort(
        labels, groups, [CohortRule(0.5, attribute=0), CohortRule(0.5, attribute=2)], 4, rng()
    )
    assert np.array_equal(np.sort(assigned(partition)), np.r_[0:100, 200:300])


def test_dirichlet_inside_a_cohort() -> None:
    labels = balanced_labels(per_class=500)
    cohorts = [CohortRule(share=0.5, alpha=0.05), CohortRule(share=0.5, alpha=1000.0)]
    partition = by_cohort(labels, None, cohorts, 40, rng(2))
    assert_disjoint(partition, len(labels))
    skewed = Partition([partition.client_indices[c] for c in partition.clients_of(0)], np.zeros(20))
    mild = Partition([partition.client_indices[c] for c in partition.clients_of(1)], np.zeros(20))
    assert label_skew(skewed, labels, 10) > 0.4 > 0.1 > label_skew(mild, labels, 10)


def test_partitions_are_reproducible() -> None:
    labels = balanced_labels(per_class=100)
    cohorts = [CohortRule(0.7), CohortRule(0.3, class_fractions={1: 0.6}, alpha=0.3)]
    first = by_cohort(labels, None, cohorts, 10, rng(7))
    second = by_cohort(labels, None, cohorts, 10, rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(first.client_indices, second.client_indices, strict=True))


@settings(max_examples=40, deadline=None)
@given(
    shares=st.lists(st.integers(1, 10), min_size=1, max_size=4),
    fractions=st.lists(st.floats(0, 0.5), min_size=4, max_size=4),
    num_clients=st.integers(4, 30),
    seed=st.integers(0, 2**32 - 1),
)
def test_cohort_partitions_respect_counts_and_fractions(shares, fractions, num_clients, seed) -> None:
    labels = np.random.default_rng(seed).integers(0, 5, size=2000)
    weights = np.array(shares, dtype=float) / sum(shares)
    weights[-1] = 1.0 - weights[:-1].sum()
    cohorts = [
        CohortRule(float(share), class_fractions={position % 5: fractions[position]})
        for position, share in enumerate(weights)
    ]
    try:
        counts = cohort_client_counts(list(weights), num_clients)
    except ValueError:
        return  # a cohort would get no client: refused, as tested below
    partition = by_cohort(labels, None, cohorts, num_clients, np.random.default_rng(seed))
    assert np.bincount(partition.client_cohorts, minlength=len(cohorts)).tolist() == counts
    assert_disjoint(partition, len(labels))
    for position, cohort in enumerate(cohorts):
        (cls, fraction), *_ = cohort.fractions.items()
        held = (labels[partition.cohort_indices(position)] == cls).sum()
        assert abs(held - fraction * (labels == cls).sum()) <= 1


# ----------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: iid(5, 10, rng()), "too few"),
        (lambda: iid(10, 0, rng()), "num_clients"),
        (lambda: dirichlet(np.zeros(100, int), 5, 0.0, rng()), "alpha"),
        (lambda: dirichlet(np.zeros(100, int), 5, float("nan"), rng()), "alpha"),
        (lambda: dirichlet(np.zeros(100, int), 5, float("inf"), rng()), "alpha"),
        (lambda: dirichlet(np.zeros(3, int), 5, 1.0, rng()), "too few"),
        (lambda: dirichlet(np.zeros((10, 2), int), 2, 1.0, rng()), "1-D"),
        (lambda: dirichlet(np.zeros(10), 2, 1.0, rng()), "integers"),
        (lambda: CohortRule(share=0.0), "share"),
        (lambda: CohortRule(share=0.5, class_fractions={8: 1.2}), "[0, 1]"),
        (lambda: CohortRule(share=0.5, class_fractions={8: -0.1}), "[0, 1]"),
        (lambda: CohortRule(share=0.5, class_fractions={"eight": 0.5}), "class index"),
        (lambda: CohortRule(share=0.5, attribute=0, class_fractions={8: 0.5}), "not both"),
        (lambda: CohortRule(share=0.5, alpha=-1.0), "alpha"),
        (lambda: CohortRule(share=0.5, attribute=-1), "attribute"),
    ],
)
def test_invalid_arguments_raise_one_line(call, fragment) -> None:
    with pytest.raises(ValueError) as caught:
        call()
    assert_one_line(caught, fragment)


LABELS = np.repeat(np.arange(10), 20)
GROUPS = np.repeat([0, 1], 100)


@pytest.mark.parametrize(
    ("cohorts", "groups", "num_clients", "fragment"),
    [
        ([CohortRule(0.5), CohortRule(0.4)], None, 10, "sum to 1"),
        ([], None, 10, "at least one"),
        (
            [CohortRule(0.5, class_fractions={8: 0.7}), CohortRule(0.5, class_fractions={8: 0.4})],
            None,
            10,
            "class 8",
        ),
        ([CohortRule(0.5, class_fractions={12: 0.5}), CohortRule(0.5)], None, 10, "class 12"),
        ([CohortRule(0.99), CohortRule(0.01)], None, 10, "gets 0 of 10 clients"),
        ([CohortRule(0.5, attribute=0), CohortRule(0.5)], GROUPS, 10, "every cohort"),
        ([CohortRule(0.5, attribute=0), CohortRule(0.5, attribute=1)], None, 10, "groups"),
        ([CohortRule(0.5, attribute=0), CohortRule(0.5, attribute=0)], GROUPS, 10, "distinct"),
        ([CohortRule(0.5, attribute=0), CohortRule(0.5, attribute=3)], GROUPS, 10, "attribute value 3"),
        ([CohortRule(0.5, attribute=0), CohortRule(0.5, attribute="other")], GROUPS, 10, "group name"),
        ([CohortRule(0.5, attribute=0), CohortRule(0.5, attribute=1)], GROUPS[:10], 10, "entries"),
        ([CohortRule(0.5, name="a"), CohortRule(0.5, name="a")], None, 10, "distinct"),
        ([CohortRule(0.9), CohortRule(0.1, class_fractions={0: 0.0})], None, 190, "holds"),
    ],
)
def test_invalid_cohorts_raise_one_line(cohorts, groups, num_clients, fragment) -> None:
    with pytest.raises(ValueError) as caught:
        by_cohort(LABELS, groups, cohorts, num_clients, rng())
    assert_one_line(caught, fragment)
