"""Partitioners: which training examples each of N clients holds.

All take a ``numpy.random.Generator`` and are deterministic given its state. Each returns a
:class:`Partition`: one sorted index array per client (indices into the training set; no example is
given to two clients) and the cohort of each client.

* :func:`iid` shuffles and deals the examples into N near-equal parts (sizes differ by at most 1).
* :func:`dirichlet` (label skew): for each class, the class's examples are dealt to the N clients in
  proportions drawn from Dirichlet(α·1_N); small α gives clients few classes, large α approaches
  IID. Clients left with fewer than ``min_size`` examples then receive random examples taken from
  the currently largest client, so that every client can train.
* :func:`by_cohort`: cohorts of clients with their own share of the population and their own
  data (docs/design.md, section 4). Cohort k gets ``round(share_k·N)`` clients (half rounds up), the last
  cohort the remainder; every cohort needs at least one. Its data follow one rule:

  - ``attribute=a``: the cohort takes every example whose protected attribute equals ``a``. Either
    every cohort names an attribute (distinct values; examples of unnamed values stay
    unassigned) or none does.
  - ``class_fractions={c: f}``: the cohort takes the fraction f of class c's examples. For each
    class, the cohorts that do not name it share what the naming cohorts leave (1 − Σ f) in
    proportion to their numbers of clients, so their clients get equal expected amounts of it. If
    every cohort names a class and the fractions sum below 1, the rest of that class is left
    unassigned. A cohort with no rule names no class: it gets its proportional share of each.

  Amounts are rounded cumulatively, so each class is divided exactly. Each cohort's examples are
  then dealt among its clients IID, or by :func:`dirichlet`'s rule when the cohort has ``alpha``.

Invalid arguments raise ``ValueError`` with a one-line message.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

_TOLERANCE = 1e-9


@dataclass(frozen=True, eq=False)
class Partition:
    """The examples of each client and the cohort each client belongs to."""

    client_indices: list[np.ndarray]
    client_cohorts: np.ndarray
    cohort_names: tuple[str, ...] = ("all",)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def sizes(self) -> np.ndarray:
        """Number of examples of each client."""
        return np.array([len(indices) for indices in self.client_indices], dtype=np.int64)

    def clients_of(self, cohort: int) -> np.ndarray:
        """Ids of the clients in cohort ``cohort``."""
        return np.flatnonzero(self.client_cohorts == cohort)

    def cohort_indices(self, cohort: int) -> np.ndarray:
        """All example indices held by the clients of cohort ``cohort`` (sorted)."""
        parts = [self.client_indices[client] for client in self.clients_of(cohort)]
        return np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class CohortRule:
    """A cohort: its share of the clients and at most one data rule (see the module docstring).

    ``attribute`` is a group index (the value of ``g``) or a group name, resolved against the
    ``group_names`` given to :func:`by_cohort` (case-insensitive; a string of digits is an index).

    ``class_fractions`` keys may be integers or strings of integers (TOML table keys are strings).
    ``alpha``, when set, deals the cohort's examples to its clients with Dirichlet label skew.
    """

    share: float
    attribute: int | str | None = None
    class_fractions: Mapping[int, float] | None = None
    alpha: float | None = None
    name: str | None = None
    _fractions: dict[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        label = f"cohort {self.name!r}" if self.name else "cohort"
        share = self.share
        if isinstance(share, bool) or not isinstance(share, numbers.Real) or not 0.0 < share <= 1.0:
            raise ValueError(f"{label}: share must lie in (0, 1], not {self.share!r}")
        if self.attribute is not None and self.class_fractions is not None:
            raise ValueError(f"{label}: give either attribute or class_fractions, not both")
        attribute = self.attribute
        if attribute is not None and (
            isinstance(attribute, bool)
            or not isinstance(attribute, int | np.integer | str)
            or (isinstance(attribute, str) and not attribute.strip())
            or (not isinstance(attribute, str) and attribute < 0)
        ):
            raise ValueError(f"{label}: attribute must be a group index or group name, not {attribute!r}")
        if self.alpha is not None:
            _check_alpha(self.alpha, label)
        fractions: dict[int, float] = {}
        for key, value in (self.class_fractions or {}).items():
            try:
                cls = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"{label}: class_fractions key {key!r} is not a class index") from None
            if isinstance(key, float | bool) or str(cls) != str(key).strip() or cls < 0:
                raise ValueError(f"{label}: class_fractions key {key!r} is not a class index")
            if cls in fractions:
                raise ValueError(f"{label}: class {cls} appears twice in class_fractions")
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{label}: fraction of class {cls} must lie in [0, 1], not {value!r}")
            fractions[cls] = float(value)
        object.__setattr__(self, "_fractions", fractions)

    @property
    def fractions(self) -> dict[int, float]:
        """``class_fractions`` with integer keys (empty when the cohort names no class)."""
        return dict(self._fractions)


def _check_alpha(alpha: float, label: str = "dirichlet") -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < math.inf:
        raise ValueError(f"{label}: alpha must be a positive finite number, not {alpha!r}")


def _check_count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{what} must be a positive integer, not {value!r}")
    return int(value)


def _as_index_array(values: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array, not of shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{what} must hold integers, not {array.dtype}")
    return array.astype(np.int64, copy=False)


def _deal_iid(indices: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(indices), num_clients)]


def _deal_dirichlet(
    indices: np.ndarray,
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int,
) -> list[np.ndarray]:
    """Deal ``indices`` (with their ``labels``) to clients with Dirichlet(α) class proportions."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls in np.unique(labels):
        members = rng.permutation(indices[labels == cls])
        proportions = rng.dirichlet(np.full(num_clients, float(alpha)))
        if not np.all(np.isfinite(proportions)):
            raise ValueError(f"alpha {alpha} is too small for a numerically stable Dirichlet draw")
        cuts = np.round(np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for client, piece in enumerate(np.split(members, np.clip(cuts, 0, len(members)))):
            parts[client].append(piece)
    dealt = [np.concatenate(pieces) if pieces else np.empty(0, np.int64) for pieces in parts]
    # Top up clients below min_size with random examples of the currently largest client.
    for client in range(num_clients):
        while len(dealt[client]) < min_size:
            donor = int(np.argmax([len(d) for d in dealt]))
            need = min(min_size - len(dealt[client]), len(dealt[donor]) - min_size)
            if need <= 0:  # unreachable while len(indices) >= num_clients * min_size
                raise ValueError(f"{len(indices)} examples cannot give {num_clients} clients {min_size} each")
            moved = rng.choice(len(dealt[donor]), size=need, replace=False)
            dealt[client] = np.concatenate([dealt[client], dealt[donor][moved]])
            dealt[donor] = np.delete(dealt[donor], moved)
    return [np.sort(d) for d in dealt]


def iid(num_examples: int, num_clients: int, rng: np.random.Generator) -> Partition:
    """Examples 0..num_examples-1 shuffled and dealt to ``num_clients`` near-equal parts."""
    num_examples = _check_count(num_examples, "num_examples")
    num_clients = _check_count(num_clients, "num_clients")
    if num_examples < num_clients:
        raise ValueError(f"{num_examples} examples are too few for {num_clients} clients")
    parts = _deal_iid(np.arange(num_examples, dtype=np.int64), num_clients, rng)
    return Partition(parts, np.zeros(num_clients, dtype=np.int64))


def dirichlet(
    labels: Sequence[int] | np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    min_size: int = 1,
) -> Partition:
    """Label skew: each class dealt to the clients in Dirichlet(α) proportions (module docstring)."""
    labels = _as_index_array(labels, "labels")
    num_clients = _check_count(num_clients, "num_clients")
    _check_alpha(alpha)
    min_size = _check_count(min_size, "min_size")
    if len(labels) < num_clients * min_size:
        raise ValueError(f"{len(labels)} examples are too few for {num_clients} clients of {min_size} each")
    indices = np.arange(len(labels), dtype=np.int64)
    parts = _deal_dirichlet(indices, labels, num_clients, alpha, rng, min_size)
    return Partition(parts, np.zeros(num_clients, dtype=np.int64))


def cohort_client_counts(shares: Sequence[float], num_clients: int) -> list[int]:
    """Clients per cohort: round(share·N) with halves rounded up, the last cohort the remainder."""
    num_clients = _check_count(num_clients, "num_clients")
    counts = [math.floor(share * num_clients + 0.5) for share in shares[:-1]]
    counts.append(num_clients - sum(counts))
    for position, count in enumerate(counts):
        if count < 1:
            raise ValueError(
                f"cohort {position} gets {count} of {num_clients} clients; "
                "raise its share or the number of clients"
            )
    return counts


def by_cohort(
    labels: Sequence[int] | np.ndarray,
    groups: Sequence[int] | np.ndarray | None,
    cohorts: Sequence[CohortRule],
    num_clients: int,
    rng: np.random.Generator,
    *,
    group_names: Sequence[str] = (),
) -> Partition:
    """Cohorts of clients, each with its share of clients and its data rule (module docstring).

    ``groups`` holds each example's protected-attribute index (needed only by attribute cohorts);
    ``group_names`` names those indices so that cohorts may name their attribute (``"female"``).
    """
    labels = _as_index_array(labels, "labels")
    cohorts = list(cohorts)
    if not cohorts:
        raise ValueError("at least one cohort is required")
    for cohort in cohorts:
        if not isinstance(cohort, CohortRule):
            raise ValueError(f"cohorts must be CohortRule objects, not {type(cohort).__name__}")
    names = tuple(cohort.name or f"cohort{position}" for position, cohort in enumerate(cohorts))
    if len(set(names)) != len(names):
        raise ValueError(f"cohort names must be distinct, not {list(names)}")
    total = math.fsum(cohort.share for cohort in cohorts)
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise ValueError(f"cohort shares must sum to 1, not {total:g}")
    counts = cohort_client_counts([cohort.share for cohort in cohorts], num_clients)

    with_attribute = [cohort.attribute is not None for cohort in cohorts]
    if any(with_attribute):
        if not all(with_attribute):
            raise ValueError("either every cohort names an attribute or none does")
        members = _members_by_attribute(labels, groups, cohorts, names, group_names)
    else:
        members = _members_by_class(labels, cohorts, counts, names, rng)

    client_indices: list[np.ndarray] = []
    client_cohorts: list[int] = []
    for position, (cohort, count, held) in enumerate(zip(cohorts, counts, members, strict=True)):
        if len(held) < count:
            raise ValueError(f"cohort {names[position]!r} holds {len(held)} examples for its {count} clients")
        if cohort.alpha is None:
            parts = _deal_iid(held, count, rng)
        else:
            parts = _deal_dirichlet(held, labels[held], count, cohort.alpha, rng, min_size=1)
        client_indices.extend(parts)
        client_cohorts.extend([position] * count)
    return Partition(client_indices, np.array(client_cohorts, dtype=np.int64), names)


def _members_by_attribute(
    labels: np.ndarray,
    groups: Sequence[int] | np.ndarray | None,
    cohorts: list[CohortRule],
    names: tuple[str, ...],
    group_names: Sequence[str],
) -> list[np.ndarray]:
    if groups is None:
        raise ValueError("attribute cohorts need the protected attribute of every example (groups)")
    groups = _as_index_array(groups, "groups")
    if len(groups) != len(labels):
        raise ValueError(f"groups has {len(groups)} entries for {len(labels)} labels")
    values = [
        group_index(cohort.attribute, name, group_names) for cohort, name in zip(cohorts, names, strict=True)
    ]
    if len(set(values)) != len(values):
        raise ValueError(f"attribute cohorts must name distinct values, not {values}")
    members = []
    for name, value in zip(names, values, strict=True):
        held = np.flatnonzero(groups == value)
        if len(held) == 0:
            raise ValueError(f"cohort {name!r}: no example has attribute value {value}")
        members.append(held)
    return members


def group_index(attribute: int | str | None, name: str, group_names: Sequence[str]) -> int:
    if not isinstance(attribute, str):
        return int(attribute)  # type: ignore[arg-type]
    text = attribute.strip()
    lowered = [group.lower() for group in group_names]
    if text.lower() in lowered:
        return lowered.index(text.lower())
    if text.isdigit():
        return int(text)
    known = ", ".join(group_names) if group_names else "none given"
    raise ValueError(f"cohort {name!r}: attribute {attribute!r} is not a group name (groups: {known})")


def _members_by_class(
    labels: np.ndarray,
    cohorts: list[CohortRule],
    counts: list[int],
    names: tuple[str, ...],
    rng: np.random.Generator,
) -> list[np.ndarray]:
    classes = np.unique(labels)
    present = set(classes.tolist())
    fractions = [cohort.fractions for cohort in cohorts]
    for name, named in zip(names, fractions, strict=True):
        absent = sorted(set(named) - present)
        if absent:
            raise ValueError(f"cohort {name!r}: class_fractions names class {absent[0]}, which no label has")
    for cls in sorted(set().union(*fractions)):
        claimed = math.fsum(named.get(cls, 0.0) for named in fractions)
        if claimed > 1.0 + _TOLERANCE:
            raise ValueError(f"fractions of class {cls} sum to {claimed:g} over the cohorts, more than 1")

    weights = np.asarray(counts, dtype=np.float64)
    pieces: list[list[np.ndarray]] = [[] for _ in cohorts]
    for cls in classes.tolist():
        held = rng.permutation(np.flatnonzero(labels == cls))
        naming = np.array([cls in named for named in fractions])
        amounts = np.array([named.get(cls, 0.0) for named in fractions]) * len(held)
        rest = max(0.0, 1.0 - math.fsum(named.get(cls, 0.0) for named in fractions))
        if rest > 0 and not naming.all():
            others = ~naming
            amounts[others] = rest * len(held) * weights[others] / weights[others].sum()
        bounds = np.minimum(np.round(np.cumsum(amounts)).astype(np.int64), len(held))
        starts = np.concatenate([[0], bounds[:-1]])
        for position, (start, stop) in enumerate(zip(starts, bounds, strict=True)):
            pieces[position].append(held[start:stop])
    return [np.concatenate(parts) for parts in pieces]


def per_example(
    labels: Sequence[int] | np.ndarray,
    groups: Sequence[int] | np.ndarray | None,
    cohorts: Sequence[CohortRule],
    *,
    group_names: Sequence[str] = (),
) -> Partition:
    """One client per training example (the sample-level special case, docs/design.md, section 2).

    Client i holds example i. Its cohort is the cohort whose rule claims the example: the one
    naming the example's protected attribute, or the one whose ``class_fractions`` names the
    example's class with fraction 1 (shares are ignored: the data decide the cohort sizes). Every
    example must be claimed by exactly one cohort.
    """
    labels = _as_index_array(labels, "labels")
    cohorts = list(cohorts)
    if not cohorts:
        raise ValueError("at least one cohort is required")
    names = tuple(cohort.name or f"cohort{position}" for position, cohort in enumerate(cohorts))
    owner = np.full(len(labels), -1, dtype=np.int64)
    if all(cohort.attribute is not None for cohort in cohorts):
        members = _members_by_attribute(labels, groups, cohorts, names, group_names)
    elif all(cohort.attribute is None and cohort.fractions for cohort in cohorts):
        members = []
        for cohort, name in zip(cohorts, names, strict=True):
            if any(fraction != 1.0 for fraction in cohort.fractions.values()):
                raise ValueError(f"cohort {name!r}: the per-example partition needs class fractions of 1")
            members.append(np.flatnonzero(np.isin(labels, list(cohort.fractions))))
    else:
        raise ValueError("the per-example partition needs every cohort to name an attribute or its classes")
    for position, held in enumerate(members):
        if np.any(owner[held] >= 0):
            raise ValueError(f"cohort {names[position]!r} claims examples of another cohort")
        owner[held] = position
    if np.any(owner < 0):
        example = int(np.flatnonzero(owner < 0)[0])
        raise ValueError(f"training example {example} (class {labels[example]}) belongs to no cohort")
    return Partition([np.array([i], dtype=np.int64) for i in range(len(labels))], owner, names)
