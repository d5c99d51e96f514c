"""The per-client diagnostics are one declared list (``aggregation.CLIENT_DIAGNOSTICS``)
that the client side, the sums, a reply's record and the row writer all read; none of them is
released (they are simulation-only: no DP covers them), and a simulation's summary names every
column of its ``rounds.csv`` that DP does not cover."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd

from fairclip.api import simulate_config
from fairclip.client.protocol import DIAGNOSTIC_FIELDS
from fairclip.scenarios.config import load_config
from fairclip.server.run import ROUND_DIAGNOSTICS, _round_row
from fairclip.strategies.aggregation import CLIENT_DIAGNOSTICS, CohortDiagnostics, RoundSums

KINDS = {"count", "bit", "norm"}


def test_each_diagnostic_is_a_field_of_the_sums_and_of_a_reply():
    fields = {field.name for field in dataclasses.fields(CohortDiagnostics)}
    assert all(diagnostic.name in fields for diagnostic in CLIENT_DIAGNOSTICS)
    assert tuple(diagnostic.name for diagnostic in CLIENT_DIAGNOSTICS) == DIAGNOSTIC_FIELDS
    assert all(diagnostic.kind in KINDS for diagnostic in CLIENT_DIAGNOSTICS)
    assert [d.name for d in CLIENT_DIAGNOSTICS if d.kind == "count"] == ["sampled"]


def test_sums_add_every_diagnostic():
    first, second = CohortDiagnostics.zeros(2), CohortDiagnostics.zeros(2)
    for k, diagnostic in enumerate(CLIENT_DIAGNOSTICS):
        getattr(first, diagnostic.name)[:] = k
        getattr(second, diagnostic.name)[:] = 10 * k
    total = first + second
    for k, diagnostic in enumerate(CLIENT_DIAGNOSTICS):
        np.testing.assert_array_equal(getattr(total, diagnostic.name), [11 * k, 11 * k])


def test_every_diagnostic_column_is_internal_never_public():
    diagnostics = CohortDiagnostics.zeros(2)
    for diagnostic in CLIENT_DIAGNOSTICS:
        getattr(diagnostics, diagnostic.name)[:] = 1.0
    diagnostics.sampled[:] = 2.0
    sums = RoundSums(np.zeros(3), np.zeros(0), 4, diagnostics)
    server = SimpleNamespace(
        clip_bound=1.0, noise_std=0.5, sensitivity=1.0, server_lr_factor=1.0, info={}, noisy_reports=None
    )
    public, internal = _round_row(1, server, sums, 0.1, {}, {}, ("a", "b"))
    for name in ("a", "b"):
        for diagnostic in CLIENT_DIAGNOSTICS:
            if diagnostic.column is not None:
                column = f"{name}/{diagnostic.column}"
                assert column in internal and column not in public, column
        assert internal[f"{name}/sampled"] == 2
        assert internal[f"{name}/clipped_fraction"] == 0.5
    assert not any("/" in column for column in public)


def test_a_simulation_names_every_rounds_column_dp_does_not_cover(cli, tmp_path):
    """End to end through ``fairclip run``, with the clients' evaluation on (whose exact values a
    simulation keeps too): the summary's ``not_covered_by_dp`` names, in one entry, exactly the
    columns of ``rounds.csv`` outside the run's public columns, and no public one."""
    overrides = ["federation.num_clients=200", "training.rounds=3", "evaluation.clients=true"]
    out = tmp_path / "run"
    sets = [item for override in overrides for item in ("--set", override)]
    status, _, err = cli("run", "--scenario", "demo", *sets, "--out", str(out))
    assert status == 0, err
    columns = set(pd.read_csv(out / "rounds.csv").columns)
    summary = json.loads((out / "summary.json").read_text())
    entries = [entry for entry in summary["not_covered_by_dp"] if entry.startswith(ROUND_DIAGNOSTICS)]
    assert len(entries) == 1
    named = set(entries[0][len(ROUND_DIAGNOSTICS) :].split(", "))
    result = simulate_config(load_config("demo", None, overrides))  # the same run, for its split
    assert named == columns - result.public_columns
    assert {"clipped_fraction", "sampled_clients", "client_eval_sampled"} <= named
    assert any(column.endswith("_exact") for column in named)
    assert not named & result.public_columns and "epsilon" in result.public_columns
