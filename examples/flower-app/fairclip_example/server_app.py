"""The app's ServerApp: FedAvg with central evaluation. fairclip adds one thing, the
``DifferentialPrivacy`` wrapper around FedAvg (bounded adaptive clipping, user-level DP)."""

from __future__ import annotations

from logging import ERROR
from pathlib import Path

import pandas as pd
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.app.exception import AppExitException
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.exit import ExitCode

from fairclip.flower import DifferentialPrivacy
from fairclip_example.task import accuracy, make_model, test_data

app = ServerApp()


class RelativeOut(AppExitException):
    """``out`` is relative: the ServerApp runs in the SuperLink's working folder, not this app's,
    so a relative folder would land (and overwrite) wherever that SuperLink was started."""

    exit_code = ExitCode.SERVERAPP_STRATEGY_PRECONDITION_UNMET


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    out = str(config["out"])
    if out and not Path(out).is_absolute():  # refused before any round, in one line
        message = f"out={out!r} is relative to the SuperLink's working folder; give an absolute one"
        log(ERROR, "fairclip example: error: %s (--run-config \"out='$PWD/runs'\")", message)
        raise RelativeOut(message)
    model = make_model()
    clients = int(config["num-clients"])  # the population: every client runs one node here
    inner = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=clients)
    strategy = DifferentialPrivacy(  # fairclip: user-level DP with bounded adaptive clipping
        inner,
        "bounded",
        {
            "initial_bound": config["initial-bound"],
            "lower_bound": config["lower-bound"],
            "bound_lr": config["bound-lr"],
        },
        num_clients=clients,
        sample_rate=float(config["sample-rate"]),
        noise_multiplier=float(config["noise-multiplier"]),
    )
    x, y, cohorts = test_data()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        per_cohort = {
            f"{c}/accuracy": accuracy(model, x[cohorts == c], y[cohorts == c])
            for c in ("majority", "minority")
        }
        return MetricRecord({"accuracy": accuracy(model, x, y), **per_cohort})

    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        evaluate_fn=evaluate,
    )
    if out:
        rows = [
            {"round": t, **dict(metrics), **dict(result.evaluate_metrics_serverapp.get(t, {}))}
            for t, metrics in sorted(result.train_metrics_clientapp.items())
        ]
        Path(out).mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(Path(out) / "rounds.csv", index=False)
