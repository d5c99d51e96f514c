"""Issue 69, section 2: per-cohort evaluation on the clients' held-out data, under DP
(:mod:`fairclip.strategies.evaluation`, ``[evaluation]``): each admitted contribution's norm is
within Δ_E, the release's noise has std σ_E·Δ_E, every release is accounted in the run's one ε
(Opacus' ε of the mixed history), the plan never charges less than what runs, and a simulation
publishes the noisy per-cohort metrics (the exact ones only in its internal columns)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant

from fairclip.scenarios.config import load_config
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import build_task
from fairclip.server.outputs import split_rows
from fairclip.server.privacy_plan import EPSILON_ROWS, PrivacyPlan
from fairclip.server.run import Run
from fairclip.server.secure_noise import noise_source
from fairclip.sims.executors.local import LocalExecutor
from fairclip.sims.executors.loop import simulate
from fairclip.strategies import evaluation as mechanism
from fairclip.strategies.accounting import evaluation_steps
from fairclip.strategies.aggregation import shard_ids
from fairclip.strategies.randomness import Stream

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=300, deadline=None)
@given(
    num_cohorts=st.integers(1, 4),
    max_examples=st.integers(1, 200),
    loss_bound=st.floats(1e-3, 100.0),
    data=st.data(),
)
def test_every_admitted_vector_is_within_the_sensitivity(num_cohorts, max_examples, loss_bound, data):
    """Whatever a client sends, what reaches the sum has norm <= Δ_E = m·sqrt(2 + L²)."""
    bound = mechanism.sensitivity(max_examples, loss_bound)
    assert bound >= max_examples * math.sqrt(2 + loss_bound**2)
    anything = np.array(data.draw(st.lists(floats, min_size=3 * num_cohorts, max_size=3 * num_cohorts)))
    kept = mechanism.admitted(anything, num_cohorts, max_examples, loss_bound)
    assert np.linalg.norm(kept) <= bound
    # the largest honest contribution passes the check and is within the bound too
    cohort = data.draw(st.integers(0, num_cohorts - 1))
    size = data.draw(st.integers(0, 3 * max_examples))
    correct = np.array(data.draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype=bool)
    losses = np.array(data.draw(st.lists(floats, min_size=size, max_size=size)))
    vector = mechanism.contribution(cohort, num_cohorts, correct, losses, max_examples, loss_bound)
    assert mechanism.problem(vector, num_cohorts, max_examples, loss_bound) is None
    assert np.linalg.norm(vector) <= bound
    worst = mechanism.contribution(
        cohort,
        num_cohorts,
        np.ones(max_examples, bool),
        np.full(max_examples, np.inf),
        max_examples,
        loss_bound,
    )
    assert np.linalg.norm(worst) <= bound


@pytest.mark.parametrize(
    ("vector", "why"),
    [
        ([1, 2, 3, 1, 1, 1], "2 cohorts"),
        ([3, 2, 0, 0, 0, 0], "correct"),
        ([0, 65, 0, 0, 0, 0], "correct"),
        ([1, 2, 10.5, 0, 0, 0], "loss sum"),
        ([-1, 2, 1, 0, 0, 0], "correct"),
        ([0, 0, 0, np.nan, 0, 0], "not finite"),
        ([0, 0, 0, 0], "shape"),
    ],
)
def test_a_vector_outside_the_contributions_is_named_and_dropped(vector, why):
    assert why in mechanism.problem(np.array(vector, float), 2, 64, 5.0)
    assert not mechanism.admitted(np.array(vector, float), 2, 64, 5.0).any()


def test_the_released_noise_has_std_sigma_times_the_sensitivity():
    sigma, m, bound = 2.0, 16, 3.0
    draws = np.stack(
        [
            mechanism.release(np.zeros(12), np.random.default_rng([7, i]), sigma, m, bound)[0]
            for i in range(4000)
        ]
    )
    expected = sigma * m * math.sqrt(2 + bound**2)
    _, std = mechanism.release(np.zeros(12), np.random.default_rng(0), sigma, m, bound)
    assert std == pytest.approx(expected, rel=1e-12)
    # 48,000 draws: the sample std is within 2 % of σ_E·Δ_E (its own std is ~0.3 %)
    assert draws.std() == pytest.approx(expected, rel=0.02)
    assert abs(draws.mean()) < 0.03 * expected


def test_metrics_are_post_processing_of_the_noisy_sums():
    per_cohort = mechanism.cohort_metrics(
        np.array([9.0, 10.0, 4.0, 6.0, 5.0, -1.0, 3.0, 0.0, 1.0]), "abc", 5.0
    )
    assert per_cohort["a"] == {"client_accuracy": 0.9, "client_loss": 0.4, "client_examples": 10.0}
    assert per_cohort["b"]["client_accuracy"] == 1.0 and per_cohort["b"]["client_loss"] == 0.0  # clipped
    assert math.isnan(per_cohort["c"]["client_accuracy"]) and math.isnan(per_cohort["c"]["client_loss"])
    assert mechanism.accuracy_gap(per_cohort) == pytest.approx(0.1)


def test_evaluation_noise_and_sample_are_streams_of_their_own():
    training = noise_source(None, 3, 2).normal(size=5)
    evaluation = noise_source(None, 3, 2, Stream.EVALUATION_NOISE).normal(size=5)
    assert not np.allclose(training, evaluation)
    server = Run(_config(), build_task(_config()))
    assert not np.array_equal(server.sample(2), server.evaluation_sample(2))


def _config(*overrides: str):
    return load_config(
        "demo",
        None,
        [
            "training.rounds=4",
            "privacy.accountant=rdp",
            "evaluation.clients=true",
            "federation.num_clients=100",
            "seed=5",
            *overrides,
        ],
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["evaluation.server=false"], "evaluation: clients and server are both false"),
        (["evaluation.max_examples=0"], "evaluation.max_examples"),
        (["evaluation.noise_multiplier=0"], "evaluation.noise_multiplier"),
        (["evaluation.holdout=1.0"], "evaluation.holdout"),
    ],
)
def test_bad_evaluation_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("demo", None, overrides)


def test_a_mean_has_no_accuracy_for_clients_to_evaluate():
    with pytest.raises(ConfigError, match=r"evaluation\.clients: a mean-estimation task"):
        load_config("bimodal-mean", None, ["evaluation.clients=true"])


def test_a_holdout_that_holds_out_nothing_is_refused_before_any_round():
    config = _config("evaluation.holdout=0.01")  # 32 examples a client: floor(0.32) = 0
    with pytest.raises(ConfigError, match=r"evaluation\.holdout = 0\.01 holds out no example"):
        build_task(config)


def test_epsilon_counts_every_evaluation_release_as_opacus_composes_them():
    config = _config("training.eval_every=2", "training.rounds=5")
    result = simulate(config, build_task(config))
    privacy = result.summary["privacy"]
    assert privacy["rounds"] == 5 and privacy["evaluation_releases"] == 3  # after rounds 2, 4 and 5
    # Opacus' own RDP accountant, fed the same releases one by one
    opacus = RDPAccountant()
    sigma_eff, q = privacy["effective_noise_multiplier"], config.federation.sample_rate
    for round_number in range(1, 6):
        opacus.step(noise_multiplier=sigma_eff, sample_rate=q)
        if round_number in (2, 4, 5):
            opacus.step(noise_multiplier=config.evaluation.noise_multiplier, sample_rate=q)
    assert result.summary["epsilon"] == pytest.approx(opacus.get_epsilon(config.privacy.delta), rel=1e-9)
    rows = pd.DataFrame(result.rows).set_index("round")
    assert rows.loc[5, "epsilon"] == result.summary["epsilon"]
    without = simulate(
        _config("training.eval_every=2", "training.rounds=5", "evaluation.clients=false"), build_task(config)
    )
    assert result.summary["epsilon"] > without.summary["epsilon"]
    # the plan charges at least what ran (its bound of the evaluations)
    server = Run(config, build_task(config))
    assert server.plan.evaluations_after(5) == evaluation_steps(5, 2, EPSILON_ROWS) == 3
    assert server.plan.epsilon_after(5) >= result.summary["epsilon"] * (1 - 1e-12)


@pytest.mark.parametrize("eval_every", [1, 2, 3, 7])
def test_the_plan_charges_at_least_the_evaluations_a_run_releases(eval_every):
    """For every T, a run whose last round is T reports ⌈T / k⌉ times (k from the schedule, which
    grows for long runs); the plan's count is the largest of those up to T: never less than any
    run stopping by T releases, exact where the schedule has not grown, and non-decreasing."""
    most = 0
    for rounds in range(1, 2 * EPSILON_ROWS * eval_every + 150):
        every = PrivacyPlan.report_every(rounds, eval_every)
        released = len(range(every, rounds + 1, every)) + (rounds % every != 0)
        most = max(most, released)
        assert evaluation_steps(rounds, eval_every, EPSILON_ROWS) == most, rounds
        if rounds <= EPSILON_ROWS * eval_every:
            assert most == released == -(-rounds // eval_every)


@pytest.mark.parametrize(
    "keys", [["privacy.target_epsilon=3.0"], ["privacy.epsilon_budget=3.0", "privacy.noise_multiplier=1.5"]]
)
def test_a_target_or_budget_is_kept_with_the_evaluations(keys):
    config = _config("training.rounds=6", *keys)
    result = simulate(config, build_task(config))
    assert result.summary["privacy"]["evaluation_releases"] >= 1
    assert result.summary["epsilon"] <= 3.0
    plain = Run(_config("training.rounds=6", *keys, "evaluation.clients=false"), build_task(config))
    server = Run(config, build_task(config))
    if keys[0].startswith("privacy.target"):  # more noise for the same target
        assert server.plan.noise.update > plain.plan.noise.update
    else:  # no more rounds within the same budget
        assert server.plan.rounds_allowed <= plain.plan.rounds_allowed
    assert server.plan.epsilon_after(server.rounds_to_run) <= 3.0


def test_a_simulation_publishes_noisy_client_metrics_without_the_server_test_set(cli, tmp_path):
    sets = ["training.rounds=3", "evaluation.clients=true", "evaluation.server=false", "seed=2"]
    # a tiny σ_E: the noisy estimate is the exact one (RDP: PRV's grid for so small a σ would not fit)
    sets += ["evaluation.noise_multiplier=0.001", "privacy.accountant=rdp"]
    status, _, err = cli(
        "run", "--scenario", "demo", *[a for s in sets for a in ("--set", s)], "--out", str(tmp_path)
    )
    assert status == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    rounds = pd.read_csv(tmp_path / "rounds.csv").set_index("round")
    assert summary["evaluation"] == "clients (DP)"
    assert set(summary["cohorts"]) == {"majority", "minority"}
    assert "accuracy" not in summary["overall"]  # the server's test set was not used
    last = rounds.loc[3]
    for cohort, metrics in summary["cohorts"].items():
        assert set(metrics) == {"client_accuracy", "client_loss", "client_examples"}
        assert metrics["client_accuracy"] == pytest.approx(last[f"{cohort}/client_accuracy"])
        assert metrics["client_accuracy"] == pytest.approx(last[f"{cohort}/client_accuracy_exact"], abs=0.01)
        assert metrics["client_examples"] == pytest.approx(last[f"{cohort}/client_examples_exact"], abs=1.0)
        assert "client_accuracy_exact" not in metrics
    assert not any("exact" in key for key in json.dumps(summary["client_evaluation"]).split('"'))
    noise_std = summary["client_evaluation"]["noise_std"]
    assert noise_std == pytest.approx(0.001 * 64 * math.sqrt(2 + 25), rel=1e-12)
    assert last["client_eval_noise_std"] == noise_std

    config = load_config("demo", None, sets)
    result = simulate(config, build_task(config))
    public, internal = split_rows(result.rows, result.public_columns)
    published = {key for row in public for key in row}
    assert {
        "majority/client_accuracy",
        "minority/client_loss",
        "client_accuracy_gap",
        "client_eval_noise_std",
    } <= published
    assert not any(key.endswith("_exact") for key in published)
    assert "client_eval_sampled" not in published
    assert any("majority/client_accuracy_exact" in row for row in internal)


def test_a_run_without_client_evaluation_is_unchanged_by_the_section():
    """The default (clients off) holds nothing out, samples and noises nothing more."""
    base = load_config("demo", None, ["training.rounds=3", "seed=4"])
    explicit = load_config(
        "demo", None, ["training.rounds=3", "seed=4", "evaluation.server=true", "evaluation.clients=false"]
    )
    first = simulate(base, build_task(base))
    second = simulate(explicit, build_task(explicit))
    np.testing.assert_array_equal(first.model, second.model)
    assert "client_evaluation" not in first.summary and "evaluation" not in first.summary
    assert first.summary["epsilon"] == second.summary["epsilon"]
    assert "evaluation_releases" not in first.summary["privacy"]


def test_the_local_executor_sums_evaluations_in_fixed_blocks():
    config = _config()
    task = build_task(config)
    execute = LocalExecutor(task, Run(config, task).policy, workers=2)
    model = task.initial_model()
    ids = np.arange(0, 100, 3)
    total = execute.evaluate_clients(model, ids, 64, 5.0)
    blocks = shard_ids(ids, len(task.client_cohorts))
    assert len(blocks) > 1
    in_blocks = sum(task.evaluation_contributions(model, block, 64, 5.0).sum(axis=0) for block in blocks)
    np.testing.assert_allclose(total, in_blocks, rtol=1e-12)  # one task call per block, in block order
    # one call for all: the same to float32 rounding (a CPU's kernels may depend on the batch size)
    np.testing.assert_allclose(
        total, task.evaluation_contributions(model, ids, 64, 5.0).sum(axis=0), rtol=1e-6
    )
    assert total[1] + total[4] == sum(len(task.holdout_indices[i][:64]) for i in ids)


def test_local_and_ray_give_the_same_client_evaluation(ray_session):
    """Ray actors hold only their blocks' clients (with their held-out examples) and the block
    sums are added in block order: the same numbers, bit for bit, as the in-process executor."""
    from fairclip.sims.executors.ray import RayExecutor

    config = _config("training.rounds=3", "evaluation.server=false", "evaluation.noise_multiplier=0.01")
    local = simulate(config, build_task(config), LocalExecutor)
    executor = RayExecutor.start(config, None, num_actors=3)
    try:
        remote = simulate(config, build_task(config), lambda _task, _policy: executor)
    finally:
        executor.stop()
    local_rounds, remote_rounds = pd.DataFrame(local.rows), pd.DataFrame(remote.rows)
    assert local_rounds["minority/client_accuracy"].notna().all()
    pd.testing.assert_frame_equal(local_rounds, remote_rounds, check_exact=True)
    assert local.summary["cohorts"] == remote.summary["cohorts"]
    assert local.summary["client_evaluation"] == remote.summary["client_evaluation"]


class _StopAfter:
    """An observer that interrupts the run (as Ctrl-C would) after round ``round_number``."""

    def __init__(self, round_number: int):
        self.round_number = round_number

    def on_round(self, row, run) -> None:
        if row["round"] == self.round_number:
            raise KeyboardInterrupt

    def on_finish(self, run) -> None:
        return None


def test_a_run_stopped_continues_with_its_evaluations_accounted(tmp_path):
    from fairclip.server.checkpoint import CHECKPOINT_FILE, Checkpointing

    config = _config("training.rounds=4", "training.eval_every=2")
    straight = simulate(config, build_task(config))
    path = tmp_path / CHECKPOINT_FILE
    with pytest.raises(KeyboardInterrupt):
        simulate(config, build_task(config), observers=[_StopAfter(2)], checkpoint=Checkpointing(path))
    resumed = simulate(config, build_task(config), checkpoint=Checkpointing(path))
    assert pd.DataFrame(resumed.rows).equals(pd.DataFrame(straight.rows))
    assert resumed.summary["privacy"] == straight.summary["privacy"]
    assert resumed.summary["privacy"]["evaluation_releases"] == 2
    assert resumed.summary["client_evaluation"] == straight.summary["client_evaluation"]


def test_the_flower_apps_take_client_evaluation():
    """The Flower path runs it (tests/test_secure_aggregation.py in process, and
    tests/test_secure_deployment.py on real SuperNodes)."""
    from fairclip.scenarios.flower_config import flower_run

    run = flower_run({"scenario": "flower-local", "set": "evaluation.clients=true;evaluation.server=false"})
    assert run.config.evaluation.clients and not run.config.evaluation.server


def test_the_evaluation_schedule_is_part_of_a_run_whose_clients_evaluate():
    """A stored run with another ``training.eval_every`` released another number of noisy
    evaluations: not the same run (without client evaluation, the schedule is ignored)."""
    from fairclip.atomic import json_normalised
    from fairclip.scenarios.stored import same_configuration

    stored = json_normalised(_config("training.eval_every=2").as_dict())
    assert same_configuration(stored, _config("training.eval_every=2"))
    assert not same_configuration(stored, _config("training.eval_every=3"))
    plain = json_normalised(_config("training.eval_every=2", "evaluation.clients=false").as_dict())
    assert same_configuration(plain, _config("training.eval_every=3", "evaluation.clients=false"))


def test_prv_composes_the_evaluations_as_opacus_does():
    """PRV: the accountant adds the steps of each mechanism (composition commutes) before Opacus
    discretises them; ε is Opacus' of the interleaved history, to its discretisation error."""
    from opacus.accountants import PRVAccountant

    config = _config("training.rounds=3", "privacy.accountant=prv")
    result = simulate(config, build_task(config))
    privacy = result.summary["privacy"]
    opacus = PRVAccountant()
    q = config.federation.sample_rate
    for _ in range(3):
        opacus.step(noise_multiplier=privacy["effective_noise_multiplier"], sample_rate=q)
        opacus.step(noise_multiplier=config.evaluation.noise_multiplier, sample_rate=q)
    assert result.summary["epsilon"] == pytest.approx(opacus.get_epsilon(config.privacy.delta), rel=0.02)
    assert Run(config, build_task(config)).plan.epsilon_after(3) >= result.summary["epsilon"]


def test_flowers_run_config_can_set_every_evaluation_key():
    """Flower refuses a --run-config key the app does not declare ("Invalid run configuration"):
    every key of [evaluation] is declared in pyproject.toml's [tool.flwr.app.config]."""
    import tomllib
    from pathlib import Path

    from fairclip.scenarios.config import EvaluationSpec

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    declared = pyproject["tool"]["flwr"]["app"]["config"]["evaluation"]
    assert set(declared) == set(EvaluationSpec.model_fields)


def test_a_node_on_its_own_data_file_holds_out_its_own_examples():
    """A deployed node's data file replaces its partition: ⌊holdout·n⌋ of the file's examples are
    held out (seeded, the same on every build), the rest trained on, and its evaluation vector
    counts only held-out examples of the file, in its cohort's slot."""
    config = _config()
    rng = np.random.default_rng(3)
    features = rng.normal(size=(30, 10)).astype(np.float32)
    labels = rng.integers(0, 2, 30)
    tasks = [build_task(config), build_task(config)]
    for task in tasks:
        task.use_local_examples(7, features, labels)
    first, second = tasks
    held, trained = np.asarray(first.holdout_indices[7]), np.asarray(first.client_indices[7])
    assert len(held) == int(config.evaluation.holdout * 30) == 6 and len(trained) == 24
    assert set(held).isdisjoint(trained)
    start = first.train_x.shape[0] - 30  # the file's rows were appended
    assert set(held) | set(trained) == set(range(start, start + 30))
    np.testing.assert_array_equal(held, second.holdout_indices[7])  # seeded
    model = first.initial_model()
    (vector,) = first.evaluation_contributions(model, np.array([7]), 64, 5.0)
    cohort = int(first.client_cohorts[7])
    assert vector[3 * cohort + 1] == 6 and np.count_nonzero(vector) <= 3


def test_a_training_loss_beside_the_clients_evaluation_stays_out_of_its_release():
    """With the server's test set off, the summary's cohorts are the clients' noisy evaluation,
    and a training loss (not covered by DP) joins them there; the release itself
    (``client_evaluation``) keeps only its noisy values."""
    config = _config("training.rounds=2", "evaluation.server=false", "training.train_loss=true")
    summary = simulate(config, build_task(config)).summary
    for name, released in summary["client_evaluation"]["cohorts"].items():
        assert "train_loss" not in released
        assert "train_loss" in summary["cohorts"][name]
        np.testing.assert_equal(summary["cohorts"][name]["client_accuracy"], released["client_accuracy"])
    assert summary["not_covered_by_dp"][1:] == ["cohorts.*.train_loss (the clients' training examples)"]
    assert summary["not_covered_by_dp"][0].startswith("rounds.csv columns")


def test_a_run_stopped_while_its_clients_evaluate_continues_to_the_same_result(tmp_path):
    """Ctrl-C or SIGTERM lands while the clients evaluate round 2's model (after the round's
    release, before the evaluation's): the checkpoint written then may not hold round 2 without
    its evaluation, or the resumed run goes on to round 3 and that evaluation is never made."""
    from fairclip.server.checkpoint import CHECKPOINT_FILE, Checkpointing, rounds_done

    config = _config("training.rounds=4", "training.eval_every=2")
    straight = simulate(config, build_task(config))

    class InterruptedEvaluation(LocalExecutor):
        def evaluate_clients(self, model, client_ids, max_examples, loss_bound):
            raise KeyboardInterrupt

    path = tmp_path / CHECKPOINT_FILE
    every_round = Checkpointing(path, every_seconds=1e-9)
    with pytest.raises(KeyboardInterrupt):
        simulate(config, build_task(config), InterruptedEvaluation, checkpoint=every_round)
    assert rounds_done(path, config) == 1, "the checkpoint of round 1 stands"
    resumed = simulate(config, build_task(config), checkpoint=Checkpointing(path))
    assert pd.DataFrame(resumed.rows).equals(pd.DataFrame(straight.rows))
    assert resumed.summary["privacy"] == straight.summary["privacy"]
    assert resumed.summary["client_evaluation"] == straight.summary["client_evaluation"]
