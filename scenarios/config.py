"""Scenario configuration: TOML files, ``--set`` overrides and validation (docs/design.md, section 5).

A configuration has the tables ``[scenario]``, ``[federation]``, ``[training]``,
``[policy]`` and ``[privacy]`` and a top-level ``seed``. Keys directly under ``[policy]``
(besides ``name``) apply to whichever policy is chosen; a sub-table ``[policy.<name>]``
holds defaults for that one policy only, so a scenario can give ``bounded`` its lower bound
without breaking ``--set policy.name=constant``. Direct keys win over the sub-table, which
is where ``--set policy.lower_bound=...`` lands. Unknown keys and out-of-range values raise
:class:`ConfigError` with one line naming the key.

``[strategy]`` is the table's old name and still read, as ``[policy]``, wherever a configuration
comes in (TOML files, ``--set strategy.x=...``, grid and setup keys, Flower's run configuration,
stored configurations): :func:`canonical_raw` and :func:`canonical_key`, with a one-time
:class:`OldNameNote`. Giving both names at once is a :class:`ConfigError`.
"""

from __future__ import annotations

import copy
import math
import tomllib
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fairclip.plugins import PluginError, resolve
from fairclip.scenarios import dataset_registry
from fairclip.scenarios.dataset_registry import GENERATED
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.model_names import MODELS
from fairclip.strategies import PolicyConfigError, build_policy, policy_parameters
from fairclip.strategies.errors import did_you_mean
from fairclip.strategies.params import first_problem
from fairclip.strategies.registry import policy_class
from fairclip.strategies.secure_sum import DEFAULT_RHO

SCENARIO_DIR = Path(__file__).parent / "builtin"

POLICY = "policy"
"""The table of the clipping policy: ``policy.name``, ``policy.<param>``, ``policy.<name>.<param>``."""
OLD_POLICY = "strategy"
"""The table's old name, read as :data:`POLICY` (an alias)."""
OLD_NAME_NOTE = "'strategy.*' keys are read as 'policy.*' (the old name)"


class OldNameNote(FutureWarning):
    """A configuration used the old name ``strategy`` of the ``policy`` table (read as ``policy``;
    the command line prints it once as ``fairclip: note: ...``)."""


def _note_old_name() -> None:
    # one location and one message: the default filter shows it once per process
    warnings.warn(OLD_NAME_NOTE, OldNameNote, stacklevel=1)


def canonical_key(key: str, *, quiet: bool = False) -> str:
    """A dotted configuration key with the old table name ``strategy`` read as ``policy``
    (``quiet``: without the note, for a file written before the rename)."""
    head, dot, rest = key.partition(".")
    if head.strip() != OLD_POLICY:
        return key
    if not quiet:
        _note_old_name()
    return f"{POLICY}{dot}{rest}"


def canonical_keys(keys: Iterable[str], where: str = "--set", *, quiet: bool = False) -> list[str]:
    """:func:`canonical_key` of each of ``keys`` (one source: ``--set``, a grid, a setup's settings),
    refusing both names at once."""
    keys = list(keys)
    heads = {key.partition(".")[0].strip() for key in keys}
    if {POLICY, OLD_POLICY} <= heads:
        raise ConfigError(
            f"{where}: give policy.* keys or strategy.* keys (the old name of policy.*), not both"
        )
    return [canonical_key(key, quiet=quiet) for key in keys]


def canonical_mapping(
    mapping: Mapping[str, Any] | None, where: str = "--set", *, quiet: bool = False
) -> dict[str, Any]:
    """A mapping of dotted keys (overrides, a grid, settings) with :func:`canonical_keys`."""
    mapping = dict(mapping or {})
    return dict(zip(canonical_keys(mapping, where, quiet=quiet), mapping.values(), strict=True))


def canonical_assignments(
    assignments: Iterable[str], where: str = "--set", *, quiet: bool = False
) -> list[str]:
    """``KEY=VALUE`` assignments with :func:`canonical_keys` (the values as given)."""
    split = [assignment.partition("=") for assignment in assignments]
    keys = canonical_keys([key for key, _, _ in split], where, quiet=quiet)
    return [f"{key}{sep}{value}" for key, (_, sep, value) in zip(keys, split, strict=True)]


def canonical_raw(
    raw: dict[str, Any], where: str = "configuration", *, quiet: bool = False
) -> dict[str, Any]:
    """A raw configuration whose ``[strategy]`` table (the old name) is read as ``[policy]``; a
    :class:`ConfigError` where it has both. ``raw`` itself is not changed. ``quiet``: no note (a
    stored configuration, written before the rename, is no one's choice of key)."""
    if not isinstance(raw, dict) or OLD_POLICY not in raw:
        return raw
    if POLICY in raw:
        raise ConfigError(f"{where}: give [policy] or [strategy] (the old name of [policy]), not both")
    if not quiet:
        _note_old_name()
    return {(POLICY if key == OLD_POLICY else key): value for key, value in raw.items()}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _ScenarioBase(_Section):
    name: str
    description: str = ""

    @field_validator("cohorts", check_fields=False)
    @classmethod
    def _shares_sum_to_one(cls, cohorts: dict[str, Any]) -> dict[str, Any]:
        if not cohorts:
            raise ValueError("at least one cohort is required")
        total = sum(c.share for c in cohorts.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"cohort shares must sum to 1 (they sum to {total:g})")
        return cohorts


class CohortSpec(_Section):
    """One cohort of the ``mean-estimation`` task: its share of clients and point cloud."""

    share: Annotated[float, Field(gt=0, le=1)]
    centre: float | list[float]
    spread: NonNegativeFloat = 0.0


class ScenarioSpec(_ScenarioBase):
    """``mean-estimation``: each client holds a point, the model is their mean."""

    task: Literal["mean-estimation"]
    dimension: Annotated[int, Field(ge=1)] = 1
    cohorts: dict[str, CohortSpec]

    @model_validator(mode="after")
    def _centres_match_dimension(self) -> ScenarioSpec:
        for name, cohort in self.cohorts.items():
            if isinstance(cohort.centre, list) and len(cohort.centre) != self.dimension:
                raise ValueError(
                    f"cohorts.{name}.centre has {len(cohort.centre)} values but dimension is {self.dimension}"
                )
        return self


class SyntheticCohortSpec(_Section):
    """Data of one synthetic cohort (see :mod:`fairclip.scenarios.data.synthetic`)."""

    signal_feature: Annotated[int, Field(ge=0)]
    signal_strength: PositiveFloat = 1.0
    noise: PositiveFloat = 1.0
    """Standard deviation of the noise on the signal feature."""
    background_noise: NonNegativeFloat = 0.1
    """Standard deviation of the noise on every other feature."""
    offset: float = 0.0
    """Added to every feature of the cohort (a shifted feature distribution)."""


class ClassificationCohortSpec(_Section):
    """A cohort of a classification scenario: its share of clients and one data rule."""

    share: Annotated[float, Field(gt=0, le=1)]
    attribute: str | None = None
    """Holds the training rows whose protected attribute has this value (Adult, Dutch)."""
    class_fractions: dict[str, Annotated[float, Field(ge=0, le=1)]] | None = None
    """{class: fraction of that class's examples held by this cohort}."""
    synthetic: SyntheticCohortSpec | None = None
    """How this cohort's examples are generated (dataset ``synthetic``)."""


class ClassificationSpec(_ScenarioBase):
    """A classification task over a real or synthetic dataset."""

    task: Literal["classification"]
    dataset: str
    """A built-in dataset (``mnist``, ``fashion-mnist``, ``adult``, ``dutch``: one module each in
    :mod:`fairclip.scenarios.data.builtin`) or ``synthetic`` (generated per cohort)."""
    model: str = "logistic"
    """A built-in model (``logistic``, ``mlp``, ``cnn``, ``tanh-cnn``) or a plug-in model factory
    (:mod:`fairclip.plugins`: a registered name, an entry point or ``package.module:factory``)."""
    partition: Literal["cohort", "iid", "dirichlet", "per-example"] = "cohort"
    """``per-example``: one client per training example (federation.num_clients = that number)."""
    dirichlet_alpha: PositiveFloat = 0.5
    skew_class: Annotated[int, Field(ge=0)] | None = None
    skew_keep: Annotated[float, Field(gt=0, le=1)] = 0.09
    skew_count: Annotated[int, Field(ge=0)] | None = None
    """Keep exactly this many training examples of ``skew_class`` (a seeded subset) instead of
    each with probability ``skew_keep``."""
    balance: bool = True
    balance_by: Literal["sex", "age"] | None = None
    """Adult: the attribute whose groups ``balance`` samples 14,000 rows of each, where it is not
    ``protected`` (seed 001 draws 14,000 men and 14,000 women and groups them by age:
    ``protected = "age"``, ``balance_by = "sex"``); unset: the protected attribute."""
    group_rows: dict[str, Annotated[int, Field(ge=1)]] | None = None
    """Keep exactly this many rows of each group of the protected attribute, by group name, drawn
    (seeded, without replacement) before the split into training and test rows (``adult`` with
    ``balance = false``, ``dutch``); a group not named keeps no row. Seed 004's unbalanced Dutch:
    ``{ female = 30000, male = 10000 }``."""
    group_rows_by: Literal["sex", "marital-status"] | None = None
    """Dutch: the attribute whose groups ``group_rows`` names, where it is not ``protected`` (seed
    000's code draws 14,000 rows of each sex and groups them by marital status:
    ``protected = "marital-status"``, ``group_rows_by = "sex"``); unset: the protected attribute."""
    test_rows: Literal["split", "left-out"] = "split"
    """Where rows are sampled (``group_rows``, Adult's ``balance``): ``split`` tests on
    ``test_fraction`` of the sample; ``left-out`` on every row the sample left out, and trains on
    the sample's other ``1 - test_fraction``; with ``evaluate_on = "validation"`` the runs train
    on the same rows and evaluate on the sample's held-out share (seed 000's code, which validates
    its grid runs there and trains its final models on the rest)."""
    one_hot: Literal["every", "drop-first"] = "every"
    """How the categorical attributes become inputs (``adult``, ``dutch``): ``every`` category gets
    an indicator, or ``drop-first``: each attribute's first category, in sorted order, gets none,
    as scikit-learn's ``OneHotEncoder(drop="first")`` does (seed 000's code; on Adult it drops
    the unknown value ``?`` of workclass, occupation and native country, so those keep every
    documented value)."""
    incomplete_rows: Literal["drop", "keep"] = "drop"
    """Adult: ``drop`` the 3,620 rows with an unknown (``?``) workclass, occupation or native
    country (seeds 003 and 004, and their code), or ``keep`` all 48,842, an unknown value getting
    no indicator (seed 000's code, which encodes ``?`` as a value and drops it as the first in
    sorted order)."""
    include_protected: bool = True
    """Whether the sex column is an input feature (``adult``, ``dutch``); seed 004 trains on
    the unprotected attributes only (``false``)."""
    balance_per_group: Annotated[int, Field(ge=1)] = 14_000
    """Rows of each protected group that ``balance`` draws (Adult): 14,000, as seeds 003 and 004
    write it; 14,695, all complete female rows, is what seed 003's code keeps (its
    ``group_ratios`` 1,1 keep every row of the smaller group and thin the other to its size)."""
    protected: Literal["sex", "age", "marital-status"] = "sex"
    """The protected attribute, which ``attribute`` cohorts name: ``sex`` (``male``,
    ``female``); for Adult ``age`` binarised at ``age_split`` (``younger``, ``older``; seed
    001's second grouping); for Dutch ``marital-status``, code 4 against the others
    (``marital-4``, ``marital-other``: the grouping seed 000's code evaluates)."""
    age_split: Literal["public", "median"] = "public"
    """Where ``protected = "age"`` splits Adult's ages: ``public``, at 40 (a documented threshold,
    no statistic of the rows), or ``median``, at the median age of the complete rows (seed 001's
    grouping: a statistic of the rows, outside ε, which the run's summary says)."""
    feature_scaling: Literal["public", "standardize", "minmax"] = "public"
    """How Adult's numeric columns are scaled: ``public``, by each column's documented domain
    alone (no statistic of the rows); or by the training rows' statistics, as the papers do,
    a step outside ε that the run's summary says: ``standardize`` (mean 0, standard deviation
    1) or ``minmax`` (into [0, 1], as seed 004 does)."""
    test_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.2
    """Share of the rows held out for testing where the dataset has no fixed test set (``adult``,
    ``dutch``: a seeded split), and share of the training rows held out with ``evaluate_on =
    "validation"``."""
    split_seed: Annotated[int, Field(ge=0)] | None = None
    """The seed of the split of the rows into training and test rows (``adult``, ``dutch``; and of
    Adult's balancing sample) instead of the run's ``seed``, which still seeds everything else: runs
    with different seeds then share one test set (a reproduction with a grid fixes it at its first
    seed, so that no seed's test rows were seen by the selection)."""
    evaluate_on: Literal["test", "validation"] = "test"
    """``validation``: hold out ``test_fraction`` of the training rows (seeded) and evaluate on them
    instead of the test set, which is then not used (hyper-parameter selection, real datasets);
    with ``test_rows = "left-out"``, evaluate on the sample's held-out share instead."""
    test_limit: Annotated[int, Field(ge=1)] | None = None
    """Evaluate on a seeded subset of at most this many of the test (or validation) rows instead of
    all of them (real datasets; smoke runs: the numbers then describe a smaller evaluation set)."""
    features: Annotated[int, Field(ge=1)] = 20
    """Number of features (dataset ``synthetic``)."""
    examples_per_client: Annotated[int, Field(ge=1)] = 32
    """Training examples per client (dataset ``synthetic``)."""
    test_examples_per_cohort: Annotated[int, Field(ge=1)] = 2000
    """Test examples generated per cohort (dataset ``synthetic``)."""
    cohorts: dict[str, ClassificationCohortSpec]

    @field_validator("model")
    @classmethod
    def _model_resolves(cls, reference: str) -> str:
        return check_model(reference)

    @field_validator("dataset")
    @classmethod
    def _dataset_is_known(cls, name: str) -> str:
        if name not in GENERATED:
            dataset_registry.get(name)  # one line, with a "did you mean", where none has the name
        return name

    @model_validator(mode="after")
    def _cohort_rules_fit_the_dataset(self) -> ClassificationSpec:
        row_split = dataset_registry.row_split_datasets()
        for name, cohort in self.cohorts.items():
            if self.dataset == "synthetic" and cohort.synthetic is None:
                raise ValueError(f"cohorts.{name}.synthetic is required for the synthetic dataset")
            if self.dataset == "synthetic" and cohort.synthetic.signal_feature >= self.features:
                raise ValueError(
                    f"cohorts.{name}.synthetic.signal_feature must be < features ({self.features})"
                )
            if self.dataset != "synthetic" and cohort.synthetic is not None:
                raise ValueError(f"cohorts.{name}.synthetic is only for the synthetic dataset")
            if cohort.attribute is not None and cohort.class_fractions is not None:
                raise ValueError(f"cohorts.{name}: give attribute or class_fractions, not both")
            if self.partition == "per-example" and cohort.attribute is None and not cohort.class_fractions:
                raise ValueError(f"cohorts.{name}: partition per-example needs attribute or class_fractions")
        if self.evaluate_on == "validation" and self.dataset == "synthetic":
            raise ValueError("evaluate_on: validation needs a real dataset")
        if self.test_limit is not None and self.dataset == "synthetic":
            raise ValueError("test_limit applies to real datasets (synthetic: test_examples_per_cohort)")
        if self.partition == "per-example" and self.dataset == "synthetic":
            raise ValueError("partition: per-example needs a real dataset")
        if self.protected == "age" and self.dataset != "adult":
            raise ValueError("protected = age applies to the adult dataset only (its age column)")
        if self.protected == "marital-status" and self.dataset != "dutch":
            raise ValueError("protected = marital-status applies to the dutch dataset only")
        if self.split_seed is not None and self.dataset not in row_split:
            named = " and ".join(row_split)
            raise ValueError(
                f"split_seed applies to the {named} datasets only (the others have a fixed test set)"
            )
        if self.group_rows is not None and self.dataset not in row_split:
            raise ValueError(f"group_rows applies to the {' and '.join(row_split)} datasets only")
        if self.group_rows_by is not None and (self.dataset != "dutch" or self.group_rows is None):
            raise ValueError("group_rows_by applies to the dutch dataset with group_rows only")
        sampled = self.group_rows is not None or (self.dataset == "adult" and self.balance)
        if self.test_rows != "split" and (self.dataset not in row_split or not sampled):
            raise ValueError(
                "test_rows = left-out needs sampled rows: group_rows, or the adult dataset's balance"
            )
        if self.group_rows is not None and self.dataset == "adult" and self.balance:
            raise ValueError("group_rows samples Adult's groups itself: set balance = false")
        if self.one_hot != "every" and self.dataset not in row_split:
            raise ValueError(f"one_hot applies to the {' and '.join(row_split)} datasets only")
        if self.incomplete_rows != "drop" and self.dataset != "adult":
            raise ValueError("incomplete_rows applies to the adult dataset only (its unknown values)")
        if not self.include_protected and self.dataset not in row_split:
            raise ValueError(f"include_protected applies to the {' and '.join(row_split)} datasets only")
        if self.balance_per_group != 14_000 and (self.dataset != "adult" or not self.balance):
            raise ValueError("balance_per_group applies to the adult dataset with balance = true only")
        if self.feature_scaling != "public" and self.dataset != "adult":
            raise ValueError("feature_scaling applies to the adult dataset only (its numeric columns)")
        if self.age_split != "public" and "age" not in (self.protected, self.balance_by):
            raise ValueError(
                "age_split applies to protected = age only (or balance_by = age; the adult dataset)"
            )
        if self.balance_by is not None and (self.dataset != "adult" or not self.balance):
            raise ValueError("balance_by applies to the adult dataset with balance = true only")
        return self


BUILTIN_MODELS = MODELS
"""The built-in models (:mod:`fairclip.scenarios.model_names`: validation needs no torch)."""


def check_model(reference: str) -> str:
    """A built-in model's name, or a plug-in reference that resolves (its module imported)."""
    if reference not in BUILTIN_MODELS:
        _resolve("model", reference, f"built-in: {', '.join(BUILTIN_MODELS)}")
    return reference


def _resolve(kind: Any, reference: str, known: str) -> Any:

    try:
        return resolve(kind, reference)
    except PluginError as error:
        raise ValueError(f"{error} ({known}; or package.module:attribute)") from None


class FederatedDatasetSpec(_Section):
    """``federated-dataset``: the user's own classification data, a :class:`fairclip.FederatedDataset`
    from a plug-in, with the cohorts it defines. ``dataset`` names a dataset object or a loader
    ``(num_clients, seed, **options) -> FederatedDataset`` (a registered name, an entry point of
    ``fairclip.datasets`` or ``package.module:loader``); ``options`` are the loader's keyword
    arguments."""

    name: str
    description: str = ""
    task: Literal["federated-dataset"]
    dataset: str
    options: dict[str, Any] = {}
    model: str = "logistic"
    """As :attr:`ClassificationSpec.model`."""

    @field_validator("model")
    @classmethod
    def _model_resolves(cls, reference: str) -> str:
        return check_model(reference)

    @field_validator("dataset")
    @classmethod
    def _dataset_resolves(cls, reference: str) -> str:
        _resolve("dataset", reference, "a registered name, an entry point")
        return reference


class FederationSpec(_Section):
    num_clients: Annotated[int, Field(ge=1)]
    sample_rate: Annotated[float, Field(gt=0, le=1)]


class TrainingSpec(_Section):
    rounds: Annotated[int, Field(ge=1)]
    local_epochs: Annotated[int, Field(ge=1)] = 1
    batch_size: Annotated[int, Field(ge=1)] = 32
    client_lr: PositiveFloat = 0.1
    server_lr: PositiveFloat = 1.0
    server_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    class_weights: list[PositiveFloat] | None = None
    """w_y, one per class: each training example's loss is multiplied by its class's weight
    (seed 001's binary cross-entropy with positive weight 2 is ``[1.0, 2.0]`` on a ``binary-*``
    model); classification only. The evaluation loss stays the plain cross-entropy."""
    server_optimizer: Literal["sgd", "adam", "adam-wosm"] = "sgd"
    """How the server steps along the released Δ̂ (post-processing): SGD with
    ``server_momentum``, Adam with ``server_beta1``, ``server_beta2`` and ``server_eps``
    (DP-Adam in the sample-level case), or ``adam-wosm``, Adam's first moment (``server_beta1``)
    over the noise's standard deviation per coordinate (Mohapatra et al. 2022's DPAdamWOSM; a
    private run only) (:mod:`fairclip.server.optimizer`)."""
    server_beta1: Annotated[float, Field(ge=0, lt=1)] = 0.9
    server_beta2: Annotated[float, Field(ge=0, lt=1)] = 0.999
    server_eps: PositiveFloat = 1e-8
    weight_decay: NonNegativeFloat = 0.0
    """λ of an L2 penalty λ/2·||θ||², applied by the server step to the released model
    (post-processing): θ_{t+1} = θ_t + η_s·ρ_t·v_{t+1} with v_{t+1} = β·v_t + Δ̂_t − λ·θ_t."""
    eval_every: Annotated[int, Field(ge=1)] = 1
    """Evaluate the model (and report ε in ``rounds.csv``) after every k-th round and the last."""
    per_example: Literal["auto", "materialize"] = "auto"
    """How one-step clients (one example, one step) are clipped: ``auto`` takes each example's
    gradient norm from its layers' inputs and output gradients and sums the clipped gradients
    without forming them, where the policy is row-scaling and the model's parameterised layers
    are ``Linear``, ``Conv2d``, ``ConvTranspose2d`` or ``GroupNorm``
    (:mod:`fairclip.scenarios.tasks.ghost`); ``materialize`` always forms each example's gradient
    with ``torch.func``. Both give the same run to float32 rounding."""
    one_step_rows: Annotated[int, Field(ge=1)] | None = None
    """Examples per call of the one-step path (one-step clients only): the executors train a
    round's sampled clients in groups of whole summation blocks of about this many examples,
    the same groups on every executor and number of workers, so a run is the same run on all of
    them for a given value; another value changes the run by float rounding. Unset: 32 where
    the task trains on the CPU, 1,024 on a GPU
    (:func:`fairclip.scenarios.tasks.classification.rows_per_one_step_call`)."""
    cohort_directions: bool = False
    """Record, per cohort and round, the direction and magnitude errors of the client side of
    the policy: cos(Σ c_i, Σ Δ_i) and ||Σ c_i|| / ||Σ Δ_i|| over the cohort's sampled clients
    (seed 003, section 4). Simulation-only diagnostics (``rounds.csv``, never released); they cost
    2 K model-sized sums per call of the client side (each sampled client's update read twice),
    about twice a one-step call's time on ``xu-cnn`` and ``galli-cnn`` (before 2026-12-06, 2 K
    sums per summation block: about 25 times)."""
    clipping_error: Literal["both", "direction", "magnitude"] = "both"
    """Seed 003's Table 1 ablation, for non-private runs of a clipping policy (simulation only):
    ``direction`` steps along the clipped aggregate Σ c_i rescaled to the length of the unclipped
    one Σ Δ_i (clipping's direction error alone); ``magnitude`` steps along Σ Δ_i rescaled to the
    length of Σ c_i (its magnitude error alone); ``both`` is clipping as it is
    (:func:`fairclip.scenarios.tasks.clipping_errors.keep_one_error`)."""
    objective: Literal["cross-entropy", "fairlens", "reconstruction"] = "cross-entropy"
    """What each client's gradient step minimises: its examples' cross-entropy; ``reconstruction``,
    each example's mean squared error between the model's output and its input (an autoencoder:
    seed 002's Fashion MNIST experiment; the model's output has the input's shape, the evaluation
    loss is that error overall, per class and per cohort, and there is no accuracy:
    :func:`fairclip.scenarios.tasks.evaluation.evaluate_reconstruction`); or ``fairlens``,
    the cross-entropy plus FairLens's two batch regularisers (Tran et al. 2021, as seed 003's
    Algorithm 4 runs it: :mod:`fairclip.scenarios.tasks.fairlens`) with the weights ``fairlens_weights``
    and the ``constant`` policy's bound as C_0. Simulation only: each example's step then
    depends on the whole batch, so the run claims no ε; one-example, one-step clients, two
    cohorts, two classes, the in-process executor."""
    fairlens_weights: Annotated[list[NonNegativeFloat], Field(min_length=2, max_length=2)] = [1.0, 1.0]
    """γ_1 and γ_2 of ``objective = "fairlens"`` (seed 003, appendix B.2: both 1)."""
    train_loss: bool | Literal["last-epoch", "last-epoch-examples"] = False
    """Also report each cohort's mean training cross-entropy (``<cohort>/train_loss`` in
    summary.json): ``true``, over its clients' training examples under the final model;
    ``"last-epoch"``, as seed 003's authors' code takes its tables' Loss columns, each round's
    mean over the batch's examples of the cohort under θ_t (0 where the batch holds none),
    averaged over the last epoch's ⌈1/q⌉ rounds; ``"last-epoch-examples"``, as seed 004's Table
    2, the mean over every example of the last epoch's batches under the θ_t of its round. Both
    last-epoch readings also report each cohort's mean update norm before clipping over those
    rounds (``<cohort>/train_update_norm``) and the mean norm of its batch mean update
    (``<cohort>/train_mean_update_norm``; :mod:`fairclip.server.last_epoch`), whose updates the
    server trains again in those rounds (about one more training of the batch a round).
    Simulation-only diagnostics of private data, not covered by DP; the Flower apps refuse them."""
    train_loss_limit: Annotated[int, Field(ge=1)] | None = None
    """With ``train_loss = true``: compute each cohort's training loss on a seeded subset of at
    most this many of its clients' examples instead of all of them (smoke runs: evaluating every
    training image dominated a short run)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where clients train and the server evaluates (classification): ``auto`` picks a GPU when
    torch sees one; ``cuda`` requires one."""

    @field_validator("train_loss", mode="before")
    @classmethod
    def _train_loss_is_a_reading(cls, value: Any) -> Any:
        # one line naming the choices, not pydantic's error for each member of the union
        if isinstance(value, str) and value not in ("last-epoch", "last-epoch-examples"):
            raise ValueError("must be true, false, 'last-epoch' or 'last-epoch-examples'")
        return value

    @field_validator("device")
    @classmethod
    def _cuda_is_there(cls, device: str) -> str:
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("cuda, but torch sees no CUDA device (use auto or cpu)")
        return device

    @model_validator(mode="after")
    def _momentum_is_sgds(self) -> TrainingSpec:
        if self.server_optimizer != "sgd" and self.server_momentum:
            raise ValueError("server_momentum is SGD's; Adam keeps its own moments (server_beta1/2)")
        return self


class PrivacySpec(_Section):
    noise_multiplier: NonNegativeFloat = 0.0
    count_noise_multiplier: NonNegativeFloat | None = None
    count_noise_ratio: PositiveFloat | None = None
    """k = σ_b / σ_Δ when σ_b is not given (default 10), also when ``target_epsilon``
    calibrates: seed 002 runs σ_q ≈ 7.124 σ_eff, which is k = (7.124² − 1)^½ = 7.054."""
    target_epsilon: PositiveFloat | None = None
    epsilon_budget: PositiveFloat | None = None
    delta: Annotated[float, Field(gt=0, lt=1)] = 1e-5
    accountant: Literal["prv", "rdp"] = "prv"
    secure_noise: bool | None = None
    """Draw the DP noise with OpenDP's exact sampler (:mod:`fairclip.server.secure_noise`);
    unset: on for the Flower ``ServerApp`` (deployments), off for simulations."""
    secure_aggregation: bool = False
    """Sum the clients' contributions and reports with fairclip's SecAgg+ (Flower apps only,
    :mod:`fairclip.server.secure_aggregation`): the server unmasks only the round's sum, and the
    noise is widened to the quantised sensitivity s·(1 + ``secagg_rounding_slack``)."""
    secagg_neighbours: Annotated[int, Field(ge=0)] = 0
    """Each node's neighbours in a SecAgg+ ring (an even number >= 2), or 0: all pairs (SecAgg)."""
    secagg_threshold: Annotated[int, Field(ge=2)] | None = None
    """Shamir threshold t; unset: just above half of a neighbourhood (``default_threshold``)."""
    secagg_rounding_slack: Annotated[float, Field(gt=0, le=1)] = DEFAULT_RHO
    """ρ: the quantiser's step is ρ·s/√d, and the noise's sensitivity s·(1+ρ)."""
    secagg_stage_timeout: PositiveFloat = 120.0
    """Seconds the server waits for each stage's replies (a node that has not answered drops out)."""

    @property
    def adds_noise(self) -> bool:
        """Whether the run adds DP noise: σ_Δ > 0, or a target ε that calibrates one."""
        return self.noise_multiplier > 0 or self.target_epsilon is not None

    @model_validator(mode="after")
    def _secagg_neighbourhood(self) -> PrivacySpec:
        k, t = self.secagg_neighbours, self.secagg_threshold
        if k and (k < 2 or k % 2):
            raise ValueError(f"secagg_neighbours must be 0 (all pairs) or an even number >= 2 (got {k})")
        if k and t is not None and t > k:
            raise ValueError(f"secagg_threshold {t} exceeds secagg_neighbours {k}")
        return self

    @model_validator(mode="after")
    def _one_count_noise(self) -> PrivacySpec:
        if self.count_noise_multiplier is not None and self.count_noise_ratio is not None:
            raise ValueError(
                "give count_noise_multiplier (sigma_b) or count_noise_ratio (sigma_b / sigma_delta), not both"
            )
        if self.count_noise_multiplier is not None and self.target_epsilon is not None:
            raise ValueError(
                "target_epsilon calibrates sigma_b too (sigma_b = count_noise_ratio * sigma_delta): "
                "give count_noise_ratio instead of count_noise_multiplier"
            )
        return self


class EvaluationSpec(_Section):
    """``[evaluation]``: who evaluates the released model (docs/design.md, section 7).

    ``server`` evaluates it on the server's own test set (public data, no privacy cost);
    ``clients`` has a fresh Poisson sample of clients (rate q) evaluate it on their own held-out
    examples after every reporting round and the server release the per-cohort sums of their
    correct predictions, examples and clipped losses with Gaussian noise
    (:mod:`fairclip.strategies.evaluation`), accounted in the run's ε. At least one of them."""

    clients: bool = False
    """Have a fresh sample of clients evaluate the model on their held-out examples after every
    reporting round, released with DP noise and accounted in ε (simulations and fairclip's Flower
    apps)."""
    server: bool = True
    """Evaluate the model on the server's own test set (off: the summary's cohorts are the
    clients' noisy evaluation)."""
    max_examples: Annotated[int, Field(ge=1)] = 64
    """m: at most this many held-out examples of each client count (a public constant); the
    sensitivity of a release is m·sqrt(2 + L²)."""
    loss_bound: PositiveFloat = 5.0
    """L: each example's loss is clipped to [0, L] before it is summed."""
    noise_multiplier: PositiveFloat = 5.0
    """σ_E: the noise's standard deviation is σ_E·m·sqrt(2 + L²) per coordinate. At 5 an
    evaluation step costs about 1/25 of the RDP of a training round at σ = 1 (RDP of the
    sampled Gaussian scales about as 1/σ² at small q), so evaluating every round adds a few
    per cent to ε; a cohort's accuracy is then within about σ_E·sqrt(2 + L²)·sqrt(2)/n_k of
    the exact one, n_k the cohort's sampled clients (0.04 for n_k = 1,000 at the defaults)."""
    holdout: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Share of each simulated client's examples held out of its training for its evaluation
    (⌊share·n⌋ of its n examples, a seeded choice); only where ``clients`` is on, so that runs
    without it keep every number."""

    @model_validator(mode="after")
    def _someone_evaluates(self) -> EvaluationSpec:
        if not (self.clients or self.server):
            raise ValueError("clients and server are both false: at least one must evaluate the model")
        return self


class PolicySpec(_Section):
    """The chosen policy and its complete parameters (defaults filled in)."""

    name: str
    params: dict[str, Any]


class RunConfig(_Section):
    seed: Annotated[int, Field(ge=0)] = 0
    scenario: Annotated[ScenarioSpec | ClassificationSpec | FederatedDatasetSpec, Field(discriminator="task")]
    federation: FederationSpec
    training: TrainingSpec
    policy: PolicySpec
    privacy: PrivacySpec
    evaluation: EvaluationSpec = EvaluationSpec()

    @property
    def expected_clients(self) -> float:
        """m̂ = qN, the public denominator."""
        return self.federation.sample_rate * self.federation.num_clients

    def as_dict(self) -> dict[str, Any]:
        """The resolved configuration, as it would be written back to TOML (policy flattened)."""
        data = self.model_dump()
        policy = data.pop("policy")
        data["policy"] = {"name": policy["name"], **policy["params"]}
        return data


# ----- loading --------------------------------------------------------------------------


def builtin_scenarios() -> dict[str, Path]:
    """Name -> file of every scenario shipped inside the package."""
    return {path.stem: path for path in sorted(SCENARIO_DIR.glob("*.toml"))}


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a missing, unreadable, non-UTF-8 or malformed file is a :class:`ConfigError`."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a folder") from None
    except OSError as error:
        raise ConfigError(f"config file {path} cannot be read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not UTF-8 text, as TOML must be ({error.reason} at byte {error.start})"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML ({error})") from None


def scenario_source(scenario: str | None, config_file: Path | None) -> dict[str, Any]:
    """The raw configuration of a built-in scenario or of a TOML file (exactly one of them)."""
    if (scenario is None) == (config_file is None):
        raise ConfigError("give exactly one of --scenario NAME or --config FILE")
    if config_file is not None:
        return canonical_raw(read_toml(config_file), str(config_file))
    scenarios = builtin_scenarios()
    if scenario not in scenarios:
        hint = did_you_mean(scenario, scenarios)
        raise ConfigError(f"unknown scenario {scenario!r}{hint} (built-in: {', '.join(scenarios)})")
    return canonical_raw(read_toml(scenarios[scenario]), f"scenario {scenario}")


def parse_override(assignment: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a", "b", "c"], value); VALUE is read as TOML, else as a string."""
    key, separator, text = assignment.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not separator or not all(path):
        raise ConfigError(f"--set expects KEY=VALUE with a dotted key (got {assignment!r})")
    try:
        value = tomllib.loads(f"value = {text.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return path, value


def set_value(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of ``raw`` with the dotted ``key`` set to ``value`` (``strategy.*``, the old name of
    ``policy.*``, read as ``policy.*``: :func:`canonical_key`)."""
    path = [part.strip() for part in canonical_key(key).split(".")]
    if not all(path):
        raise ConfigError(f"{key!r} is not a dotted configuration key")
    result = copy.deepcopy(canonical_raw(raw))
    table = result
    for part in path[:-1]:
        child = table.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a table")
        table = child
    table[path[-1]] = value
    return result


def apply_overrides(raw: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """A copy of ``raw`` with every ``--set`` assignment applied in order (refused where the
    result would not use one: :func:`check_overrides_used`)."""
    result = copy.deepcopy(canonical_raw(raw))
    parsed = [parse_override(assignment) for assignment in assignments]
    keys = canonical_keys(".".join(path) for path, _ in parsed)
    for key, (_, value) in zip(keys, parsed, strict=True):
        result = set_value(result, key, value)
    check_overrides_used(result, keys)
    return result


def check_overrides_used(raw: dict[str, Any], keys: Iterable[str]) -> None:
    """Refuse an override (or grid key) that the configuration ``raw`` would drop without a word:

    - ``privacy.noise_multiplier`` while ``privacy.target_epsilon`` is set, since the target
      calibrates the noise multiplier (a scenario's own noise multiplier is a default the target
      replaces, and stays allowed);
    - ``policy.<name>.<key>`` while ``policy.<key>`` is set directly, since a direct key wins
      over every policy's table (:func:`policy_spec`).
    """
    raw = canonical_raw(raw)
    privacy = raw.get("privacy") if isinstance(raw.get("privacy"), dict) else {}
    policy = raw.get(POLICY) if isinstance(raw.get(POLICY), dict) else {}
    for key in canonical_keys(keys):
        parts = key.split(".")
        if key == "privacy.noise_multiplier" and privacy.get("target_epsilon") is not None:
            raise ConfigError(
                f"privacy.noise_multiplier: privacy.target_epsilon = {privacy['target_epsilon']!r} is set "
                "and calibrates the noise multiplier, so the value given would not be used"
            )
        direct = policy.get(parts[-1])
        if len(parts) == 3 and parts[0] == POLICY and direct is not None and not isinstance(direct, dict):
            raise ConfigError(
                f"{key}: policy.{parts[2]} = {direct!r} is set directly and wins over the table "
                f"policy.{parts[1]}, so the value given would not be used; set policy.{parts[2]}"
            )


def policy_spec(raw_policy: dict[str, Any], num_cohorts: int) -> PolicySpec:
    """Merge ``[policy.<name>]`` with the direct keys, check every key and fill in defaults."""
    if not isinstance(raw_policy, dict) or "name" not in raw_policy:
        raise ConfigError("policy.name is required")
    name = raw_policy["name"]
    if not isinstance(name, str):
        raise ConfigError(f"policy.name must be a string (got {name!r})")
    try:
        policy_class(name)  # a built-in, a registered plug-in or an import path
    except PolicyConfigError as error:
        raise ConfigError(f"policy.name: {error}") from None
    direct = {k: v for k, v in raw_policy.items() if k != "name" and not isinstance(v, dict)}
    for policy_name, table in raw_policy.items():
        if isinstance(table, dict):
            try:
                policy_class(policy_name)
            except PolicyConfigError as error:
                raise ConfigError(f"policy.{policy_name}: {error}") from None
            _check_keys(policy_name, table, f"policy.{policy_name}")
            try:  # the values too, also of a policy that does not run in this configuration
                policy_class(policy_name).Params.check_values(table, policy_name)
            except PolicyConfigError as error:
                raise ConfigError(f"policy.{policy_name}: {error}") from None
    params = {**raw_policy.get(name, {}), **direct}
    _check_keys(name, params, POLICY)
    try:
        build_policy(name, params, num_cohorts=num_cohorts)
    except PolicyConfigError as error:
        raise ConfigError(f"policy ({name}): {error}") from None
    return PolicySpec(name=name, params={**policy_parameters(name), **params})


def _check_keys(policy_name: str, params: dict[str, Any], where: str) -> None:
    known = policy_parameters(policy_name)
    for key in params:
        if key not in known:
            takes = ", ".join(known)
            raise ConfigError(
                f"{where}.{key}: policy {policy_name!r} has no such parameter"
                f"{did_you_mean(key, known)} (it takes: {takes})"
            )


def validate(raw: dict[str, Any]) -> RunConfig:
    """Turn a raw configuration into a :class:`RunConfig`, or raise one-line :class:`ConfigError`."""
    raw = copy.deepcopy(canonical_raw(raw))
    raw_policy = raw.pop(POLICY, None)
    num_cohorts = len(raw.get("scenario", {}).get("cohorts", {}) or {}) or 1
    try:
        partial = RunConfig.model_validate({**raw, POLICY: {"name": "none", "params": {}}}, strict=True)
    except ValidationError as error:
        raise ConfigError(_first_error(error)) from None
    policy = policy_spec(raw_policy, num_cohorts)
    config = partial.model_copy(update={POLICY: policy})
    _check_clipping_error(config)
    _check_server_optimizer(config)
    _check_objective(config)
    if config.training.class_weights is not None and config.scenario.task == "mean-estimation":
        raise ConfigError("training.class_weights: a mean-estimation task has no classes")
    _check_evaluation(config)
    return config


def _check_evaluation(config: RunConfig) -> None:
    """``evaluation.clients`` needs a classification task (a mean has no accuracy) and a run
    that claims an ε (a FairLens run claims none, so it has nothing to account the release in);
    ``evaluation.server = false`` needs ``evaluation.clients``."""
    evaluation = config.evaluation
    if not evaluation.clients:
        return
    if config.scenario.task == "mean-estimation":
        raise ConfigError("evaluation.clients: a mean-estimation task has no accuracy to evaluate")
    if config.training.objective == "fairlens":
        raise ConfigError(
            "evaluation.clients: training.objective = fairlens claims no epsilon to account it in"
        )
    if config.training.objective == "reconstruction":
        raise ConfigError(
            "evaluation.clients counts correct predictions, "
            "which training.objective = reconstruction has none of"
        )


def _check_clipping_error(config: RunConfig) -> None:
    """``training.clipping_error`` other than ``both`` only in a run without DP noise: the update
    it steps with uses the clients' unclipped sum, which no DP release covers."""
    if config.training.clipping_error == "both" or config.policy.name == "none":
        return
    if config.privacy.adds_noise:
        raise ConfigError(
            f"training.clipping_error: {config.training.clipping_error!r} steps with the unclipped sum, "
            "which DP does not cover; set privacy.noise_multiplier = 0 and no privacy.target_epsilon "
            "(a non-private ablation)"
        )


def _check_server_optimizer(config: RunConfig) -> None:
    """``training.server_optimizer = "adam-wosm"`` divides by the noise's standard deviation, so
    only a private run (a private policy, with DP noise) can use it."""
    if config.training.server_optimizer != "adam-wosm":
        return
    if config.policy.name == "none" or not config.privacy.adds_noise:
        raise ConfigError(
            "training.server_optimizer: adam-wosm divides by the DP noise's standard deviation; "
            "it needs a private policy and privacy.noise_multiplier > 0 or privacy.target_epsilon"
        )


def _check_objective(config: RunConfig) -> None:
    """``training.train_loss`` only for a classification task, and ``training.objective =
    "fairlens"`` only where Algorithm 4 of seed 003 is defined: a classification scenario of two
    cohorts (its groups a and b) whose clients hold one example
    each and take one step (a DP-SGD batch), clipped by ``constant`` (its fixed C_0), with the
    plain cross-entropy (no class weights). The task checks the two classes. ``"reconstruction"``
    needs a classification scenario (the labels name each example's class for the evaluation)
    and no class weights (its loss ignores the label); the task checks the model's output
    shape."""
    training = config.training
    scenario = config.scenario
    if training.train_loss and not isinstance(scenario, ClassificationSpec | FederatedDatasetSpec):
        raise ConfigError(f"training.train_loss needs a classification task (got {scenario.task!r})")
    if training.train_loss_limit is not None and training.train_loss is not True:
        raise ConfigError("training.train_loss_limit applies only with training.train_loss = true")
    if training.objective == "cross-entropy":
        return
    if training.objective == "reconstruction":
        if not isinstance(scenario, ClassificationSpec | FederatedDatasetSpec):
            raise ConfigError(
                "training.objective = reconstruction needs a classification task's examples "
                f"(got {scenario.task!r})"
            )
        if training.class_weights is not None:
            raise ConfigError(
                "training.class_weights: training.objective = reconstruction "
                "ignores the labels it would weigh"
            )
        return
    where = "training.objective = fairlens"
    if not isinstance(scenario, ClassificationSpec):
        raise ConfigError(f"{where} needs a classification scenario (got task {scenario.task!r})")
    if len(scenario.cohorts) != 2:
        raise ConfigError(
            f"{where} needs exactly two cohorts, its groups a and b (got {len(scenario.cohorts)})"
        )
    if scenario.partition != "per-example" or training.local_epochs != 1:
        raise ConfigError(
            f"{where} needs one-example, one-step clients (scenario.partition = per-example, "
            "training.local_epochs = 1): its regularisers are functions of a DP-SGD batch"
        )
    if config.policy.name != "constant":
        raise ConfigError(
            f"{where} clips at a fixed C_0: policy.name must be constant (got {config.policy.name!r})"
        )
    if training.class_weights is not None:
        raise ConfigError(
            f"{where} regularises the plain cross-entropy: training.class_weights must be unset"
        )


def load_config(scenario: str | None, config_file: Path | None, assignments: list[str]) -> RunConfig:
    """Scenario or file, then ``--set`` overrides, then validation."""
    return validate(apply_overrides(scenario_source(scenario, config_file), assignments))


def _first_error(error: ValidationError) -> str:
    """The line of a failed validation (:func:`fairclip.strategies.params.first_problem`)."""
    first, location, message = first_problem(error.errors())
    location = location or "config"
    if first["type"] == "extra_forbidden":
        message = "unknown key" + did_you_mean(first["loc"][-1], _known_keys(first["loc"][:-1]))
    elif first["type"] == "missing":
        message = "required key is missing"
    given = first.get("input")
    suffix = (
        ""
        if first["type"] in {"missing", "extra_forbidden"} or isinstance(given, dict)
        else f" (got {given!r})"
    )
    return f"{location}: {message}{suffix}"


def _known_keys(location: tuple) -> list[str]:
    """The keys the configuration allows at ``location`` (a pydantic error's ``loc`` without its
    last part; a discriminated union's tag, ``scenario.classification``, picks its member)."""
    candidates: list[type[BaseModel]] = [RunConfig]
    for part in location:
        inner = [
            m
            for model in candidates
            if part in model.model_fields
            for m in _models_in(model.model_fields[part].annotation)
        ]
        if not inner:  # the tag of a union: keep the member whose ``task`` it is
            inner = [m for m in candidates if part in _tags(m)]
        candidates = inner
    return sorted({key for model in candidates for key in model.model_fields})


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in get_args(annotation) for model in _models_in(argument)]


def _tags(model: type[BaseModel]) -> tuple[Any, ...]:
    task = model.model_fields.get("task")
    return get_args(task.annotation) if task is not None else ()


__all__ = [
    "ConfigError",
    "OldNameNote",
    "PolicySpec",
    "RunConfig",
    "canonical_assignments",
    "canonical_key",
    "canonical_keys",
    "canonical_mapping",
    "canonical_raw",
    "load_config",
    "validate",
]
