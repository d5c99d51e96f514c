"""The contract every clipping policy fulfils, and the server step they share.

A policy is split the way pfl-research splits a privacy mechanism
(``postprocess_one_user`` / ``postprocess_server``):

* **client side** -- :meth:`Policy.client_side` turns the raw updates Δ_i of some clients into
  their contributions Δ̄_i and their report vectors a_i (the bits the policy needs: a count
  indicator, a one-hot cohort count, or a unit direction). It sees only the public parameters
  that the server broadcast for the round (:meth:`Policy.broadcast`).
* **server side** -- :meth:`Policy.server_side` takes the *sums* Σ Δ̄_i and Σ a_i, adds
  Gaussian noise, forms the update estimate and moves the policy state.

Notation (docs/design.md, section 2)::

    Δ_i        raw model update of client i (a flat float vector)
    Δ̄_i        its contribution after the policy's client transform
    a_i        its report vector (L2 norm <= 1 under add/remove of client i)
    s_t        sensitivity of one contribution in round t: ||Δ̄_i|| <= s_t for every i
    n_t        the scale the update noise is calibrated to: n_t = s_t, unless a policy that
               declares ``noises_below_sensitivity`` gives 0 < n_t < s_t (:meth:`Policy.noise_scale`)
    σ_Δ, σ_b   noise multipliers of the update sum and of the report sum
    m̂ = qN    expected number of sampled clients (public)

    S   = Σ Δ̄_i + N(0, (σ_Δ n_t)² I)       noise calibrated to the bound that clipped round t
    A   = Σ a_i + N(0, σ_b² I)              (only if the policy releases reports)
    Δ̂   = S / m̂        or  S / (m̂ s_t) with ``normalize`` (De et al. 2022)
    state_{t+1} = policy.next_state(state_t, Δ̂, A, m̂)    after noise, never before

The round's :class:`DPEvent` -- what the accountant is told -- is derived here, never by a
policy (:meth:`Policy.round_event`): the update sum ran the Gaussian mechanism of sensitivity s_t
with noise standard deviation σ_Δ n_t, i.e. with multiplier σ_Δ · n_t / s_t (σ_Δ exactly where
n_t = s_t), so a policy that noises below its sensitivity is charged for it.

The executors (in-process, Ray, Flower) call exactly these two methods with flattened update
vectors; no executor re-implements any part of a policy.

The invariants that DP rests on are enforced here, at run time, on every path -- not left to
each policy, and not to a plug-in author remembering :func:`fairclip.policies.check_policy`:

* every round's public parameters come from :meth:`Policy.checked_broadcast`, which refuses
  (:class:`PolicyError`, naming both numbers) a state whose client bounds
  (:meth:`Policy.contribution_bounds`) exceed the sensitivity its noise is calibrated to
  (:meth:`Policy.sensitivity`), or whose sensitivity is not a finite number > 0;
* every contribution leaves :meth:`Policy.client_side` (and :meth:`Policy.scaled_client_side`,
  the one-step path) with norm at most its client's bound -- a final guarded projection,
  :func:`fairclip.strategies.clipping.clip_rows_with_norms` -- and so at most the sensitivity;
* every round's noise scale n_t (:meth:`Policy.noise_scale`) must be a finite number in
  (0, s_t], and below s_t only for a policy that declares ``noises_below_sensitivity``
  (:class:`PolicyError` otherwise); the round's :class:`DPEvent` then carries the multiplier
  σ_Δ · n_t / s_t of what ran (:meth:`Policy.round_event`), which a plan with a privacy budget
  or target ε refuses in advance (:func:`fairclip.server.privacy_plan.plan_privacy`);
* every report vector leaves them with norm at most 1, the sensitivity its noise assumes
  (:func:`fairclip.strategies.clipping.project_reports`);
* a client whose update, contribution or report is not finite sends zeros, so a diverged client
  (or a plug-in's NaN) can never break the bound;
* a private policy may not override the steps that do this (:data:`GUARDED_METHODS`, checked
  by :func:`fairclip.strategies.registry.check_policy_class` wherever a policy is accepted).

The server of the Flower path checks each reply against the same bounds
(:func:`fairclip.server.replies.check_reply`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from fairclip.strategies import reports
from fairclip.strategies.clipping import (
    clip_factors,
    clip_rows,
    clip_rows_with_norms,
    guard_scales,
    hard_clip,
    project_reports,
    row_norms,
)
from fairclip.strategies.errors import PolicyConfigError, PolicyError
from fairclip.strategies.params import PolicyParams

State = Any
"""A policy's state: an immutable dataclass owned by the policy (for example the bound C_t)."""

Broadcast = dict[str, Any]
"""Public per-round parameters sent to clients: floats or lists of floats, JSON-serialisable."""

BOUND_FLOOR = 1e-30
"""Smallest bound any geometric update may reach, so a bound never underflows to zero."""

GUARDED_METHODS = (
    "client_side",
    "scaled_client_side",
    "row_scaling",
    "checked_broadcast",
    "count_side",
    "server_side",
    "round_event",
)
"""What a private policy may not override: the steps of :class:`Policy` that project every
contribution and report, check the bounds against the sensitivity, and noise with it. A policy
defines its transform (:meth:`Policy.scales` or :meth:`Policy.transform`), bounds, sensitivity
and state update; these run it."""

BOUND_CEILING = 1e30
"""Largest value a multiplicative update may take a bound to (unless it started above), so that
the bound and the noise σ_Δ · s_t stay finite however long it keeps growing."""


@dataclass(frozen=True)
class NoiseMultipliers:
    """Noise multipliers of one round's releases.

    ``update`` is σ_Δ (the sum of contributions is noised with σ_Δ · s_t); ``report`` is σ_b
    (the sum of report vectors, each of L2 norm at most 1, is noised with σ_b). Zero turns a
    release's noise off.
    """

    update: float
    report: float

    def __post_init__(self) -> None:
        for label, value in (("noise multiplier", self.update), ("count noise multiplier", self.report)):
            if not np.isfinite(value) or value < 0:
                raise PolicyConfigError(f"{label} must be a finite number >= 0 (got {value})")


class GaussianSampler(Protocol):
    """Where a round's Gaussian noise comes from (a numpy generator, or a sampler built against
    floating-point attacks such as :class:`fairclip.server.secure_noise.ExactGaussian`)."""

    def add_noise(
        self, values: np.ndarray, multiplier: float, sensitivity: float
    ) -> tuple[np.ndarray, float]:
        """(``values`` + Gaussian noise for a release of L2 sensitivity ``sensitivity`` with noise
        multiplier ``multiplier``, the noise's standard deviation, at least multiplier·sensitivity)."""
        ...


@dataclass(frozen=True)
class GeneratorSampler:
    """Gaussian noise N(0, (multiplier·sensitivity)²) per coordinate from a numpy generator:
    reproducible from a seed, and what every simulation uses."""

    rng: np.random.Generator

    def add_noise(
        self, values: np.ndarray, multiplier: float, sensitivity: float
    ) -> tuple[np.ndarray, float]:
        std = multiplier * sensitivity
        return values + self.rng.normal(0.0, 1.0, size=values.shape) * std, std


def as_sampler(rng: np.random.Generator | GaussianSampler) -> GaussianSampler:
    """A :class:`GaussianSampler` for ``rng`` (a numpy generator is wrapped)."""
    return GeneratorSampler(rng) if isinstance(rng, np.random.Generator) else rng


@dataclass(frozen=True)
class ClientReports:
    """What a batch of clients sends, plus simulation-only diagnostics.

    ``contributions`` (n, d) and ``reports`` (n, k) are what a real client sends.
    ``exceeded`` (n,) is the true indicator ||Δ_i|| > τ·bound, and ``nonfinite`` (n,) marks
    updates that were not finite and were replaced by zero; both are diagnostics that only a
    simulation may record (a real client never reveals them).
    """

    contributions: np.ndarray
    reports: np.ndarray
    exceeded: np.ndarray
    nonfinite: np.ndarray
    norms: np.ndarray
    """||Δ_i|| of each update (0 for a non-finite one): a diagnostic, computed for clipping anyway."""
    contribution_norms: np.ndarray
    """||Δ̄_i|| of each contribution: a diagnostic, computed by the final projection anyway."""


@dataclass(frozen=True)
class RowScales:
    """A row-scaling policy's client transform, decided from the update norms alone
    (:meth:`Policy.scales`)::

        Δ̄_i = c_i · Δ_i · min(1, C_i / ||Δ_i||)        (C_i = ∞ where ``clip`` is None)
        a_i  = a fixed report vector,  or  r_i · Δ_i

    Every built-in policy has this shape: a hard clip, a tanh or global scale, a cohort weight;
    a count bit or one-hot cohort as report, or ``online``'s unit direction. Knowing the
    factors, an executor can form Σ Δ̄_i and Σ a_i without materialising any Δ_i (per-example
    gradient norms and weighted sums, :mod:`fairclip.scenarios.tasks.ghost`).
    """

    contribution: np.ndarray
    """c_i (n,)."""
    reports: np.ndarray | None
    """The report vectors (n, k) where they do not depend on Δ_i's direction; ``None`` where the
    report is r_i · Δ_i (:attr:`report_scales`)."""
    exceeded: np.ndarray
    """The diagnostic of :attr:`ClientReports.exceeded` (n,)."""
    clip: np.ndarray | None = None
    """C_i (n,), the hard-clipping bound applied before c_i, or ``None`` for no clipping."""
    report_scales: np.ndarray | None = None
    """r_i (n,) where a_i = r_i · Δ_i, else ``None``."""

    def factors(self, norms: np.ndarray) -> np.ndarray:
        """The total factor of each row: c_i · min(1, C_i·:data:`GUARD_RADIUS` / ||Δ_i||)."""
        contribution = np.asarray(self.contribution, dtype=np.float64)
        return contribution if self.clip is None else contribution * clip_factors(norms, self.clip)


@dataclass(frozen=True)
class ScaledReports:
    """What :meth:`Policy.scaled_client_side` decides for a batch of clients from their norms:
    the guarded factors, the reports that do not depend on direction, and the diagnostics of
    :class:`ClientReports` (without any d-dimensional row)."""

    contribution_scales: np.ndarray
    """c_i after the guard: c_i · ||Δ_i|| stays inside each client's bound; 0 for a non-finite
    update."""
    reports: np.ndarray | None
    """(n, k) reports (zero for a non-finite update), or ``None`` where they are r_i · Δ_i."""
    report_scales: np.ndarray | None
    """r_i after the guard (r_i · ||Δ_i|| < 1; 0 for a non-finite update), or ``None``."""
    exceeded: np.ndarray
    nonfinite: np.ndarray
    norms: np.ndarray
    """||Δ_i|| (0 for a non-finite update)."""
    contribution_norms: np.ndarray
    """c_i · ||Δ_i||."""


@dataclass(frozen=True)
class DPEvent:
    """What one round released, for the accountant (:class:`fairclip.strategies.accounting.Accountant`).

    The round ran the Gaussian mechanism on the sum of contributions with noise multiplier
    ``noise_multiplier`` (relative to the sensitivity s_t the contributions were bounded by:
    σ_Δ, or σ_Δ · n_t / s_t for a policy that noises below its sensitivity, as
    :meth:`Policy.round_event` derives it) and, where ``report_noise_multiplier`` is not
    ``None``, on the sum of report vectors (σ_b, sensitivity 1). Together they are one Gaussian
    mechanism of multiplier σ_eff = (σ_Δ^−2 + σ_b^−2)^−1/2 (0: no noise, no privacy).
    """

    noise_multiplier: float
    report_noise_multiplier: float | None = None

    @classmethod
    def planned(cls, noise: NoiseMultipliers, releases_reports: bool) -> DPEvent:
        """The event of a round run with the multipliers ``noise`` (σ_b only where reports are
        released)."""
        return cls(noise.update, noise.report if releases_reports else None)

    @property
    def effective_noise_multiplier(self) -> float:
        if self.report_noise_multiplier is None:
            return self.noise_multiplier
        if self.noise_multiplier == 0 or self.report_noise_multiplier == 0:
            return 0.0
        return (self.noise_multiplier**-2 + self.report_noise_multiplier**-2) ** -0.5


@dataclass(frozen=True)
class ServerRound:
    """Result of the server side of one round."""

    estimate: np.ndarray
    """Δ̂, the noisy update estimate handed to the server optimizer."""
    state: State
    """The policy state for the next round."""
    sensitivity: float
    """s_t, the sensitivity that this round's noise was calibrated to."""
    clip_bound: float
    """The bound that clipped this round's updates (the largest one for ``per-cohort``)."""
    server_lr_factor: float
    """Factor on the server learning rate for this round's step (1 except for ``online``)."""
    noise_std: float
    """Standard deviation σ_Δ · n_t of the noise added to the sum of contributions (n_t = s_t
    unless the policy ``noises_below_sensitivity``)."""
    noisy_reports: np.ndarray | None
    """The noisy sum of report vectors, or ``None`` when the policy releases none."""
    info: dict[str, float] = field(default_factory=dict)
    """Extra public values to log (for example the server learning-rate factor of ``online``)."""
    event: DPEvent = DPEvent(0.0)
    """What this round released, for the accountant (no noise: the non-private ``none``)."""
    estimate_noise_std: float = 0.0
    """ξ_t = ``noise_std`` / Δ̂'s denominator: the standard deviation of each coordinate of Δ̂'s
    noise (public: σ_Δ, n_t, m̂ and, with ``normalize``, s_t), for a server optimizer that scales
    by it (``adam-wosm``)."""


@dataclass(frozen=True)
class CountRelease:
    """What the first exchange of a :attr:`Policy.counts_first` round released."""

    state: State
    """The state whose broadcast clips this round's updates (for example this round's C_k)."""
    noisy_reports: np.ndarray
    """A = Σ a_i + N(0, σ_b² I)."""


class Policy(ABC):
    """A clipping policy: a client transform, a noise sensitivity and a bound update."""

    name: ClassVar[str]
    needs_cohorts: ClassVar[bool] = False
    """Whether the server must know each client's cohort (``per-cohort``, ``reweight``)."""
    private: ClassVar[bool] = True
    """False only for ``none``, the non-private reference."""

    Params: ClassVar[type[PolicyParams]] = PolicyParams
    """The policy's parameter schema (:mod:`fairclip.strategies.params`): names, types, ranges and
    defaults of what a scenario's ``[policy]`` table may set for it."""

    def __init__(self, *, num_cohorts: int = 1, **params: Any) -> None:
        """Check ``params`` against :attr:`Params` (one :class:`PolicyConfigError` line naming the
        first bad parameter) and keep them: as ``self.params`` and as attributes of the same
        names. ``num_cohorts`` is the scenario's number of cohorts, set by the executor."""
        if isinstance(num_cohorts, bool) or not isinstance(num_cohorts, int) or num_cohorts < 1:
            raise PolicyConfigError(f"num_cohorts must be an integer >= 1 (got {num_cohorts!r})")
        self.num_cohorts = int(num_cohorts)
        self.params = type(self).Params.parse(params, getattr(type(self), "name", type(self).__name__))
        for key, value in self.params:
            setattr(self, key, value)

    # ----- what a policy defines -------------------------------------------------------
    @abstractmethod
    def initial_state(self, dim: int) -> State:
        """State before round 1, for models with ``dim`` parameters."""

    @abstractmethod
    def broadcast(self, state: State) -> Broadcast:
        """Public parameters that clients need to transform their updates in this round."""

    def checked_broadcast(self, state: State) -> Broadcast:
        """:meth:`broadcast` of ``state``, the parameters that clip a round, once it is checked
        that they keep the sensitivity the round's noise uses: for a private policy,
        ``sensitivity(state)`` must be a finite number > 0 and every cohort's client bound
        (:meth:`contribution_bounds` of these parameters) must lie in [0, sensitivity(state)];
        otherwise :class:`PolicyError` names the policy and both numbers. Every executor, the
        ServerApp and the Flower wrapper send only what this returns
        (:meth:`fairclip.server.rounds.Rounds.broadcast`)."""
        params = self.broadcast(state)
        if not self.private:
            return params
        name = getattr(self, "name", type(self).__name__)
        sensitivity = float(self.sensitivity(state))
        if not (math.isfinite(sensitivity) and sensitivity > 0):
            raise PolicyError(f"policy {name!r} has sensitivity {sensitivity!r}, not a finite number > 0")
        cohorts = np.arange(self.num_cohorts)
        bounds = np.asarray(self.contribution_bounds(params, cohorts), dtype=np.float64)
        if bounds.shape != cohorts.shape:
            raise PolicyError(
                f"policy {name!r}: contribution_bounds gave {bounds.shape[0] if bounds.ndim else 1} "
                f"bounds for {cohorts.shape[0]} cohort(s)"
            )
        outside = ~((bounds >= 0) & (bounds <= sensitivity))
        if outside.any():
            bound = float(bounds[np.flatnonzero(outside)[0]])
            raise PolicyError(
                f"policy {name!r} lets a client contribute up to {bound!r} but its noise is calibrated "
                f"to sensitivity {sensitivity!r}: contribution_bounds() must lie in [0, sensitivity()]"
            )
        return params

    @abstractmethod
    def sensitivity(self, state: State) -> float:
        """s_t: the largest norm any contribution can have under ``broadcast(state)``."""

    @abstractmethod
    def contribution_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        """Per-client norm bound of the contribution (each at most the round's sensitivity)."""

    @property
    def noises_below_sensitivity(self) -> bool:
        """Whether this policy may noise a round with a scale below its sensitivity
        (:meth:`noise_scale`; ``per-cohort`` with ``noise_bound = "initial"``). Its rounds then
        have different noise multipliers, which the accountant follows but a privacy budget or
        target ε, planned for one multiplier, cannot: such a plan is refused. Default False."""
        return False

    def noise_scale(self, state: State) -> float:
        """n_t, the scale the update sum's noise is calibrated to (standard deviation σ_Δ · n_t):
        the sensitivity, unless the policy ``noises_below_sensitivity``. Whatever it returns,
        the round is accounted with the multiplier σ_Δ · n_t / s_t (:meth:`round_event`)."""
        return self.sensitivity(state)

    def round_event(self, state: State, noise: NoiseMultipliers, releases_reports: bool) -> DPEvent:
        """The :class:`DPEvent` of a round whose contributions are clipped under ``state`` and
        noised with ``noise``: the update release has sensitivity s_t = ``sensitivity(state)``
        and noise standard deviation σ_Δ · n_t (n_t = :meth:`noise_scale`), so its multiplier is
        σ_Δ · n_t / s_t (exactly σ_Δ where n_t = s_t); σ_b only where reports are released.
        Refuses (:class:`PolicyError`) a noise scale that is not a finite number in (0, s_t],
        or one below s_t from a policy that does not declare ``noises_below_sensitivity``."""
        sensitivity, scale = self._noise_scales(state)
        multiplier = noise.update if scale == sensitivity else noise.update * (scale / sensitivity)
        return DPEvent(multiplier, noise.report if releases_reports else None)

    def _noise_scales(self, state: State) -> tuple[float, float]:
        """(s_t, n_t) of ``state``, n_t checked as :meth:`round_event` says."""
        sensitivity = float(self.sensitivity(state))
        if not self.private:
            return sensitivity, sensitivity
        scale = float(self.noise_scale(state))
        name = getattr(self, "name", type(self).__name__)
        if not (math.isfinite(scale) and 0 < scale <= sensitivity):
            raise PolicyError(
                f"policy {name!r} noises with scale {scale!r}: noise_scale() must be a finite number "
                f"in (0, sensitivity() = {sensitivity!r}]"
            )
        if scale < sensitivity and not self.noises_below_sensitivity:
            raise PolicyError(
                f"policy {name!r} noises with scale {scale!r} below its sensitivity {sensitivity!r} "
                "but does not declare noises_below_sensitivity (a privacy budget would be planned "
                "for noise it does not add)"
            )
        return sensitivity, scale

    def scales(self, norms: np.ndarray, cohorts: np.ndarray, params: Broadcast) -> RowScales:
        """The client transform of a row-scaling policy, from the norms of finite updates:
        Δ̄_i = c_i · Δ_i, and reports that are fixed vectors or r_i · Δ_i (:class:`RowScales`).
        A policy defines this *or* :meth:`transform`; defining this one lets the one-step path
        clip per-example gradients it never materialises (:mod:`fairclip.scenarios.tasks.ghost`)."""
        raise NotImplementedError(f"policy {type(self).__name__} defines neither scales() nor transform()")

    def transform(
        self, updates: np.ndarray, norms: np.ndarray, cohorts: np.ndarray, params: Broadcast
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Client transform of finite updates: (contributions, reports, exceeded). By default
        the rows scaled by :meth:`scales`; a policy whose transform is not a per-row scale
        overrides this instead (and its one-step clients then materialise their gradients)."""
        row = self.scales(norms, cohorts, params)
        contributions = updates if row.clip is None else hard_clip(updates, norms, row.clip)
        contribution = np.asarray(row.contribution, dtype=np.float64)
        if not np.all(contribution == 1.0):
            contributions = contributions * contribution[:, None]
        if row.report_scales is None:
            reports = row.reports
        else:  # Δ/||Δ|| can have norm 1 + 2^-52 after rounding; the guard keeps it <= 1
            reports = clip_rows(updates * np.asarray(row.report_scales, dtype=np.float64)[:, None], 1.0)
        return contributions, reports, row.exceeded

    @property
    def row_scaling(self) -> bool:
        """Whether the client transform is :meth:`scales` alone (not an overridden
        :meth:`transform` or :meth:`client_side`), so that :meth:`scaled_client_side` gives
        exactly what :meth:`client_side` sends."""
        kind = type(self)
        return (
            kind.scales is not Policy.scales
            and kind.transform is Policy.transform
            and kind.client_side is Policy.client_side
        )

    def report_size(self, dim: int) -> int:
        """Length k of each client's report vector (0: the policy releases nothing else)."""
        return 0

    integer_reports: bool = False
    """Whether every report entry is an integer in [0, 1] (bits, one-hot counts): under secure
    aggregation they are then summed exactly; otherwise they are quantised like a float segment
    of L2 bound 1 and their noise is widened by (1 + ρ) (the safe default)."""

    def report_is_valid(self, report: np.ndarray, cohort: int | None) -> bool:
        """Whether ``report`` is a report an honest client could send in this round
        (:mod:`fairclip.strategies.reports`); ``cohort`` is the client's cohort where the policy
        ``needs_cohorts`` and ``None`` otherwise. The server of the Flower path drops any other."""
        return reports.is_empty(report)

    def next_state(
        self, state: State, estimate: np.ndarray, noisy_reports: np.ndarray | None, expected_clients: float
    ) -> State:
        """State of round t+1 from the released (noisy) values of round t."""
        return state

    def round_info(self, state: State) -> dict[str, float]:
        """Public values of ``state`` worth logging each round."""
        return {}

    def clip_bound(self, state: State) -> float:
        """The bound reported as ``clip_bound``; the sensitivity unless a policy says otherwise."""
        return self.sensitivity(state)

    def server_lr_factor(self, state: State) -> float:
        """Factor on the server learning rate (``online`` adapts it; others keep 1)."""
        return 1.0

    @property
    def counts_first(self) -> bool:
        """Whether a round releases the reports *before* the clients clip, in two exchanges
        (``per-cohort`` with ``same_round``, DPSGD-F as its authors ran it). Such a round is:

        1. clients get ``broadcast(state)`` and send only their report vectors;
           :meth:`count_side` noises the report sum and gives the state of this round's
           clipping (:meth:`with_counts`);
        2. clients get ``broadcast`` of that state and send only their contributions;
           :meth:`server_side` noises their sum with that state's sensitivity, taking the
           released reports as they are (``released_reports``).

        Both releases act on the same sampled clients: the round is one adaptive composition of
        two Gaussian mechanisms, accounted like any other round as one Gaussian of multiplier
        σ_eff = (σ_Δ^-2 + σ_b^-2)^-1/2 (:class:`DPEvent`). That holds because the adaptive
        composition of Gaussian mechanisms with L2 sensitivities 1 and 1 is dominated by the
        pair (N(μ, 1), N(0, 1)) with μ² = σ_Δ^-2 + σ_b^-2, also under Poisson subsampling of
        the whole round (Zhu, Dong, Wang, "Optimal Accounting of Differential Privacy via
        Characteristic Function", AISTATS 2022, dominating pairs)."""
        return False

    def with_counts(self, state: State, noisy_reports: np.ndarray, expected_clients: float) -> State:
        """The state that clips a :attr:`counts_first` round, from that round's noisy report sum."""
        raise NotImplementedError(f"policy {self.name!r} does not release its counts first")

    # ----- the client side, shared by every executor -------------------------------------
    def client_side(self, updates: np.ndarray, cohorts: np.ndarray, params: Broadcast) -> ClientReports:
        """Transform the raw updates of ``n`` clients (rows of ``updates``) into what they send.

        ``cohorts`` holds each client's cohort index; only policies with ``needs_cohorts``
        read it. Every returned contribution has norm at most its client's bound.
        """
        updates = np.atleast_2d(np.asarray(updates, dtype=np.float64))
        cohorts = np.asarray(cohorts, dtype=np.int64).reshape(-1)
        if cohorts.shape[0] != updates.shape[0]:
            raise ValueError(f"{updates.shape[0]} updates but {cohorts.shape[0]} cohort labels")
        if self.needs_cohorts and cohorts.size and (cohorts.min() < 0 or cohorts.max() >= self.num_cohorts):
            raise ValueError(f"cohort index outside 0..{self.num_cohorts - 1}")
        nonfinite = ~np.isfinite(updates).all(axis=1)
        safe = np.where(nonfinite[:, None], 0.0, updates) if nonfinite.any() else updates
        norms = row_norms(safe)
        overflowed = ~np.isfinite(norms)  # finite entries whose norm is not: dropped like them,
        if overflowed.any():  # as scaled_client_side drops a non-finite norm
            nonfinite = nonfinite | overflowed
            safe = np.where(nonfinite[:, None], 0.0, updates)
            norms = np.where(nonfinite, 0.0, norms)
        contributions, reports, exceeded = self.transform(safe, norms, cohorts, params)
        contributions, contribution_norms = clip_rows_with_norms(
            contributions, self._client_bounds(params, cohorts)
        )
        broken = ~np.isfinite(contribution_norms)  # a transform's NaN or ∞ (the norms tell)
        if broken.any():  # sends zeros, as a non-finite update does
            nonfinite = nonfinite | broken
            contributions = np.where(nonfinite[:, None], 0.0, contributions)
            contribution_norms = np.where(nonfinite, 0.0, contribution_norms)
        reports = np.array(reports, dtype=np.float64)
        reports[nonfinite] = 0.0
        reports = project_reports(reports)  # norm <= 1; a non-finite report becomes zero
        return ClientReports(
            contributions=contributions,
            reports=reports,
            exceeded=exceeded & ~nonfinite,
            nonfinite=nonfinite,
            norms=norms,
            contribution_norms=contribution_norms,
        )

    def scaled_client_side(self, norms: np.ndarray, cohorts: np.ndarray, params: Broadcast) -> ScaledReports:
        """:meth:`client_side` of a row-scaling policy (:attr:`row_scaling`) from the update norms
        alone: the factors c_i (and r_i) such that c_i · Δ_i is the contribution it sends.

        The final projection acts on the factors: where c_i · ||Δ_i|| exceeds a client's bound
        by more than :data:`SAFETY` below it, c_i becomes bound · :data:`GUARD_RADIUS` / ||Δ_i||
        (r_i likewise against 1), as :func:`clip_rows` would scale the row. ``norms`` must be
        the exact norms of the rows the factors will multiply (to float64 rounding); a
        non-finite norm marks a non-finite update, whose factors are 0."""
        if not self.row_scaling:
            raise TypeError(f"policy {type(self).__name__} is not row-scaling (it overrides transform)")
        norms = np.asarray(norms, dtype=np.float64).reshape(-1)
        cohorts = np.asarray(cohorts, dtype=np.int64).reshape(-1)
        if cohorts.shape[0] != norms.shape[0]:
            raise ValueError(f"{norms.shape[0]} norms but {cohorts.shape[0]} cohort labels")
        if self.needs_cohorts and cohorts.size and (cohorts.min() < 0 or cohorts.max() >= self.num_cohorts):
            raise ValueError(f"cohort index outside 0..{self.num_cohorts - 1}")
        nonfinite = ~np.isfinite(norms)
        norms = np.where(nonfinite, 0.0, norms)
        row = self.scales(norms, cohorts, params)
        contribution = guard_scales(row.factors(norms), norms, self._client_bounds(params, cohorts))
        contribution[nonfinite] = 0.0
        report_scales = None
        reports_out = None
        if row.report_scales is None:
            reports_out = np.array(row.reports, dtype=np.float64)
            reports_out[nonfinite] = 0.0
            reports_out = project_reports(reports_out)
        else:
            report_scales = guard_scales(row.report_scales, norms, np.ones_like(norms))
            report_scales[nonfinite] = 0.0
        return ScaledReports(
            contribution_scales=contribution,
            reports=reports_out,
            report_scales=report_scales,
            exceeded=np.asarray(row.exceeded, dtype=bool) & ~nonfinite,
            nonfinite=nonfinite,
            norms=norms,
            contribution_norms=np.abs(contribution) * norms,
        )

    def _client_bounds(self, params: Broadcast, cohorts: np.ndarray) -> np.ndarray:
        """The bound each client's contribution is projected to: :meth:`contribution_bounds`,
        with a bound that is not a number or is negative taken as 0 (nothing gets through it), and
        so is an infinite one under a private policy: a broadcast the client did not expect
        never lets its update out unclipped."""
        bounds = np.asarray(self.contribution_bounds(params, cohorts), dtype=np.float64)
        unusable = np.isnan(bounds) | (bounds < 0) | (np.isinf(bounds) & self.private)
        return np.where(unusable, 0.0, bounds)

    # ----- the server side, shared by every executor -------------------------------------
    def count_side(
        self,
        state: State,
        report_sum: np.ndarray,
        *,
        expected_clients: float,
        noise: NoiseMultipliers,
        rng: np.random.Generator | GaussianSampler,
    ) -> CountRelease:
        """The first exchange of a :attr:`counts_first` round: A = Σ a_i + N(0, σ_b² I), and the
        state that clips this round (:meth:`with_counts`). ``rng`` must be the generator that
        then noises the round's sum (:meth:`server_side`): one stream per round, never two
        copies of it."""
        if not self.counts_first:
            raise ValueError(f"policy {self.name!r} releases its reports with its contributions")
        if expected_clients <= 0:
            raise ValueError(f"expected_clients must be > 0 (got {expected_clients})")
        noisy_reports, _ = as_sampler(rng).add_noise(
            np.asarray(report_sum, dtype=np.float64), noise.report, 1.0
        )
        return CountRelease(self.with_counts(state, noisy_reports, expected_clients), noisy_reports)

    def server_side(
        self,
        state: State,
        contribution_sum: np.ndarray,
        report_sum: np.ndarray | None,
        *,
        expected_clients: float,
        num_reports: int,
        noise: NoiseMultipliers,
        rng: np.random.Generator | GaussianSampler,
        released_reports: np.ndarray | None = None,
        rounding_slack: float | None = None,
    ) -> ServerRound:
        """Noise the sums, form Δ̂ and move the state (module docstring).

        ``rounding_slack`` ρ (secure aggregation): the sums are of quantised vectors, whose L2
        bound is s_t·(1+ρ) (:func:`fairclip.strategies.secure_sum.quantised_sensitivity`), so the
        contribution noise uses that sensitivity (the accountant's multipliers unchanged, the
        std widened by 1+ρ), as does the report noise unless the reports are integers
        (:attr:`integer_reports`, summed exactly). The reported ``sensitivity`` is the widened
        one; Δ̂'s denominator keeps s_t.

        ``rng`` draws the noise: a numpy generator, or any :class:`GaussianSampler`.

        ``num_reports`` is the true number of clients that reported. It is private and only the
        non-private ``none`` policy reads it; every private policy divides by the public
        ``expected_clients`` m̂.

        A :attr:`counts_first` round passes the reports its first exchange released
        (:meth:`count_side`) as ``released_reports``, and ``state`` is the state that clipped
        (:attr:`CountRelease.state`); ``report_sum`` is then not used.
        """
        if expected_clients <= 0:
            raise ValueError(f"expected_clients must be > 0 (got {expected_clients})")
        if self.counts_first and released_reports is None:
            raise ValueError(f"policy {self.name!r} releases its counts first: pass released_reports")
        if released_reports is not None and not self.counts_first:
            raise ValueError(f"policy {self.name!r} releases its reports with its contributions")
        releases_reports = released_reports is not None or self.report_size(contribution_sum.shape[0]) > 0
        event = self.round_event(state, noise, releases_reports)
        sensitivity = float(self.sensitivity(state))
        noised_sensitivity, report_sensitivity = sensitivity, 1.0
        if rounding_slack is not None:
            from fairclip.strategies.secure_sum import quantised_sensitivity

            noised_sensitivity = quantised_sensitivity(sensitivity, rounding_slack)
            if not self.integer_reports:
                report_sensitivity = quantised_sensitivity(1.0, rounding_slack)
        sampler = as_sampler(rng)
        # a release of sensitivity s_t with the multiplier the accountant is told: std σ_Δ · n_t
        noisy_sum, noise_std = sampler.add_noise(contribution_sum, event.noise_multiplier, noised_sensitivity)
        noisy_reports = released_reports
        if released_reports is None and self.report_size(contribution_sum.shape[0]) > 0:
            if report_sum is None:
                raise ValueError(f"policy {self.name!r} needs the sum of client reports")
            noisy_reports, _ = sampler.add_noise(report_sum, noise.report, report_sensitivity)
        denominator = expected_clients * (sensitivity if self.normalize else 1.0)
        estimate = noisy_sum / denominator
        next_state = self.next_state(state, estimate, noisy_reports, expected_clients)
        return ServerRound(
            estimate=estimate,
            state=next_state,
            sensitivity=noised_sensitivity,
            clip_bound=float(self.clip_bound(state)),
            server_lr_factor=float(self.server_lr_factor(state)),
            noise_std=noise_std,
            noisy_reports=noisy_reports,
            info=self.round_info(state),
            event=event,
            estimate_noise_std=noise_std / denominator,
        )


def exponential_step(value: float, exponent: float, lower: float = 0.0) -> float:
    """value · exp(exponent), kept within [max(lower, BOUND_FLOOR), max(BOUND_CEILING, value)].

    Computed without overflow for any finite exponent (a large learning rate, or a bound that
    keeps growing round after round, would otherwise reach infinity). ``value`` must be > 0.
    """
    lowest = max(float(lower), BOUND_FLOOR)
    highest = max(BOUND_CEILING, float(value))
    exponent = min(float(exponent), math.log(highest) - math.log(value))
    return min(highest, max(lowest, value * math.exp(exponent)))


def geometric_update(
    bound: float, fraction_above: float, target: float, learning_rate: float, lower: float
) -> float:
    """C_{t+1} = max(C_LB, C_t · exp(η_C · (b̃ − γ))), with b̃ clamped to [0, 1] first.

    b̃ is the noisy fraction of updates above τ·C_t (docs/design.md, section 2, step 4); clamping it to
    its valid range is post-processing. The result stays within ``BOUND_FLOOR`` and
    ``BOUND_CEILING`` (:func:`exponential_step`).
    """
    clamped = min(max(float(fraction_above), 0.0), 1.0)
    return exponential_step(bound, learning_rate * (clamped - target), lower)


def noisy_fraction(noisy_count: np.ndarray | None, expected_clients: float) -> float:
    """b̃ = B / m̂ from a released one-element count vector."""
    if noisy_count is None:
        raise ValueError("the bound update needs the noisy count")
    return float(noisy_count[0]) / expected_clients
