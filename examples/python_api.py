"""fairclip from Python, end to end, on a model, data and clipping policy of your own.

Run it with ``python examples/python_api.py``. It builds a federated dataset of three cohorts from
numpy arrays, a small MLP, and a policy of its own -- hard clipping with a bound that decays on a
public schedule -- checks the policy with the property test every policy must pass, and compares
it with fairclip's ``constant`` and ``bounded`` at one target ε.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import fairclip
from fairclip.policies import Fraction, Policy, PolicyParams, PositiveFinite, RowScales, check_policy

COHORTS = ("north", "south", "east")


def federated_data(clients: int = 90, examples: int = 16, seed: int = 0) -> fairclip.FederatedDataset:
    """Cohort k's label follows feature k; east, every third client, has the noisiest labels."""
    rng = np.random.default_rng(seed)
    cohort_of_client = np.array([COHORTS[c % 3] for c in range(clients)])

    def sample(cohorts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(len(cohorts), 4)).astype(np.float32)
        signal = np.array([COHORTS.index(c) for c in cohorts])
        noise = np.where(cohorts == "east", 1.0, 0.2) * rng.normal(size=len(cohorts))
        return x, (x[np.arange(len(cohorts)), signal] + noise > 0).astype(np.int64)

    owner = np.repeat(np.arange(clients), examples)
    x, y = sample(cohort_of_client[owner])
    test_cohorts = np.repeat(np.array(COHORTS), 300)
    test_x, test_y = sample(test_cohorts)
    return fairclip.FederatedDataset.from_arrays(
        x, y, clients=owner, cohorts=cohort_of_client, test_x=test_x, test_y=test_y, test_cohorts=test_cohorts
    )


def small_mlp(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(int(np.prod(input_shape)), 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, num_classes),
    )


@dataclass(frozen=True)
class Round:
    number: int


class DecayingClipping(Policy):
    """Hard clipping at C_t = max(C_min, C_0 · decay^t): the bound follows a public schedule, so
    no report is released and nothing but the update sum costs privacy."""

    name = "decaying"

    class Params(PolicyParams):
        initial_bound: PositiveFinite = 1.0
        decay: Fraction = 0.9
        floor: PositiveFinite = 0.05

    def initial_state(self, dim: int) -> Round:
        return Round(0)

    def broadcast(self, state: Round) -> dict[str, float]:
        return {"bound": max(self.floor, self.initial_bound * self.decay**state.number)}

    def sensitivity(self, state: Round) -> float:
        return self.broadcast(state)["bound"]

    def contribution_bounds(self, params, cohorts):
        return np.full(cohorts.shape[0], params["bound"])

    def scales(self, norms, cohorts, params) -> RowScales:
        # Δ̄_i = Δ_i · min(1, C / ||Δ_i||): a hard clip, decided from the norms alone, so that
        # one-example clients are clipped without forming their gradients
        n, bound = norms.shape[0], params["bound"]
        return RowScales(np.ones(n), np.zeros((n, 0)), norms > bound, clip=np.full(n, bound))

    def next_state(self, state, estimate, noisy_reports, expected_clients) -> Round:
        return Round(state.number + 1)


def main() -> fairclip.Comparison:
    check_policy(DecayingClipping, {"initial_bound": 2.0}, max_examples=30)  # the DP properties hold
    scenario = fairclip.Scenario(
        "three-cohorts",
        dataset=federated_data(),
        model=small_mlp,
        sample_rate=0.3,
        rounds=15,
        settings={"training.client_lr": 0.5, "policy.bounded.lower_bound": 0.1},
    )
    comparison = fairclip.compare(
        scenario, policies=["constant", "bounded", DecayingClipping], epsilons=[4.0]
    )
    table = comparison.table.pivot_table(index="policy", columns="cohort", values="accuracy")
    print(table.round(3))
    worst = table.min(axis=1).drop("none")
    print(f"best for the worst-off cohort at ε = 4: {worst.idxmax()} ({worst.max():.3f})")
    return comparison


if __name__ == "__main__":
    main()
