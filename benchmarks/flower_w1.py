"""fairclip's Flower apps for the W1 benchmark on Flower's simulation runtime.

Imported by the throw-away Flower project that :func:`benchmarks.w1.run_flower` writes. The
apps here are thin wrappers whose handlers call fairclip's own (the ``identify`` and ``train``
handlers of ``fairclip.sims.flower_apps.clients`` and :func:`~fairclip.sims.flower_apps.run_federation`)
after two patches, re-applied on every call since Flower's runtime may load the app's modules afresh:

1. ``fairclip.sims.tasks.build_task`` also builds the benchmark image task;
2. the ServerApp records when the first round starts and when each round ends, with its
   accepted and dropped replies (``bench_timing.json`` next to ``rounds.csv``), so that Flower's
   throughput is measured over the same phase as fairclip's engine: from the first round's
   sampling to the last round's server step and evaluation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .imagetask import patch_fairclip_build_task

_TIMING: dict = {"rounds_start": None, "rounds_end": None, "updates": [], "dropped": []}

clientapp = ClientApp()
serverapp = ServerApp()


@clientapp.query()
def identify(message: Message, context: Context) -> Message:
    from fairclip.sims.flower_apps import clients

    patch_fairclip_build_task()
    return clients.identify(message, context)


@clientapp.train()
def train(message: Message, context: Context) -> Message:
    from fairclip.sims.flower_apps import clients

    patch_fairclip_build_task()
    return clients.train(message, context)


@serverapp.main()
def main(grid: Grid, context: Context) -> None:
    from fairclip.sims.flower_apps import server_app

    patch_fairclip_build_task()
    _patch_server_timing()
    server_app(grid, context)


def _patch_server_timing() -> None:
    from fairclip.sims import engine, outputs

    if getattr(engine.RunServer, "_bench_patched", False):
        return
    original_sample = engine.RunServer.sample
    original_finish_round = engine.RunServer.finish_round
    original_write_run = outputs.write_run

    def sample(self, round_number):
        if _TIMING["rounds_start"] is None:
            _TIMING["rounds_start"] = time.time()
        return original_sample(self, round_number)

    def finish_round(self, round_number, sums, extra=None):
        row = original_finish_round(self, round_number, sums, extra)
        _TIMING["rounds_end"] = time.time()
        extra = extra or {}
        _TIMING["updates"].append(int(extra.get("accepted_replies", sums.num_reports)))
        _TIMING["dropped"].append(int(extra.get("dropped_replies", 0)))
        return row

    def write_run(out, *args, **kwargs):
        result = original_write_run(out, *args, **kwargs)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench_timing.json").write_text(json.dumps(_TIMING))
        return result

    engine.RunServer.sample = sample
    engine.RunServer.finish_round = finish_round
    engine.RunServer._bench_patched = True
    outputs.write_run = write_run


__all__ = ["clientapp", "serverapp"]
