"""Issue 64, points 1 and 2: the Flower wrapper (``DifferentialPrivacy``) releases nothing that
depends on how many nodes are connected, samples only with its own Poisson step, logs no node
count, and never draws its noise from a seed unless the run says it is not private."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp.strategy import FedAvg, Strategy

from fairclip.client.protocol import CONTRIBUTION, REPORTS, UPDATE
from fairclip.flower import DifferentialPrivacy
from fairclip.policies import PolicyConfigError
from fairclip.strategies.randomness import Stream, rng

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flower-app"
DIM = 400


class _Grid:
    """What the wrapper and FedAvg ask of a grid: the connected nodes."""

    def __init__(self, nodes: int):
        self.nodes = list(range(1, nodes + 1))

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


def _arrays() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(DIM, dtype=np.float64))})


def _reply(instruction: Message, contribution: np.ndarray) -> Message:
    content = RecordDict(
        {UPDATE: ArrayRecord({CONTRIBUTION: Array(contribution), REPORTS: Array(np.zeros(0))})}
    )
    return Message(content, reply_to=instruction)


def _release(strategy: DifferentialPrivacy, nodes: int, answer=None) -> tuple[np.ndarray, dict]:
    """(θ_1, the round's metrics) after one round over ``nodes`` connected nodes;
    ``answer(instructions)`` gives the replies."""
    instructions = list(strategy.configure_train(1, _arrays(), ConfigRecord({}), _Grid(nodes)))
    replies = answer(instructions) if answer is not None else []
    aggregated, metrics = strategy.aggregate_train(1, replies)
    return aggregated["w"].numpy(), dict(metrics)


def _constant(**options) -> DifferentialPrivacy:
    settings = {"num_clients": 100, "sample_rate": 0.5, "noise_multiplier": 1.0, **options}
    return DifferentialPrivacy(FedAvg(fraction_train=1.0), "constant", {"initial_bound": 1.0}, **settings)


def test_the_release_does_not_change_between_100_and_101_connected_nodes(server_task_identity):
    """The same noise (a not-private seed, so that it repeats) and no reply: the released update
    is S / m̂ with m̂ = q·N public, bit for bit the same whether 100 or 101 nodes are connected.
    Dividing by q·n (n the connected nodes) gave n away in the release's scale."""
    with_100, _ = _release(_constant(not_private_seed=3), 100)
    with_101, _ = _release(_constant(not_private_seed=3), 101)
    assert np.std(with_100) > 0.001  # noise of σ·C / m̂ = 1 / 50 per coordinate
    np.testing.assert_array_equal(with_100, with_101)
    assert np.std(with_100) == pytest.approx(1.0 / 50, rel=0.1)


def test_the_population_is_required_in_one_clear_line():
    with pytest.raises(PolicyConfigError, match="num_clients is required: the population size N"):
        DifferentialPrivacy(FedAvg(), "constant", sample_rate=0.5, noise_multiplier=1.0)
    for bad in (0, -3, 2.5, True, "100"):
        with pytest.raises(PolicyConfigError, match="num_clients must be an integer"):
            DifferentialPrivacy(FedAvg(), "constant", num_clients=bad, sample_rate=0.5, noise_multiplier=1.0)


def test_an_inner_strategy_that_samples_is_refused():
    with pytest.raises(PolicyConfigError, match=r"samples its own nodes \(fraction_train=0.5\)"):
        DifferentialPrivacy(
            FedAvg(fraction_train=0.5), "constant", num_clients=10, sample_rate=1.0, noise_multiplier=1.0
        )


class _PicksTwo(Strategy):
    """An inner strategy that addresses a fixed-size sample of two nodes (and knows no fraction)."""

    def configure_train(self, server_round, arrays, config, grid):
        content = RecordDict({"arrays": arrays, "config": config})
        nodes = sorted(grid.get_node_ids())[:2]
        return [Message(content, dst_node_id=node, message_type=MessageType.TRAIN) for node in nodes]

    def aggregate_train(self, server_round, replies):
        return next(iter(replies)).content["arrays"], None

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None

    def summary(self):
        return None


def test_the_wrapper_alone_samples_every_connected_node(server_task_identity):
    """A fixed-size inner sample lets one client push another out (the sum then moves by 2s where
    the accountant assumes s); the wrapper sends the inner strategy's message to each connected
    node its own Poisson step keeps, whatever the inner strategy addressed."""
    strategy = DifferentialPrivacy(
        _PicksTwo(), "constant", num_clients=5, sample_rate=1.0, noise_multiplier=1.0
    )
    instructions = strategy.configure_train(1, _arrays(), ConfigRecord({}), _Grid(5))
    assert sorted(message.metadata.dst_node_id for message in instructions) == [1, 2, 3, 4, 5]
    # a Poisson sample at q = 0.5 over 200 nodes: about half, different from round to round
    strategy = _constant(num_clients=200)
    sizes = {
        len(list(strategy.configure_train(t, _arrays(), ConfigRecord({}), _Grid(200)))) for t in (1, 2, 3)
    }
    assert len(sizes) > 1 and all(60 < size < 140 for size in sizes)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("nodes", [100, 101])
def test_nothing_logged_at_info_or_below_names_the_node_count(server_task_identity, nodes):
    handler = _Lines()
    FLOWER_LOGGER.addHandler(handler)
    try:
        strategy = _constant(num_clients=5000, sample_rate=1.0)  # N is public; n is not
        strategy.summary()
        _release(
            strategy, nodes, answer=lambda instructions: [_reply(m, np.zeros(DIM)) for m in instructions]
        )
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    lines = [record.getMessage() for record in handler.records if record.levelno <= logging.INFO]
    assert lines, "the wrapper's own summary is logged"
    assert not [line for line in lines if str(nodes) in line], lines


def test_without_a_not_private_seed_no_seed_gives_a_contribution_back(server_task_identity):
    """One client contributes c; whoever regenerates numpy's seeded noise for any seed (the
    example app passed seed 7) must not recover c from the release."""
    contribution = np.zeros(DIM)
    contribution[:4] = [0.5, -0.5, 0.5, -0.5]  # norm 1 = C

    def answer(instructions):
        return [_reply(instructions[0], contribution)] + [_reply(m, np.zeros(DIM)) for m in instructions[1:]]

    released, metrics = _release(_constant(num_clients=4, sample_rate=1.0), 4, answer)
    assert metrics["epsilon"] > 0 and "not_private" not in metrics
    noise_std = 1.0  # σ·C
    for seed in [*range(50), 7]:
        guess = released * 4 - rng(seed, Stream.NOISE, 1).normal(0.0, 1.0, DIM) * noise_std
        assert np.linalg.norm(guess - contribution) > 1.0, f"seed {seed} gives the contribution back"
    # the not-private seed does give it back, and the release says it is not private
    seeded = _constant(num_clients=4, sample_rate=1.0, not_private_seed=7)
    instructions = list(seeded.configure_train(1, _arrays(), ConfigRecord({}), _Grid(4)))
    aggregated, metrics = seeded.aggregate_train(1, answer(instructions))
    guess = aggregated["w"].numpy() * 4 - rng(7, Stream.NOISE, 1).normal(0.0, 1.0, DIM) * noise_std
    np.testing.assert_allclose(guess, contribution, atol=1e-12)
    assert metrics["not_private"] == 1.0 and "epsilon" not in metrics and metrics["mechanism_epsilon"] > 0


def test_the_example_and_the_docker_files_never_use_a_seed():
    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert not [key for key in config if "seed" in key or "not-private" in key], config
    server = (EXAMPLE / "fairclip_example" / "server_app.py").read_text()
    assert "seed" not in server and "not_private" not in server
    for path in (ROOT / "docker").iterdir():
        text = path.read_text()
        assert "not-private" not in text and "seed" not in text, path


def test_flowers_loop_logs_no_wall_time(server_task_identity):
    """Flower's Strategy.start logs how long the run took, which depends on who took part and on
    their data; neither the wrapper nor fairclip's own strategy lets that line out."""
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    class Silent(_Grid):
        def send_and_receive(self, messages, timeout=None):
            return []

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    FLOWER_LOGGER.addHandler(handler)
    try:
        _constant(not_private_seed=0).start(Silent(20), _arrays(), num_rounds=2, timeout=1)
    finally:
        FLOWER_LOGGER.removeHandler(handler)
    lines = [record.getMessage() for record in records]
    assert any("Final results" in line for line in lines)  # Flower's loop ran and logged
    assert not any("finished in" in line for line in lines)
