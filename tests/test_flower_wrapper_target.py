"""Issue 67: the Flower wrapper takes ``target_epsilon`` with ``num_rounds``, as Opacus'
``make_private_with_epsilon`` does, and spends exactly that budget: the calibrated multipliers
are the ones fairclip's own runs use, the reported ε after T rounds is at most the target, and a
round past T is refused rather than released beyond the budget."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg

from fairclip.flower import DifferentialPrivacy
from fairclip.policies import PolicyConfigError
from fairclip.strategies.accounting import calibrate

DIM = 50


class _Grid:
    def __init__(self, nodes: int):
        self.nodes = list(range(1, nodes + 1))

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


def _arrays() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(DIM, dtype=np.float64))})


def _wrapper(policy="bounded", params=None, **options) -> DifferentialPrivacy:
    settings = {"num_clients": 20, "sample_rate": 0.25, "not_private_seed": 0, **options}
    params = {"lower_bound": 0.05} if params is None and policy == "bounded" else params
    return DifferentialPrivacy(FedAvg(fraction_train=1.0), policy, params, **settings)


@pytest.mark.parametrize(("policy", "reports"), [("bounded", True), ("constant", False)])
def test_target_epsilon_calibrates_the_noise_and_spends_the_budget_in_num_rounds(
    server_task_identity, policy, reports
):
    strategy = _wrapper(policy, target_epsilon=3.0, num_rounds=4, accountant="rdp")
    expected = calibrate(3.0, 0.25, 4, 1e-5, "rdp", releases_reports=reports)
    for t in range(1, 5):
        strategy.configure_train(t, _arrays(), ConfigRecord({}), _Grid(20))
        _, metrics = strategy.aggregate_train(t, [])
    assert strategy.noise == expected and (expected.report > 0) == reports
    assert metrics["mechanism_epsilon"] <= 3.0 and metrics["mechanism_epsilon"] == pytest.approx(
        3.0, rel=0.02
    )
    with pytest.raises(PolicyConfigError, match=r"privacy budget .* was spent in num_rounds = 4"):
        strategy.configure_train(5, _arrays(), ConfigRecord({}), _Grid(20))


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({}, "either noise_multiplier or target_epsilon"),
        ({"noise_multiplier": 1.0, "target_epsilon": 2.0, "num_rounds": 3}, "not both or neither"),
        ({"target_epsilon": 2.0}, "needs num_rounds"),
        ({"target_epsilon": 2.0, "num_rounds": 0}, "needs num_rounds"),
        ({"noise_multiplier": 1.0, "num_rounds": 3}, "num_rounds goes with target_epsilon"),
        ({"target_epsilon": 2.0, "num_rounds": 3, "count_noise_multiplier": 5.0}, "calibrated"),
        ({"target_epsilon": 1e-9, "num_rounds": 3}, "cannot be reached"),
    ],
)
def test_a_wrong_way_to_set_the_noise_is_one_clear_error_before_any_round(options, problem):
    with pytest.raises(PolicyConfigError, match=problem):
        _wrapper(**options)


def test_a_strategy_started_again_cannot_spend_the_budget_twice(server_task_identity):
    """Flower numbers the rounds of every start from 1; the budget counts the rounds released."""
    strategy = _wrapper("constant", target_epsilon=3.0, num_rounds=2, accountant="rdp")
    for t in (1, 2):
        strategy.configure_train(t, _arrays(), ConfigRecord({}), _Grid(20))
        strategy.aggregate_train(t, [])
    with pytest.raises(PolicyConfigError, match=r"spent in num_rounds = 2 rounds \(2 released"):
        strategy.configure_train(1, _arrays(), ConfigRecord({}), _Grid(20))
    assert strategy.accountant.rounds == 2


def test_a_wrapper_that_releases_without_noise_says_it_is_not_private(server_task_identity):
    strategy = DifferentialPrivacy(
        FedAvg(fraction_train=1.0), "constant", None, num_clients=20, sample_rate=0.25, noise_multiplier=0.0
    )
    strategy.configure_train(1, _arrays(), ConfigRecord({}), _Grid(20))
    _, metrics = strategy.aggregate_train(1, [])
    assert metrics["not_private"] == 1.0
    assert "epsilon" not in metrics
    # a policy that does not clip at all is refused: the mod would refuse it on every node
    with pytest.raises(PolicyConfigError, match="does not clip"):
        DifferentialPrivacy(
            FedAvg(fraction_train=1.0), "none", None, num_clients=20, sample_rate=0.25, noise_multiplier=1.0
        )
