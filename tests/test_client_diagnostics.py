"""The per-client diagnostics are one declared list (``aggregation.CLIENT_DIAGNOSTICS``)
that the client side, the sums, a reply's record and the row writer all read; none of them is
released (they are simulation-only: no DP covers them)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

from fairclip.client.protocol import DIAGNOSTIC_FIELDS
from fairclip.server.run import _round_row
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
