"""Paired metrics (seed 003's privacy cost, excessive risk and their gaps): declared in a setup,
formed per seed against the reference run of the same seed, tabulated and tested like any
metric, and added to a recorded reproduction from its per-seed values (``tools.results
retabulate``)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce import setups as setup_files
from fairclip.sims.reproduce import tables
from fairclip.sims.reproduce.paired_metrics import PairedMetric, add_paired_metrics, parse_paired_metrics
from tools import results

METRICS = ["accuracy_a", "accuracy_b", "loss_a", "loss_b"]
PAIRED = parse_paired_metrics(
    {
        "privacy_cost_gap": {"gap": ["privacy_cost_a", "privacy_cost_b"]},  # before its parts: still fine
        "privacy_cost_a": {"of": "accuracy_a", "difference": "reference - policy"},
        "privacy_cost_b": {"of": "accuracy_b", "difference": "reference - policy"},
        "excessive_risk_a": {"of": "loss_a", "difference": "policy - reference"},
    },
    METRICS,
    "test",
)


def _row(policy: str, seed: int, accuracy_a: float, accuracy_b: float, loss_a: float = 0.5) -> dict:
    return {
        "policy": policy,
        "target_epsilon": "",
        "seed": seed,
        "accuracy_a": accuracy_a,
        "accuracy_b": accuracy_b,
        "loss_a": loss_a,
        "loss_b": 0.4,
    }


def test_costs_and_risks_are_formed_per_seed_against_the_same_seeds_reference():
    per_seed = [
        _row("none", 0, 0.90, 0.80, 0.30),
        _row("none", 1, 0.92, 0.70, 0.20),
        _row("dp", 0, 0.85, 0.79, 0.45),  # costs 0.05 and 0.01
        _row("dp", 1, 0.91, 0.60, 0.50),  # costs 0.01 and 0.10: the gap's sign flips
        _row("dp", 2, 0.50, 0.50),  # the reference did not run seed 2
    ]
    rows = add_paired_metrics(PAIRED, "none", per_seed)
    assert all("privacy_cost_a" not in row for row in rows[:2])  # the reference has none
    dp = [row for row in rows if row["policy"] == "dp"]
    assert (dp[0]["privacy_cost_a"], dp[0]["privacy_cost_b"]) == pytest.approx((0.05, 0.01))
    assert (dp[0]["excessive_risk_a"], dp[1]["excessive_risk_a"]) == pytest.approx((0.15, 0.30))
    assert (dp[0]["privacy_cost_gap"], dp[1]["privacy_cost_gap"]) == pytest.approx((0.04, 0.09))
    assert all(math.isnan(dp[2][metric.name]) for metric in PAIRED)
    # the gap is |π_a − π_b| of each seed, then averaged: 0.065, not |mean π_a − mean π_b| = 0.025
    values = pd.DataFrame(rows).query("policy == 'dp'")["privacy_cost_gap"].dropna()
    assert values.mean() == pytest.approx(0.065)
    assert add_paired_metrics(PAIRED, "none", [r for r in per_seed if r["policy"] != "none"])[0].keys() == (
        per_seed[2].keys()
    )  # --policies without the reference: nothing is added


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(*(st.floats(0.0, 1.0) for _ in range(4))),
        min_size=2,
        max_size=8,
    )
)
def test_a_gaps_mean_is_never_below_the_gap_of_the_means(seeds):
    """Jensen: mean_s |π_a − π_b| ≥ |mean_s π_a − mean_s π_b|, with equality where every seed's
    difference has one sign; and each cost is the reference's accuracy minus the policy's."""
    per_seed = []
    for seed, (ref_a, ref_b, pol_a, pol_b) in enumerate(seeds):
        per_seed += [_row("none", seed, ref_a, ref_b), _row("dp", seed, pol_a, pol_b)]
    table = pd.DataFrame(add_paired_metrics(PAIRED, "none", per_seed)).query("policy == 'dp'")
    references = [(a, b) for a, b, _, _ in seeds]
    assert np.allclose(
        table["privacy_cost_a"], [a - p for (a, _), (_, _, p, _) in zip(references, seeds, strict=True)]
    )
    gap = table["privacy_cost_gap"].mean()
    assert gap >= abs(table["privacy_cost_a"].mean() - table["privacy_cost_b"].mean()) - 1e-12


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"x": {"of": "accuracy_c", "difference": "reference - policy"}}, "no metric 'accuracy_c'"),
        ({"x": {"of": "accuracy_a", "difference": "reference minus policy"}}, "difference must be one of"),
        ({"x": {"gap": ["privacy_cost_a", "y"]}}, "gap names 'privacy_cost_a'"),
        ({"x": {"gap": ["y", "y"]}}, "two different paired metrics"),
        ({"accuracy_a": {"gap": ["y", "z"]}}, "already a metric of the setup"),
        ({"x": {"of": "accuracy_a"}}, "must be { of = METRIC"),
        ({"x": 1}, "must be { of = METRIC"),
    ],
)
def test_a_malformed_declaration_is_one_line_naming_it(table, message):
    with pytest.raises(ConfigError, match=r"^test: setup\.paired_metrics\.\w+") as raised:
        parse_paired_metrics(table, METRICS, "test")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_setup_declares_them_only_beside_a_non_private_reference(tmp_path, monkeypatch):
    text = (setup_files.builtin_setups()["esipova-dutch"]).read_text()
    folder = tmp_path / "builtin"
    folder.mkdir()
    monkeypatch.setattr(setup_files, "SETUP_DIR", folder)
    (folder / "paired-relative.toml").write_text(
        text.replace("paper_epsilon = 2.27\n", 'paper_epsilon = 2.27\nrelative_to = "none"\n', 1)
    )
    with pytest.raises(ConfigError, match=r"paired_metrics and setup\.relative_to exclude each other"):
        setup_files.load_setup("paired-relative")
    without_none = text.replace("[policies.none]\n", '[policies.none]\npolicy = "constant"\n')
    (folder / "paired-no-reference.toml").write_text(without_none)
    assert without_none != text
    with pytest.raises(ConfigError, match="needs a policy that runs none"):
        setup_files.load_setup("paired-no-reference")


def test_the_builtin_paired_metrics_are_seed_003s_with_every_published_value():
    """Tables 2, 4 and 5 print π_a, π_b, π_{a,b}, R_a, R_b and R_{a,b} for every private method:
    each has its paper value (privacy costs as fractions, like the accuracies)."""
    for name in ("esipova-adult", "esipova-dutch", "esipova-skewed-mnist"):
        setup = setup_files.load_setup(name)
        assert [m.name.split("_")[0] for m in setup.paired_metrics] == ["privacy"] * 3 + ["excessive"] * 3
        gaps = [m for m in setup.paired_metrics if m.gap is not None]
        assert [m.name for m in gaps] == ["privacy_cost_gap", "excessive_risk_gap"]
        for policy in setup.policies:
            values = policy.paper.get("", {})
            if policy.policy_name == "none" or not values:  # the reference; a variant without values
                continue
            assert {m.name for m in setup.paired_metrics} <= set(values), (name, policy.name)
            costs = [values[m.name] for m in setup.paired_metrics if m.name.startswith("privacy_cost")]
            assert all(abs(v) < 1 for v in costs)  # fractions, not the paper's points
            cost = [m for m in setup.paired_metrics if m.name.startswith("privacy_cost_") and m.gap is None]
            assert all(isinstance(m, PairedMetric) and m.sign == -1.0 for m in cost)


def test_a_records_paired_metrics_come_from_its_per_seed_values(tmp_path):
    """``tools.results retabulate`` gives the committed esipova-dutch record exactly (the
    committed files are what the code makes of the recorded per-seed values), and forms its rows
    from per_seed.csv: removing them and tabulating again brings them back, number for number."""
    folder = tmp_path / "esipova-dutch"
    shutil.copytree(results.RESULTS_DIR / "esipova-dutch", folder)
    committed = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert results.retabulate(folder) is False
    table = pd.read_csv(folder / "reproduction.csv", keep_default_na=False)
    paired = table["metric"].str.startswith(("privacy_cost", "excessive_risk"))
    assert paired.sum() == 6 * 6  # six private policies
    per_seed = pd.read_csv(folder / "per_seed.csv", keep_default_na=False)
    none = per_seed[per_seed["policy"] == "none"].set_index("seed")
    constant = per_seed[per_seed["policy"] == "constant"].set_index("seed")
    costs = none["accuracy_male"] - constant["accuracy_male"]
    assert np.allclose(constant["privacy_cost_male"].astype(float), costs)
    row = table[(table["policy"] == "constant") & (table["metric"] == "privacy_cost_male")].iloc[0]
    assert float(row["fairclip_mean"]) == pytest.approx(costs.mean(), abs=1e-6)
    assert float(row["fairclip_stderr"]) == pytest.approx(costs.std(ddof=1) / math.sqrt(len(costs)), abs=1e-6)

    table[~paired].to_csv(folder / "reproduction.csv", index=False)  # a record from before them
    per_seed.drop(
        columns=[m for m in per_seed.columns if m.startswith(("privacy_cost", "excessive"))]
    ).to_csv(folder / "per_seed.csv", index=False)
    assert results.retabulate(folder) is True
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == committed


def test_every_committed_record_is_what_the_code_makes_of_its_per_seed_values(tmp_path):
    """Each committed record that ``retabulate`` can rebuild (no grid, per-seed values kept)
    comes out byte for byte: its tables, claims and ranking are current. esipova-skewed-mnist has
    a paired test whose seeds all differ by the same amount (no t interval: empty cells), which
    the report could not render from the CSV before 2026-12-05."""
    folders = [
        folder
        for folder in sorted(results.RESULTS_DIR.iterdir())
        if (folder / "per_seed.csv").is_file()
        and not setup_files.load_setup(json.loads((folder / "record.json").read_text())["setup"]).has_grid
    ]
    if not folders:
        pytest.skip("no results folder here (an installed copy): nothing recorded to check")
    assert "esipova-skewed-mnist" in {folder.name for folder in folders}
    for folder in folders:
        copy = tmp_path / folder.name
        shutil.copytree(folder, copy)
        assert results.retabulate(copy) is False, f"{folder.name}: the committed record is stale"


def test_retabulate_refuses_what_it_cannot_rebuild(tmp_path, cli_results):
    """A setup with a grid (its chosen points are not recorded) and a record without per-seed
    values: one line, status 2."""
    status, err = cli_results("retabulate", "zhao-dutch")
    assert status == 2 and "has a grid" in err and err.count("\n") == 1
    folder = tmp_path / "esipova-adult"
    shutil.copytree(results.RESULTS_DIR / "esipova-adult", folder)
    (folder / "per_seed.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"holds no per_seed\.csv"):
        results.retabulate(folder)


@pytest.fixture
def cli_results(capsys):
    def run(*argv: str) -> tuple[int, str]:
        status = results.main(list(argv))
        return status, capsys.readouterr().err

    return run


def test_the_table_rows_follow_each_policys_metrics():
    """:func:`tables.paired_metric_rows` takes its ε columns from the policy's own row and flags
    against the paper's value like any metric."""
    setup = setup_files.load_setup("esipova-dutch")
    constant = next(policy for policy in setup.policies if policy.name == "constant")
    per_seed = pd.DataFrame(
        add_paired_metrics(
            setup.paired_metrics,
            "none",
            [
                {"policy": "none", "target_epsilon": "", "seed": s, **dict.fromkeys(setup.metrics, 0.8)}
                for s in range(3)
            ]
            + [
                {"policy": "constant", "target_epsilon": "", "seed": s, **dict.fromkeys(setup.metrics, 0.7)}
                for s in range(3)
            ],
        )
    )
    template = {
        "setup": setup.name,
        "policy": "constant",
        "epsilon": 2.27,
        "epsilon_rdp": 2.27,
        "grid_point": {},
    }
    rows = tables.paired_metric_rows(setup, constant, "", per_seed, template)
    assert [row["metric"] for row in rows] == [m.name for m in setup.paired_metrics]
    by_metric = {row["metric"]: row for row in rows}
    cost = by_metric["privacy_cost_male"]
    assert cost["fairclip_mean"] == pytest.approx(0.1) and cost["epsilon"] == 2.27 and cost["seeds"] == 3
    assert cost["paper"] == 0.038 and cost["outside"] is True  # 0.1 against the paper's 0.038
    assert by_metric["excessive_risk_male"]["fairclip_mean"] == pytest.approx(-0.1)
    assert by_metric["privacy_cost_gap"]["fairclip_mean"] == pytest.approx(0.0)


def test_without_the_reference_the_paired_claims_are_left_out_not_failed():
    """``--policies constant`` runs no reference: its per-seed rows hold no paired metric, and
    the claims on them (DP-SGD's cost for men against women's) are not tested, where they used to
    raise a KeyError after every run had finished."""
    setup = setup_files.load_setup("esipova-dutch")
    per_seed = [
        {"policy": "constant", "target_epsilon": "", "seed": s, **dict.fromkeys(setup.metrics, 0.7)}
        for s in range(2)
    ]
    assert any(c.first.policy == c.second.policy == "constant" for c in setup.claims)
    claims, _fairest = tables.claim_and_fairest_rows(
        setup, add_paired_metrics(setup.paired_metrics, "none", per_seed)
    )
    assert claims == []
    with_reference = per_seed + [{**row, "policy": "none", "accuracy_male": 0.8} for row in per_seed]
    claims, _fairest = tables.claim_and_fairest_rows(
        setup, add_paired_metrics(setup.paired_metrics, "none", with_reference)
    )
    assert [row["id"] for row in claims] == ["constant-costs-male-more"]
    assert claims[0]["first_mean"] == pytest.approx(0.1) and claims[0]["second_mean"] == pytest.approx(0.0)


def test_retabulate_takes_the_paper_values_and_flags_from_the_setup_file(tmp_path):
    """A record tabulated under older paper values (here: the non-private loss on women, whose
    printed ± 0.000 was stored as 0 and fell back to ± 2 points) gets the setup file's current
    value, error and flag from ``retabulate``, while its means stay as recorded."""
    folder = tmp_path / "esipova-dutch"
    shutil.copytree(results.RESULTS_DIR / "esipova-dutch", folder)
    committed = {path.name: path.read_bytes() for path in folder.iterdir()}
    table = pd.read_csv(folder / "reproduction.csv", keep_default_na=False)
    row = (table["policy"] == "none") & (table["metric"] == "loss_female")
    assert table.loc[row, "outside"].tolist() == [True]
    table.loc[row, ["paper_stderr", "outside"]] = ["0.0", False]
    table.to_csv(folder / "reproduction.csv", index=False)
    assert results.retabulate(folder) is True
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == committed
