"""Issue 18, points 9, 10 and 12: the comparison's figures and report cannot be misread.

One colour and one legend place per policy in every figure, bands over seeds that say what
they are, the ε axis labelled with the ε values run, the mechanism plot (median update norm per
cohort against the bound), a "best" named only where the lead is clear, and no empty
accuracy-vs-ε figure for a sweep without target ε.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from fairclip.sims.compare.report import best_for_worst_cohort, markdown_report, write_report
from fairclip.sims.sweeps import plots

COHORTS = ("majority", "minority")


def _sweep(policies, epsilons, seeds=3, spent=None, rounds=6):
    """A made-up finished sweep: (summary table, rounds by key, keys)."""
    rng = np.random.default_rng(0)
    rows, frames, keys = [], {}, {}
    cells = [("none", math.inf)] + [(s, e) for s in policies for e in epsilons]
    for policy, epsilon in cells:
        for seed in range(seeds):
            key = f"{policy}__{epsilon}__{seed}"
            keys[key] = (policy, epsilon)
            frame = {"round": np.arange(1, rounds + 1)}
            frame["clip_bound"] = np.inf if policy == "none" else 1.0 + 0.1 * rng.random(rounds)
            for index, cohort in enumerate(COHORTS):
                frame[f"{cohort}/accuracy"] = 0.5 + 0.05 * np.arange(rounds) + 0.01 * rng.random(rounds)
                frame[f"{cohort}/median_norm"] = 0.5 + index + 0.1 * rng.random(rounds)
            frames[key] = pd.DataFrame(frame)
            for cohort in COHORTS:
                rows.append(
                    {
                        "policy": policy,
                        "target_epsilon": epsilon,
                        "epsilon": math.inf
                        if policy == "none"
                        else (spent if spent is not None else epsilon),
                        "seed": seed,
                        "cohort": cohort,
                        "accuracy": 0.8 + 0.01 * rng.random(),
                        "loss": 0.4,
                        "privacy_cost": 0.01,
                        "excessive_risk": 0.01,
                    }
                )
    return pd.DataFrame(rows), frames, keys


@pytest.fixture
def figures(monkeypatch):
    """Every figure the plots module saves, by file name (the figure stays open for inspection)."""
    saved = {}

    def keep(figure, path: Path) -> None:
        saved[path.name] = figure

    monkeypatch.setattr(plots, "save", keep)
    yield saved
    plots.plt.close("all")


def _lines(figure) -> dict[str, list]:
    """Label -> colours of that label's lines (and error-bar lines) over every panel of ``figure``."""
    found: dict[str, list] = {}
    for axis in figure.axes:
        drawn = [(line.get_label(), line) for line in axis.get_lines()]
        drawn += [(container.get_label(), container.lines[0]) for container in axis.containers]
        for label, line in drawn:
            if not label.startswith("_"):
                found.setdefault(label, []).append(tuple(np.atleast_1d(line.get_color())))
    return found


def _legend(axis) -> list[str]:
    return [text.get_text() for text in axis.get_legend().get_texts()]


def test_a_policy_has_one_colour_and_place_whichever_policies_run():
    alone = plots.policy_styles(["bounded", "none"])
    many = plots.policy_styles(["none", "soft", "bounded", "constant", "adaptive"])
    assert alone["bounded"] == many["bounded"]
    assert list(many) == ["none", "constant", "adaptive", "bounded", "soft"]
    assert alone["none"].colour == "black" and alone["none"].linestyle == "--"
    mine = plots.policy_styles(["my-policy", "constant"])
    builtin_colours = {plots.policy_styles([name])[name].colour for name in plots.POLICIES}
    assert mine["my-policy"].colour not in builtin_colours and list(mine) == ["constant", "my-policy"]


def test_every_figure_draws_a_policy_in_the_same_colour_and_legend_order(figures, tmp_path):
    table, rounds, keys = _sweep(["bounded", "adaptive", "constant"], [2.0, 8.0])
    plots.write_plots(tmp_path, table, rounds, keys)
    styles = plots.policy_styles(["constant", "adaptive", "bounded", "none"])
    for name in (plots.ACCURACY_VS_EPSILON, plots.CLIP_BOUND_ROUNDS, plots.COHORT_ACCURACY_ROUNDS):
        for label, colours in _lines(figures[name]).items():
            if label in styles:
                expected = tuple(np.atleast_1d(styles[label].colour))
                assert set(colours) == {expected}, (name, label)
    orders = [
        _legend(figures[plots.COHORT_ACCURACY_ROUNDS].axes[0]),
        _legend(figures[plots.ACCURACY_VS_EPSILON].axes[0]),
    ]
    assert orders == [["none", "constant", "adaptive", "bounded"]] * 2


def test_curves_over_rounds_have_a_band_over_seeds_and_say_so(figures, tmp_path):
    table, rounds, keys = _sweep(["adaptive"], [2.0], seeds=3)
    plots.write_plots(tmp_path, table, rounds, keys)
    figure = figures[plots.COHORT_ACCURACY_ROUNDS]
    assert "band: ± 1 standard error over seeds" in figure._suptitle.get_text()
    assert "mean over 3 seeds" in figure._suptitle.get_text()
    assert all(any(isinstance(c, PolyCollection) for c in axis.collections) for axis in figure.axes)
    one_seed = _sweep(["adaptive"], [2.0], seeds=1)
    plots.write_plots(tmp_path, *one_seed)
    figure = figures[plots.COHORT_ACCURACY_ROUNDS]
    assert "one seed: no band" in figure._suptitle.get_text()
    assert not any(isinstance(c, PolyCollection) for axis in figure.axes for c in axis.collections)


def test_the_epsilon_axis_is_labelled_with_the_values_run(figures, tmp_path):
    table, rounds, keys = _sweep(["adaptive"], [0.5, 2.0, 8.0])
    plots.write_plots(tmp_path, table, rounds, keys)
    for axis in figures[plots.ACCURACY_VS_EPSILON].axes:
        assert [tick.get_text() for tick in axis.get_xticklabels()] == ["0.5", "2", "8"]
        assert list(axis.get_xticks()) == [0.5, 2.0, 8.0]
        assert len(axis.xaxis.get_minor_locator().tick_values(0.1, 10)) == 0
        assert axis.get_xlabel() == "target ε"


def test_the_mechanism_plot_puts_each_cohorts_median_norm_against_the_bound(figures, tmp_path):
    table, rounds, keys = _sweep(["adaptive", "bounded"], [2.0, 8.0])
    plots.write_plots(tmp_path, table, rounds, keys)
    figure = figures[plots.COHORT_NORMS_ROUNDS]
    titles = [axis.get_title() for axis in figure.axes]
    assert titles == ["adaptive, ε = 2", "bounded, ε = 2", "adaptive, ε = 8", "bounded, ε = 8"]
    for axis in figure.axes:
        labels = [line.get_label() for line in axis.get_lines()]
        assert labels == ["clipping bound", "majority median norm", "minority median norm"]
        minority = axis.get_lines()[2].get_ydata()
        assert np.all((minority > 1.4) & (minority < 1.6))  # the mean over seeds of what was recorded


def test_without_target_epsilon_the_plot_shows_the_epsilon_spent(figures, tmp_path):
    table, rounds, keys = _sweep(["adaptive", "bounded"], [math.nan], spent=3.21)
    left_out = plots.write_plots(tmp_path, table, rounds, keys)
    assert list(left_out) == [plots.COHORT_DIRECTIONS_ROUNDS]  # these rounds hold no direction errors
    assert "training.cohort_directions = true" in left_out[plots.COHORT_DIRECTIONS_ROUNDS]
    axis = figures[plots.ACCURACY_VS_EPSILON].axes[0]
    assert axis.get_xlabel().startswith("ε spent")
    assert [tick.get_text() for tick in axis.get_xticklabels()] == ["3.21"]
    points = {c.get_label(): pytest.approx(list(c.lines[0].get_xdata())) for c in axis.containers}
    assert points == {"adaptive": [3.21], "bounded": [3.21]}


def test_without_any_finite_epsilon_the_plot_is_left_out_and_the_report_says_why(tmp_path):
    table, rounds, keys = _sweep(["adaptive"], [math.nan], spent=math.inf)
    (tmp_path / plots.ACCURACY_VS_EPSILON).write_bytes(b"stale")
    drawn = write_report(tmp_path, table, rounds, keys, "t")
    assert plots.ACCURACY_VS_EPSILON not in drawn and plots.CLIP_BOUND_ROUNDS in drawn
    assert not (tmp_path / plots.ACCURACY_VS_EPSILON).exists()
    report = (tmp_path / "report.md").read_text()
    assert f"![{plots.ACCURACY_VS_EPSILON}]" not in report
    assert "`accuracy_vs_epsilon.png` is not drawn: no finite ε was run" in report


def _per_run(scores: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"policy": name, "seed": seed, "worst_cohort_accuracy": value}
            for name, values in scores.items()
            for seed, value in enumerate(values)
        ]
    )


def test_a_best_policy_is_named_only_where_its_lead_is_clear():
    # The case: 0.796 ± 0.015 against 0.790 ± 0.014 is a tie.
    tied = _per_run({"constant": [0.78, 0.826, 0.782], "bounded": [0.80, 0.762, 0.808]})
    verdict = best_for_worst_cohort(tied, seeds=3)
    assert verdict.startswith("No clear best") and "`constant`" in verdict and "`bounded`" in verdict
    assert "**" not in verdict
    clear = _per_run({"constant": [0.80, 0.81, 0.79], "adaptive": [0.58, 0.60, 0.57]})
    assert best_for_worst_cohort(clear, seeds=3).startswith(
        "Best policy for the worst cohort: **`constant`**"
    )
    # Small but consistent on every seed (paired): clear; the same means, inconsistent: tied.
    paired = _per_run({"a": [0.70, 0.80, 0.90], "b": [0.69, 0.79, 0.89]})
    assert "**`a`**" in best_for_worst_cohort(paired, seeds=3)
    shuffled = _per_run({"a": [0.70, 0.80, 0.90], "b": [0.79, 0.89, 0.69]})
    assert best_for_worst_cohort(shuffled, seeds=3).startswith("No clear best")


def test_a_policy_alone_is_not_named_best():
    verdict = best_for_worst_cohort(_per_run({"bounded": [0.7, 0.8, 0.75]}), seeds=3)
    assert verdict.startswith("Only `bounded` ran here") and "**" not in verdict


def test_one_seed_names_no_best():
    verdict = best_for_worst_cohort(_per_run({"constant": [0.8], "adaptive": [0.5]}), seeds=1)
    assert "no policy is named best" in verdict and "**" not in verdict


def test_the_report_lists_policies_in_the_legend_order():
    table, _, _ = _sweep(["bounded", "constant"], [2.0])
    report = markdown_report(table, "t")
    assert report.index("`constant` |") < report.index("`bounded` |") and report.index(
        "`none` |"
    ) < report.index("`constant` |")


def test_a_line_drawn_on_another_says_so_and_the_panels_share_their_y_axis(figures, tmp_path):
    """Issue 67: two policies with identical results hid each other without a word, and panels
    of one figure had their own y scales without saying so."""
    table, rounds, keys = _sweep(["constant", "adaptive"], [2.0])
    for key, (policy, _) in keys.items():  # adaptive's runs copy constant's, seed by seed
        if policy == "adaptive":
            rounds[key] = rounds[key.replace("adaptive", "constant")].copy()
    copied = table["policy"] == "adaptive"
    table.loc[copied, "accuracy"] = table.loc[table["policy"] == "constant", "accuracy"].to_numpy()
    plots.write_plots(tmp_path, table, rounds, keys)
    for name in (plots.CLIP_BOUND_ROUNDS, plots.COHORT_ACCURACY_ROUNDS, plots.ACCURACY_VS_EPSILON):
        figure = figures[name]
        assert "adaptive (same as constant: lines coincide)" in _legend(figure.axes[0]), name
        assert "constant" in _legend(figure.axes[0]), name
        limits = {axis.get_ylim() for axis in figure.axes}
        assert len(limits) == 1 and "share one y axis" in figure._suptitle.get_text(), name
    different = _sweep(["constant", "adaptive"], [2.0])
    plots.write_plots(tmp_path, *different)
    assert not any("same as" in label for label in _legend(figures[plots.COHORT_ACCURACY_ROUNDS].axes[0]))


@pytest.mark.parametrize("cohort_name", ["seed", "policy", "target_epsilon"])
def test_a_cohort_named_like_a_column_of_the_report_keeps_its_own_column(cohort_name):
    """Issue 67: a cohort named like one of the report's keys took that key's column."""
    from fairclip.sims.compare.report import per_run_quantities

    table, _, _ = _sweep(["constant"], [2.0])
    table["cohort"] = table["cohort"].replace({"minority": cohort_name})
    per_run = per_run_quantities(table)
    assert f"{cohort_name} accuracy" in per_run.columns and "majority accuracy" in per_run.columns
    assert sorted(per_run["seed"].unique()) == [0, 1, 2] and set(per_run["policy"]) == {"none", "constant"}
    minority = table[(table["cohort"] == cohort_name) & (table["policy"] == "constant")]
    mine = per_run[per_run["policy"] == "constant"].sort_values("seed")
    np.testing.assert_allclose(mine[f"{cohort_name} accuracy"], minority.sort_values("seed")["accuracy"])
