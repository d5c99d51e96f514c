"""Issue 65, point 2: the papers' claims tested with paired tests across seeds, the fairest
policy per setup, and the flag rule with combined standard errors."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairclip.scenarios.data import DATASET_FILES
from fairclip.scenarios.errors import ConfigError
from fairclip.sims.reproduce import reproduction as repro
from fairclip.sims.reproduce import setups, tables
from fairclip.sims.reproduce.claims import claim_rows, fairest_markdown, fairest_rows, parse_claims, verdict

DATA_DIR = Path(os.environ.get("FAIRCLIP_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")

CONTEXT = {
    "policies": ["none", "constant", "bounded"],
    "metrics": ["acc_a", "acc_b"],
    "epsilons": ["1", "8"],
}


def _entry(**changes) -> dict:
    entry = {
        "id": "bounded-helps-b",
        "claim": "bounded keeps b's accuracy above constant's",
        "source": "Table 1",
        "paper": "0.9 against 0.7",
        "expect": "greater",
        "first": {"policy": "bounded", "metric": "acc_b", "epsilon": 1.0},
        "second": {"policy": "constant", "metric": "acc_b", "epsilon": 1.0},
    }
    entry.update(changes)
    return entry


def test_claims_parse_and_each_mistake_is_one_line():
    (claim,) = parse_claims([_entry()], where="reproduction x", **CONTEXT)
    assert claim.first.epsilon == "1" and claim.second.policy == "constant"
    mistakes = [
        (_entry(expect="bigger"), "expect must be one of greater, less"),
        (_entry(first={"policy": "soft", "metric": "acc_b"}), "has no policy 'soft'"),
        (_entry(first={"policy": "bounded", "metric": "acc_c", "epsilon": 1}), "has no metric 'acc_c'"),
        (_entry(first={"policy": "bounded", "metric": "acc_b", "epsilon": 2}), "epsilon 2 is not a target"),
        (_entry(second=_entry()["first"]), "first and second are the same quantity"),
        ({k: v for k, v in _entry().items() if k != "paper"}, "lacks 'paper'"),
        (_entry(note="x"), "unknown key 'note'"),
    ]
    for entry, message in mistakes:
        with pytest.raises(ConfigError, match=message):
            parse_claims([entry], where="reproduction x", **CONTEXT)
    with pytest.raises(ConfigError, match="used twice"):
        parse_claims([_entry(), _entry()], where="reproduction x", **CONTEXT)


def _per_seed(differences: list[float]) -> pd.DataFrame:
    rows = []
    for seed, difference in enumerate(differences):
        rows.append({"policy": "constant", "target_epsilon": "1", "seed": seed, "acc_b": 0.7 + 0.01 * seed})
        rows.append(
            {
                "policy": "bounded",
                "target_epsilon": "1",
                "seed": seed,
                "acc_b": 0.7 + 0.01 * seed + difference,
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("differences", "expected"),
    [
        ([0.10, 0.12, 0.09, 0.11, 0.10], "holds"),
        ([-0.10, -0.12, -0.09, -0.11, -0.10], "reverses"),
        ([0.05, -0.06, 0.02, -0.01, 0.00], "inconclusive"),
        ([0.10], "inconclusive"),
    ],
)
def test_a_claim_holds_reverses_or_is_inconclusive_by_its_paired_test(differences, expected):
    claims = parse_claims([_entry()], where="x", **CONTEXT)
    (row,) = claim_rows("x", claims, _per_seed(differences))
    assert row["verdict"] == expected and row["seeds"] == len(differences)
    assert row["mean_difference"] == pytest.approx(np.mean(differences))
    less = parse_claims([_entry(expect="less")], where="x", **CONTEXT)
    flipped = {"holds": "reverses", "reverses": "holds", "inconclusive": "inconclusive"}[expected]
    assert claim_rows("x", less, _per_seed(differences))[0]["verdict"] == flipped
    assert verdict(0.1, math.nan, "greater") == "inconclusive"


def test_the_fairest_policy_is_the_one_whose_worst_group_loses_least():
    rows = []
    rng = np.random.default_rng(0)
    for seed in range(5):
        base = {"majority/accuracy": 0.9, "minority/accuracy": 0.8}
        rows.append({"policy": "none", "target_epsilon": "", "seed": seed, **base})
        for policy, cost in (("adaptive", 0.25), ("bounded", 0.03)):
            noise = rng.normal(0, 0.005)
            rows.append(
                {
                    "policy": policy,
                    "target_epsilon": "8",
                    "seed": seed,
                    "majority/accuracy": 0.9 - 0.01,
                    "minority/accuracy": 0.8 - cost + noise,
                }
            )
    ranked = fairest_rows("demo", pd.DataFrame(rows), "none", ["majority", "minority"])
    assert [row["policy"] for row in ranked] == ["bounded", "adaptive"]
    best = ranked[0]
    assert best["rank"] == 1 and best["worst_group"] == "minority" and best["seeds"] == 5
    assert best["worst_group_cost"] == pytest.approx(0.03, abs=0.01)
    assert best["ci_low"] < best["worst_group_cost"] < best["ci_high"] and best["p_vs_next"] < 0.05
    assert math.isnan(ranked[1]["p_vs_next"])
    assert fairest_rows("demo", pd.DataFrame(rows), None, ["majority"]) == []


def test_a_policy_that_spends_far_more_epsilon_is_listed_but_not_ranked():
    """Algorithm 3 as written (ε ~800 beside DP-SGD's 5.9) or FairLens (no ε claimed) could owe a
    lower worst-group cost to their budget: they follow the ranked policies, with their ε and no
    rank, and rank 1 is tested against the runner-up among the comparable ones."""
    rows = []
    rng = np.random.default_rng(1)
    costs = {"constant": 0.5, "per-cohort": 0.25, "alg3": 0.0, "fairlens": 0.1}
    for seed in range(4):
        rows.append(
            {"policy": "none", "target_epsilon": "", "seed": seed, "a/accuracy": 0.9, "b/accuracy": 0.9}
        )
        for policy, cost in costs.items():
            rows.append(
                {
                    "policy": policy,
                    "target_epsilon": "",
                    "seed": seed,
                    "a/accuracy": 0.89,
                    "b/accuracy": 0.9 - cost + rng.normal(0, 0.005),
                }
            )
    spent = {
        ("constant", ""): 5.909,
        ("per-cohort", ""): 5.986,
        ("alg3", ""): 814.6,
        ("fairlens", ""): math.inf,
    }
    listed = fairest_rows("x", pd.DataFrame(rows), "none", ["a", "b"], spent)
    assert [(row["policy"], row["rank"]) for row in listed] == [
        ("per-cohort", 1), ("constant", 2), ("alg3", ""), ("fairlens", "")
    ]  # fmt: skip
    assert [row["epsilon"] for row in listed] == [5.986, 5.909, 814.6, "inf"]
    assert listed[0]["p_vs_next"] < 0.05 and all(math.isnan(row["p_vs_next"]) for row in listed[1:])
    shown = "\n".join(fairest_markdown(listed))
    assert "| not ranked | `alg3` | 814.6 |" in shown and "Not ranked: a policy that spends more" in shown
    # without the spent ε (a record from before), every policy is ranked as it was
    assert [row["rank"] for row in fairest_rows("x", pd.DataFrame(rows), "none", ["a", "b"])] == [1, 2, 3, 4]


def test_flags_use_two_combined_standard_errors_where_both_sides_have_one():
    # paper 0.80 ± 0.01, fairclip ± 0.01: tolerance 2·sqrt(2)·0.01 = 0.0283
    assert not tables.outside(0.80, 0.01, 0.827, 0.01)
    assert tables.outside(0.80, 0.01, 0.829, 0.01)
    # without fairclip's error (one seed) or the paper's: ± 2 points
    assert not tables.outside(0.80, 0.01, 0.819) and tables.outside(0.80, 0.01, 0.821)
    assert not tables.outside(0.80, None, 0.819, 0.05) and tables.outside(0.80, None, 0.821, 0.05)
    assert not tables.outside(None, None, 0.5) and tables.outside(0.80, 0.01, math.nan, 0.01)


def test_a_reproduction_writes_its_claims_and_fairest_policy(tmp_path, monkeypatch):
    """A copy of esipova-dutch with one claim, two policies, two seeds and one round each: the
    runs' metrics by seed, the claim's paired test and the ranking are written and reported."""
    for relative in DATASET_FILES["dutch"]:
        if not (DATA_DIR / relative).is_file():
            pytest.skip(f"{DATA_DIR / relative} is absent: set FAIRCLIP_DATA to the benchmark data folder")
    text = setups.builtin_setups()["esipova-dutch"].read_text()
    text += """
[[claims]]
id = "women-keep-more"
claim = "Constant clipping leaves women's accuracy above men's"
source = "Table 2"
paper = "0.864 against 0.760"
expect = "greater"
first = { policy = "constant", metric = "accuracy_female" }
second = { policy = "constant", metric = "accuracy_male" }
"""
    (tmp_path / "esipova-dutch.toml").write_text(text)
    monkeypatch.setattr(setups, "SETUP_DIR", tmp_path)
    out = tmp_path / "out"
    smoke = {"seeds": 2, "max_rounds": 1, "max_batch": 64, "data_dir": DATA_DIR}
    repro.reproduce("esipova-dutch", out=out, policies=["none", "constant"], ray=False, **smoke)
    per_seed = pd.read_csv(out / "per_seed.csv", keep_default_na=False)
    assert len(per_seed) == 4 and set(per_seed["seed"]) == {0, 1}
    assert {"accuracy_female", "accuracy_male", "female/accuracy", "male/accuracy"} <= set(per_seed.columns)
    claims = pd.read_csv(out / "claims.csv", keep_default_na=False).set_index("id")
    # the setup's own claims on these two policies: DP-SGD's privacy cost for men against women's
    assert list(claims.index) == ["constant-costs-male-more", "women-keep-more"]
    assert (claims["seeds"] == 2).all()
    constant = per_seed[per_seed["policy"] == "constant"].set_index("seed")
    expected = (constant["accuracy_female"] - constant["accuracy_male"]).mean()
    assert claims.loc["women-keep-more", "mean_difference"] == pytest.approx(expected)
    assert claims.loc["women-keep-more", "verdict"] in ("holds", "reverses", "inconclusive")
    # paired metrics: each seed's constant run against the none run of the same seed
    none = per_seed[per_seed["policy"] == "none"].set_index("seed")
    costs = {sex: none[f"accuracy_{sex}"] - constant[f"accuracy_{sex}"] for sex in ("male", "female")}
    assert (none["privacy_cost_male"] == "").all()  # the reference has none
    assert constant["privacy_cost_male"].astype(float).tolist() == pytest.approx(costs["male"].tolist())
    gaps = (costs["male"] - costs["female"]).abs()
    assert constant["privacy_cost_gap"].astype(float).tolist() == pytest.approx(gaps.tolist())
    risks = constant["loss_female"] - none["loss_female"]
    assert constant["excessive_risk_female"].astype(float).tolist() == pytest.approx(risks.tolist())
    difference = (costs["male"] - costs["female"]).mean()
    assert claims.loc["constant-costs-male-more", "mean_difference"] == pytest.approx(difference)
    table = pd.read_csv(out / "reproduction.csv", keep_default_na=False)
    gap = table[(table["policy"] == "constant") & (table["metric"] == "privacy_cost_gap")]
    assert len(gap) == 1 and float(gap["fairclip_mean"].iloc[0]) == pytest.approx(gaps.mean(), abs=1e-6)
    assert float(gap["paper"].iloc[0]) == 0.034
    assert (table["policy"] == "none").sum() == 4  # the reference: its own four metrics only
    fairest = pd.read_csv(out / "fairest.csv", keep_default_na=False)
    assert list(fairest["policy"]) == ["constant"] and fairest["rank"].iloc[0] == 1
    report = (out / "reproduction.md").read_text()
    assert "## The paper's claims" in report and "Constant clipping leaves women's accuracy" in report
    assert "## Which policy makes its worst group pay least" in report


def test_the_claims_page_gathers_every_recorded_setup(tmp_path):
    """A recorded setup with claims.csv and fairest.csv shows its verdicts and ranking; the others'
    claims are pending; the agreement counts use the combined error where both sides have one."""
    from tools import results

    folder = tmp_path / "esipova-dutch"
    folder.mkdir()
    (folder / "record.json").write_text('{"setup": "esipova-dutch"}')
    pd.DataFrame(
        [
            {"setup": "esipova-dutch", "policy": "constant", "epsilon": 2.27, "metric": "accuracy_male",
             "paper": 0.76, "paper_stderr": 0.005, "fairclip_mean": 0.77, "fairclip_stderr": 0.002},
            {"setup": "esipova-dutch", "policy": "constant", "epsilon": 2.27, "metric": "accuracy_female",
             "paper": 0.864, "paper_stderr": "", "fairclip_mean": 0.83, "fairclip_stderr": 0.002},
        ]
    ).to_csv(folder / "reproduction.csv", index=False)  # fmt: skip
    claims = claim_rows("esipova-dutch", parse_claims([_entry()], where="x", **CONTEXT), _per_seed([0.1] * 5))
    pd.DataFrame(claims).to_csv(folder / "claims.csv", index=False)
    rows = [{"policy": "none", "target_epsilon": "", "seed": s, "a/accuracy": 0.9} for s in range(3)]
    rows += [
        {"policy": "constant", "target_epsilon": "2", "seed": s, "a/accuracy": 0.8 + s / 100}
        for s in range(3)
    ]
    pd.DataFrame(fairest_rows("esipova-dutch", pd.DataFrame(rows), "none", ["a"])).to_csv(
        folder / "fairest.csv", index=False
    )
    page = results.claims_page(tmp_path)
    assert "bounded keeps b's accuracy above constant's" in page and "**holds**" in page
    # the setup's own claims, which this record did not test, wait for a rerun; the tested one does not
    pending = page.split("## Claims pending a rerun")[1].split("## Which policy")[0]
    own = setups.load_setup("esipova-dutch").claims
    assert all(f"| esipova-dutch | {claim.claim} (" in pending for claim in own)
    assert "bounded keeps b's accuracy above constant's" not in pending
    assert "**esipova-dutch**" in page and "| 2 | 1 | `constant` |" in page
    assert "Of 2 published numbers with a fairclip counterpart, 1 have the paper's standard error; " in page
    assert "1 lie within ± 2 combined standard errors" in page and "1 within ± 2 points" in page


def test_the_committed_claims_page_is_current():
    from tools import results

    assert results.CLAIMS_PAGE.read_text() == results.claims_page(), (
        "docs/claims.md is stale: run python -m tools.results claims"
    )
