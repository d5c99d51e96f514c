"""W3, scale: 100,000 clients and about 1,000 per round (Poisson, q = 0.01), policy ``bounded``,
fairclip's in-process engine (one process, so its resident memory is the whole run's).

* ``bimodal-mean``: the scenario of that name (one point per client, the model is their mean).
* ``logistic``: the ``demo`` scenario (logistic regression, 10 features, 32 examples per
  client, batch 16, one local epoch).

Rounds per second and peak resident memory (target: under 4 GiB).
"""

from __future__ import annotations

from typing import Any

from .common import Measurement, measured

UNIT = "rounds/s"
MEMORY_LIMIT_BYTES = 4 * 2**30


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"num_clients": 10000, "sample_rate": 0.01, "rounds": {"bimodal-mean": 5, "logistic": 2}}
    return {"num_clients": 100000, "sample_rate": 0.01, "rounds": {"bimodal-mean": 50, "logistic": 10}}


def _run(quick: bool, name: str) -> Measurement:
    from fairclip.sims.config import load_config
    from fairclip.sims.local_engine import LocalExecutor
    from fairclip.sims.tasks import build_task
    from fairclip.strategies import build_policy

    from .engine import timed_rounds

    size = sizes(quick)
    scenario = "bimodal-mean" if name == "bimodal-mean" else "demo"

    def body():
        config = load_config(
            scenario,
            None,
            [
                f"federation.num_clients={size['num_clients']}",
                f"federation.sample_rate={size['sample_rate']}",
                f"training.rounds={size['rounds'][name]}",
                "strategy.name=bounded",
            ],
        )
        task = build_task(config)
        policy = build_policy(
            config.strategy.name, config.strategy.params, num_cohorts=len(task.cohort_names)
        )
        seconds, details = timed_rounds(config, task, LocalExecutor(task, policy))
        details.update(engine="local", num_clients=size["num_clients"], scenario=scenario)
        return seconds, details["rounds"], details

    return measured(UNIT, body)


def run_bimodal(quick: bool) -> Measurement:
    return _run(quick, "bimodal-mean")


def run_logistic(quick: bool) -> Measurement:
    return _run(quick, "logistic")


CONTENDERS = {"bimodal-mean": run_bimodal, "logistic": run_logistic}
