"""W3, scale: 100,000 clients and about 1,000 per round (Poisson, q = 0.01), policy ``bounded``,
fairclip's in-process executor (one process, so its resident memory is the whole run's).

* ``bimodal-mean``: the scenario of that name (one point per client, the model is their mean).
* ``logistic``: the ``demo`` scenario (logistic regression, 10 features, 32 examples per
  client, batch 16, one local epoch).
* ``logistic-1e9`` and ``logistic-1e6``: the ``demo`` scenario with 10⁹ and with 10⁶ clients,
  10⁴ of them per round (q = 10⁴/N): the population is sampled without touching every client
  and each sampled client's examples are generated from its id
  (:mod:`fairclip.scenarios.data.generated_clients`), so a round costs what its clients cost.

Rounds per second and peak resident memory (targets: under 4 GiB; the billion-client run's
rounds/s within 1.5× of the million-client run's).
"""

from __future__ import annotations

from typing import Any

from .common import Measurement, measured

UNIT = "rounds/s"
MEMORY_LIMIT_BYTES = 4 * 2**30


POPULATIONS = {"logistic-1e9": 10**9, "logistic-1e6": 10**6}
"""The population of each large-population contender."""


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "num_clients": 10000,
            "sample_rate": 0.01,
            "rounds": {"bimodal-mean": 5, "logistic": 2, "logistic-1e9": 2, "logistic-1e6": 2},
            "sampled": 100,
        }
    return {
        "num_clients": 100000,
        "sample_rate": 0.01,
        "rounds": {"bimodal-mean": 50, "logistic": 10, "logistic-1e9": 4, "logistic-1e6": 4},
        "sampled": 10000,
    }


def _run(quick: bool, name: str) -> Measurement:
    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.scenarios.config import load_config
    from fairclip.scenarios.tasks import build_task
    from fairclip.sims.executors.local import LocalExecutor
    from fairclip.strategies import build_policy

    from .timing import timed_rounds

    size = sizes(quick)
    scenario = "bimodal-mean" if name == "bimodal-mean" else "demo"
    num_clients = POPULATIONS.get(name, size["num_clients"])
    sample_rate = size["sampled"] / num_clients if name in POPULATIONS else size["sample_rate"]

    def body():
        config = load_config(
            scenario,
            None,
            [
                f"federation.num_clients={num_clients}",
                f"federation.sample_rate={sample_rate!r}",
                f"training.rounds={size['rounds'][name]}",
                "policy.name=bounded",
            ],
        )
        task = build_task(config)
        policy = build_policy(config.policy.name, config.policy.params, num_cohorts=len(task.cohort_names))
        seconds, details = timed_rounds(config, task, LocalExecutor(task, policy))
        details.update(executor="local", num_clients=num_clients, sample_rate=sample_rate, scenario=scenario)
        return seconds, details["rounds"], details

    return measured(UNIT, body)


def run_bimodal(quick: bool) -> Measurement:
    return _run(quick, "bimodal-mean")


def run_logistic(quick: bool) -> Measurement:
    return _run(quick, "logistic")


def run_logistic_billion(quick: bool) -> Measurement:
    return _run(quick, "logistic-1e9")


def run_logistic_million(quick: bool) -> Measurement:
    return _run(quick, "logistic-1e6")


CONTENDERS = {
    "bimodal-mean": run_bimodal,
    "logistic": run_logistic,
    "logistic-1e9": run_logistic_billion,
    "logistic-1e6": run_logistic_million,
}
